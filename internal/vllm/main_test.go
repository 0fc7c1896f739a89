package vllm_test

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/ortrain/ortrain/internal/model"
	"github.com/ortrain/ortrain/internal/worker"
)

// binaries built once for every test of the package.
var (
	binDir       string
	toyServer    string // testdata/toyserver: engineserver.Server over a pure-Go sampler
	ortrainBin   string // the real ortrain, for `ortrain serve-engine`
	ortrainErr   error
	tinyModelDir string
)

func TestMain(m *testing.M) {
	code := run(m)
	os.Exit(code)
}

func run(m *testing.M) int {
	var err error
	binDir, err = os.MkdirTemp("", "ortrain-vllm-test-")
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	defer os.RemoveAll(binDir)
	toyServer = filepath.Join(binDir, "toyserver")
	if out, err := exec.Command("go", "build", "-o", toyServer, "./testdata/toyserver").CombinedOutput(); err != nil {
		fmt.Fprintf(os.Stderr, "build toyserver: %v\n%s", err, out)
		return 1
	}
	ortrainBin = filepath.Join(binDir, "ortrain")
	if out, err := exec.Command("go", "build", "-o", ortrainBin, "../../cmd/ortrain").CombinedOutput(); err != nil {
		ortrainErr = fmt.Errorf("build ortrain: %v\n%s", err, out)
	}
	tinyModelDir = filepath.Join(binDir, "tiny")
	p, _ := model.PresetByName("tiny")
	if err := model.InitOverwrite(tinyModelDir, p, 1); err != nil {
		fmt.Fprintln(os.Stderr, "init tiny model:", err)
		return 1
	}
	code := m.Run()
	if code == 0 {
		if err := checkNoLeaks(); err != nil {
			fmt.Fprintln(os.Stderr, "leak check:", err)
			return 1
		}
	}
	return code
}

// checkNoLeaks fails when a child process of this test binary is still
// alive or a supervisor goroutine is still running.
func checkNoLeaks() error {
	deadline := time.Now().Add(5 * time.Second)
	for {
		kids := childPIDs(os.Getpid())
		stacks := supervisorGoroutines()
		if len(kids) == 0 && stacks == "" {
			return nil
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("child processes %v still alive; goroutines:\n%s", kids, stacks)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

func childPIDs(parent int) []int {
	var out []int
	entries, _ := os.ReadDir("/proc")
	for _, e := range entries {
		pid, err := strconv.Atoi(e.Name())
		if err != nil {
			continue
		}
		stat, err := os.ReadFile(filepath.Join("/proc", e.Name(), "stat"))
		if err != nil {
			continue
		}
		// Fields after the parenthesised command: state, ppid, ...
		rest := string(stat[strings.LastIndexByte(string(stat), ')')+2:])
		f := strings.Fields(rest)
		if len(f) > 1 && f[1] == strconv.Itoa(parent) && f[0] != "Z" {
			out = append(out, pid)
		}
	}
	return out
}

func supervisorGoroutines() string {
	buf := make([]byte, 1<<20)
	buf = buf[:runtime.Stack(buf, true)]
	var out []string
	for _, g := range strings.Split(string(buf), "\n\n") {
		if strings.Contains(g, "internal/vllm.(*Supervisor)") || strings.Contains(g, "internal/childproc.Start") {
			out = append(out, g)
		}
	}
	return strings.Join(out, "\n\n")
}

// childKind is a program the supervisor tests run as a replica.
type childKind struct {
	name    string
	command []string
	model   string
}

// childKinds are the toy server (always) and `ortrain serve-engine` over
// the real worker (when the worker library is built; required in CI).
func childKinds(t *testing.T) []childKind {
	kinds := []childKind{{name: "toyserver", command: []string{toyServer}, model: "toy-model"}}
	if ok := requireWorker(t); ok {
		kinds = append(kinds, childKind{name: "serve-engine", command: []string{ortrainBin, "serve-engine", "--threads", "1"}, model: tinyModelDir})
	}
	return kinds
}

// requireWorker reports whether serve-engine can really generate here: the
// ortrain binary built and the worker library exists. Without the library
// the caller skips, unless ORTRAIN_REQUIRE_WORKER is set (CI): then it fails.
func requireWorker(t *testing.T) bool {
	t.Helper()
	if ortrainErr != nil {
		t.Fatalf("%v", ortrainErr)
	}
	if _, searched, err := worker.FindLibrary("", os.Getenv); err != nil {
		if os.Getenv("ORTRAIN_REQUIRE_WORKER") != "" {
			t.Fatalf("ORTRAIN_REQUIRE_WORKER is set but the worker library is missing: %v (searched %v)", err, searched)
		}
		t.Logf("serve-engine child skipped: worker library not built (run scripts/build-worker.sh): %v", err)
		return false
	}
	return true
}

func testContext(t *testing.T, d time.Duration) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), d)
	t.Cleanup(cancel)
	return ctx
}
