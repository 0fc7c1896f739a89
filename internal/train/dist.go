package train

import (
	"bytes"
	"context"
	"encoding/gob"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"strings"
	"time"

	"github.com/ortrain/ortrain/internal/config"
	"github.com/ortrain/ortrain/internal/curriculum"
	"github.com/ortrain/ortrain/internal/engine"
	"github.com/ortrain/ortrain/internal/grpo"
	"github.com/ortrain/ortrain/internal/launch"
	"github.com/ortrain/ortrain/internal/reward"
	"github.com/ortrain/ortrain/internal/rollout"
	"github.com/ortrain/ortrain/internal/worker"
	"github.com/rs/zerolog"
)

// Data parallelism (grpo-reference.md §1, §4): every rank draws the same
// global round from the task sampler and rolls out whole groups for its
// slice of it; the round's samples are then gathered, so every rank holds
// the global round and computes advantages, metrics and the micro-batch
// split exactly as one rank would. Each global micro-batch of P*B rows is
// cut into P slices of B rows; rank r trains on slice r with the dapo
// normaliser divided by P, and the gradients are averaged. The result is
// the one-rank run with the same global batch, up to summation order.

// collectives is the trainer's view of a data-parallel process group
// (worker.Group).
type collectives interface {
	Rank() int
	WorldSize() int
	AllGather(ctx context.Context, data []byte) ([][]byte, error)
	ReduceGrads(ctx context.Context) (worker.GradSyncStats, error)
	// Shard and OptimizerStep: a sharded optimizer (worker.shard) steps
	// through the group, which gathers the parameters.
	Shard() worker.ShardStage
	OptimizerStep(ctx context.Context, lr float64) (worker.ShardStepStats, error)
}

// checkDistributed refuses the settings a data-parallel run does not
// support yet, naming the field.
func checkDistributed(cfg *config.Config, w launch.World) error {
	if !w.Distributed() {
		return nil
	}
	switch {
	case cfg.Async.MaxOffPolicySteps > 0:
		return &config.FieldError{Field: "async.max_off_policy_steps", Value: cfg.Async.MaxOffPolicySteps,
			Allowed: fmt.Sprintf("0 with more than one rank (this run has %d): async rollouts run on one rank only", w.WorldSize)}
	case cfg.Engine.Kind == "vllm" && len(cfg.Engine.VLLMURLs) == 0 && w.LocalWorldSize != w.WorldSize:
		return &config.FieldError{Field: "engine.vllm_urls", Value: "[]",
			Allowed: fmt.Sprintf("the replicas every rank samples from, with ranks on several machines (%d ranks, %d here): start them with `ortrain serve-vllm` or `vllm serve` and list their URLs; rank 0 pushes each step's weights through engine.vllm_sync_dir, which the replicas must read (on one machine, rank 0 launches the replicas itself)", w.WorldSize, w.LocalWorldSize)}
	}
	return nil
}

// replicaAddress is where the replicas rank 0 launched listen, for the
// other ranks.
type replicaAddress struct {
	URLs   []string
	APIKey string
}

