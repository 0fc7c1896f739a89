package train

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"

	"github.com/ortrain/ortrain/internal/config"
	"github.com/ortrain/ortrain/internal/grpo"
	"github.com/ortrain/ortrain/internal/runlock"
	"github.com/ortrain/ortrain/internal/worker"
)

// Trainer is the seam other ways of training (`ortrain sft`) plug into: the
// run directory (fresh, --resume, --overwrite), the policy on the worker
// (full or LoRA, from the checkpoint when resuming), the ranks of a
// data-parallel run, the optimizer step over a BatchSource (step.go), and
// checkpoints in the layout `ortrain run` writes and reads. `ortrain run`'s
// loop uses the same step, reducer and checkpoint writer.
type Trainer struct {
	cfg        *config.Config
	ro         RunOptions
	modelDir   string
	resumeDir  string
	resumeStep int
	lib        *worker.Library
	policy     *workerPolicy
	group      *worker.Group
	rd         *runDir
	phases     stepPhases
	lock       *runlock.Lock // rank 0's hold on output_dir
}

// PolicySettings are the policy's training settings when they do not come
// from the grpo section: LoRA, AdamW and gradient checkpointing.
type PolicySettings struct {
	LoRA                  config.LoRAConfig
	WeightDecay           float64
	AdamBeta1, AdamBeta2  float64
	AdamEpsilon           float64
	MaxGradNorm           float64
	GradientCheckpointing bool
}

// TrainerOptions configure OpenTrainer.
type TrainerOptions struct {
	RunOptions
	Policy PolicySettings
	Loss   grpo.LossConfig
	// GA is the number of micro-steps per optimizer step.
	GA int
	// Kind names the run in manifest.json ("sft"); Extra is recorded there.
	Kind  string
	Extra any
	// ResumeChanges lists what a resume may not change (config.ResumeChanges
	// when nil).
	ResumeChanges func(saved, now *config.Config) []config.Change
}

// OpenTrainer prepares output_dir, loads the policy and joins the process
// group. On error nothing is left open and a fresh output_dir it created
// is removed again.
func OpenTrainer(ctx context.Context, cfg *config.Config, to TrainerOptions) (_ *Trainer, err error) {
	ro := to.RunOptions
	t := &Trainer{cfg: cfg, ro: ro, phases: stepPhases{GA: to.GA, Loss: to.Loss,
		StepTimeout: cfg.Worker.StepTimeout, OptimizerTimeout: cfg.Worker.OptimizerTimeout, PackTokens: cfg.Worker.PackTokens}}
	if ro.rank0() {
		if err := checkFreshRunDir(cfg.OutputDir, ro); err != nil {
			return nil, err
		}
	}
	var accepted []config.Change // settings --resume-with-changes let through
	if ro.Resume {
		if t.resumeDir, t.resumeStep, err = LatestCheckpoint(cfg.OutputDir); err != nil {
			return nil, fmt.Errorf("--resume: %w", err)
		}
		if ro.rank0() {
			saved, err := config.LoadFile(filepath.Join(cfg.OutputDir, "config.yaml"))
			if err != nil {
				return nil, fmt.Errorf("--resume: read the run's config.yaml: %w", err)
			}
			changes := config.ResumeChanges
			if to.ResumeChanges != nil {
				changes = to.ResumeChanges
			}
			ch := changes(saved, cfg)
			if len(ch) > 0 && !ro.ResumeWithChanges {
				return nil, &config.ResumeChangedError{Changes: ch}
			}
			accepted = ch
		}
	}
	created := missingDirs(cfg.OutputDir)
	if err := os.MkdirAll(cfg.OutputDir, 0o755); err != nil {
		return nil, fmt.Errorf("create output_dir: %w", err)
	}
	defer func() {
		if err != nil {
			t.Close()
			removeCreatedDirs(created)
		}
	}()
	if ro.rank0() {
		// One live writer per run directory (runlock), held until Close.
		kind := to.Kind
		if kind == "" {
			kind = "train"
		}
		if t.lock, err = runlock.Acquire(cfg.OutputDir, kind); err != nil {
			return nil, err
		}
	}
	if t.modelDir, err = PrepareModel(cfg, ro.Getenv, ro.Logger); err != nil {
		return nil, err
	}
	pcfg := policyConfig(cfg, to.Policy)
	if t.lib, t.policy, err = loadPolicy(ctx, pcfg, t.modelDir, t.resumeDir, false, ro.World, ro.Getenv, ro.Logger); err != nil {
		return nil, err
	}
	if ro.World.Distributed() {
		if t.group, err = joinGroup(ctx, cfg, ro.World, t.policy, ro.Logger); err != nil {
			return nil, err
		}
	} else {
		noteShardAlone(cfg, ro)
	}
	if ro.Overwrite && ro.rank0() {
		if err := clearEarlierRun(cfg.OutputDir, ro.World.Distributed()); err != nil {
			return nil, err
		}
	}
	t.rd = &runDir{}
	if ro.rank0() {
		if t.rd, err = openRunDir(cfg, t.modelDir, nil, ro, t.lib, t.resumeStep); err != nil {
			t.rd = nil
			return nil, err
		}
		if err := recordKind(cfg.OutputDir, to.Kind, to.Extra); err != nil {
			return nil, err
		}
		// What --resume-with-changes accepted, as train.Run records it.
		if len(accepted) > 0 {
			if err := recordResumeChanges(cfg.OutputDir, t.resumeStep, accepted); err != nil {
				return nil, err
			}
		}
	}
	return t, nil
}

