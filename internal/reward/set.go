package reward

import (
	"context"
	"errors"
	"fmt"
	"math"
	"net/http"
	"sync"

	"cel.dev/cel-go/cel"
	"github.com/rs/zerolog"

	"github.com/ortrain/ortrain/internal/backoff"
	"github.com/ortrain/ortrain/internal/grpo"
)

// OutcomeRewardError is the outcome of a rollout a reward function failed
// to score (Scores.Err != nil): count it and keep it out of the loss, as
// other failed rollouts.
const OutcomeRewardError = "reward_error"

// Options are what Compile needs besides the specs.
type Options struct {
	// Aggregation turns env rewards into env_reward where a spec names
	// none (the run's reward aggregation; zero value: last).
	Aggregation grpo.RewardAggregation
	// HTTPClient posts to http scorers; nil means a client of its own.
	// Each request's deadline is its spec's timeout, not the client's.
	HTTPClient *http.Client
	// Logger receives one line per http retry.
	Logger zerolog.Logger
	// NewBackoff makes the retry delays of one http request; nil means
	// 250ms doubling to 5s with 20% jitter (tests make it instant).
	NewBackoff func(name string) *backoff.Backoff
}

// Set is a compiled, validated list of reward functions. Score may be
// called from one goroutine at a time or many; a Set holds no mutable
// state.
type Set struct {
	specs []Spec
	funcs []scorer
}

// scorer computes one function's values for a batch (NaN = declines;
// errs[i] != nil = failed for trajectory i). Trajectories marked Failed
// are never passed in.
type scorer interface {
	score(ctx context.Context, batch []*Trajectory) (vals []float64, errs []error, err error)
}

// Compile validates specs and builds their functions: every expression is
// parsed and type-checked here, so a bad one stops the run before any
// rollout (all bad ones are reported together). An empty list means
// DefaultSpecs().
func Compile(specs []Spec, opts Options) (*Set, error) {
	if len(specs) == 0 {
		specs = DefaultSpecs()
	}
	if err := ValidateSpecs(specs); err != nil {
		return nil, err
	}
	if opts.HTTPClient == nil {
		opts.HTTPClient = &http.Client{}
	}
	if opts.NewBackoff == nil {
		opts.NewBackoff = defaultBackoff(opts.Logger)
	}
	env, err := newCELEnv()
	if err != nil {
		return nil, fmt.Errorf("build expression environment: %w", err)
	}
	set := &Set{specs: append([]Spec(nil), specs...)}
	var errs []error
	for _, s := range specs {
		f, err := newScorer(s, opts, env)
		errs = append(errs, err)
		set.funcs = append(set.funcs, f)
	}
	if err := errors.Join(errs...); err != nil {
		return nil, err
	}
	return set, nil
}

// newScorer builds one validated spec's function.
func newScorer(s Spec, opts Options, env *cel.Env) (scorer, error) {
	agg := opts.Aggregation
	if s.Aggregation != "" {
		agg, _ = grpo.ParseRewardAggregation(s.Aggregation) // checked by Validate
	}
	switch s.Kind {
	case KindEnv:
		return perTrajectory(func(_ context.Context, t *Trajectory) (float64, error) {
			return agg.Aggregate(t.EnvRewards), nil
		}), nil
	case KindAgent:
		return perTrajectory(func(_ context.Context, t *Trajectory) (float64, error) {
			if t.AgentReward == nil {
				return 0, nil
			}
			return *t.AgentReward, nil
		}), nil
	case KindBuiltin:
		b := builtins[s.Function]
		return perTrajectory(func(_ context.Context, t *Trajectory) (float64, error) { return b.score(s, t), nil }), nil
	case KindExpression:
		prg, err := compileExpression(env, s)
		if err != nil {
			return nil, err
		}
		return perTrajectory(func(ctx context.Context, t *Trajectory) (float64, error) {
			v, err := evalExpression(ctx, prg, activation(t, agg.Aggregate(t.EnvRewards)))
			if err != nil {
				return math.NaN(), &EvalError{Reward: s.Name, Expression: s.Expression, Err: err}
			}
			return v, nil
		}), nil
	case KindHTTP:
		return &httpScorer{spec: s, agg: agg, client: opts.HTTPClient, newBackoff: opts.NewBackoff}, nil
	}
	return nil, fmt.Errorf("reward %q: unknown kind %q", s.Name, s.Kind) // unreachable after Validate
}

