package sft

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"math"
	"math/rand/v2"
	"os"
	"path/filepath"
	"strings"
	"time"

	"github.com/ortrain/ortrain/internal/config"
	"github.com/ortrain/ortrain/internal/grpo"
	"github.com/ortrain/ortrain/internal/train"
	"github.com/ortrain/ortrain/internal/worker"
)

// RunOptions are what an SFT run needs beyond its config (the run
// directory, ranks, resume and logging options `ortrain run` has).
type RunOptions struct {
	train.RunOptions
	// OnMetrics receives every logged step's metrics.
	OnMetrics func(step int, m map[string]float64)
}

// Result summarises a finished (or interrupted) SFT run.
type Result struct {
	RunDir     string
	Steps      int
	MaxSteps   int
	Checkpoint string // the last checkpoint written
	// Model is the checkpoint's weights (`ortrain run --model` takes it) or
	// its adapter (LoRA).
	Model string
	Data  DataStats
	First map[string]float64
	Last  map[string]float64
}

// DataStats count what became of the data's rows.
type DataStats struct {
	File      string `json:"file"`
	SHA256    string `json:"sha256"`
	Rows      int    `json:"rows"`       // rows trained on
	EvalRows  int    `json:"eval_rows"`  // rows held out
	Skipped   int    `json:"skipped"`    // unusable rows skipped (sft.skip_bad_rows)
	Truncated int    `json:"truncated"`  // rows cut at max_length
	Tokens    int    `json:"tokens"`     // tokens of the training rows
	Trained   int    `json:"trained"`    // trained (assistant) tokens of the training rows
	MaxTokens int    `json:"max_tokens"` // longest training row
}

// state is trainer_state.json of an SFT checkpoint.
type state struct {
	Step      int   `json:"step"`
	Position  int64 `json:"position"` // rows drawn
	NumTokens int   `json:"num_tokens"`
}

// Run fine-tunes cfg.Model on cfg.SFT.Data. On ctx's cancellation it saves
// the last completed step and returns an error wrapping train.ErrInterrupted.
func Run(ctx context.Context, cfg *config.Config, ro RunOptions) (res *Result, err error) {
	if err := cfg.ValidateSFT(); err != nil {
		return nil, err
	}
	s := cfg.SFT
	modelDir, err := train.PrepareModel(cfg, ro.Getenv, ro.Logger)
	if err != nil {
		return nil, err
	}
	spec, err := train.LoadChat(modelDir, cfg.Chat)
	if err != nil {
		return nil, err
	}
	enc := &Encoder{
		Tokenizer: spec.Tokenizer, Template: spec.Template, Format: spec.Format, Kwargs: spec.Kwargs,
		System: cfg.Chat.SystemPrompt, HideTools: spec.HideTools,
		AssistantOnly: s.AssistantOnlyLoss, CompletionOnly: s.CompletionOnlyLoss,
		MaxLength: s.MaxLength, Refuse: s.TruncationMode == "refuse",
	}
	trainRows, evalRows, stats, err := loadRows(s, enc, cfg.Seed)
	if err != nil {
		return nil, err
	}
	world := max(1, ro.World.WorldSize)
	if len(trainRows) < s.PerDeviceTrainBatchSize*world*s.GradientAccumulationSteps {
		return nil, &config.FieldError{Field: "sft.per_device_train_batch_size", Value: s.PerDeviceTrainBatchSize,
			Allowed: fmt.Sprintf("at most what the data fills: %d training rows, and one step takes batch size x gradient_accumulation_steps (%d) x ranks (%d)", len(trainRows), s.GradientAccumulationSteps, world)}
	}
	// TRL's defaults for what the sft loss ignores (clips, IS caps), so the
	// worker's checks of them pass.
	loss := grpo.DefaultLossConfig()
	loss.Type, loss.Temperature, loss.Beta = grpo.LossSFT, 1, 0
	tr, err := train.OpenTrainer(ctx, cfg, train.TrainerOptions{
		RunOptions: ro.RunOptions, Loss: loss, GA: s.GradientAccumulationSteps, Kind: "sft", Extra: stats,
		ResumeChanges: resumeChanges(cfg.OutputDir, stats, ro.Resume),
		Policy: train.PolicySettings{LoRA: s.LoRA, WeightDecay: s.WeightDecay, AdamBeta1: s.AdamBeta1, AdamBeta2: s.AdamBeta2,
			AdamEpsilon: s.AdamEpsilon, MaxGradNorm: s.MaxGradNorm, GradientCheckpointing: s.GradientCheckpointing},
	})
	if err != nil {
		return nil, err
	}
	defer tr.Close()
	batches := NewBatches(trainRows, cfg.Seed, s.PerDeviceTrainBatchSize, world, s.GradientAccumulationSteps)
	total := s.MaxSteps
	if total == 0 {
		total = batches.StepsFor(s.NumTrainEpochs)
	}
	warmup := s.WarmupSteps
	if s.WarmupRatio > 0 {
		warmup = int(math.Ceil(s.WarmupRatio * float64(total)))
	}
	sched := worker.LRSchedule{Kind: s.LRSchedulerType, Peak: s.LearningRate, WarmupSteps: warmup, TotalSteps: total}
	if err := sched.Validate(); err != nil {
		return nil, &config.FieldError{Field: "sft.lr_scheduler_type", Value: s.LRSchedulerType, Allowed: err.Error()}
	}
	r := &runner{cfg: cfg, ro: ro, tr: tr, batches: batches, evalRows: evalRows, total: total, sched: sched}
	res = &Result{RunDir: cfg.OutputDir, MaxSteps: total, Data: stats}
	if tr.ResumeStep() > 0 {
		var st state
		if err := tr.ResumeState(&st); err != nil {
			return nil, fmt.Errorf("--resume: %w", err)
		}
		r.st = st
		r.saved, r.ckpt = st.Step, tr.ResumeDir()
		batches.Restore(st.Position)
		ro.Logger.Info().Int("step", st.Step).Msg("resumed")
	}
	if ro.OnStart != nil {
		ro.OnStart(total, r.st.Step)
	}
	ro.Logger.Info().Int("rows", stats.Rows).Int("eval_rows", stats.EvalRows).Int("truncated", stats.Truncated).
		Int("skipped", stats.Skipped).Int("steps", total).Int("trained_tokens", stats.Trained).Msg("sft data")
	runErr := r.loop(ctx, res)
	return r.finish(ctx, res, runErr)
}

