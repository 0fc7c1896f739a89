package train

import (
	"fmt"
	"math/rand/v2"
)

// TaskRef names one task: which configured env, and its index in that env's split.
type sampledTask struct {
	Env   int `json:"env"`
	Index int `json:"index"`
}

// EnvTasks is what the sampler knows about one env: its task indices and
// its mixing weight.
type envTasks struct {
	Indices []int
	Weight  float64
}

// SamplerState is the sampler's position; it is checkpointed so a resumed
// run draws exactly the prompts it would have drawn.
type samplerState struct {
	Round   int   `json:"round"`
	Cursors []int `json:"cursors"` // next position in each env's current permutation
	Epochs  []int `json:"epochs"`  // completed passes over each env's tasks
}

// TaskSampler draws the prompts of each generation round like TRL's
// RepeatSampler (grpo-reference.md §1.2): each env's tasks are shuffled with
// the seed (a fresh permutation every epoch), a round takes K unique tasks,
// and each task is repeated G times in a row. With several envs, every slot
// of a round picks its env by weight (deterministically from seed and round).
type taskSampler struct {
	envs    []envTasks
	k, g    int
	seed    seeds
	shuffle bool
	state   samplerState
	// perms caches each env's permutation for its current epoch.
	perms []cachedPerm
}

type cachedPerm struct {
	epoch int
	perm  []int
}

// NewTaskSampler makes a sampler for k unique tasks per round, each repeated g times.
func newTaskSampler(envs []envTasks, k, g int, seed int64, shuffle bool) (*taskSampler, error) {
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
	s := &taskSampler{envs: envs, k: k, g: g, seed: seeds(seed), shuffle: shuffle}
	s.state = samplerState{Cursors: make([]int, len(envs)), Epochs: make([]int, len(envs))}
	s.perms = make([]cachedPerm, len(envs))
	return s, nil
}

// State returns a copy of the sampler's position.
func (s *taskSampler) State() samplerState {
	return samplerState{Round: s.state.Round, Cursors: append([]int(nil), s.state.Cursors...), Epochs: append([]int(nil), s.state.Epochs...)}
}

// Restore sets the position from a checkpoint.
func (s *taskSampler) Restore(st samplerState) error {
	if len(st.Cursors) != len(s.envs) || len(st.Epochs) != len(s.envs) {
		return fmt.Errorf("restore sampler: checkpoint has %d envs, config has %d", len(st.Cursors), len(s.envs))
	}
	s.state = samplerState{Round: st.Round, Cursors: append([]int(nil), st.Cursors...), Epochs: append([]int(nil), st.Epochs...)}
	return nil
}

// Epoch is the number of completed passes over the first env's tasks
// (single-env runs: exactly TRL's epoch).
func (s *taskSampler) Epoch() int { return s.state.Epochs[0] }

// Next returns the next round: k tasks, each repeated g times, groups contiguous.
func (s *taskSampler) Next() []sampledTask {
	pick := s.seed.envPick(s.state.Round)
	out := make([]sampledTask, 0, s.k*s.g)
	for range s.k {
		env := s.chooseEnv(pick)
		idx := s.take(env)
		for range s.g {
			out = append(out, sampledTask{Env: env, Index: idx})
		}
	}
	s.state.Round++
	return out
}

func (s *taskSampler) chooseEnv(r *rand.Rand) int {
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
func (s *taskSampler) take(env int) int {
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

func (s *taskSampler) permutation(env, epoch int) []int {
	if c := s.perms[env]; c.perm != nil && c.epoch == epoch {
		return c.perm
	}
	p := s.makePermutation(env, epoch)
	s.perms[env] = cachedPerm{epoch: epoch, perm: p}
	return p
}

func (s *taskSampler) makePermutation(env, epoch int) []int {
	n := len(s.envs[env].Indices)
	if !s.shuffle {
		p := make([]int, n)
		for i := range p {
			p[i] = i
		}
		return p
	}
	r := s.seed.permutation(env, epoch)
	return r.Perm(n)
}

// RoundsPerEpoch is how many whole rounds one pass over the tasks yields
// (the single-env case; with several envs, the sum of their tasks).
func (s *taskSampler) RoundsPerEpoch() int {
	total := 0
	for _, e := range s.envs {
		total += len(e.Indices)
	}
	return total / s.k
}
