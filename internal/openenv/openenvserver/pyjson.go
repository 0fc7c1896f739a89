package openenvserver

import (
	"fmt"
	"strings"
	"unicode/utf8"
)

// pyDumps rewrites compact JSON the way Python's json.dumps writes by
// default, which is what the /mcp WebSocket sends: ", " and ": "
// separators, non-ASCII escaped as \uXXXX (surrogate pairs above the BMP).
// Clients must parse JSON anyway; this keeps the bytes familiar.
func pyDumps(compact []byte) []byte {
	var b strings.Builder
	b.Grow(len(compact) + len(compact)/8)
	inString, escaped := false, false
	s := string(compact)
	for i := 0; i < len(s); {
		c := s[i]
		if inString {
			switch {
			case escaped:
				escaped = false
			case c == '\\':
				escaped = true
			case c == '"':
				inString = false
			case c >= utf8.RuneSelf:
				r, size := utf8.DecodeRuneInString(s[i:])
				if r > 0xffff {
					r -= 0x10000
					fmt.Fprintf(&b, `\u%04x\u%04x`, 0xd800+(r>>10), 0xdc00+(r&0x3ff))
				} else {
					fmt.Fprintf(&b, `\u%04x`, r)
				}
				i += size
				continue
			}
			b.WriteByte(c)
			i++
			continue
		}
		b.WriteByte(c)
		switch c {
		case '"':
			inString = true
		case ',', ':':
			b.WriteByte(' ')
		}
		i++
	}
	return []byte(b.String())
}
