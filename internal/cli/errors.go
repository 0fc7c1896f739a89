package cli

import (
	"context"
	"errors"
	"fmt"
	"io"
	"strings"

	"github.com/ortrain/ortrain/internal/chat"
	"github.com/ortrain/ortrain/internal/config"
	"github.com/ortrain/ortrain/internal/envtarget"
	"github.com/ortrain/ortrain/internal/model"
	"github.com/ortrain/ortrain/internal/openenv"
	"github.com/ortrain/ortrain/internal/ors"
	"github.com/ortrain/ortrain/internal/reward"
	"github.com/ortrain/ortrain/internal/runlock"
	"github.com/ortrain/ortrain/internal/train"
	"github.com/ortrain/ortrain/internal/worker"
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

// exitCodeFor maps an error to the process exit code. Every typed error a
// command may return is classified here and nowhere else.
func exitCodeFor(err error) int {
	switch {
	case err == nil:
		return ExitOK
	case isInterrupted(err):
		return ExitInterrupted
	case isUsage(err):
		return ExitUsage
	}
	return ExitError
}

func isInterrupted(err error) bool {
	var interrupted *InterruptedError
	return errors.As(err, &interrupted) || errors.Is(err, context.Canceled) || errors.Is(err, train.ErrInterrupted)
}

// isUsage: what the user can fix by changing flags, config or environment
// variables before running again.
func isUsage(err error) bool {
	var usage *UsageError
	var field *config.FieldError
	var target *envtarget.TargetError
	var split *envtarget.SplitError
	var index *envtarget.IndexError
	var typ *config.TypeError
	var unknown *config.UnknownKeysError
	var changed *config.ResumeChangedError
	var auth *ors.AuthError
	var rexpr *reward.ExpressionError
	var rfield *reward.FieldError
	var noModel *model.NotFoundError
	var proto *envtarget.ProtocolError
	var oeAuth *openenv.AuthError
	switch {
	case errors.As(err, &noModel): // a missing model is 3 in every command (run, eval, serve-vllm, …)
		return true
	case errors.As(err, new(*model.IncompleteError)), errors.As(err, new(*chat.MissingTokenizerError)): // so is one missing its weights or tokenizer
		return true
	case errors.As(err, new(*envtarget.NoTaskListError)): // an OpenEnv env needs tasks: or num_tasks
		return true
	case errors.As(err, &proto): // speaks neither protocol (or not the pinned one), whatever protocol says
		return true
	case errors.As(err, &oeAuth):
		return !oeAuth.TokenSent // no token at all: set the variable and run again
	case errors.As(err, &usage), errors.As(err, &field), errors.As(err, &target), errors.As(err, &split), errors.As(err, &index):
		return true
	case errors.As(err, &typ), errors.As(err, &unknown), errors.As(err, &changed):
		return true
	case errors.As(err, &rexpr), errors.As(err, &rfield):
		return true
	case errors.Is(err, worker.ErrNoCGO), worker.IsNotFound(err): // build ortrain with cgo, or the worker library
		return true
	case errors.Is(err, train.ErrRunDirInUse), errors.Is(err, train.ErrNoCheckpoint), errors.As(err, new(*runlock.HeldError)):
		return true
	case errors.As(err, &auth):
		return auth.MissingKey // no key at all: set one and run again
	}
	return false
}

// unreachableHint is the next step for a target that did not answer. Only a
// URL target can be a local server the user forgot to start; a catalog
// target is the hosted platform, whose hosts the OPENREWARD_* variables set.
func unreachableHint(target string) string {
	if strings.HasPrefix(target, "http://") || strings.HasPrefix(target, "https://") {
		return "is a server running there? For a local test env: 'ortrain env serve echo --port PORT', or use --env builtin:echo"
	}
	return "check the network and, if set, OPENREWARD_URL, OPENREWARD_API_URL and OPENREWARD_SESSION_URL"
}

// printError writes err with the hint that tells the user what to do next.
func printError(w io.Writer, cmdPath string, err error) {
	if errors.Is(err, context.Canceled) {
		fmt.Fprintln(w, "interrupted")
		return
	}
	fmt.Fprintf(w, "error: %v\n", err)
	var auth *ors.AuthError
	var unreachable *envtarget.UnreachableError
	switch {
	case errors.As(err, &unreachable):
		fmt.Fprintf(w, "hint: %s\n", unreachableHint(unreachable.Target))
	case errors.As(err, &auth):
		fmt.Fprintln(w, "hint: set OPENREWARD_API_KEY to a valid key, or pass --env http://HOST:PORT for a self-hosted server")
	case errors.Is(err, worker.ErrTimeout):
		fmt.Fprintln(w, "hint: a rank of the process group is stalled or gone; check the other ranks' logs, and raise worker.collective_timeout if their rollouts can take longer than it")
	case isUsage(err):
		fmt.Fprintf(w, "Run '%s --help' for usage.\n", cmdPath)
	}
}