// startRankEngine joins the process group (the policy is loaded; every
// rank then holds rank 0's weights) and starts this rank's generation
// backend. Replicas the run launches (engine.vllm_gpus, one machine) are
// launched by rank 0; the other ranks learn their URLs and key through the
// group and sample from them too, following rank 0's weight pushes.
func startRankEngine(ctx context.Context, cfg *config.Config, modelDir string, p *workerPolicy, ro RunOptions, st *stack) (engine.Generator, error) {
	g, err := joinGroup(ctx, cfg, ro.World, p, ro.Logger)
	if err != nil {
		return nil, err
	}
	st.group = g
	if cfg.Engine.Kind != "vllm" {
		return startEngine(ctx, cfg, modelDir, p, ro)
	}
	var mine replicaAddress
	var gen engine.Generator
	// Rank 0 launches or reaches the replicas and pushes the first weights.
	start0 := func() error {
		v, key, err := startVLLM(ctx, cfg, modelDir, p, ro, ro.Logger.With().Str("component", "engine").Logger())
		if err != nil {
			return err
		}
		gen, mine = v, replicaAddress{URLs: v.URLs(), APIKey: key}
		return nil
	}
	switch {
	case p.paramSync != nil: // parameters sharded: every rank takes part in the push
		err = sharedPush(ctx, p.paramSync, scoreService{g: g, policy: p}, start0)
	case ro.rank0():
		err = start0()
	}
	if err != nil {
		if gen != nil {
			_ = gen.Close()
		}
		return nil, err
	}
	if len(cfg.Engine.VLLMURLs) > 0 {
		if ro.rank0() {
			return gen, nil
		}
		return startEngine(ctx, cfg, modelDir, p, ro) // follows rank 0's pushes
	}
	all, err := gatherGob(ctx, g, mine)
	if err != nil {
		if gen != nil {
			_ = gen.Close()
		}
		return nil, fmt.Errorf("rank %d: learn rank 0's replicas: %w", ro.World.Rank, err)
	}
	if ro.rank0() {
		return gen, nil
	}
	c := *cfg
	c.Engine.VLLMURLs, c.Engine.VLLMAPIKey = all[0].URLs, all[0].APIKey
	ro.Logger.Info().Strs("urls", c.Engine.VLLMURLs).Msg("sampling from the replicas rank 0 launched")
	return startEngine(ctx, &c, modelDir, p, ro)
}

// policyDevice resolves worker.device for this process: "auto" is CUDA
// when the worker's libtorch has it and sees a GPU, else CPU (logged, with
// why), and a distributed run's "cuda" is the rank's own GPU (rankDevice).
func policyDevice(wc config.WorkerConfig, info worker.Info, w launch.World, getenv func(string) string, log zerolog.Logger) (string, error) {
	device := wc.Device
	if device == "auto" || device == "" {
		device = "cpu"
		why := fmt.Sprintf("the worker's libtorch %s sees no CUDA GPU (a CPU build, or none visible)", info.LibtorchVersion)
		if info.CUDADevices > 0 {
			device = "cuda"
			why = fmt.Sprintf("the worker's libtorch %s sees %d CUDA GPU(s)", info.LibtorchVersion, info.CUDADevices)
		}
		log.Info().Str("worker.device", "auto").Str("device", device).Msg("training on " + strings.ToUpper(device) + ": " + why + "; set worker.device (--device) to choose")
	}
	if !w.Distributed() {
		return device, nil
	}
	return rankDevice(device, wc.GPUs, w, getenv)
}

// rankDevice is the device a rank trains on. worker.device "cuda" means
// this rank's GPU: worker.gpus[LOCAL_RANK] when worker.gpus is set, else
// cuda:LOCAL_RANK — unless CUDA_VISIBLE_DEVICES shows the process a single
// GPU (srun --gpus-per-task=1, one GPU per pod), which is cuda:0. "cpu" and
// an explicit "cuda:N" are kept.
func rankDevice(device string, gpus []int, w launch.World, getenv func(string) string) (string, error) {
	if device != "cuda" || !w.Distributed() {
		return device, nil
	}
	if v := strings.TrimSpace(getenv("CUDA_VISIBLE_DEVICES")); v != "" && !strings.Contains(v, ",") {
		return "cuda:0", nil
	}
	if len(gpus) == 0 {
		return fmt.Sprintf("cuda:%d", w.LocalRank), nil
	}
	if w.LocalRank >= len(gpus) {
		return "", &config.FieldError{Field: "worker.gpus", Value: gpus,
			Allowed: fmt.Sprintf("one GPU per local rank: local rank %d of %d has none", w.LocalRank, w.LocalWorldSize)}
	}
	return fmt.Sprintf("cuda:%d", gpus[w.LocalRank]), nil
}

// noteShardAlone warns that worker.shard does nothing in a run of one
// rank: there is nobody to spread the optimizer over.
func noteShardAlone(cfg *config.Config, ro RunOptions) {
	if cfg.Worker.Shard != "" && cfg.Worker.Shard != "none" {
		ro.Logger.Warn().Str("worker.shard", cfg.Worker.Shard).
			Msg("one rank holds the whole optimizer: worker.shard spreads it over the ranks of a data-parallel run (--nproc-per-node N, or a launcher's RANK and WORLD_SIZE)")
	}
}