// Specs returns the compiled specs, in order (Scores.Values follows it).
func (s *Set) Specs() []Spec { return append([]Spec(nil), s.specs...) }

// Names returns the functions' names, in order.
func (s *Set) Names() []string {
	names := make([]string, len(s.specs))
	for i, sp := range s.specs {
		names[i] = sp.Name
	}
	return names
}

// Scores is one trajectory's rewards.
type Scores struct {
	// Values has one entry per function, in the Set's order; NaN means
	// the function declined, failed, or the trajectory was not scored.
	Values []float64
	// Total is the weighted sum of the non-NaN values (TRL's nansum). It
	// is NaN when every value is NaN (TRL's "unscorable" row: the trainer
	// gives it advantage 0, as grpo does with NaN rewards today), when the
	// trajectory was marked Failed, and when Err is set.
	Total float64
	// Err is set when a function failed for this trajectory (*ScorerError
	// from an http scorer, *EvalError from an expression): the trainer
	// marks the rollout failed with OutcomeRewardError, never as a 0.
	Err error
}

// EvalError is an expression that failed at run time for one trajectory
// (a missing map key, a wrong type from a dyn value, the cost limit).
type EvalError struct {
	Reward, Expression string
	Err                error
}

func (e *EvalError) Error() string {
	return fmt.Sprintf("reward %q: evaluate %q: %v", e.Reward, e.Expression, e.Err)
}

func (e *EvalError) Unwrap() error { return e.Err }

// Score scores a batch: every function on every trajectory not marked
// Failed, http scorers concurrently (one request each per batch). Per
// trajectory failures land in Scores.Err; the error return is only for
// ctx ending, when no scores are returned.
func (s *Set) Score(ctx context.Context, batch []Trajectory) ([]Scores, error) {
	out := make([]Scores, len(batch))
	live := make([]*Trajectory, 0, len(batch))
	liveIdx := make([]int, 0, len(batch))
	for i := range batch {
		out[i].Values = make([]float64, len(s.funcs))
		for k := range out[i].Values {
			out[i].Values[k] = math.NaN()
		}
		if !batch[i].Failed {
			live = append(live, &batch[i])
			liveIdx = append(liveIdx, i)
		}
	}
	errs := make([][]error, len(s.funcs))
	fatal := make([]error, len(s.funcs))
	var wg sync.WaitGroup
	for k, f := range s.funcs {
		run := func() {
			vals, es, err := f.score(ctx, live)
			if err != nil {
				fatal[k] = err
				return
			}
			for j, i := range liveIdx {
				out[i].Values[k] = vals[j]
			}
			errs[k] = es
		}
		switch _, remote := f.(*httpScorer); {
		case len(live) == 0: // nothing to score: no request either
		case remote:
			wg.Go(run)
		default:
			run()
		}
	}
	wg.Wait()
	if err := errors.Join(fatal...); err != nil {
		return nil, err
	}
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	perTraj := make([][]error, len(batch))
	for k := range s.funcs {
		for j, e := range errs[k] {
			if e != nil {
				perTraj[liveIdx[j]] = append(perTraj[liveIdx[j]], e)
			}
		}
	}
	for i := range out {
		out[i].Err = errors.Join(perTraj[i]...)
		out[i].Total = s.total(out[i].Values)
		if out[i].Err != nil || batch[i].Failed {
			out[i].Total = math.NaN()
		}
	}
	return out, nil
}

// total is the weighted sum of the non-NaN values; NaN if all are NaN.
func (s *Set) total(vals []float64) float64 {
	sum, n := 0.0, 0
	for k, v := range vals {
		if !math.IsNaN(v) {
			sum += s.specs[k].WeightValue() * v
			n++
		}
	}
	if n == 0 {
		return math.NaN()
	}
	return sum
}

// perTrajectory is a scorer that scores each trajectory on its own.
type perTrajectory func(ctx context.Context, t *Trajectory) (float64, error)

func (f perTrajectory) score(ctx context.Context, batch []*Trajectory) ([]float64, []error, error) {
	vals := make([]float64, len(batch))
	errs := make([]error, len(batch))
	for i, t := range batch {
		if err := ctx.Err(); err != nil {
			return nil, nil, err
		}
		vals[i], errs[i] = f(ctx, t)
	}
	return vals, errs, nil
}
