// Package curriculum decides which tasks a run trains on: the epoch
// sampler (TRL's RepeatSampler over weighted envs), each task's running
// pass rate and the difficulty curriculum that samples solved and
// unsolvable tasks less, and DAPO's dynamic sampling (which groups of a
// round keep, how a short round is refilled). It knows nothing of
// rollouts or the worker: the trainer (internal/train) feeds it rewards.
package curriculum

import (
	"fmt"
	"math/rand/v2"
)

// Task names one task: which configured env, and its index in that env's split.
type Task struct {
	Env   int `json:"env"`
	Index int `json:"index"`
}

// EnvTasks is what the sampler knows about one env: its task indices and
// its mixing weight.
type EnvTasks struct {
	Indices []int
	Weight  float64
}

// SamplerState is the sampler's position; it is checkpointed so a resumed
// run draws exactly the prompts it would have drawn.
type SamplerState struct {
	Round   int   `json:"round"`
	Cursors []int `json:"cursors"` // next position in each env's current permutation
	Epochs  []int `json:"epochs"`  // completed passes over each env's tasks
	// Tasks are the pass rates of the tasks tried so far, sorted by env
	// and index: the curriculum's memory, so a resumed run skips what the
	// interrupted one would have.
	Tasks []TaskRate `json:"tasks,omitempty"`
}

// Sampler draws the prompts of each generation round like TRL's
// RepeatSampler (grpo-reference.md §1.2): each env's tasks are shuffled with
// the seed (a fresh permutation every epoch), a round takes K unique tasks,
// and each task is repeated G times in a row. With several envs, every slot
// of a round picks its env by weight (deterministically from seed and round).
type Sampler struct {
	envs    []EnvTasks
	k, g    int
	seed    int64
	shuffle bool
	state   SamplerState
	// perms caches each env's permutation for its current epoch.
	perms []cachedPerm
	// rates are the tasks' pass rates; with cur.Enabled, Next skips the
	// tasks outside the band (curriculum.go).
	rates passRates
	cur   Config
	// skipped counts the draws the curriculum skipped (TakeSkipped).
	skipped int
}

type cachedPerm struct {
	epoch int
	perm  []int
}

// NewSampler makes a sampler for k unique tasks per round, each repeated g times.
func NewSampler(envs []EnvTasks, k, g int, seed int64, shuffle bool) (*Sampler, error) {
	if len(envs) == 0 {
		return nil, fmt.Errorf("task sampler: no envs")
	}
	total := 0.0
	for i, e := range envs {
		if len(e.Indices) == 0 {
			return nil, fmt.Errorf("task sampler: env %d has no tasks", i)
		}
		if !(e.Weight > 0) {
			return nil, fmt.Errorf("task sampler: env %d has weight %v, want > 0", i, e.Weight)
		}
		total += e.Weight
	}
	if k < 1 || g < 1 {
		return nil, fmt.Errorf("task sampler: %d tasks x %d generations per round", k, g)
	}
	s := &Sampler{envs: envs, k: k, g: g, seed: seed, shuffle: shuffle, rates: passRates{}, cur: Config{}.withDefaults()}
	s.state = SamplerState{Cursors: make([]int, len(envs)), Epochs: make([]int, len(envs))}
	s.perms = make([]cachedPerm, len(envs))
	return s, nil
}

// State returns a copy of the sampler's position and pass rates.
func (s *Sampler) State() SamplerState {
	return SamplerState{Round: s.state.Round, Cursors: append([]int(nil), s.state.Cursors...), Epochs: append([]int(nil), s.state.Epochs...),
		Tasks: s.rates.list()}
}

// Restore sets the position from a checkpoint.
func (s *Sampler) Restore(st SamplerState) error {
	if len(st.Cursors) != len(s.envs) || len(st.Epochs) != len(s.envs) {
		return fmt.Errorf("restore sampler: checkpoint has %d envs, config has %d", len(st.Cursors), len(s.envs))
	}
	for _, r := range st.Tasks {
		if r.Env < 0 || r.Env >= len(s.envs) {
			return fmt.Errorf("restore sampler: a pass rate names env %d, config has %d", r.Env, len(s.envs))
		}
	}
	s.state = SamplerState{Round: st.Round, Cursors: append([]int(nil), st.Cursors...), Epochs: append([]int(nil), st.Epochs...)}
	s.rates = passRates{}
	for _, r := range st.Tasks {
		s.rates[Task{Env: r.Env, Index: r.Index}] = r
	}
	return nil
}

// Round is the number of rounds drawn.
func (s *Sampler) Round() int { return s.state.Round }

// Epoch is the number of completed passes over the first env's tasks
// (single-env runs: exactly TRL's epoch).
func (s *Sampler) Epoch() int { return s.state.Epochs[0] }

