package train

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"math"
	"time"

	"github.com/ortrain/ortrain/internal/curriculum"
	"github.com/ortrain/ortrain/internal/grpo"
	"github.com/ortrain/ortrain/internal/reward"
	"github.com/ortrain/ortrain/internal/rollout"
)

// Producing a round: its rollouts run, scored, and turned into the rows the
// trainer splits into micro-batches (split out of loop.go, which keeps
// the step and the use of a round).

// roundJob is one round to generate: its tasks, its number (seeds derive
// from it), the policy version of the weights that generate it, and the
// step that first trains on it (its trajectories are logged under it).
type roundJob struct {
	Refs      []curriculum.Task
	Round     int64
	Version   int
	FirstStep int
	// Refill draws the tasks that top the round up (dynamic sampling;
	// nil: off). Skipped counts the draws the curriculum skipped.
	Refill  *curriculum.Sampler
	Skipped int
}

// genRound is a generated round before the trainer uses it: rows with
// advantages but no old or reference log-probs yet, what the step's
// metrics take from it, and its trajectories as JSONL records. Async runs
// checkpoint the rounds generated ahead of training in this form.
type genRound struct {
	Round   int64
	Version int
	// Versions is, per row, the oldest policy version used across the
	// rollout's turns (rounds are generated with one version each).
	Versions []int
	// Groups is, per row, its GRPO group (nil: g consecutive rows each):
	// set when agents' forks add rows after the samples' own.
	Groups  []int
	Rows    []grpo.Row
	Stats   roundStats
	Records [][]byte
	// Outcomes are the rewards of every group generated for the round,
	// those dynamic sampling dropped included: the curriculum's input.
	Outcomes []curriculum.Outcome
}

// roundStats are a round's contributions to its step's metrics.
type roundStats struct {
	RolloutTime    time.Duration
	Rewards        map[string]float64
	Outcomes       map[string]int
	FormatErrors   int
	AssistantTurns int // sampled turns, the denominator of tools/parse_rate
	// AgentRollouts counts the rollouts a user's agent played, PrefixBreaks
	// the times those agents rewrote their history (agent/prefix_breaks).
	AgentRollouts, PrefixBreaks int
	AgentCalls                  rollout.AgentCallStats
	EnvBusy, GenBusy            time.Duration
	EnvSpans, GenSpans          []rollout.Span
	Round                       grpo.RoundMetrics
	// Tools counts the round's tool calls (checked in round order when the
	// round is used: rounds of two versions may generate at once).
	Tools toolCounts
	// GeneratedTokens counts the completion tokens of every rollout
	// generated for the round (dropped groups included); Skipped the
	// tasks the curriculum skipped drawing it; Dynamic what dynamic
	// sampling did.
	GeneratedTokens, Skipped int
	Dynamic                  *curriculum.DynamicStats
}

// produceRound runs a round's rollouts and turns them into rows. It touches
// no state the trainer owns (step, sampler, pending round), so async runs
// call it beside a training step. With dynamic sampling it tops the round
// up with more tasks (round_fill.go).
func (l *stepLoop) produceRound(ctx context.Context, job roundJob) (*genRound, error) {
	part, err := l.rolloutPart(ctx, job, job.Refs, 0)
	if err == nil && job.Refill != nil {
		part, err = l.fillRound(ctx, job, part)
	}
	if err != nil {
		return nil, err
	}
	return l.buildRound(ctx, job, part)
}

// rolloutPart runs the rollouts of refs (attempt 0: the round's own tasks;
// later ones: dynamic sampling's refills) and scores them. A rank of a
// data-parallel run rolls out its slice of the groups and gathers the
// others' (dist.go).
func (l *stepLoop) rolloutPart(ctx context.Context, job roundJob, refs []curriculum.Task, attempt int) (*roundPart, error) {
	lo, hi := 0, len(refs)
	if l.dist != nil {
		lo, hi = rankRange(len(refs), l.dist.Rank(), l.dist.WorldSize())
	}
	tasks := make([]rollout.Task, 0, hi-lo)
	for i := lo; i < hi; i++ {
		r := refs[i]
		tasks = append(tasks, rollout.Task{
			Env: r.Env, Index: r.Index, Split: l.cfg.Splits[r.Env], Secrets: l.cfg.Secrets[r.Env],
			// Every rollout of every round samples with its own seed.
			Seed:    seeds(l.cfg.Seed).rollout(job.Round, i, attempt),
			Version: job.Version,
		})
	}
	t0 := time.Now()
	trajs := l.rollouts.RunAll(ctx, tasks, l.OnRolloutDone)
	rolloutTime := time.Since(t0)
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	scores, err := scoreRollouts(ctx, l.cfg.Rewards, trajs, l.cfg.EnvNames)
	if err != nil {
		return nil, err
	}
	part := l.newRoundPart(job, trajs, scores)
	part.Stats.RolloutTime = rolloutTime
	if l.dist != nil {
		if part, err = gatherRound(ctx, l.dist, part, l.OnTrajectory != nil); err != nil {
			return nil, err
		}
	}
	if frac := float64(part.Failures) / float64(len(part.Samples)); frac > l.cfg.MaxFailureFrac {
		return nil, fmt.Errorf("%w: %d of %d rollouts failed (%s); rollout.max_failure_fraction is %v",
			ErrTooManyFailures, part.Failures, len(part.Samples), part.FirstFailure, l.cfg.MaxFailureFrac)
	}
	part.Outcomes = groupOutcomes(refs, part.Samples, l.cfg.Shape.G, int(job.Round))
	for _, s := range part.Samples {
		part.Stats.GeneratedTokens += len(s.CompletionIDs)
	}
	return part, nil
}

