// Package verdict is the machine-readable outcome of a suite of checks
// (ortrain env check's conformance cases): each check's name, status,
// what was expected and observed, and its time, written as text for a
// person, JSON for scripts and JUnit XML for CI systems.
package verdict

import (
	"encoding/json"
	"encoding/xml"
	"fmt"
	"io"
	"strings"
	"time"
)

// Status is a check's outcome.
type Status string

// The statuses. A skipped check did not apply (the server lacks an
// optional endpoint, or an earlier check it needs failed) and is not a
// failure.
const (
	Pass Status = "pass"
	Fail Status = "fail"
	Skip Status = "skip"
)

// Check is one named check.
type Check struct {
	Name     string        `json:"name"`
	Status   Status        `json:"status"`
	Expected string        `json:"expected,omitempty"`
	Observed string        `json:"observed,omitempty"`
	Duration time.Duration `json:"-"`
}

// Verdict is a suite's checks, in the order they ran.
type Verdict struct {
	Suite    string        `json:"suite"`
	Target   string        `json:"target"`
	Checks   []Check       `json:"checks"`
	Duration time.Duration `json:"-"`
}

// Count returns the number of checks with status s.
func (v *Verdict) Count(s Status) int {
	n := 0
	for _, c := range v.Checks {
		if c.Status == s {
			n++
		}
	}
	return n
}

// Passed: no check failed.
func (v *Verdict) Passed() bool { return v.Count(Fail) == 0 }

// Summary is the one-line result: "12 passed, 1 failed, 2 skipped in 0.4s".
func (v *Verdict) Summary() string {
	return fmt.Sprintf("%d passed, %d failed, %d skipped in %s",
		v.Count(Pass), v.Count(Fail), v.Count(Skip), v.Duration.Round(time.Millisecond))
}

// WriteText writes one line per check, the failures with what was
// expected and observed, then the summary.
func (v *Verdict) WriteText(w io.Writer) error {
	var b strings.Builder
	fmt.Fprintf(&b, "%s: %s\n", v.Suite, v.Target)
	for _, c := range v.Checks {
		fmt.Fprintf(&b, "  %-4s %-40s %s\n", strings.ToUpper(string(c.Status)), c.Name, c.Duration.Round(time.Millisecond))
		if c.Status != Pass {
			if c.Expected != "" {
				fmt.Fprintf(&b, "         expected: %s\n", c.Expected)
			}
			if c.Observed != "" {
				fmt.Fprintf(&b, "         observed: %s\n", c.Observed)
			}
		}
	}
	result := "PASS"
	if !v.Passed() {
		result = "FAIL"
	}
	fmt.Fprintf(&b, "%s: %s\n", result, v.Summary())
	_, err := io.WriteString(w, b.String())
	return err
}

type jsonCheck struct {
	Check
	Seconds float64 `json:"seconds"`
}

type jsonVerdict struct {
	Suite   string      `json:"suite"`
	Target  string      `json:"target"`
	Passed  bool        `json:"passed"`
	Counts  jsonCounts  `json:"counts"`
	Seconds float64     `json:"seconds"`
	Checks  []jsonCheck `json:"checks"`
}

type jsonCounts struct {
	Pass int `json:"pass"`
	Fail int `json:"fail"`
	Skip int `json:"skip"`
}

// WriteJSON writes the verdict as one indented JSON object: suite,
// target, passed, counts, seconds and each check with its seconds.
func (v *Verdict) WriteJSON(w io.Writer) error {
	out := jsonVerdict{Suite: v.Suite, Target: v.Target, Passed: v.Passed(), Seconds: v.Duration.Seconds(),
		Counts: jsonCounts{v.Count(Pass), v.Count(Fail), v.Count(Skip)}, Checks: []jsonCheck{}}
	for _, c := range v.Checks {
		out.Checks = append(out.Checks, jsonCheck{Check: c, Seconds: c.Duration.Seconds()})
	}
	enc := json.NewEncoder(w)
	enc.SetIndent("", "  ")
	enc.SetEscapeHTML(false)
	return enc.Encode(out)
}

// The JUnit XML schema CI systems read (Jenkins, GitLab, GitHub
// reporters): one testsuite, a testcase per check, a failure or skipped
// element where it applies.
type junitSuites struct {
	XMLName xml.Name     `xml:"testsuites"`
	Suites  []junitSuite `xml:"testsuite"`
}

type junitSuite struct {
	Name     string      `xml:"name,attr"`
	Tests    int         `xml:"tests,attr"`
	Failures int         `xml:"failures,attr"`
	Skipped  int         `xml:"skipped,attr"`
	Time     string      `xml:"time,attr"`
	Cases    []junitCase `xml:"testcase"`
}

type junitCase struct {
	Name      string        `xml:"name,attr"`
	ClassName string        `xml:"classname,attr"`
	Time      string        `xml:"time,attr"`
	Failure   *junitFailure `xml:"failure,omitempty"`
	Skipped   *junitFailure `xml:"skipped,omitempty"`
}

type junitFailure struct {
	Message string `xml:"message,attr"`
	Text    string `xml:",chardata"`
}

func seconds(d time.Duration) string { return fmt.Sprintf("%.3f", d.Seconds()) }

// WriteJUnit writes the verdict as JUnit XML.
func (v *Verdict) WriteJUnit(w io.Writer) error {
	s := junitSuite{Name: v.Suite + " " + v.Target, Tests: len(v.Checks), Failures: v.Count(Fail), Skipped: v.Count(Skip), Time: seconds(v.Duration)}
	for _, c := range v.Checks {
		jc := junitCase{Name: c.Name, ClassName: v.Suite, Time: seconds(c.Duration)}
		detail := fmt.Sprintf("expected: %s\nobserved: %s", c.Expected, c.Observed)
		switch c.Status {
		case Fail:
			jc.Failure = &junitFailure{Message: c.Observed, Text: detail}
		case Skip:
			jc.Skipped = &junitFailure{Message: c.Observed}
		}
		s.Cases = append(s.Cases, jc)
	}
	if _, err := io.WriteString(w, xml.Header); err != nil {
		return err
	}
	enc := xml.NewEncoder(w)
	enc.Indent("", "  ")
	if err := enc.Encode(junitSuites{Suites: []junitSuite{s}}); err != nil {
		return err
	}
	_, err := io.WriteString(w, "\n")
	return err
}