// policyConfig is cfg with the policy settings in the places loadPolicy
// reads them.
func policyConfig(cfg *config.Config, ps PolicySettings) *config.Config {
	c := *cfg
	g := &c.GRPO
	g.LoRA, g.WeightDecay, g.AdamBeta1, g.AdamBeta2, g.AdamEpsilon = ps.LoRA, ps.WeightDecay, ps.AdamBeta1, ps.AdamBeta2, ps.AdamEpsilon
	g.MaxGradNorm, g.GradientCheckpointing = ps.MaxGradNorm, ps.GradientCheckpointing
	return &c
}

// recordKind adds the kind of run and its extra record to manifest.json.
func recordKind(dir, kind string, extra any) error {
	path := filepath.Join(dir, "manifest.json")
	var man manifest
	if err := ReadJSON(path, &man); err != nil {
		return err
	}
	rec := map[string]any{"kind": kind}
	if extra != nil {
		rec["details"] = extra
	}
	b, err := json.Marshal(rec)
	if err != nil {
		return err
	}
	man.Extra = b
	return writeJSONAtomic(path, man)
}

// ModelDir is the base model's directory.
func (t *Trainer) ModelDir() string { return t.modelDir }

// ResumeStep is the step of the checkpoint the run resumed from (0: fresh).
func (t *Trainer) ResumeStep() int { return t.resumeStep }

// ResumeDir is the checkpoint the run resumed from ("": fresh).
func (t *Trainer) ResumeDir() string { return t.resumeDir }

// ResumeState decodes the resumed checkpoint's trainer_state.json into v.
func (t *Trainer) ResumeState(v any) error {
	if t.resumeDir == "" {
		return errors.New("not resuming")
	}
	return ReadJSON(filepath.Join(t.resumeDir, "trainer_state.json"), v)
}

// Rank and WorldSize place this process in a data-parallel run.
func (t *Trainer) Rank() int { return t.ro.World.Rank }

// PassesAreCollective says whether every Logprobs call is a collective
// (parameters sharded over the ranks): each rank must then make the same
// calls, whatever its share of the rows.
func (t *Trainer) PassesAreCollective() bool {
	return t.group != nil && t.group.Shard() == worker.ShardParameters
}
func (t *Trainer) WorldSize() int { return reducerOf(t.collectives()).worldSize() }

func (t *Trainer) collectives() collectives {
	if t.group == nil {
		return nil
	}
	return t.group
}

// StepResult is one optimizer step's outcome: every rank's loss statistics
// (one per micro-step) and the gradient norm before clipping.
type StepResult struct {
	Stats    []worker.LossStats
	GradNorm float64
}

