package vllm

import (
	"testing"

	"github.com/stretchr/testify/assert"
)

func TestMinorVersion(t *testing.T) {
	cases := []struct {
		in           string
		major, minor int
		ok           bool
	}{
		{"0.14.0", 0, 14, true},
		{"0.33.0", 0, 33, true},
		{"0.15.1.dev3+gabc", 0, 15, true},
		{"0.16rc1", 0, 16, true},
		{"1.2", 1, 2, true},
		{"", 0, 0, false},
		{"dev", 0, 0, false},
		{"0.x.1", 0, 0, false},
	}
	for _, tc := range cases {
		major, minor, ok := MinorVersion(tc.in)
		assert.Equal(t, tc.ok, ok, tc.in)
		if tc.ok {
			assert.Equal(t, [2]int{tc.major, tc.minor}, [2]int{major, minor}, tc.in)
		}
	}
	assert.True(t, PauseIgnoresMode("0.14.0"))
	assert.True(t, PauseIgnoresMode("0.12.1"))
	assert.False(t, PauseIgnoresMode("0.16.0"))
	assert.False(t, PauseIgnoresMode(""))
}