// joinGroup joins the run's process group through rank 0's store and
// makes every rank start from rank 0's trainable weights.
func joinGroup(ctx context.Context, cfg *config.Config, w launch.World, p *workerPolicy, log zerolog.Logger) (*worker.Group, error) {
	shard, err := worker.ParseShardStage(cfg.Worker.Shard)
	if err != nil {
		return nil, &config.FieldError{Field: "worker.shard", Value: cfg.Worker.Shard, Allowed: "none, optimizer, gradients or parameters"}
	}
	if shard != worker.ShardNone && w.Rank == 0 {
		if err := clearStaging(cfg.OutputDir); err != nil {
			return nil, err
		}
		if err := os.RemoveAll(paramSyncDir(cfg.OutputDir)); err != nil {
			return nil, fmt.Errorf("clear earlier parameter slices: %w", err)
		}
	}
	g, err := p.m.JoinGroup(ctx, worker.DistOptions{
		Addr: w.MasterAddr, Port: w.MasterPort, Rank: w.Rank, WorldSize: w.WorldSize,
		Timeout: cfg.Worker.CollectiveTimeout, BucketBytes: int64(cfg.Worker.BucketMB) << 20, Shard: shard,
	})
	if err != nil {
		return nil, fmt.Errorf("rank %d of %d: join the process group at %s:%d (set by %s): %w", w.Rank, w.WorldSize, w.MasterAddr, w.MasterPort, w.Source, err)
	}
	// The group's own timeout bounds the broadcast: a second deadline of
	// the same length here would race it (worker.ErrTimeout vs the
	// context's error).
	if err := g.BroadcastTrainable(ctx); err != nil {
		_ = g.Close()
		return nil, fmt.Errorf("rank %d: broadcast rank 0's weights: %w", w.Rank, err)
	}
	switch shard {
	case worker.ShardNone:
	case worker.ShardParameters:
		p.shards = newOptimizerShards(cfg.OutputDir, g, log)
		p.params = g
		if cfg.Engine.Kind == "vllm" {
			p.paramSync = newParamSync(cfg.OutputDir, g, p, log)
		}
		log.Info().Str("stage", shard.String()).Int("ranks", w.WorldSize).
			Msg("parameters sharded (ZeRO-3): this rank keeps its slice of every layer's weights, gradients and AdamW state, and gathers each layer only while it runs")
	default:
		p.shards = newOptimizerShards(cfg.OutputDir, g, log)
		log.Info().Str("stage", shard.String()).Int("ranks", w.WorldSize).
			Msg("optimizer sharded: this rank keeps the AdamW state of its slice of every gradient bucket")
	}
	return g, nil
}

// syncWeights makes generation use the step's weights. The ranks of a
// data-parallel run that share replicas take turns: rank 0 pushes, every
// rank waits for it, then the others move to the version it pushed.
func (l *stepLoop) syncWeights(ctx context.Context) error {
	if l.dist == nil || !l.cfg.SharedEngine {
		return l.gen.SyncWeights(ctx, l.step)
	}
	if wp, ok := l.policy.(*workerPolicy); ok && wp.paramSync != nil {
		// Parameters sharded: every rank takes part in rank 0's push.
		err := sharedPush(ctx, wp.paramSync, scoreService{g: l.dist, policy: l.policy}, func() error { return l.gen.SyncWeights(ctx, l.step) })
		if err != nil || l.dist.Rank() == 0 {
			return err
		}
		return l.gen.SyncWeights(ctx, l.step)
	}
	if l.dist.Rank() == 0 {
		if err := l.gen.SyncWeights(ctx, l.step); err != nil {
			return err
		}
	}
	if _, err := l.dist.AllGather(ctx, []byte{1}); err != nil {
		return fmt.Errorf("wait for rank 0's push: %w", err)
	}
	if l.dist.Rank() == 0 {
		return nil
	}
	return l.gen.SyncWeights(ctx, l.step)
}

// rankRange is the part [lo, hi) of n items that rank takes of size
// ranks; n is a multiple of size (whole groups per rank).
func rankRange(n, rank, size int) (lo, hi int) {
	per := n / size
	return rank * per, (rank + 1) * per
}

