package train

import (
	"math"
	"time"

	"github.com/ortrain/ortrain/internal/grpo"
	"github.com/ortrain/ortrain/internal/rollout"
	"github.com/ortrain/ortrain/internal/worker"
)

// StepMetrics is everything logged for one optimizer step, reduced in one
// place (reduceLoss) and written under TRL's names (Map).
type StepMetrics struct {
	Step         int
	Epoch        int
	LearningRate float64
	GradNorm     float64
	NumTokens    int

	Loss            float64
	Entropy         float64
	KL              float64
	HasKL           bool
	ClipLowMean     float64
	ClipHighMean    float64
	ClipRegionMean  float64
	ClipLowMin      float64
	ClipHighMax     float64
	CISPOClipRatio  float64
	ReportsClipping bool

	Rounds       int
	Round        grpo.RoundMetrics
	Outcomes     map[string]int
	FormatErrors int
	// AssistantTurns are the sampled turns of the step's rollouts: with
	// FormatErrors, the share of turns whose tool calls parsed.
	AssistantTurns int
	// PaddedPositions and PackedPositions (worker.pack_tokens): the token
	// positions the step's micro-batches would compute padded row by row,
	// and those they computed packed.
	PaddedPositions, PackedPositions int
	// PeakRSS is the most resident memory the process held during the
	// step's micro-steps and optimizer (0 where procfs cannot tell).
	PeakRSS int64
	// PeakAllocated is the most the device allocator held during the step
	// (CUDA, libtorch 2.10 or later; torch.cuda.max_memory_allocated); 0
	// where it cannot tell.
	PeakAllocated int64
	// ShardMemory is what this rank held of the policy after the step
	// (parameters, gradients and AdamW state; with worker.shard its
	// slices) and, with parameters sharded, the most it gathered at once
	// during the step.
	ShardMemory worker.ShardMemory
	// AgentRollouts and PrefixBreaks: rollouts played by a user's agent,
	// and the history rewrites among them (each one more trained row).
	AgentRollouts, PrefixBreaks int
	// AgentCalls: what the agents asked that the run replaced or did not train.
	AgentCalls rollout.AgentCallStats

	// EnvTime and GenTime are wall time: how long at least one rollout was
	// in that phase. EnvBusy and GenBusy sum the phase over all rollouts
	// (they exceed the step time when rollouts run concurrently).
	StepTime, RolloutTime, EnvTime, GenTime, TrainTime, SyncTime time.Duration
	EnvBusy, GenBusy                                             time.Duration
	Extra                                                        map[string]float64

	// Async runs: WaitTime is how long the trainer waited for generation;
	// Staleness covers the samples of the step's rounds.
	Async     bool
	WaitTime  time.Duration
	Staleness staleness

	// Data-parallel runs: the ranks, and the gradient all-reduce's time
	// and bytes per rank.
	WorldSize      int
	AllReduceTime  time.Duration
	AllReduceBytes int64
	// AllGatherTime and AllGatherBytes are a sharded optimizer step's
	// communication (worker.shard): the gradient norm's all-reduce and the
	// parameters' all-gather.
	AllGatherTime  time.Duration
	AllGatherBytes int64

	// The step's phase intervals, kept so that a second round in the same
	// step extends the union instead of adding to it.
	envSpans, genSpans []rollout.Span
}

// addPhaseTimes adds the trajectories' env and generation calls to the
// round's busy times and intervals.
func (s *roundStats) addPhaseTimes(trajs []*rollout.Trajectory) {
	for _, t := range trajs {
		s.EnvBusy += t.EnvTime
		s.GenBusy += t.GenTime
		s.EnvSpans = append(s.EnvSpans, t.EnvSpans...)
		s.GenSpans = append(s.GenSpans, t.GenSpans...)
	}
}

// addRound adds a round's generation metrics to the step: times, outcomes
// (the step's last round's), reward-function and round metrics. The phase
// wall times are the union of all intervals seen in this step.
func (m *StepMetrics) addRound(s roundStats) {
	m.RolloutTime += s.RolloutTime
	for k, v := range s.Rewards {
		m.Extra[k] = v
	}
	m.Outcomes = s.Outcomes
	m.FormatErrors += s.FormatErrors
	m.AssistantTurns += s.AssistantTurns
	m.AgentRollouts += s.AgentRollouts
	m.PrefixBreaks += s.PrefixBreaks
	m.AgentCalls.Add(s.AgentCalls)
	m.EnvBusy += s.EnvBusy
	m.GenBusy += s.GenBusy
	m.envSpans = append(m.envSpans, s.EnvSpans...)
	m.genSpans = append(m.genSpans, s.GenSpans...)
	m.EnvTime = rollout.UnionDuration(m.envSpans)
	m.GenTime = rollout.UnionDuration(m.genSpans)
	m.Round = s.Round
	m.Rounds++
	addTaskMetrics(m.Extra, s)
}

