package curriculum

import (
	"cmp"
	"encoding/json"
	"fmt"
	"math"
	"os"
	"path/filepath"
	"slices"
	"strings"
)

// Config is the difficulty curriculum (the config's `curriculum:`): every
// task's pass rate over its last Window scored rollouts is tracked; with
// Enabled, a task whose rate is at or below MinPassRate (too hard) or at
// or above MaxPassRate (too easy) is skipped when drawn, unless a draw
// below RevisitProbability keeps it (prime-rl's easy/hard filtering;
// verl's curriculum samplers). Tasks not tried yet are always in band.
type Config struct {
	Enabled bool `json:"enabled"`
	// PassThreshold: a rollout passes when its reward is at least this.
	PassThreshold      float64 `json:"pass_threshold"`
	MinPassRate        float64 `json:"min_pass_rate"`
	MaxPassRate        float64 `json:"max_pass_rate"`
	RevisitProbability float64 `json:"revisit_probability"`
	Window             int     `json:"window"`
}

// Defaults: a task is out of band once all of its last 16 rollouts passed
// or all failed, and comes back one draw in ten.
const (
	DefaultPassThreshold      = 1.0
	DefaultMinPassRate        = 0.0
	DefaultMaxPassRate        = 1.0
	DefaultRevisitProbability = 0.1
	DefaultWindow             = 16
)

// DefaultConfig is the curriculum's settings before a config changes them.
func DefaultConfig() Config {
	return Config{PassThreshold: DefaultPassThreshold, MinPassRate: DefaultMinPassRate, MaxPassRate: DefaultMaxPassRate,
		RevisitProbability: DefaultRevisitProbability, Window: DefaultWindow}
}

func (c Config) withDefaults() Config {
	if c.Window <= 0 {
		d := DefaultConfig()
		d.Enabled = c.Enabled
		return d
	}
	return c
}

// Validate names the first field out of range.
func (c Config) Validate() error {
	switch {
	case c.MinPassRate < 0 || c.MinPassRate >= 1:
		return &FieldError{Field: "min_pass_rate", Value: c.MinPassRate, Allowed: "0 <= min_pass_rate < 1"}
	case c.MaxPassRate <= c.MinPassRate || c.MaxPassRate > 1:
		return &FieldError{Field: "max_pass_rate", Value: c.MaxPassRate, Allowed: fmt.Sprintf("min_pass_rate (%v) < max_pass_rate <= 1", c.MinPassRate)}
	case c.RevisitProbability < 0 || c.RevisitProbability > 1:
		return &FieldError{Field: "revisit_probability", Value: c.RevisitProbability, Allowed: "0 (never) to 1 (no skipping)"}
	case c.Window < 1 || c.Window > 4096:
		return &FieldError{Field: "window", Value: c.Window, Allowed: "1 to 4096 rollouts"}
	case math.IsNaN(c.PassThreshold) || math.IsInf(c.PassThreshold, 0):
		return &FieldError{Field: "pass_threshold", Value: c.PassThreshold, Allowed: "a finite reward"}
	}
	return nil
}

// FieldError is a curriculum setting out of range; the config package
// prefixes the section.
type FieldError struct {
	Field   string
	Value   any
	Allowed string
}

func (e *FieldError) Error() string {
	return fmt.Sprintf("%s is %v (allowed: %s)", e.Field, e.Value, e.Allowed)
}

// SetCurriculum sets the pass threshold and window of the pass rates and,
// with c.Enabled, makes Next skip tasks outside the band.
func (s *Sampler) SetCurriculum(c Config) { s.cur = c.withDefaults() }

// Curriculum returns the curriculum settings in force.
func (s *Sampler) Curriculum() Config { return s.cur }

// TaskRate is one task's recent results: Recent holds its last scored
// rollouts, oldest first, '1' for a pass.
type TaskRate struct {
	Env        int     `json:"env"`
	Index      int     `json:"index"`
	Recent     string  `json:"recent"`
	Rollouts   int     `json:"rollouts"`
	MeanReward float64 `json:"mean_reward"` // over Recent's rollouts
	LastRound  int     `json:"last_round"`
	// Rewards are Recent's rollouts' rewards.
	Rewards []float64 `json:"rewards,omitempty"`
}

// PassRate is the fraction of the recent rollouts that passed (NaN before
// any).
func (r TaskRate) PassRate() float64 {
	if r.Recent == "" {
		return math.NaN()
	}
	return float64(strings.Count(r.Recent, "1")) / float64(len(r.Recent))
}