// Step runs one optimizer step (number step, 1-based) over src at lr. A
// step that fails before the optimizer ran leaves the weights as they were
// (its gradients are discarded); the caller rewinds its source.
func (t *Trainer) Step(ctx context.Context, src BatchSource, step int, lr float64, m *StepMetrics) (StepResult, error) {
	out, err := runOptimizerStep(ctx, t.policy, src, reducerOf(t.collectives()), t.phases, step, lr, m)
	if err != nil {
		var optErr *OptimizerError
		if !errors.As(err, &optErr) {
			dctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), t.cfg.Worker.OptimizerTimeout)
			defer cancel()
			if derr := t.policy.DiscardGradients(dctx); derr != nil {
				err = errors.Join(err, fmt.Errorf("discard the step's gradients: %w", derr))
			}
		}
		return StepResult{}, err
	}
	return StepResult{Stats: out.Stats, GradNorm: out.GradNorm}, nil
}

// Logprobs scores rows with the current weights (no gradients), bounded by
// worker.logprob_timeout.
func (t *Trainer) Logprobs(ctx context.Context, rows []grpo.Row) ([][]float32, error) {
	var lp [][]float32
	err := withDeadline(ctx, t.cfg.Worker.LogprobTimeout, func(c context.Context) (err error) {
		lp, err = t.policy.Logprobs(c, rows, 1, false)
		return err
	})
	return lp, err
}

// SumAcrossRanks adds values over the ranks (one rank: values).
func (t *Trainer) SumAcrossRanks(ctx context.Context, values []float64) ([]float64, error) {
	if t.group == nil {
		return values, nil
	}
	return t.group.AllReduceSum(ctx, values)
}

// SaveCheckpoint writes checkpoint step (weights or adapter, optimizer,
// state) on rank 0, bounded by worker.save_timeout; other ranks write only
// their optimizer slice when it is sharded, and return "".
func (t *Trainer) SaveCheckpoint(ctx context.Context, step int, state any) (string, error) {
	ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), t.cfg.Worker.SaveTimeout)
	defer cancel()
	if !t.ro.rank0() {
		return "", t.policy.saveShard(ctx, step)
	}
	path, err := writeCheckpoint(t.cfg.OutputDir, step, state, func(tmp string) error {
		return t.policy.writeCheckpoint(ctx, tmp, step)
	})
	if err != nil {
		return "", err
	}
	_ = t.policy.checkpointPublished(step) // best effort, as in run's saveCheckpoint
	return path, nil
}

// CheckpointWeights is the weights of checkpoint ckpt as `run --model`
// takes them, for a process that did not train it: the adapter of a LoRA
// run, else the full model.
func CheckpointWeights(ckpt string) string {
	if st, err := os.Stat(filepath.Join(ckpt, ckptAdapterDir)); err == nil && st.IsDir() {
		return filepath.Join(ckpt, ckptAdapterDir)
	}
	return filepath.Join(ckpt, ckptModelDir)
}

// CheckpointModel is where a checkpoint keeps what `ortrain run --model`
// (full weights) or an adapter-aware eval (LoRA) loads.
func (t *Trainer) CheckpointModel(ckpt string) string {
	if t.policy.lora {
		return filepath.Join(ckpt, ckptAdapterDir)
	}
	return filepath.Join(ckpt, ckptModelDir)
}

// WriteMetrics appends one step's metrics to metrics.jsonl (and
// TensorBoard) on rank 0.
func (t *Trainer) WriteMetrics(step int, m map[string]float64) error {
	if t.rd == nil {
		return nil
	}
	return t.rd.writeMetrics(step, m)
}

// Close releases the run directory's files, the group, the policy and the
// library.
func (t *Trainer) Close() {
	if t.rd != nil {
		t.rd.close()
	}
	defer t.lock.Release() // last: the directory is ours until everything is closed
	if t.group != nil {
		_ = t.group.Close()
	}
	if t.policy != nil {
		t.policy.m.Close()
	}
	if t.lib != nil {
		_ = t.lib.Close()
	}
}