// resumeChanges is config.SFTResumeChanges plus the data's contents: a
// file with the same name but other rows (sha256 against the run's
// manifest) would not continue the same run either.
func resumeChanges(dir string, now DataStats, resume bool) func(saved, cur *config.Config) []config.Change {
	var was struct {
		Extra struct {
			Details DataStats `json:"details"`
		} `json:"extra"`
	}
	if resume {
		// No manifest or no recorded hash: only the config is compared.
		_ = train.ReadJSON(filepath.Join(dir, "manifest.json"), &was)
	}
	return func(saved, cur *config.Config) []config.Change {
		ch := config.SFTResumeChanges(saved, cur)
		if old := was.Extra.Details.SHA256; old != "" && old != now.SHA256 {
			ch = append(ch, config.Change{Field: "sft.data (contents, sha256)", Old: old, New: now.SHA256})
		}
		return ch
	}
}

// loadRows reads and encodes the training data and the held-out rows.
func loadRows(s config.SFTConfig, enc *Encoder, seed int64) (trainRows, evalRows []grpo.Row, stats DataStats, err error) {
	stats.File = s.Data
	if stats.SHA256, err = fileSHA256(s.Data); err != nil {
		if errors.Is(err, fs.ErrNotExist) { // a usage error: name the flag and what writes one
			return nil, nil, stats, fmt.Errorf("%w: %w", &config.FieldError{Field: "sft.data", Value: s.Data,
				Allowed: "an existing JSONL file of conversations (--data FILE; `ortrain env demos` writes one)"}, err)
		}
		return nil, nil, stats, fmt.Errorf("sft.data: %w", err)
	}
	rows, st, err := encodeFile(s.Data, enc, s.SkipBadRows)
	if err != nil {
		return nil, nil, stats, err
	}
	stats.Skipped, stats.Truncated = st.Skipped, st.Truncated
	switch {
	case s.EvalData != "":
		erows, est, err := encodeFile(s.EvalData, enc, s.SkipBadRows)
		if err != nil {
			return nil, nil, stats, err
		}
		stats.Skipped += est.Skipped
		evalRows = erows
	case s.EvalSplit > 0:
		perm := rand.New(rand.NewPCG(uint64(seed), 0xe1a1)).Perm(len(rows))
		n := int(math.Round(s.EvalSplit * float64(len(rows))))
		held := map[int]bool{}
		for _, i := range perm[:n] {
			held[i] = true
		}
		var kept []grpo.Row
		for i, r := range rows {
			if held[i] {
				evalRows = append(evalRows, r)
			} else {
				kept = append(kept, r)
			}
		}
		rows = kept
	}
	if len(rows) == 0 {
		return nil, nil, stats, &config.FieldError{Field: "sft.eval_split", Value: s.EvalSplit, Allowed: "a fraction that leaves rows to train on"}
	}
	stats.Rows, stats.EvalRows = len(rows), len(evalRows)
	for _, r := range rows {
		stats.Tokens += len(r.Tokens)
		stats.MaxTokens = max(stats.MaxTokens, len(r.Tokens))
		for _, m := range r.LossMask {
			stats.Trained += int(m)
		}
	}
	return rows, evalRows, stats, nil
}