// reduceLoss combines the micro-batch sums into the step's loss metrics:
// the loss is the sum of micro-batch losses (each already normalised as the
// loss type prescribes); entropy, KL and clip fractions are global masked means.
func (m *StepMetrics) reduceLoss(stats []worker.LossStats, cfg grpo.LossConfig) {
	var tokens, ent, kl, low, high, region, denom, cispo float64
	m.ClipLowMin, m.ClipHighMax = math.Inf(1), math.Inf(-1)
	for _, s := range stats {
		m.Loss += s.Loss
		tokens += s.ActiveTokens
		cispo += s.CISPOClip
		ent += s.EntropySum
		kl += s.KLSum
		low += s.ClipLow
		high += s.ClipHigh
		region += s.ClipRegion
		denom += s.ClipDenom
		if s.RowsWithTokens > 0 {
			m.ClipLowMin = math.Min(m.ClipLowMin, s.ClipLowMin)
			m.ClipHighMax = math.Max(m.ClipHighMax, s.ClipHighMax)
		}
	}
	if math.IsInf(m.ClipLowMin, 0) {
		m.ClipLowMin, m.ClipHighMax = 0, 0
	}
	m.Entropy = ratio(ent, tokens)
	m.KL, m.HasKL = ratio(kl, tokens), cfg.Beta != 0
	m.ReportsClipping = cfg.Type.UsesClip()
	m.ClipLowMean, m.ClipHighMean, m.ClipRegionMean = ratio(low, denom), ratio(high, denom), ratio(region, denom)
	if cfg.Type == grpo.LossCISPO {
		// The fraction of active tokens whose weight was capped (grpo-reference.md §6).
		m.CISPOClipRatio = ratio(cispo, tokens)
	}
}

func ratio(a, b float64) float64 {
	if b == 0 {
		return 0
	}
	return a / b
}

// Map returns the metrics under TRL's keys plus ortrain's timing, outcome
// and failure counters.
func (m StepMetrics) Map() map[string]float64 {
	out := map[string]float64{
		"step":                 float64(m.Step),
		"epoch":                float64(m.Epoch),
		"learning_rate":        m.LearningRate,
		"grad_norm":            m.GradNorm,
		"loss":                 m.Loss,
		"entropy":              m.Entropy,
		"num_tokens":           float64(m.NumTokens),
		"step_time":            m.StepTime.Seconds(),
		"time/rollout":         m.RolloutTime.Seconds(),
		"time/env":             m.EnvTime.Seconds(),
		"time/generation":      m.GenTime.Seconds(),
		"time/env_busy":        m.EnvBusy.Seconds(),
		"time/generation_busy": m.GenBusy.Seconds(),
		"time/train":           m.TrainTime.Seconds(),
		"time/sync":            m.SyncTime.Seconds(),
		"tools/format_errors":  float64(m.FormatErrors),
	}
	if m.AssistantTurns > 0 {
		out["tools/parse_rate"] = 1 - float64(m.FormatErrors)/float64(m.AssistantTurns)
	}
	if m.PackedPositions > 0 {
		out["packing/padded_positions"] = float64(m.PaddedPositions)
		out["packing/packed_positions"] = float64(m.PackedPositions)
		out["packing/padding_saved"] = float64(m.PaddedPositions - m.PackedPositions)
	}
	if m.PeakAllocated > 0 {
		out["memory/peak_allocated_bytes"] = float64(m.PeakAllocated)
	}
	if m.PeakRSS > 0 {
		out["memory/peak_rss_bytes"] = float64(m.PeakRSS)
	}
	if sm := m.ShardMemory; sm.ParamBytes > 0 {
		out["memory/params_bytes"] = float64(sm.ParamBytes)
		out["memory/grads_bytes"] = float64(sm.GradBytes)
		out["memory/optimizer_bytes"] = float64(sm.OptimBytes)
		if sm.PeakGatheredBytes > 0 {
			out["memory/peak_gathered_bytes"] = float64(sm.PeakGatheredBytes)
		}
	}
	if m.AgentRollouts > 0 {
		out["agent/prefix_breaks"] = float64(m.PrefixBreaks)
		out["agent/sampling_overridden"] = float64(m.AgentCalls.SamplingOverridden)
		out["agent/seed_overridden"] = float64(m.AgentCalls.SeedOverridden)
		out["agent/calls_after_finish"] = float64(m.AgentCalls.AfterFinish)
		out["agent/tool_calls_after_finish"] = float64(m.AgentCalls.ToolCallsAfterFinish)
		out["agent/dropped_tools"] = float64(m.AgentCalls.DroppedTools)
	}
	if m.HasKL {
		out["kl"] = m.KL
	}
	if m.ReportsClipping {
		out["clip_ratio/low_mean"] = m.ClipLowMean
		out["clip_ratio/high_mean"] = m.ClipHighMean
		out["clip_ratio/region_mean"] = m.ClipRegionMean
		out["clip_ratio/low_min"] = m.ClipLowMin
		out["clip_ratio/high_max"] = m.ClipHighMax
	}
	if m.CISPOClipRatio != 0 {
		out["cispo_clip_ratio"] = m.CISPOClipRatio
	}
	if m.Rounds > 0 {
		for k, v := range m.Round.Map() {
			out[k] = v
		}
		// Every outcome is reported, 0 included, so series have no gaps.
		for _, o := range rollout.Outcomes() {
			out["rollouts/"+string(o)] = 0
		}
		for k, v := range m.Outcomes {
			out["rollouts/"+k] = float64(v)
		}
	}
	if m.Async {
		out["time/wait"] = m.WaitTime.Seconds()
		out["async/staleness_mean"] = ratio(float64(m.Staleness.Sum), float64(m.Staleness.Count))
		out["async/staleness_max"] = float64(m.Staleness.Max)
		out["async/dropped_samples"] = float64(m.Staleness.Dropped)
	}
	if m.WorldSize > 1 {
		out["dist/world_size"] = float64(m.WorldSize)
		out["time/allreduce"] = m.AllReduceTime.Seconds()
		out["dist/allreduce_mib"] = float64(m.AllReduceBytes) / (1 << 20)
		if m.AllGatherBytes > 0 {
			out["time/allgather"] = m.AllGatherTime.Seconds()
			out["dist/allgather_mib"] = float64(m.AllGatherBytes) / (1 << 20)
		}
	}
	for k, v := range m.Extra {
		out[k] = v
	}
	return out
}
