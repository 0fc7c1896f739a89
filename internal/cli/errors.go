package cli

import (
	"context"
	"errors"
	"fmt"
	"io"

	"github.com/ortrain/ortrain/internal/ors"
)

// Exit codes, decided in one place (exitCodeFor).
const (
	ExitOK          = 0
	ExitError       = 1
	ExitInterrupted = 2 // interrupted; a checkpoint was saved where one applies
	ExitUsage       = 3 // bad flags, arguments or config
)

// UsageError is a bad flag, argument or config value: printed with a hint to
// --help, exit code 3.
type UsageError struct{ Err error }

func (e *UsageError) Error() string { return e.Err.Error() }
func (e *UsageError) Unwrap() error { return e.Err }

// usageErrorf builds a UsageError.
func usageErrorf(format string, args ...any) error {
	return &UsageError{Err: fmt.Errorf(format, args...)}
}

// InterruptedError reports that a command stopped on SIGINT/SIGTERM after
// saving what it could.
type InterruptedError struct{ What string }

func (e *InterruptedError) Error() string { return "interrupted: " + e.What }

// exitCodeFor maps an error to the process exit code.
func exitCodeFor(err error) int {
	var usage *UsageError
	var interrupted *InterruptedError
	switch {
	case err == nil:
		return ExitOK
	case errors.As(err, &interrupted), errors.Is(err, context.Canceled):
		return ExitInterrupted
	case errors.As(err, &usage):
		return ExitUsage
	}
	return ExitError
}

// printError writes err with the hint that tells the user what to do next.
func printError(w io.Writer, cmdPath string, err error) {
	if errors.Is(err, context.Canceled) {
		fmt.Fprintln(w, "interrupted")
		return
	}
	fmt.Fprintf(w, "error: %v\n", err)
	var usage *UsageError
	var auth *ors.AuthError
	switch {
	case errors.As(err, &usage):
		fmt.Fprintf(w, "Run '%s --help' for usage.\n", cmdPath)
	case errors.As(err, &auth):
		fmt.Fprintln(w, "hint: set OPENREWARD_API_KEY to a valid key, or pass --env http://HOST:PORT for a self-hosted server")
	}
}