type passRates map[Task]TaskRate

func (p passRates) clone() passRates {
	out := make(passRates, len(p))
	for k, v := range p {
		v.Rewards = slices.Clone(v.Rewards)
		out[k] = v
	}
	return out
}

func (p passRates) list() []TaskRate {
	if len(p) == 0 {
		return nil
	}
	out := make([]TaskRate, 0, len(p))
	for _, r := range p {
		r.Rewards = slices.Clone(r.Rewards)
		out = append(out, r)
	}
	slices.SortFunc(out, func(a, b TaskRate) int {
		return cmp.Or(cmp.Compare(a.Env, b.Env), cmp.Compare(a.Index, b.Index))
	})
	return out
}

func (p passRates) outOfBand(t Task, c Config) bool {
	r, ok := p[t]
	if !ok || r.Recent == "" {
		return false
	}
	rate := r.PassRate()
	return rate <= c.MinPassRate || rate >= c.MaxPassRate
}

// Outcome is one generated group's rewards (NaN: a failed rollout) in the
// round it was generated in.
type Outcome struct {
	Task    Task
	Round   int
	Rewards []float64
}

// Observe adds groups' results to their tasks' pass rates, in order.
// Failed rollouts say nothing about difficulty and are left out.
func (s *Sampler) Observe(outcomes []Outcome) {
	for _, o := range outcomes {
		r := s.rates[o.Task]
		r.Env, r.Index = o.Task.Env, o.Task.Index
		for _, x := range o.Rewards {
			if math.IsNaN(x) {
				continue
			}
			pass := byte('0')
			if x >= s.cur.PassThreshold {
				pass = '1'
			}
			r.Recent += string(pass)
			r.Rewards = append(r.Rewards, x)
			r.Rollouts++
		}
		if over := len(r.Recent) - s.cur.Window; over > 0 {
			r.Recent, r.Rewards = r.Recent[over:], slices.Clone(r.Rewards[over:])
		}
		if r.Recent == "" {
			continue
		}
		r.MeanReward = mean(r.Rewards)
		r.LastRound = max(r.LastRound, o.Round)
		s.rates[o.Task] = r
	}
}

func mean(xs []float64) float64 {
	t := 0.0
	for _, x := range xs {
		t += x
	}
	return t / float64(len(xs))
}

// Metrics are the curriculum's view of the tasks tried so far: how many,
// the fractions too easy and too hard by the band, and their mean pass
// rate (curriculum/*).
func (s *Sampler) Metrics() map[string]float64 {
	out := map[string]float64{"curriculum/tasks_seen": float64(len(s.rates))}
	if len(s.rates) == 0 {
		return out
	}
	easy, hard, total := 0, 0, 0.0
	for _, r := range s.rates {
		rate := r.PassRate()
		total += rate
		if rate >= s.cur.MaxPassRate {
			easy++
		} else if rate <= s.cur.MinPassRate {
			hard++
		}
	}
	n := float64(len(s.rates))
	out["curriculum/too_easy_fraction"] = float64(easy) / n
	out["curriculum/too_hard_fraction"] = float64(hard) / n
	out["curriculum/mean_pass_rate"] = total / n
	return out
}

// SnapshotFile is where a run directory keeps its tasks' pass rates as of
// its latest checkpoint (the checkpoint's trainer_state.json holds the
// same, for --resume): what `ortrain list-tasks --run` and `ortrain report`
// read.
const SnapshotFile = "task_pass_rates.json"

// Snapshot is SnapshotFile's content: the pass rates at a step, with the
// names and splits of the run's envs (TaskRate.Env indexes them).
type Snapshot struct {
	Step   int        `json:"step"`
	Envs   []string   `json:"envs"`
	Splits []string   `json:"splits"`
	Config Config     `json:"config"`
	Tasks  []TaskRate `json:"tasks"`
}

// ReadSnapshot reads a run directory's SnapshotFile.
func ReadSnapshot(runDir string) (*Snapshot, error) {
	b, err := os.ReadFile(filepath.Join(runDir, SnapshotFile))
	if err != nil {
		return nil, fmt.Errorf("task pass rates: %w (a run writes them with each checkpoint)", err)
	}
	var s Snapshot
	if err := json.Unmarshal(b, &s); err != nil {
		return nil, fmt.Errorf("read %s: %w", filepath.Join(runDir, SnapshotFile), err)
	}
	return &s, nil
}
