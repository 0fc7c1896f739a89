package rollout

import (
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
)

func TestUnionDuration(t *testing.T) {
	t0 := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	span := func(from, to int) Span {
		return Span{Start: t0.Add(time.Duration(from) * time.Second), End: t0.Add(time.Duration(to) * time.Second)}
	}
	tests := []struct {
		name  string
		spans []Span
		want  time.Duration
	}{
		{"none", nil, 0},
		{"one", []Span{span(2, 5)}, 3 * time.Second},
		{"disjoint", []Span{span(0, 1), span(3, 5)}, 3 * time.Second},
		{"overlapping", []Span{span(0, 4), span(2, 6)}, 6 * time.Second},
		{"nested", []Span{span(0, 10), span(2, 3), span(4, 9)}, 10 * time.Second},
		{"touching", []Span{span(0, 2), span(2, 4)}, 4 * time.Second},
		{"unsorted", []Span{span(8, 9), span(0, 3), span(1, 2), span(2, 5)}, 6 * time.Second},
		{"identical", []Span{span(1, 4), span(1, 4), span(1, 4)}, 3 * time.Second},
		{"empty and inverted count nothing", []Span{span(3, 3), span(5, 4), span(0, 1)}, time.Second},
		// 8 concurrent rollouts each generating 10 s in the same 11 s: the
		// summed 80 s is busy time, the wall time is 11 s.
		{"concurrent", []Span{span(0, 10), span(1, 11), span(0, 10), span(1, 11), span(0, 10), span(1, 11), span(0, 10), span(1, 11)}, 11 * time.Second},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			assert.Equal(t, tt.want, UnionDuration(tt.spans))
		})
	}
}
