# ortrain — the two newcomer commands are `make demo` and `make test`.
GO      ?= go
BIN     := bin/ortrain
VERSION ?= $(shell git describe --tags --always --dirty 2>/dev/null || echo dev)
LDFLAGS := -X github.com/ortrain/ortrain/internal/cli.version=$(VERSION)

.PHONY: build test test-tools bench-tools test-go lint install setup worker demo bench clean

# build: ortrain and what its commands need (libtorch and the worker, as
# setup installs and builds them; both are incremental, so a second build
# only relinks what changed).
build: setup
	$(GO) build -ldflags "$(LDFLAGS)" -o $(BIN) ./cmd/ortrain

# setup installs libtorch (Debian libtorch-dev on CPU machines, or the
# libtorch of a pip torch where one is importable) and what building the
# worker needs, nothing else, then builds the worker. Tools only the tests
# or the benchmarks use are installed by those targets (test-tools,
# bench-tools).
setup:
	scripts/install-libtorch.sh
	$(MAKE) --no-print-directory worker

worker:
	scripts/build-worker.sh

# test-tools: what only the tests need (headless Chromium for the report test).
test-tools:
	scripts/install-test-tools.sh

# bench-tools: what only the benchmarks need (PyTorch, python3-torch on
# Debian, for the PyTorch-eager and KV-cache-loop baselines).
bench-tools:
	scripts/install-bench-tools.sh

# test: everything that needs no GPU and no network, race detector on.
test: setup test-tools lint test-go

# GOTESTFLAGS adds go test flags: CI's main lane skips the mission's
# learning test, which its second lane runs on the libtorch users have.
GOTESTFLAGS ?=
test-go:
	$(GO) test -race -count=1 -timeout 45m $(GOTESTFLAGS) ./...

lint:
	@out=$$(gofmt -l cmd internal); if [ -n "$$out" ]; then echo "gofmt needed:"; echo "$$out"; exit 1; fi
	$(GO) vet ./...

# install: ortrain and its worker library side by side in $(PREFIX)/bin
# (the binary finds the worker next to itself; the worker finds libtorch by
# the rpath it was built with), as the container recipe (Dockerfile) does.
# scripts/check-install runs it into a fresh prefix and trains from there.
PREFIX ?= /usr/local
install: build
	install -d $(PREFIX)/bin
	install -m 0755 $(BIN) $(PREFIX)/bin/ortrain
	install -m 0644 build/worker/libortrain_worker.so $(PREFIX)/bin/libortrain_worker.so

# demo: the mission at CPU scale (scripts/demo, configs/lockbox.yaml):
# demonstrations from the built-in lockbox env, `ortrain sft` on them, then
# GRPO with tools rendered and parsed, each phase timed. The 10-second letters
# quickstart is `bin/ortrain run` (the embedded defaults).
demo: setup build
	scripts/demo

# bench: the Go micro-benchmarks (ORS round trips, tokenizer, rendering,
# rewards, the worker's step, sampling and all-reduce), then scripts/bench-step:
# every issue-13 ratio (training step vs PyTorch eager, sampling vs a PyTorch
# KV-cache loop, continuous vs static batching, async vs sync) measured
# side by side in alternating rounds, with per-phase step times.
bench: setup bench-tools
	$(GO) test -run '^$$' -bench . -skip 'MultiTurnEcho|AsyncOverlap' ./...
	scripts/bench-step
	scripts/bench-ddp

clean:
	rm -rf bin build