// Next returns the next round: k tasks, each repeated g times, groups contiguous.
func (s *Sampler) Next() []Task {
	pick := envPick(s.seed, s.state.Round)
	revisit := revisitDraws(s.seed, s.state.Round)
	out := make([]Task, 0, s.k*s.g)
	for range s.k {
		env := s.chooseEnv(pick)
		idx := s.takeInBand(env, revisit)
		for range s.g {
			out = append(out, Task{Env: env, Index: idx})
		}
	}
	s.state.Round++
	return out
}

func (s *Sampler) chooseEnv(r *rand.Rand) int {
	if len(s.envs) == 1 {
		return 0
	}
	total := 0.0
	for _, e := range s.envs {
		total += e.Weight
	}
	x := r.Float64() * total
	for i, e := range s.envs {
		if x < e.Weight {
			return i
		}
		x -= e.Weight
	}
	return len(s.envs) - 1
}

// take returns the next task of env from its current permutation. Like
// RepeatSampler, a single env drops the incomplete tail of a permutation
// rather than mixing two epochs in one round.
func (s *Sampler) take(env int) int {
	e := s.envs[env]
	n := len(e.Indices)
	if len(s.envs) == 1 && s.state.Cursors[env]%s.k == 0 && n-s.state.Cursors[env] < s.k {
		s.state.Cursors[env] = n // not enough left for a whole round: new epoch
	}
	if s.state.Cursors[env] >= n {
		s.state.Cursors[env] = 0
		s.state.Epochs[env]++
	}
	perm := s.permutation(env, s.state.Epochs[env])
	idx := e.Indices[perm[s.state.Cursors[env]]]
	s.state.Cursors[env]++
	return idx
}

func (s *Sampler) permutation(env, epoch int) []int {
	if c := s.perms[env]; c.perm != nil && c.epoch == epoch {
		return c.perm
	}
	p := s.makePermutation(env, epoch)
	s.perms[env] = cachedPerm{epoch: epoch, perm: p}
	return p
}

func (s *Sampler) makePermutation(env, epoch int) []int {
	n := len(s.envs[env].Indices)
	if !s.shuffle {
		p := make([]int, n)
		for i := range p {
			p[i] = i
		}
		return p
	}
	r := permutation(s.seed, env, epoch)
	return r.Perm(n)
}

// RoundsPerEpoch is how many whole rounds one pass over the tasks yields
// (the single-env case; with several envs, the sum of their tasks).
func (s *Sampler) RoundsPerEpoch() int {
	total := 0
	for _, e := range s.envs {
		total += len(e.Indices)
	}
	return total / s.k
}

// takeInBand is take, skipping (with the curriculum on) the tasks whose
// pass rate is outside the band unless a revisit draw keeps them; after a
// whole permutation of skips it keeps the last one, so a round is never
// short.
func (s *Sampler) takeInBand(env int, revisit *rand.Rand) int {
	idx := s.take(env)
	if !s.cur.Enabled {
		return idx
	}
	for range len(s.envs[env].Indices) - 1 {
		if !s.rates.outOfBand(Task{Env: env, Index: idx}, s.cur) || revisit.Float64() < s.cur.RevisitProbability {
			return idx
		}
		s.skipped++
		idx = s.take(env)
	}
	return idx
}

// TakeSkipped returns how many draws the curriculum skipped since the
// last call.
func (s *Sampler) TakeSkipped() int {
	n := s.skipped
	s.skipped = 0
	return n
}

// Refill returns the sampler that tops up round (dynamic sampling): its
// own shuffled pass over the tasks, seeded by round, with the pass rates
// as they are now frozen into it. It shares nothing with s, so a round
// generated beside training draws the same tasks whatever the timing.
func (s *Sampler) Refill(round int) *Sampler {
	r := &Sampler{envs: s.envs, k: s.k, g: s.g, seed: refillSeed(s.seed, round), shuffle: true, cur: s.cur, rates: s.rates.clone()}
	r.state = SamplerState{Cursors: make([]int, len(s.envs)), Epochs: make([]int, len(s.envs))}
	r.perms = make([]cachedPerm, len(s.envs))
	return r
}

// The streams below are pure functions of (seed, position), so a resumed
// run draws exactly what an uninterrupted one would.

// envPick chooses the env of each prompt of round (multi-env runs).
func envPick(seed int64, round int) *rand.Rand {
	return rand.New(rand.NewPCG(uint64(seed)^0x9e3779b97f4a7c15, uint64(round)))
}

// permutation orders env's tasks in epoch.
func permutation(seed int64, env, epoch int) *rand.Rand {
	return rand.New(rand.NewPCG(uint64(seed)+uint64(env)*0x51ed27, uint64(epoch)))
}

// revisitDraws decides which out-of-band tasks of round are kept.
func revisitDraws(seed int64, round int) *rand.Rand {
	return rand.New(rand.NewPCG(uint64(seed)^0x2545f4914f6cdd1d, uint64(round)))
}

// refillSeed seeds the refill sampler of round.
func refillSeed(seed int64, round int) int64 {
	return int64(uint64(seed)*0x100000001b3 ^ (uint64(round)+1)*0xbf58476d1ce4e5b9)
}
