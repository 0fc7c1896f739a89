package train

import (
	"context"
	"maps"

	"github.com/ortrain/ortrain/internal/curriculum"
	"github.com/ortrain/ortrain/internal/grpo"
)

// fillRound is DAPO's dynamic sampling: while fewer than K of the groups
// generated for the round have a reward spread, it rolls out K more tasks
// from the round's refill sampler, at most MaxExtraRounds times; then the
// round trains on the first K groups with a spread. A round still short
// after the last refill trains on uniform groups in the empty places (no
// policy gradient: advantage 0) and says so: a batch is never silently
// short. Every rank decides alike: each sees the gathered groups.
func (l *stepLoop) fillRound(ctx context.Context, job roundJob, all *roundPart) (*roundPart, error) {
	g, k := l.cfg.Shape.G, len(job.Refs)/l.cfg.Shape.G
	st := curriculum.DynamicStats{}
	for ; spreadGroups(all.Outcomes) < k && st.ExtraRounds < l.cfg.MaxExtraRounds; st.ExtraRounds++ {
		more, err := l.rolloutPart(ctx, job, job.Refill.Next(), st.ExtraRounds+1)
		if err != nil {
			return nil, err
		}
		all.absorb(more)
		all.Stats.Skipped += job.Refill.TakeSkipped()
	}
	rewards := make([][]float64, len(all.Outcomes))
	for i, o := range all.Outcomes {
		rewards[i] = o.Rewards
	}
	keep, filled := curriculum.SelectGroups(rewards, k)
	st.Generated, st.Kept, st.Filled = len(all.Outcomes), len(keep)-filled, filled
	sel := &roundPart{Failures: all.Failures, FirstFailure: all.FirstFailure, Stats: all.Stats, Outcomes: all.Outcomes}
	kept := map[int]bool{}
	for _, gi := range keep {
		kept[gi] = true
		for i := gi * g; i < (gi+1)*g; i++ {
			sel.Samples = append(sel.Samples, all.Samples[i])
			sel.Scores = append(sel.Scores, all.Scores[i])
			if len(all.Records) == len(all.Samples) {
				sel.Records = append(sel.Records, all.Records[i])
			}
		}
	}
	for i, s := range all.Samples {
		if !kept[i/g] {
			st.DroppedTokens += len(s.CompletionIDs)
		}
	}
	sel.Stats.Dynamic = &st
	if filled > 0 {
		l.log.Warn().Int("step", job.FirstStep).Int("groups_with_spread", st.Kept).Int("groups", k).Int("extra_rounds", st.ExtraRounds).
			Msg("dynamic sampling stayed short: too few groups had a reward spread after grpo.dynamic_sampling_max_extra_rounds refills, so uniform groups (advantage 0, no policy gradient) fill the batch; dynamic_sampling/filled_groups counts them. Raise the limit, or let the curriculum skip solved and unsolvable tasks")
	}
	return sel, nil
}

// spreadGroups counts the groups whose rewards differ.
func spreadGroups(outcomes []curriculum.Outcome) int {
	n := 0
	for _, o := range outcomes {
		if curriculum.HasSpread(o.Rewards) {
			n++
		}
	}
	return n
}

// groupOutcomes is each group's task and rewards (refs and samples hold g
// consecutive entries per group).
func groupOutcomes(refs []curriculum.Task, samples []grpo.Sample, g, round int) []curriculum.Outcome {
	out := make([]curriculum.Outcome, 0, len(samples)/g)
	for i := 0; i+g <= len(samples); i += g {
		o := curriculum.Outcome{Task: refs[i], Round: round, Rewards: make([]float64, g)}
		for j := range g {
			o.Rewards[j] = samples[i+j].Reward
		}
		out = append(out, o)
	}
	return out
}

// absorb appends another attempt's rollouts of the same round.
func (p *roundPart) absorb(o *roundPart) {
	p.Samples = append(p.Samples, o.Samples...)
	p.Scores = append(p.Scores, o.Scores...)
	p.Records = append(p.Records, o.Records...)
	p.Outcomes = append(p.Outcomes, o.Outcomes...)
	p.Failures += o.Failures
	if p.FirstFailure == "" || p.FirstFailure == "no error recorded" {
		p.FirstFailure = o.FirstFailure
	}
	p.Stats.add(o.Stats)
}

// add sums another part's counters into s (rollout times add up: the
// attempts of a round run one after another).
func (s *roundStats) add(o roundStats) {
	s.RolloutTime += o.RolloutTime
	if s.Outcomes == nil {
		s.Outcomes = map[string]int{}
	}
	for k, v := range o.Outcomes {
		s.Outcomes[k] += v
	}
	s.FormatErrors += o.FormatErrors
	s.AssistantTurns += o.AssistantTurns
	s.AgentRollouts += o.AgentRollouts
	s.PrefixBreaks += o.PrefixBreaks
	s.AgentCalls.Add(o.AgentCalls)
	s.EnvBusy += o.EnvBusy
	s.GenBusy += o.GenBusy
	s.EnvSpans = append(s.EnvSpans, o.EnvSpans...)
	s.GenSpans = append(s.GenSpans, o.GenSpans...)
	s.Tools.Calls += o.Tools.Calls
	s.Tools.Failed += o.Tools.Failed
	if s.Tools.Example == "" {
		s.Tools.Example = o.Tools.Example
	}
	s.GeneratedTokens += o.GeneratedTokens
}

// addTaskMetrics reports the round's generation cost, the draws the
// curriculum skipped and what dynamic sampling did.
func addTaskMetrics(extra map[string]float64, s roundStats) {
	extra["tokens/generated"] += float64(s.GeneratedTokens)
	if s.Skipped > 0 {
		extra["curriculum/skipped_draws"] += float64(s.Skipped)
	}
	if s.Dynamic != nil {
		maps.Copy(extra, s.Dynamic.Metrics())
	}
}
