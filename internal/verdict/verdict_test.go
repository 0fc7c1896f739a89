package verdict

import (
	"bytes"
	"encoding/json"
	"encoding/xml"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

func sample() *Verdict {
	return &Verdict{Suite: "env check (ORS)", Target: "http://127.0.0.1:1", Duration: 1500 * time.Millisecond, Checks: []Check{
		{Name: "ors/health", Status: Pass, Expected: "200 {\"status\":\"ok\"}", Observed: "200", Duration: 2 * time.Millisecond},
		{Name: "ors/task", Status: Fail, Expected: "env_name in the reply", Observed: "no \"env_name\" key <&>", Duration: 3 * time.Millisecond},
		{Name: "ors/ping", Status: Skip, Observed: "needs a session (ors/create failed)"},
	}}
}

func TestCountsAndSummary(t *testing.T) {
	v := sample()
	assert.Equal(t, 1, v.Count(Pass))
	assert.Equal(t, 1, v.Count(Fail))
	assert.Equal(t, 1, v.Count(Skip))
	assert.False(t, v.Passed())
	assert.Equal(t, "1 passed, 1 failed, 1 skipped in 1.5s", v.Summary())
	v.Checks[1].Status = Pass
	assert.True(t, v.Passed(), "skips are not failures")
	assert.True(t, (&Verdict{}).Passed(), "no check, nothing failed")
}

func TestWriteText(t *testing.T) {
	var b bytes.Buffer
	require.NoError(t, sample().WriteText(&b))
	out := b.String()
	assert.Contains(t, out, "PASS ors/health")
	assert.Contains(t, out, "FAIL ors/task")
	assert.Contains(t, out, "expected: env_name in the reply")
	assert.Contains(t, out, "observed: no \"env_name\" key <&>")
	assert.Contains(t, out, "SKIP ors/ping")
	assert.Contains(t, out, "FAIL: 1 passed, 1 failed, 1 skipped")
	assert.NotContains(t, out, "expected: 200", "a passing check prints one line")
}

func TestWriteJSON(t *testing.T) {
	var b bytes.Buffer
	require.NoError(t, sample().WriteJSON(&b))
	var got struct {
		Suite, Target string
		Passed        bool
		Counts        map[string]int
		Seconds       float64
		Checks        []struct {
			Name, Status, Expected, Observed string
			Seconds                          float64
		}
	}
	require.NoError(t, json.Unmarshal(b.Bytes(), &got), b.String())
	assert.Equal(t, "env check (ORS)", got.Suite)
	assert.False(t, got.Passed)
	assert.Equal(t, map[string]int{"pass": 1, "fail": 1, "skip": 1}, got.Counts)
	assert.InDelta(t, 1.5, got.Seconds, 1e-9)
	require.Len(t, got.Checks, 3)
	assert.Equal(t, "fail", got.Checks[1].Status)
	assert.Equal(t, `no "env_name" key <&>`, got.Checks[1].Observed)
	assert.InDelta(t, 0.003, got.Checks[1].Seconds, 1e-9)
	assert.Contains(t, b.String(), "<&>", "not HTML-escaped")

	b.Reset()
	require.NoError(t, (&Verdict{Suite: "s"}).WriteJSON(&b))
	assert.Contains(t, b.String(), `"checks": []`, "an empty suite is an empty list, not null")
}

func TestWriteJUnit(t *testing.T) {
	var b bytes.Buffer
	require.NoError(t, sample().WriteJUnit(&b))
	var got struct {
		XMLName xml.Name `xml:"testsuites"`
		Suites  []struct {
			Name     string `xml:"name,attr"`
			Tests    int    `xml:"tests,attr"`
			Failures int    `xml:"failures,attr"`
			Skipped  int    `xml:"skipped,attr"`
			Time     string `xml:"time,attr"`
			Cases    []struct {
				Name    string `xml:"name,attr"`
				Time    string `xml:"time,attr"`
				Failure *struct {
					Message string `xml:"message,attr"`
					Text    string `xml:",chardata"`
				} `xml:"failure"`
				Skipped *struct{} `xml:"skipped"`
			} `xml:"testcase"`
		} `xml:"testsuite"`
	}
	require.NoError(t, xml.Unmarshal(b.Bytes(), &got), b.String())
	require.Len(t, got.Suites, 1)
	s := got.Suites[0]
	assert.Equal(t, 3, s.Tests)
	assert.Equal(t, 1, s.Failures)
	assert.Equal(t, 1, s.Skipped)
	assert.Equal(t, "1.500", s.Time)
	require.Len(t, s.Cases, 3)
	assert.Nil(t, s.Cases[0].Failure)
	require.NotNil(t, s.Cases[1].Failure)
	assert.Equal(t, `no "env_name" key <&>`, s.Cases[1].Failure.Message)
	assert.Contains(t, s.Cases[1].Failure.Text, "expected: env_name in the reply")
	assert.NotNil(t, s.Cases[2].Skipped)
	assert.Equal(t, "0.003", s.Cases[1].Time)
}
