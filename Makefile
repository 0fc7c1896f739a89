# ortrain — build, test, lint, install.
GO      ?= go
BIN     := bin/ortrain
VERSION ?= $(shell git describe --tags --always --dirty 2>/dev/null || echo dev)
LDFLAGS := -X github.com/ortrain/ortrain/internal/cli.version=$(VERSION)

.PHONY: build test lint install clean

build:
	$(GO) build -ldflags "$(LDFLAGS)" -o $(BIN) ./cmd/ortrain

# test runs every test that needs no GPU and no network, race detector on.
test: lint
	$(GO) test -race -count=1 ./...

lint:
	@out=$$(gofmt -l cmd internal); if [ -n "$$out" ]; then echo "gofmt needed:"; echo "$$out"; exit 1; fi
	$(GO) vet ./...

install:
	$(GO) install -ldflags "$(LDFLAGS)" ./cmd/ortrain

clean:
	rm -rf bin build
