//go:build cgo

package worker

/*
#include <stdlib.h>
#include "csrc/worker_abi.h"
*/
import "C"

import (
	"context"
	"sync"
	"sync/atomic"
	"unsafe"
)

// arena owns C allocations for one call. Go memory is never handed to C
// inside structs (cgo forbids Go pointers in memory passed to C), so every
// array a call needs is copied into C memory here and freed afterwards.
type arena struct{ ptrs []unsafe.Pointer }

func (a *arena) alloc(n int) unsafe.Pointer {
	p := C.calloc(C.size_t(max(n, 1)), 1)
	if p == nil {
		panic("worker: C allocation failed")
	}
	a.ptrs = append(a.ptrs, p)
	return p
}

func (a *arena) free() {
	for _, p := range a.ptrs {
		C.free(p)
	}
	a.ptrs = nil
}

// carray allocates n elements of T in C memory and returns the pointer and a
// Go view of it.
func carray[T any](a *arena, n int) (unsafe.Pointer, []T) {
	var zero T
	p := a.alloc(n * int(unsafe.Sizeof(zero)))
	return p, unsafe.Slice((*T)(p), max(n, 1))[:n]
}

// ccopy copies src into C memory.
func ccopy[T any](a *arena, src []T) unsafe.Pointer {
	p, dst := carray[T](a, len(src))
	copy(dst, src)
	return p
}

func (a *arena) cstring(s string) *C.char {
	p, dst := carray[byte](a, len(s)+1)
	copy(dst, s)
	return (*C.char)(p)
}

// cancelFlag is an int32 in C memory that the C++ side polls (per layer and
// per decoding step); it is set when ctx is done.
type cancelFlag struct {
	p    *C.int32_t
	done chan struct{}
	wg   sync.WaitGroup
}

func watchCancel(ctx context.Context) *cancelFlag {
	f := &cancelFlag{p: (*C.int32_t)(C.calloc(1, 4)), done: make(chan struct{})}
	f.wg.Add(1)
	go func() {
		defer f.wg.Done()
		select {
		case <-ctx.Done():
			atomic.StoreInt32((*int32)(unsafe.Pointer(f.p)), 1)
		case <-f.done:
		}
	}()
	return f
}

// stop ends the watcher and frees the flag.
func (f *cancelFlag) stop() {
	close(f.done)
	f.wg.Wait()
	C.free(unsafe.Pointer(f.p))
}