// roundPart is one rank's rollouts of a round, as the trainer needs them
// once the rollouts are done: samples, scores, the phase times and
// counters, and (when trajectories are logged) their records.
type roundPart struct {
	Samples      []grpo.Sample
	Scores       []reward.Scores
	Failures     int
	FirstFailure string
	Stats        roundStats
	Records      []trajectoryRecord
	// Outcomes are the gathered groups' rewards (set after the gather).
	Outcomes []curriculum.Outcome
}

// toolCounts are a round's tool calls: how many, how many failed, and the
// first error.
type toolCounts struct {
	Calls, Failed int
	Example       string
}

// wireRoundPart is roundPart as it crosses the process group: errors as
// text, records as JSON (their turns hold arbitrary JSON values).
type wireRoundPart struct {
	Samples      []grpo.Sample
	Scores       []wireScores
	Failures     int
	FirstFailure string
	Stats        wireRoundStats
	Tools        toolCounts
	Records      [][]byte
}

type wireScores struct {
	Values []float64
	Total  float64
	Err    string
}

type wireRoundStats struct {
	RolloutTime        time.Duration
	Outcomes           map[string]int
	FormatErrors       int
	AssistantTurns     int
	AgentRollouts      int
	PrefixBreaks       int
	EnvBusy, GenBusy   time.Duration
	EnvSpans, GenSpans []rollout.Span
}

func (p *roundPart) wire() (wireRoundPart, error) {
	w := wireRoundPart{Samples: p.Samples, Failures: p.Failures, FirstFailure: p.FirstFailure, Tools: p.Stats.Tools,
		Stats: wireRoundStats{RolloutTime: p.Stats.RolloutTime, Outcomes: p.Stats.Outcomes, FormatErrors: p.Stats.FormatErrors, AssistantTurns: p.Stats.AssistantTurns,
			AgentRollouts: p.Stats.AgentRollouts, PrefixBreaks: p.Stats.PrefixBreaks, EnvBusy: p.Stats.EnvBusy, GenBusy: p.Stats.GenBusy, EnvSpans: p.Stats.EnvSpans, GenSpans: p.Stats.GenSpans}}
	for _, s := range p.Scores {
		ws := wireScores{Values: s.Values, Total: s.Total}
		if s.Err != nil {
			ws.Err = s.Err.Error()
		}
		w.Scores = append(w.Scores, ws)
	}
	for _, r := range p.Records {
		b, err := json.Marshal(r)
		if err != nil {
			return w, fmt.Errorf("encode trajectory: %w", err)
		}
		w.Records = append(w.Records, b)
	}
	return w, nil
}

// appendWire appends another rank's part (in rank order, so the merged
// round is the global round in task order).
func (p *roundPart) appendWire(w wireRoundPart) error {
	p.Samples = append(p.Samples, w.Samples...)
	for _, s := range w.Scores {
		sc := reward.Scores{Values: s.Values, Total: s.Total}
		if s.Err != "" {
			sc.Err = errors.New(s.Err)
		}
		p.Scores = append(p.Scores, sc)
	}
	p.Failures += w.Failures
	if p.FirstFailure == "" {
		p.FirstFailure = w.FirstFailure
	}
	ws := w.Stats
	// Ranks roll out at once: the round took as long as the slowest.
	rt := max(p.Stats.RolloutTime, ws.RolloutTime)
	p.Stats.add(roundStats{Outcomes: ws.Outcomes, FormatErrors: ws.FormatErrors, AssistantTurns: ws.AssistantTurns, AgentRollouts: ws.AgentRollouts,
		PrefixBreaks: ws.PrefixBreaks, EnvBusy: ws.EnvBusy, GenBusy: ws.GenBusy, EnvSpans: ws.EnvSpans, GenSpans: ws.GenSpans, Tools: w.Tools})
	p.Stats.RolloutTime = rt
	for _, b := range w.Records {
		var r trajectoryRecord
		if err := json.Unmarshal(b, &r); err != nil {
			return fmt.Errorf("decode a trajectory of another rank: %w", err)
		}
		p.Records = append(p.Records, r)
	}
	return nil
}

