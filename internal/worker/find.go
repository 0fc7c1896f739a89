package worker

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
)

// LibraryName is the file name scripts/build-worker.sh produces.
const LibraryName = "libortrain_worker.so"

// EnvLibrary names the environment variable that points at the library.
const EnvLibrary = "ORTRAIN_WORKER_LIB"

// NotFoundError says the worker library is in none of the searched places.
type NotFoundError struct{ Searched []string }

func (e *NotFoundError) Error() string {
	return fmt.Sprintf("worker library %s not found (searched: %s); run scripts/build-worker.sh, or set %s",
		LibraryName, strings.Join(e.Searched, ", "), EnvLibrary)
}

// FindLibrary locates the worker library: explicit (from config) if set,
// else $ORTRAIN_WORKER_LIB, else next to the running binary, else
// build/worker/ in the binary's directory, the working directory or any of
// their parents (a source checkout). It returns every path it tried.
func FindLibrary(explicit string, getenv func(string) string) (path string, searched []string, err error) {
	try := func(p string) bool {
		if p == "" {
			return false
		}
		searched = append(searched, p)
		st, err := os.Stat(p)
		return err == nil && !st.IsDir()
	}
	if explicit != "" {
		if try(explicit) {
			return explicit, searched, nil
		}
		return "", searched, fmt.Errorf("worker library %s (from config) does not exist; run scripts/build-worker.sh or fix the path", explicit)
	}
	if env := getenv(EnvLibrary); env != "" {
		if try(env) {
			return env, searched, nil
		}
		return "", searched, fmt.Errorf("worker library %s (from %s) does not exist; run scripts/build-worker.sh or unset it", env, EnvLibrary)
	}
	var starts []string
	if exe, err := os.Executable(); err == nil {
		dir := filepath.Dir(exe)
		if try(filepath.Join(dir, LibraryName)) {
			return filepath.Join(dir, LibraryName), searched, nil
		}
		starts = append(starts, dir)
	}
	if wd, err := os.Getwd(); err == nil {
		starts = append(starts, wd)
	}
	for _, start := range starts {
		for dir := start; ; dir = filepath.Dir(dir) {
			p := filepath.Join(dir, "build", "worker", LibraryName)
			if try(p) {
				return p, searched, nil
			}
			if filepath.Dir(dir) == dir {
				break
			}
		}
	}
	return "", searched, &NotFoundError{Searched: searched}
}

// IsNotFound reports whether err says the library was not found.
func IsNotFound(err error) bool {
	var nf *NotFoundError
	return errors.As(err, &nf)
}
