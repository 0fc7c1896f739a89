package rollout

import (
	"slices"
	"time"
)

// UnionDuration is the measure of the union of the spans: the wall time
// during which at least one span was open. Overlapping and touching spans
// count once; empty or inverted spans count nothing.
func UnionDuration(spans []Span) time.Duration {
	sorted := make([]Span, 0, len(spans))
	for _, s := range spans {
		if s.End.After(s.Start) {
			sorted = append(sorted, s)
		}
	}
	slices.SortFunc(sorted, func(a, b Span) int { return a.Start.Compare(b.Start) })
	var total time.Duration
	var cur Span
	for i, s := range sorted {
		switch {
		case i == 0:
			cur = s
		case !s.Start.After(cur.End):
			if s.End.After(cur.End) {
				cur.End = s.End
			}
		default:
			total += cur.End.Sub(cur.Start)
			cur = s
		}
	}
	if len(sorted) > 0 {
		total += cur.End.Sub(cur.Start)
	}
	return total
}
