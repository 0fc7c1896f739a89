//go:build cgo

package worker

/*
#cgo LDFLAGS: -ldl
#include <stdlib.h>
#include "dlapi.h"
*/
import "C"

import (
	"encoding/json"
	"fmt"
	"runtime"
	"sync"
	"unsafe"
)

const errLen = 2048

// Library is an opened worker library. It stays loaded for the life of the
// process: unloading libtorch is not safe, so Close only forbids further use.
type Library struct {
	api  *C.ort_api
	info Info
	// Every call into the library runs on one locked OS thread (see run):
	// libgomp keeps an OpenMP thread team per calling thread, and CUDA keeps
	// the current device per thread, so hopping threads would spawn teams
	// and lose device state.
	mu     sync.RWMutex
	closed bool
	calls  chan func()
	done   chan struct{}
}

// run executes f on the library's thread and waits for it.
func (l *Library) run(f func() C.int) (C.int, error) {
	l.mu.RLock()
	defer l.mu.RUnlock()
	if l.closed {
		return 0, ErrClosed
	}
	var rc C.int
	finished := make(chan struct{})
	l.calls <- func() { rc = f(); close(finished) }
	<-finished
	return rc, nil
}

func (l *Library) serve() {
	runtime.LockOSThread() // never unlocked: the thread exits with the goroutine
	defer close(l.done)
	for f := range l.calls {
		f()
	}
}

// errBuf is a C buffer for one call's error message.
type errBuf struct{ p *C.char }

func newErrBuf() errBuf { return errBuf{(*C.char)(C.calloc(errLen, 1))} }
func (e errBuf) free()  { C.free(unsafe.Pointer(e.p)) }
func (e errBuf) err(rc C.int, what string) error {
	switch rc {
	case C.ORT_OK:
		return nil
	case C.ORT_ERR_TIMEOUT:
		return &TimeoutError{Op: what, Detail: C.GoString(e.p)}
	}
	return fmt.Errorf("%s: %s", what, C.GoString(e.p))
}

// Open loads the library at path, resolves every symbol and checks the ABI
// version. Find the path with FindLibrary.
func Open(path string) (*Library, error) {
	cpath := C.CString(path)
	defer C.free(unsafe.Pointer(cpath))
	api := (*C.ort_api)(C.calloc(1, C.size_t(unsafe.Sizeof(C.ort_api{}))))
	eb := newErrBuf()
	defer eb.free()
	if rc := C.ort_api_open(cpath, api, eb.p, errLen); rc != 0 {
		C.free(unsafe.Pointer(api))
		return nil, fmt.Errorf("open worker library %s: %s; run scripts/build-worker.sh", path, C.GoString(eb.p))
	}
	if v := int(C.ort_call_abi_version(api)); v != ABIVersion {
		return nil, fmt.Errorf("worker library %s speaks ABI %d, this binary needs %d; rebuild it with scripts/build-worker.sh", path, v, ABIVersion)
	}
	buf := (*C.char)(C.calloc(4096, 1))
	defer C.free(unsafe.Pointer(buf))
	if err := eb.err(C.ort_call_info(api, buf, 4096, eb.p, errLen), "worker info"); err != nil {
		return nil, err
	}
	var raw struct {
		Libtorch    string      `json:"libtorch"`
		CUDADevices int         `json:"cuda_devices"`
		Threads     int         `json:"threads"`
		CXX11ABI    int         `json:"cxx11_abi"`
		C10D        []string    `json:"c10d"`
		OneDNN      *OneDNNInfo `json:"onednn"`
		Store       *StoreInfo  `json:"tcpstore"`
	}
	if err := json.Unmarshal([]byte(C.GoString(buf)), &raw); err != nil {
		return nil, fmt.Errorf("worker library %s: bad info JSON: %w", path, err)
	}
	l := &Library{api: api, calls: make(chan func()), done: make(chan struct{}), info: Info{
		Path: path, ABIVersion: ABIVersion, LibtorchVersion: raw.Libtorch,
		CUDADevices: raw.CUDADevices, Threads: raw.Threads, CXX11ABI: raw.CXX11ABI != 0, DistBackends: raw.C10D,
		OneDNN: raw.OneDNN, Store: raw.Store,
	}}
	go l.serve()
	return l, nil
}

// Info reports the library's path, libtorch version and devices.
func (l *Library) Info() Info { return l.info }

// Close stops the library's thread and forbids further use, by it and by
// its models: close the models first, or their memory is not freed. The
// shared library itself stays mapped: libtorch registers global state that
// does not survive dlclose.
func (l *Library) Close() error {
	l.mu.Lock()
	defer l.mu.Unlock()
	if !l.closed {
		l.closed = true
		close(l.calls)
		<-l.done
	}
	return nil
}