type encodeStats struct{ Skipped, Truncated int }

// encodeFile reads and encodes one file; a row that cannot be encoded is
// an error naming file, line and field, or skipped and counted.
func encodeFile(path string, enc *Encoder, skipBad bool) ([]grpo.Row, encodeStats, error) {
	var st encodeStats
	ds, err := ReadFile(path, ReadOptions{SkipBad: skipBad})
	if err != nil {
		return nil, st, err
	}
	st.Skipped = len(ds.Skipped)
	rows := make([]grpo.Row, 0, len(ds.Examples))
	for _, ex := range ds.Examples {
		e, err := enc.Encode(ex)
		if err != nil {
			var re *RowError
			if !errors.As(err, &re) {
				re = &RowError{Reason: err.Error()}
			}
			re.File, re.Line = path, ex.Line
			if skipBad {
				st.Skipped++
				continue
			}
			return nil, st, re
		}
		if e.Truncated {
			st.Truncated++
		}
		rows = append(rows, e.Row)
	}
	if len(rows) == 0 {
		return nil, st, fmt.Errorf("%s: %w: all %d rows were skipped", path, ErrEmptyData, st.Skipped)
	}
	return rows, st, nil
}

func fileSHA256(path string) (string, error) {
	f, err := os.Open(path)
	if err != nil {
		return "", err
	}
	defer f.Close()
	h := sha256.New()
	if _, err := io.Copy(h, f); err != nil {
		return "", err
	}
	return hex.EncodeToString(h.Sum(nil)), nil
}

// runner is one SFT run's loop state.
type runner struct {
	cfg      *config.Config
	ro       RunOptions
	tr       *train.Trainer
	batches  *Batches
	evalRows []grpo.Row
	total    int
	sched    worker.LRSchedule
	st       state
	saved    int // the step the last checkpoint holds
	ckpt     string
}

// loop trains until the last step or an error; the position stays at the
// last completed step.
func (r *runner) loop(ctx context.Context, res *Result) error {
	s := r.cfg.SFT
	for r.st.Step < r.total {
		if err := ctx.Err(); err != nil {
			return err
		}
		m, err := r.step(ctx)
		if err != nil {
			return err
		}
		step := r.st.Step
		evalNow := (s.EvalSteps > 0 && step%s.EvalSteps == 0) || step == r.total
		if len(r.evalRows) > 0 && evalNow {
			el, err := r.evalLoss(ctx)
			if err != nil {
				return fmt.Errorf("step %d: eval: %w", step, err)
			}
			m["eval_loss"] = el
		}
		if step%s.LoggingSteps == 0 || step == r.total || m["eval_loss"] != 0 {
			if err := r.tr.WriteMetrics(step, m); err != nil {
				return fmt.Errorf("step %d: write metrics: %w", step, err)
			}
			if r.ro.OnMetrics != nil {
				r.ro.OnMetrics(step, m)
			}
		}
		if res.First == nil {
			res.First = m
		}
		res.Last = m
		if s.SaveSteps > 0 && step%s.SaveSteps == 0 && step < r.total {
			if err := r.save(ctx); err != nil {
				return err
			}
		}
	}
	return nil
}