// buildRound turns a round's scored rollouts into rows with advantages.
func (l *stepLoop) buildRound(ctx context.Context, job roundJob, part *roundPart) (*genRound, error) {
	gr := &genRound{Round: job.Round, Version: job.Version, Outcomes: part.Outcomes}
	gr.Stats = part.Stats
	gr.Stats.Skipped += job.Skipped
	gr.Stats.Rewards = l.cfg.Rewards.Metrics(part.Scores)
	samples := part.Samples
	rewards := make([]float64, len(samples))
	for i, s := range samples {
		rewards[i] = s.Reward
	}
	adv, err := grpo.GroupAdvantages(rewards, l.cfg.Shape.G, l.cfg.Scale)
	if err != nil {
		return nil, err
	}
	if gr.Rows, err = grpo.BuildRows(samples, adv, l.cfg.MaskTruncated); err != nil {
		return nil, err
	}
	if err := l.rescoreSamplerLogprobs(ctx, gr); err != nil {
		return nil, err
	}
	gr.Versions = make([]int, len(gr.Rows))
	for i := range gr.Versions {
		gr.Versions[i] = job.Version
	}
	if len(gr.Rows) > len(samples) {
		gr.Groups = forkGroups(samples, l.cfg.Shape.G)
	}
	gr.Stats.Round = grpo.ComputeRoundMetrics(samples, adv)
	gr.Stats.Round.IdenticalGroups = grpo.IdenticalGroups(samples, l.cfg.Shape.G)
	l.warnIdenticalGroups(gr.Stats.Round.IdenticalGroups, len(samples)/max(1, l.cfg.Shape.G), job.FirstStep)
	for i, rec := range part.Records {
		rec.Reward, rec.Advantage = rewards[i], adv.A[i]
		if rec.Reward != rec.Reward {
			rec.Reward = 0
		}
		if l.async() {
			rec.PolicyVersion = &gr.Versions[i]
		}
		b, err := json.Marshal(rec)
		if err != nil {
			return nil, fmt.Errorf("encode trajectory: %w", err)
		}
		gr.Records = append(gr.Records, b)
	}
	return gr, nil
}

// newRoundPart is what the trainer keeps of this process's rollouts of a
// round: samples, scores, counters, and the trajectory records when the
// run logs them (their rewards and advantages are set once the whole
// round is known).
func (l *stepLoop) newRoundPart(job roundJob, trajs []*rollout.Trajectory, scores []reward.Scores) *roundPart {
	p := &roundPart{Scores: scores, FirstFailure: firstFailure(trajs)}
	p.Stats.Tools = countToolCalls(trajs)
	p.Samples, p.Failures = l.toSamples(trajs, scores, &p.Stats)
	if l.cfg.Trajectories || l.OnTrajectory != nil {
		for i, t := range trajs {
			p.Records = append(p.Records, newTrajectoryRecord(job.FirstStep, t, p.Samples[i].Reward, 0))
		}
	}
	return p
}

