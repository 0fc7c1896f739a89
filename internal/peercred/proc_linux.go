package peercred

import (
	"bufio"
	"context"
	"encoding/binary"
	"encoding/hex"
	"errors"
	"fmt"
	"io/fs"
	"net/netip"
	"os"
	"slices"
	"strconv"
	"strings"
)

// Supported reports whether lookups can work here: Linux with procfs.
func Supported() bool {
	_, err := os.Stat("/proc/net/tcp")
	return err == nil
}

// maxFDs bounds the descriptors read of one process: a scan must end even
// against a process with a huge table (it is then skipped past the bound).
const maxFDs = 1 << 16

func lookupPID(ctx context.Context, server, client netip.AddrPort) (int, error) {
	if !Supported() {
		return 0, ErrUnsupported
	}
	file := "/proc/net/tcp"
	if client.Addr().Is6() {
		file = "/proc/net/tcp6"
	}
	inode, err := findInode(file, client, server)
	if err != nil {
		return 0, err
	}
	return findSocketHolder(ctx, inode)
}

// findInode is the inode of the socket whose local address is local and
// remote address is remote, from a /proc/net/tcp{,6} table.
func findInode(file string, local, remote netip.AddrPort) (uint64, error) {
	f, err := os.Open(file)
	if err != nil {
		return 0, fmt.Errorf("read sockets: %w", err)
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	sc.Scan() // the header
	for sc.Scan() {
		l, r, inode, ok := parseTCPLine(sc.Text())
		if ok && l == local && r == remote {
			if inode == 0 {
				// Only sockets no process holds (TIME_WAIT) show inode 0.
				return 0, fmt.Errorf("%w: the socket %s -> %s is closed", ErrNotFound, local, remote)
			}
			return inode, nil
		}
	}
	if err := sc.Err(); err != nil {
		return 0, fmt.Errorf("read %s: %w", file, err)
	}
	return 0, fmt.Errorf("%w: no local socket %s -> %s", ErrNotFound, local, remote)
}

// parseTCPLine reads one row of /proc/net/tcp{,6}: "sl local rem st tx:rx
// tr:when retrnsmt uid timeout inode …", addresses as hex words in host
// byte order and ports in hex.
func parseTCPLine(line string) (local, remote netip.AddrPort, inode uint64, ok bool) {
	f := strings.Fields(line)
	if len(f) < 10 {
		return local, remote, 0, false
	}
	var lok, rok bool
	local, lok = parseHexAddr(f[1])
	remote, rok = parseHexAddr(f[2])
	inode, err := strconv.ParseUint(f[9], 10, 64)
	if !lok || !rok || err != nil {
		return netip.AddrPort{}, netip.AddrPort{}, 0, false
	}
	return local, remote, inode, true
}

func parseHexAddr(s string) (netip.AddrPort, bool) {
	ipHex, portHex, ok := strings.Cut(s, ":")
	if !ok || (len(ipHex) != 8 && len(ipHex) != 32) {
		return netip.AddrPort{}, false
	}
	port, err := strconv.ParseUint(portHex, 16, 16)
	if err != nil {
		return netip.AddrPort{}, false
	}
	raw, err := hex.DecodeString(ipHex)
	if err != nil {
		return netip.AddrPort{}, false
	}
	// Each 32-bit word was printed as a native integer: put it back into
	// memory order to get the network-order bytes.
	b := make([]byte, len(raw))
	for i := 0; i < len(raw); i += 4 {
		binary.NativeEndian.PutUint32(b[i:], binary.BigEndian.Uint32(raw[i:]))
	}
	addr, _ := netip.AddrFromSlice(b)
	return netip.AddrPortFrom(addr.Unmap(), uint16(port)), true
}

// findSocketHolder is a process that holds socket inode among its open
// files. Newest pids are read first: the client is usually an agent that
// started recently. Processes that exit meanwhile or deny access are
// skipped.
func findSocketHolder(ctx context.Context, inode uint64) (int, error) {
	d, err := os.Open("/proc")
	if err != nil {
		return 0, fmt.Errorf("list processes: %w", err)
	}
	names, err := d.Readdirnames(-1)
	d.Close()
	if err != nil {
		return 0, fmt.Errorf("list processes: %w", err)
	}
	pids := make([]int, 0, len(names))
	for _, n := range names {
		if pid, err := strconv.Atoi(n); err == nil && pid > 0 {
			pids = append(pids, pid)
		}
	}
	slices.Sort(pids)
	slices.Reverse(pids)
	want := "socket:[" + strconv.FormatUint(inode, 10) + "]"
	for _, pid := range pids {
		if err := ctx.Err(); err != nil {
			return 0, fmt.Errorf("find the process holding socket %d: %w", inode, err)
		}
		if holds(pid, want) {
			return pid, nil
		}
	}
	return 0, fmt.Errorf("%w: no process holds socket %d", ErrNotFound, inode)
}

func holds(pid int, link string) bool {
	dir := "/proc/" + strconv.Itoa(pid) + "/fd/"
	d, err := os.Open(dir)
	if err != nil {
		return false // gone, or not ours to read
	}
	fds, err := d.Readdirnames(maxFDs)
	d.Close()
	if err != nil && len(fds) == 0 {
		return false
	}
	for _, fd := range fds {
		if target, err := os.Readlink(dir + fd); err == nil && target == link {
			return true
		}
	}
	return false
}

func isDescendant(pid, ancestor int) (bool, error) {
	for range maxDepth {
		if pid == ancestor {
			return true, nil
		}
		if pid <= 1 {
			return false, nil
		}
		b, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/stat")
		if err != nil {
			if errors.Is(err, fs.ErrNotExist) {
				return false, fmt.Errorf("%w: process %d exited", ErrNotFound, pid)
			}
			return false, fmt.Errorf("read the parent of %d: %w", pid, err)
		}
		ppid, err := parseStat(string(b))
		if err != nil {
			return false, fmt.Errorf("process %d: %w", pid, err)
		}
		pid = ppid
	}
	return false, fmt.Errorf("ancestry deeper than %d processes", maxDepth)
}
