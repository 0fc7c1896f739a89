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

// NotFoundError says the worker library is in none of the searched places,
// or not at the path given (From names where: the config, or EnvLibrary).
type NotFoundError struct {
	Searched []string
	From     string
}

func (e *NotFoundError) Error() string {
	switch e.From {
	case "config":
		return fmt.Sprintf("worker library %s (from config) does not exist; run scripts/build-worker.sh or fix the path", e.Searched[0])
	case EnvLibrary:
		return fmt.Sprintf("worker library %s (from %s) does not exist; run scripts/build-worker.sh or unset it", e.Searched[0], EnvLibrary)
	}
	return fmt.Sprintf("worker library %s not found (searched: %s); run scripts/build-worker.sh, or set %s",
		LibraryName, strings.Join(e.Searched, ", "), EnvLibrary)
}

// FindLibrary locates the worker library: explicit (from config) if set,
// else $ORTRAIN_WORKER_LIB, else next to the running binary, else
// build/worker/ in the binary's directory, the working directory or any of
// their parents (a source checkout). It returns every path it tried.
func FindLibrary(explicit string, getenv func(string) string) (path string, searched []string, err error) {
	if !CGOEnabled { // no library could be opened: say so, not "build the worker"
		return "", nil, &NoCGOError{Op: "find the worker library"}
	}
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
		return "", searched, &NotFoundError{Searched: searched, From: "config"}
	}
	if env := getenv(EnvLibrary); env != "" {
		if try(env) {
			return env, searched, nil
		}
		return "", searched, &NotFoundError{Searched: searched, From: EnvLibrary}
	}
	var exeDir, wd string
	if exe, err := os.Executable(); err == nil {
		exeDir = filepath.Dir(exe)
	}
	if d, err := os.Getwd(); err == nil {
		wd = d
	}
	for _, p := range candidates(exeDir, wd) {
		if try(p) {
			return p, searched, nil
		}
	}
	return "", searched, &NotFoundError{Searched: searched}
}

// candidates lists where the library may sit, in search order and each
// place once: next to the binary, then build/worker/ in the binary's
// directory and its parents, then in the working directory and its parents
// (the two walks usually share their upper directories). An empty start is
// skipped.
func candidates(exeDir, wd string) []string {
	var out []string
	seen := map[string]bool{}
	add := func(p string) {
		if !seen[p] {
			seen[p] = true
			out = append(out, p)
		}
	}
	if exeDir != "" {
		add(filepath.Join(exeDir, LibraryName))
	}
	for _, start := range []string{exeDir, wd} {
		if start == "" {
			continue
		}
		for dir := filepath.Clean(start); ; dir = filepath.Dir(dir) {
			add(filepath.Join(dir, "build", "worker", LibraryName))
			if filepath.Dir(dir) == dir {
				break
			}
		}
	}
	return out
}

// IsNotFound reports whether err says the library was not found.
func IsNotFound(err error) bool {
	var nf *NotFoundError
	return errors.As(err, &nf)
}
