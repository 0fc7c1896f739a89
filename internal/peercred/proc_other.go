//go:build !linux

package peercred

import (
	"context"
	"net/netip"
)

// Supported reports whether lookups can work here: never off Linux.
func Supported() bool { return false }

func lookupPID(context.Context, netip.AddrPort, netip.AddrPort) (int, error) {
	return 0, ErrUnsupported
}

func isDescendant(int, int) (bool, error) { return false, ErrUnsupported }