// toSamples turns trajectories into grpo samples: rewards aggregated per
// rollout, failed rollouts unscorable (NaN).
func (l *stepLoop) toSamples(trajs []*rollout.Trajectory, scores []reward.Scores, m *roundStats) ([]grpo.Sample, int) {
	samples := make([]grpo.Sample, len(trajs))
	failures := 0
	m.Outcomes = map[string]int{}
	m.addPhaseTimes(trajs)
	for i, t := range trajs {
		m.Outcomes[string(t.Outcome)]++
		m.FormatErrors += t.FormatErrors
		m.PrefixBreaks += t.PrefixBreaks
		if t.Agent {
			m.AgentRollouts++
			m.AgentCalls.Add(t.AgentCalls)
		}
		for _, turn := range t.Turns {
			if turn.Role == "assistant" {
				m.AssistantTurns++
			}
		}
		s := grpo.Sample{
			ToolCalls: t.ToolCalls, ToolFailures: t.ToolFailures,
			Truncated: t.Outcome == rollout.OutcomeTruncated,
			Env:       l.cfg.EnvNames[t.Task.Env],
			Reward:    scores[i].Total,
		}
		if t.Outcome.Failed() || len(t.Tokens) == 0 {
			failures++
			s.Reward = math.NaN()
			s.PromptIDs = []int32{0}
			s.CompletionIDs, s.ToolMask = []int32{0}, []uint8{0}
		} else {
			s.PromptIDs = t.Tokens[:t.PromptLen]
			s.CompletionIDs = t.Tokens[t.PromptLen:]
			s.ToolMask = t.LossMask
			s.SamplerLogprobs = t.Logprobs
			for _, f := range t.Forks {
				s.Forks = append(s.Forks, grpo.Fork{PromptIDs: f.Tokens[:f.PromptLen], CompletionIDs: f.Tokens[f.PromptLen:],
					ToolMask: f.LossMask, SamplerLogprobs: f.Logprobs})
			}
		}
		samples[i] = s
	}
	return samples, failures
}

// ErrToolsFailing stops a run in which every tool call failed for
// rollout.max_failed_tool_steps steps in a row: a misconfigured tool (a
// wrong final_answer_tool, a schema the model cannot meet) would otherwise
// train on nothing but errors and exit 0.
var ErrToolsFailing = errors.New("every tool call failed")

// countToolCalls counts the rollouts' tool calls and failed ones, with
// the first error.
func countToolCalls(trajs []*rollout.Trajectory) toolCounts {
	var c toolCounts
	for _, t := range trajs {
		for _, turn := range t.Turns {
			if turn.Role != "tool" {
				continue
			}
			c.Calls++
			if turn.Error != "" {
				c.Failed++
				if c.Example == "" {
					c.Example = turn.Error
				}
			}
		}
	}
	return c
}

// checkToolFailures warns about a round in which every tool call failed,
// naming the error, and stops after MaxFailedToolSteps such rounds in a row.
func (l *stepLoop) checkToolFailures(c toolCounts) error {
	if c.Calls == 0 || c.Failed < c.Calls {
		l.failedToolRounds = 0
		return nil
	}
	l.failedToolRounds++
	l.log.Warn().Int("tool_calls", c.Calls).Int("rounds_in_a_row", l.failedToolRounds).Str("error", c.Example).Msg("every tool call of this round failed")
	if n := l.cfg.MaxFailedToolSteps; n > 0 && l.failedToolRounds >= n {
		return fmt.Errorf("%w in %d rounds in a row (rollout.max_failed_tool_steps is %d); the last error: %s", ErrToolsFailing, l.failedToolRounds, n, c.Example)
	}
	return nil
}

func firstFailure(trajs []*rollout.Trajectory) string {
	for _, t := range trajs {
		if t.Outcome.Failed() && t.Err != nil {
			return fmt.Sprintf("first: %s: %v", t.Outcome, t.Err)
		}
	}
	return "no error recorded"
}

// forkGroups is each row's GRPO group in the order grpo.BuildRows lays
// rows out: the samples' own rows (g consecutive per group), then each
// sample's forks.
func forkGroups(samples []grpo.Sample, g int) []int {
	groups := make([]int, len(samples))
	for i := range samples {
		groups[i] = i / g
	}
	for i, s := range samples {
		for range s.Forks {
			groups = append(groups, i/g)
		}
	}
	return groups
}

// warnIdenticalGroups says once per run, loudly, when at least half of a
// round's groups are token-identical while sampling at a temperature above
// 0: such groups have no reward spread, so the run is not learning from
// them, and at the start of a run it almost always means every rollout of
// a task got the same seed (an agent or a server that fixes it), not a
// policy that has converged. rollouts/identical_groups counts them every
// step.
func (l *stepLoop) warnIdenticalGroups(identical, groups, step int) {
	if identical == 0 || 2*identical < groups || l.cfg.Loss.Temperature <= 0 || !l.identicalWarned.CompareAndSwap(false, true) {
		return
	}
	l.log.Warn().Int("step", step).Int("identical_groups", identical).Int("groups", groups).Float64("temperature", l.cfg.Loss.Temperature).
		Msg("RUN MAY NOT BE LEARNING: the rollouts of most groups are token for token the same, so their advantages are 0. " +
			"Likely cause: every rollout of a task sampled with one seed (an agent or a generation server that fixes `seed`, or a backend that ignores it); " +
			"ortrain seeds each call itself, so check a vLLM or serve-engine in between. A policy that has converged gives this too (then reward is high and steady). " +
			"rollouts/identical_groups counts them per step")
}
