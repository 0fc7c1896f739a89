package openenvserver_test

import (
	"fmt"
	"os"
	"runtime"
	"runtime/pprof"
	"testing"
	"time"
)

// TestMain fails the package if goroutines outlive its tests: every
// socket's reader and keepalive, and every kit handler, must have stopped.
func TestMain(m *testing.M) {
	base := runtime.NumGoroutine()
	code := m.Run()
	deadline := time.Now().Add(5 * time.Second)
	for runtime.NumGoroutine() > base && time.Now().Before(deadline) {
		time.Sleep(10 * time.Millisecond)
	}
	if n := runtime.NumGoroutine(); code == 0 && n > base {
		fmt.Fprintf(os.Stderr, "leaked goroutines: %d, started with %d\n", n, base)
		_ = pprof.Lookup("goroutine").WriteTo(os.Stderr, 1)
		code = 1
	}
	os.Exit(code)
}
