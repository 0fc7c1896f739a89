// Package testclients finds the real client libraries and agent CLIs that
// tests run against ortrain's servers: the npm packages pinned in
// scripts/test-clients (installed by scripts/install-test-tools.sh into
// build/test-clients, so nothing is downloaded at test time). Only tests
// import it.
package testclients

import (
	"os"
	"os/exec"
	"path/filepath"
	"testing"
)

// Node is a nodejs with the pinned npm packages beside it.
type Node struct {
	// Bin is the node executable.
	Bin string
	// Modules is the node_modules directory (NODE_PATH for require()).
	Modules string
}

// Env is os.Environ with NODE_PATH set to the modules, for a node process
// that require()s the pinned packages.
func (n Node) Env(extra ...string) []string {
	return append(append(os.Environ(), "NODE_PATH="+n.Modules), extra...)
}

// Package is the directory of one installed package (e.g. "@openai/codex").
func (n Node) Package(name string) string { return filepath.Join(n.Modules, name) }

// RequireNode returns node and the installed packages, each of pkgs
// present. Where they are missing the test skips with what to run, or
// fails when CI or ORTRAIN_REQUIRE_TEST_CLIENTS is set (CI installs them).
func RequireNode(t testing.TB, pkgs ...string) Node {
	t.Helper()
	bin, err := exec.LookPath("node")
	if err != nil {
		missing(t, "nodejs is not installed (Debian: nodejs)")
		return Node{}
	}
	root, ok := repoRoot()
	if !ok {
		missing(t, "cannot find the repository root (go.mod) above the test's directory")
		return Node{}
	}
	n := Node{Bin: bin, Modules: filepath.Join(root, "build", "test-clients", "node_modules")}
	for _, p := range pkgs {
		if _, err := os.Stat(filepath.Join(n.Package(p), "package.json")); err != nil {
			missing(t, "the npm package "+p+" is not installed in build/test-clients: run scripts/install-test-tools.sh")
			return Node{}
		}
	}
	return n
}

func missing(t testing.TB, why string) {
	t.Helper()
	if os.Getenv("CI") != "" || os.Getenv("ORTRAIN_REQUIRE_TEST_CLIENTS") != "" {
		t.Fatalf("%s (CI or ORTRAIN_REQUIRE_TEST_CLIENTS is set: the real clients must run)", why)
	}
	t.Skip(why)
}

// repoRoot is the nearest directory above the working directory holding
// go.mod.
func repoRoot() (string, bool) {
	dir, err := os.Getwd()
	if err != nil {
		return "", false
	}
	for {
		if _, err := os.Stat(filepath.Join(dir, "go.mod")); err == nil {
			return dir, true
		}
		parent := filepath.Dir(dir)
		if parent == dir {
			return "", false
		}
		dir = parent
	}
}