// step runs one optimizer step and returns its metrics.
func (r *runner) step(ctx context.Context) (map[string]float64, error) {
	start := time.Now()
	lr := r.sched.At(r.st.Step)
	var sm train.StepMetrics
	out, err := r.tr.Step(ctx, r.batches, r.st.Step+1, lr, &sm)
	if err != nil {
		r.batches.Restore(r.st.Position)
		return nil, err
	}
	tokens, _ := r.batches.StepTokens()
	r.batches.Commit()
	r.st.Step++
	r.st.Position = r.batches.Position()
	r.st.NumTokens += tokens
	var lossSum, active, correct float64
	for _, st := range out.Stats {
		lossSum += st.Loss
		active += st.ActiveTokens
		correct += st.CorrectTokens
	}
	elapsed := time.Since(start).Seconds()
	m := map[string]float64{
		"step":                float64(r.st.Step),
		"loss":                lossSum / float64(r.tr.WorldSize()),
		"mean_token_accuracy": correct / math.Max(1, active),
		"learning_rate":       lr,
		"grad_norm":           out.GradNorm,
		"epoch":               r.batches.Epoch(),
		"num_tokens":          float64(r.st.NumTokens),
		"trained_tokens":      active,
		"step_time":           elapsed,
		"tokens_per_second":   float64(tokens) / math.Max(elapsed, 1e-9),
	}
	// Measurements of the machine and the layout, as run reports them.
	for k, v := range sm.Map() {
		if strings.HasPrefix(k, "packing/") || strings.HasPrefix(k, "memory/") {
			m[k] = v
		}
	}
	return m, nil
}

// evalLoss is the mean cross-entropy over the held-out rows' trained
// tokens; each rank scores its share of the rows.
func (r *runner) evalLoss(ctx context.Context) (float64, error) {
	rank, ranks := r.tr.Rank(), r.tr.WorldSize()
	per := (len(r.evalRows) + ranks - 1) / ranks
	lo, hi := min(rank*per, len(r.evalRows)), min((rank+1)*per, len(r.evalRows))
	var sum, n float64
	b := max(1, r.cfg.SFT.PerDeviceTrainBatchSize)
	calls := (hi - lo + b - 1) / b
	if r.tr.PassesAreCollective() {
		calls = (per + b - 1) / b // as many passes as the rank with the most rows
	}
	for c := range calls {
		i := lo + c*b
		rows := r.evalRows[min(i, hi):min(i+b, hi)]
		filler := len(rows) == 0
		if filler {
			rows = r.evalRows[:1] // a pass that keeps this rank in step with the others; its result is not counted
		}
		lps, err := r.tr.Logprobs(ctx, rows)
		if err != nil {
			return 0, err
		}
		if filler {
			continue
		}
		for j, row := range rows {
			for k, mk := range row.LossMask {
				if mk == 1 {
					sum -= float64(lps[j][k])
					n++
				}
			}
		}
	}
	tot, err := r.tr.SumAcrossRanks(ctx, []float64{sum, n})
	if err != nil {
		return 0, err
	}
	return tot[0] / math.Max(1, tot[1]), nil
}

// save writes the checkpoint of the last completed step.
func (r *runner) save(ctx context.Context) error {
	path, err := r.tr.SaveCheckpoint(ctx, r.st.Step, r.st)
	if err != nil {
		return fmt.Errorf("checkpoint at step %d: %w", r.st.Step, err)
	}
	r.saved, r.ckpt = r.st.Step, path
	return nil
}

// finish saves the last completed step (after the last step, an interrupt
// or an error alike) unless it is saved already.
func (r *runner) finish(ctx context.Context, res *Result, runErr error) (*Result, error) {
	var optErr *train.OptimizerError
	if r.st.Step > 0 && r.st.Step != r.saved && !errors.As(runErr, &optErr) {
		if err := r.save(ctx); err != nil {
			runErr = errors.Join(runErr, err)
		}
	}
	res.Steps, res.Checkpoint = r.st.Step, r.ckpt
	if r.ckpt != "" {
		res.Model = r.tr.CheckpointModel(r.ckpt)
	}
	switch {
	case runErr == nil:
		return res, nil
	case ctx.Err() != nil:
		note := "checkpoint: " + r.ckpt + "; continue with --resume"
		switch {
		case r.ckpt != "":
		case r.st.Step == 0:
			note = "no step had completed: nothing was saved"
		default:
			note = "nothing was saved" // the save failed; the error says why
		}
		return res, fmt.Errorf("%w at step %d (%s): %v", train.ErrInterrupted, r.st.Step, note, runErr)
	}
	return res, runErr
}
