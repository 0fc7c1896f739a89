// Package worker loads ortrain's libtorch worker (a C++ shared library) at
// run time through dlopen and wraps its small C ABI (csrc/worker_abi.h) in Go
// types. It is the only package that uses cgo; no C type leaves it. Building
// it needs no libtorch: the library is found and opened only when a command
// trains or samples.
//
// The files that call C build only with cgo (//go:build cgo). Without cgo
// (CGO_ENABLED=0) the package keeps its options, statistics, errors and pure
// functions, and nocgo.go stands in for the handles: Open, and every call
// on a Library, Model, Decoder or Group, returns a *NoCGOError, which
// matches ErrNoCGO.
package worker
