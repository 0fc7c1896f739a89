package peercred

import (
	"strconv"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

func TestParseStat(t *testing.T) {
	cases := []struct {
		name, stat string
		ppid       int
		bad        bool
	}{
		{name: "plain", stat: "42 (bash) S 7 42 42 0 -1 4194560", ppid: 7},
		{name: "spaces in comm", stat: "42 (my agent) R 9 1 1", ppid: 9},
		{name: "parentheses in comm", stat: "42 (a) S 1 (b)) S 13 2 2", ppid: 13},
		{name: "comm is only ')'", stat: "42 ()) S 5 1", ppid: 5},
		{name: "comm mimics stat", stat: "42 (x) S 1 1) Z 321 0", ppid: 321},
		{name: "no parenthesis", stat: "42 bash S 7", bad: true},
		{name: "truncated", stat: "42 (bash) S", bad: true},
		{name: "ppid not a number", stat: "42 (bash) S x7", bad: true},
		{name: "negative ppid", stat: "42 (bash) S -3", bad: true},
		{name: "empty", stat: "", bad: true},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			ppid, err := parseStat(c.stat)
			if c.bad {
				require.Error(t, err)
				return
			}
			require.NoError(t, err)
			assert.Equal(t, c.ppid, ppid)
		})
	}
}

// FuzzParseStat: whatever a process names itself, the parent pid written
// after its name is the one read.
func FuzzParseStat(f *testing.F) {
	for _, s := range []string{"bash", "my agent", ") S 1 (", "((", "x) R 99"} {
		f.Add(s, 1234)
	}
	f.Fuzz(func(t *testing.T, comm string, ppid int) {
		if ppid < 0 || strings.ContainsAny(comm, "\x00\n") {
			t.Skip()
		}
		stat := "77 (" + comm + ") S " + strconv.Itoa(ppid) + " 77 77 0 -1"
		got, err := parseStat(stat)
		require.NoError(t, err)
		assert.Equal(t, ppid, got)
	})
}

func TestIsDescendantRejectsNonPositive(t *testing.T) {
	for _, c := range [][2]int{{0, 1}, {1, 0}, {-1, 5}} {
		_, err := IsDescendant(c[0], c[1])
		assert.Error(t, err, "%v", c)
	}
}

func TestOwnerBindOnce(t *testing.T) {
	o := NewOwner()
	require.Error(t, o.Bind(0))
	require.NoError(t, o.Bind(10))
	require.Error(t, o.Bind(11))
}