// gatherRound returns the global round: every rank's part, in rank order.
// Trajectory records are decoded only where they are kept (the rank that
// logs them).
func gatherRound(ctx context.Context, g collectives, local *roundPart, keepRecords bool) (*roundPart, error) {
	w, err := local.wire()
	if err != nil {
		return nil, err
	}
	parts, err := gatherGob(ctx, g, w)
	if err != nil {
		return nil, fmt.Errorf("gather the round's rollouts: %w", err)
	}
	out := &roundPart{Stats: roundStats{Outcomes: map[string]int{}}}
	for _, p := range parts {
		if !keepRecords {
			p.Records = nil
		}
		if err := out.appendWire(p); err != nil {
			return nil, err
		}
	}
	return out, nil
}

// gatherGob all-gathers one gob-encoded value per rank.
func gatherGob[T any](ctx context.Context, g collectives, v T) ([]T, error) {
	var buf bytes.Buffer
	if err := gob.NewEncoder(&buf).Encode(v); err != nil {
		return nil, fmt.Errorf("encode: %w", err)
	}
	all, err := g.AllGather(ctx, buf.Bytes())
	if err != nil {
		return nil, err
	}
	out := make([]T, len(all))
	for i, b := range all {
		if err := gob.NewDecoder(bytes.NewReader(b)).Decode(&out[i]); err != nil {
			return nil, fmt.Errorf("decode rank %d's part: %w", i, err)
		}
	}
	return out, nil
}

// localSlice is rank's part of a global micro-batch: B of its P*B rows,
// with the round's active-token count divided by P (grpo-reference.md
// §4: the dapo normaliser is the global count over P, and the gradients
// are averaged over ranks).
func localSlice(mb grpo.MicroBatch, rank, size int) grpo.MicroBatch {
	lo, hi := rankRange(len(mb.Rows), rank, size)
	out := mb
	out.Rows = mb.Rows[lo:hi]
	out.RoundTokens = mb.RoundTokens / float64(size)
	return out
}

// rankLogprobs are one rank's old and reference log-probs of its slices
// of a round's micro-batches, in micro-batch then row order.
type rankLogprobs struct {
	Old, Ref [][]float32
}

// addReferenceLogprobsDist computes the old and reference log-probs of
// this rank's slices only, then gathers them, so every rank holds the
// round complete (rank 0 checkpoints it; every rank resumes from it).
func (l *stepLoop) addReferenceLogprobsDist(ctx context.Context, mbs []grpo.MicroBatch, m *StepMetrics) error {
	if !l.cfg.Shape.needOldLogprobs(l.cfg.UseSamplerLogps) && l.cfg.Loss.Beta <= 0 {
		return nil
	}
	rank, size := l.dist.Rank(), l.dist.WorldSize()
	var local []grpo.Row
	for _, mb := range mbs {
		local = append(local, localSlice(mb, rank, size).Rows...)
	}
	local = append([]grpo.Row(nil), local...)
	if err := l.addReferenceLogprobs(ctx, local, m); err != nil {
		return err
	}
	mine := rankLogprobs{}
	for _, r := range local {
		mine.Old = append(mine.Old, r.OldLogprobs)
		mine.Ref = append(mine.Ref, r.RefLogprobs)
	}
	all, err := gatherGob(ctx, l.dist, mine)
	if err != nil {
		return fmt.Errorf("gather log-probs: %w", err)
	}
	for r, lp := range all {
		i := 0
		for s := range mbs {
			lo, hi := rankRange(len(mbs[s].Rows), r, size)
			for j := lo; j < hi; j++ {
				if i >= len(lp.Old) || i >= len(lp.Ref) {
					return fmt.Errorf("gather log-probs: rank %d sent %d rows", r, len(lp.Old))
				}
				mbs[s].Rows[j].OldLogprobs, mbs[s].Rows[j].RefLogprobs = lp.Old[i], lp.Ref[i]
				i++
			}
		}
	}
	if l.cfg.UseSamplerLogps {
		var global []grpo.Row
		for _, mb := range mbs {
			global = append(global, mb.Rows...)
		}
		addSamplingMetrics(global, l.cfg.Loss, m)
	}
	return nil
}
