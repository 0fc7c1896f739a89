package launch

import (
	"fmt"
	"strconv"
	"strings"
)

// maxHosts bounds an expansion (a typo like n[1-999999999] must not
// exhaust memory).
const maxHosts = 1 << 16

// ExpandNodeList expands a SLURM host list ("node[01-03,07],gpu5",
// "rack[1-2]-n[1-2]") into host names, in order, keeping zero padding.
func ExpandNodeList(list string) ([]string, error) {
	list = strings.TrimSpace(list)
	if list == "" {
		return nil, fmt.Errorf("empty host list")
	}
	var out []string
	for _, item := range splitTop(list) {
		if item == "" {
			return nil, fmt.Errorf("empty host name in %q", list)
		}
		hosts, err := expandItem(item, maxHosts-len(out))
		if err != nil {
			return nil, fmt.Errorf("host list %q: %w", list, err)
		}
		out = append(out, hosts...)
	}
	return out, nil
}

// splitTop splits on the commas outside brackets.
func splitTop(s string) []string {
	var out []string
	depth, start := 0, 0
	for i, c := range s {
		switch c {
		case '[':
			depth++
		case ']':
			depth--
		case ',':
			if depth == 0 {
				out = append(out, s[start:i])
				start = i + 1
			}
		}
	}
	return append(out, s[start:])
}

// expandItem expands one name with any number of bracket groups.
func expandItem(item string, room int) ([]string, error) {
	open := strings.IndexByte(item, '[')
	if open < 0 {
		if strings.ContainsAny(item, "]") {
			return nil, fmt.Errorf("unbalanced ] in %q", item)
		}
		return []string{item}, nil
	}
	end := strings.IndexByte(item[open:], ']')
	if end < 0 {
		return nil, fmt.Errorf("unclosed [ in %q", item)
	}
	end += open
	prefix, ranges, rest := item[:open], item[open+1:end], item[end+1:]
	if strings.ContainsAny(prefix, "]") || strings.ContainsAny(ranges, "[") {
		return nil, fmt.Errorf("nested or unbalanced brackets in %q", item)
	}
	tails, err := expandItem(rest, room)
	if err != nil {
		return nil, err
	}
	var out []string
	for _, r := range strings.Split(ranges, ",") {
		lo, hi, width, err := parseRange(r)
		if err != nil {
			return nil, fmt.Errorf("range %q in %q: %w", r, item, err)
		}
		for n := lo; n <= hi; n++ {
			for _, t := range tails {
				if len(out) >= room {
					return nil, fmt.Errorf("expands to more than %d hosts", maxHosts)
				}
				out = append(out, fmt.Sprintf("%s%0*d%s", prefix, width, n, t))
			}
		}
	}
	return out, nil
}

// parseRange reads "7", "01-04": bounds and the zero-padded width.
func parseRange(r string) (lo, hi, width int, err error) {
	a, b, isRange := strings.Cut(r, "-")
	if lo, err = digits(a); err != nil {
		return 0, 0, 0, err
	}
	hi, width = lo, len(a)
	if isRange {
		if hi, err = digits(b); err != nil {
			return 0, 0, 0, err
		}
		if hi < lo {
			return 0, 0, 0, fmt.Errorf("%d is below %d", hi, lo)
		}
	}
	return lo, hi, width, nil
}

func digits(s string) (int, error) {
	if s == "" || len(s) > 9 || strings.TrimLeft(s, "0123456789") != "" {
		return 0, fmt.Errorf("%q is not a number", s)
	}
	return strconv.Atoi(s)
}
