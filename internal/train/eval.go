package train

import (
	"context"
	"errors"
	"fmt"
	"math"
	"os"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"time"
	"unicode"

	"github.com/rs/zerolog"

	"github.com/ortrain/ortrain/internal/config"
	"github.com/ortrain/ortrain/internal/engine"
	"github.com/ortrain/ortrain/internal/model"
	"github.com/ortrain/ortrain/internal/rollout"
)

// EvalOptions configure Evaluate.
type EvalOptions struct {
	Logger zerolog.Logger
	Getenv func(string) string
	// NumGenerations is n, the rollouts per task (pass@k needs k <= n).
	NumGenerations int
	// PassThreshold: a rollout passes when its reward is at least this.
	PassThreshold float64
	OnRollout     func(*rollout.Trajectory)
	// OnStart reports the number of rollouts about to run.
	OnStart func(total int)
	// Dir is the eval's own directory (result.json, trajectories.jsonl);
	// empty picks NewEvalDir(cfg.Model, cfg.OutputDir, now). An eval never
	// writes to the files of a training run.
	Dir string
}

// TaskEval is one task's results.
type TaskEval struct {
	Env      string             `json:"env"`
	Split    string             `json:"split"`
	Index    int                `json:"task_index"`
	Rewards  []float64          `json:"rewards"`
	Mean     float64            `json:"mean_reward"`
	Passes   int                `json:"passes"`
	PassAtK  map[string]float64 `json:"pass_at_k"`
	Failures int                `json:"failed_rollouts"`
}

// EvalResult summarises an evaluation.
type EvalResult struct {
	Tasks      []TaskEval         `json:"tasks"`
	MeanReward float64            `json:"mean_reward"`
	PassAtK    map[string]float64 `json:"pass_at_k"`
	Rollouts   int                `json:"rollouts"`
	Failures   int                `json:"failed_rollouts"`
	Duration   float64            `json:"seconds"`
	Ks         []int              `json:"ks"`
	Trajectory string             `json:"trajectories,omitempty"`

	// What was evaluated: the model directory, its weights' hash
	// (model.Hash) and, when the model is a run's checkpoint, its step.
	// internal/report reads these keys from RUN_DIR/eval/<name>/result.json.
	CheckpointStep *int   `json:"checkpoint_step,omitempty"`
	Model          string `json:"model"`
	ModelHash      string `json:"model_hash"`
	// Adapter is the PEFT adapter evaluated over Model (LoRA runs).
	Adapter string `json:"adapter,omitempty"`
	// Rewards are each reward function's mean and std over the rollouts
	// (rewards/<name>/mean, as in training); pass@k is on their weighted sum.
	Rewards map[string]float64 `json:"rewards,omitempty"`
	// Dir is the eval's directory; Result is its result.json.
	Dir    string `json:"-"`
	Result string `json:"-"`
}

// Evaluate runs NumGenerations rollouts of every configured task with the
// policy's current weights, without training, and reports per-task mean
// reward and pass@k (unbiased estimator, Chen et al. 2021).
func Evaluate(ctx context.Context, cfg *config.Config, eo EvalOptions) (*EvalResult, error) {
	start := time.Now()
	if len(cfg.Envs) == 0 {
		return nil, &config.FieldError{Field: "envs", Value: "[]", Allowed: "at least one environment"}
	}
	if eo.NumGenerations < 1 {
		return nil, &config.FieldError{Field: "num_generations", Value: eo.NumGenerations, Allowed: "at least 1"}
	}
	target, err := resolveEvalModel(cfg)
	if err != nil {
		return nil, err
	}
	if cfg, err = target.configFor(cfg); err != nil {
		return nil, err
	}
	st, err := buildStack(ctx, cfg, stackOptions{getenv: eo.Getenv, logger: eo.Logger, adapterDir: target.adapter,
		engine: func(ctx context.Context, _ string, p *workerPolicy, _ *stack) (engine.Generator, error) {
			return newBuiltinEngine(ctx, cfg, p.m, eo.Logger)
		},
	})
	if err != nil {
		return nil, err
	}
	defer st.close()
	envList, runner := st.envs, st.runner
	var tasks []rollout.Task
	for ei, e := range envList {
		for _, idx := range e.Indices {
			for range eo.NumGenerations {
				tasks = append(tasks, rollout.Task{Env: ei, Split: e.Config.Split, Index: idx, Secrets: e.Config.Secrets,
					Seed: seeds(cfg.Seed).eval(len(tasks))})
			}
		}
	}
	if eo.OnStart != nil {
		eo.OnStart(len(tasks))
	}
	trajs := runner.RunAll(ctx, tasks, eo.OnRollout)
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	// The run's reward functions score the rollouts: pass@k is on their
	// weighted sum, and each function's mean is reported.
	keys := make([]string, len(envList))
	for i, e := range envList {
		keys[i] = e.Key
	}
	scores, err := scoreRollouts(ctx, st.rewards, trajs, keys)
	if err != nil {
		return nil, err
	}
	totals := make([]float64, len(scores))
	for i, s := range scores {
		totals[i] = s.Total
	}
	res := summarize(trajs, totals, envList, eo)
	res.Rewards = st.rewards.Metrics(scores)
	res.Duration = time.Since(start).Seconds()
	if res.Model, err = filepath.Abs(st.modelDir); err != nil {
		return nil, fmt.Errorf("resolve model path %s: %w", st.modelDir, err)
	}
	if res.ModelHash, err = model.Hash(st.modelDir); err != nil {
		return nil, fmt.Errorf("hash model %s: %w", st.modelDir, err)
	}
	source := res.Model
	if target.adapter != "" {
		if res.Adapter, err = filepath.Abs(target.adapter); err != nil {
			return nil, err
		}
		source = res.Adapter
	}
	if err := writeEvalDir(res, trajs, totals, cfg, eo.Dir, source); err != nil {
		return nil, err
	}
	return res, nil
}

// writeEvalDir creates the eval's directory and writes its trajectories
// (when logging.log_completions is on) and result.json, last, so a
// directory with result.json holds a finished eval.
func writeEvalDir(res *EvalResult, trajs []*rollout.Trajectory, totals []float64, cfg *config.Config, dir, source string) error {
	var step *int
	if dir == "" {
		var err error
		if dir, step, err = NewEvalDir(source, cfg.OutputDir, time.Now()); err != nil {
			return err
		}
	} else {
		if _, s, ok := checkpointOf(source); ok {
			step = &s
		}
		if err := os.MkdirAll(dir, 0o755); err != nil {
			return fmt.Errorf("create eval directory: %w", err)
		}
	}
	res.Dir, res.CheckpointStep = dir, step
	if cfg.Logging.LogCompletions {
		path := filepath.Join(dir, "trajectories.jsonl")
		if err := writeEvalTrajectories(path, trajs, totals); err != nil {
			return err
		}
		res.Trajectory = path
	}
	res.Result = filepath.Join(dir, "result.json")
	if err := writeJSONAtomic(res.Result, res); err != nil {
		return fmt.Errorf("write eval result: %w", err)
	}
	return nil
}

// NewEvalDir creates and returns a fresh directory for an eval of the model
// at modelPath: RUN/eval/<step>-<time>/ when modelPath is a run's
// checkpoint (RUN/checkpoints/step-N or its model/), else
// outputDir/eval/<model>-<time>/. The path is absolute, so every message
// names it the same way. step is the checkpoint's step, nil otherwise.
func NewEvalDir(modelPath, outputDir string, now time.Time) (dir string, step *int, err error) {
	stamp := now.UTC().Format("20060102-150405")
	parent, name := filepath.Join(outputDir, "eval"), evalName(modelPath)+"-"+stamp
	if run, n, ok := checkpointOf(modelPath); ok {
		parent, name, step = filepath.Join(run, "eval"), fmt.Sprintf("%06d-%s", n, stamp), &n
	}
	if parent, err = filepath.Abs(parent); err != nil {
		return "", nil, fmt.Errorf("eval directory: %w", err)
	}
	if err := os.MkdirAll(parent, 0o755); err != nil {
		return "", nil, fmt.Errorf("create eval directory: %w", err)
	}
	// Two evals started in the same second get distinct directories.
	for i := 1; ; i++ {
		dir = filepath.Join(parent, name)
		if i > 1 {
			dir = fmt.Sprintf("%s-%d", dir, i)
		}
		err := os.Mkdir(dir, 0o755)
		if err == nil {
			return dir, step, nil
		}
		if !errors.Is(err, os.ErrExist) || i >= 1000 {
			return "", nil, fmt.Errorf("create eval directory: %w", err)
		}
	}
}

// checkpointOf recognises a run's checkpoint path, RUN/checkpoints/step-N
// or RUN/checkpoints/step-N/model, and returns RUN and N.
func checkpointOf(path string) (run string, step int, ok bool) {
	p := filepath.Clean(path)
	if b := filepath.Base(p); b == ckptModelDir || b == ckptAdapterDir {
		p = filepath.Dir(p)
	}
	digits, found := strings.CutPrefix(filepath.Base(p), "step-")
	if !found {
		return "", 0, false
	}
	n, err := strconv.Atoi(digits)
	if err != nil || n < 0 || filepath.Base(filepath.Dir(p)) != "checkpoints" {
		return "", 0, false
	}
	return filepath.Dir(filepath.Dir(p)), n, true
}

// summarize reduces the rollouts' rewards (totals, one per rollout) to
// per-task means and pass@k; a failed or unscored rollout counts as 0.
func summarize(trajs []*rollout.Trajectory, totals []float64, envList []*runEnv, eo EvalOptions) *EvalResult {
	n := eo.NumGenerations
	res := &EvalResult{Rollouts: len(trajs), PassAtK: map[string]float64{}}
	for k := 1; k <= n; k *= 2 {
		res.Ks = append(res.Ks, k)
	}
	if res.Ks[len(res.Ks)-1] != n {
		res.Ks = append(res.Ks, n)
	}
	total := 0.0
	for i := 0; i < len(trajs); i += n {
		group := trajs[i : i+n]
		t0 := group[0].Task
		te := TaskEval{Env: envList[t0.Env].Key, Split: t0.Split, Index: t0.Index, PassAtK: map[string]float64{}}
		for j, tr := range group {
			r := totals[i+j]
			if tr.Outcome.Failed() {
				te.Failures++
			}
			if tr.Outcome.Failed() || math.IsNaN(r) {
				r = 0
			}
			te.Rewards = append(te.Rewards, r)
			te.Mean += r / float64(n)
			if r >= eo.PassThreshold {
				te.Passes++
			}
		}
		for _, k := range res.Ks {
			te.PassAtK[fmt.Sprintf("pass@%d", k)] = passAtK(n, te.Passes, k)
		}
		res.Failures += te.Failures
		total += te.Mean
		res.Tasks = append(res.Tasks, te)
	}
	sort.SliceStable(res.Tasks, func(a, b int) bool {
		if res.Tasks[a].Env != res.Tasks[b].Env {
			return res.Tasks[a].Env < res.Tasks[b].Env
		}
		return res.Tasks[a].Index < res.Tasks[b].Index
	})
	if len(res.Tasks) > 0 {
		res.MeanReward = total / float64(len(res.Tasks))
		for _, k := range res.Ks {
			key := fmt.Sprintf("pass@%d", k)
			s := 0.0
			for _, t := range res.Tasks {
				s += t.PassAtK[key]
			}
			res.PassAtK[key] = s / float64(len(res.Tasks))
		}
	}
	return res
}

// passAtK is the unbiased estimator 1 - C(n-c, k) / C(n, k) of the chance
// that at least one of k samples (out of n with c passing) passes.
func passAtK(n, c, k int) float64 {
	if n-c < k {
		return 1
	}
	p := 1.0
	for i := n - c + 1; i <= n; i++ {
		p *= 1 - float64(k)/float64(i)
	}
	return 1 - p
}

func writeEvalTrajectories(path string, trajs []*rollout.Trajectory, totals []float64) error {
	w, err := openJSONL(path)
	if err != nil {
		return err
	}
	defer w.Close()
	for i, t := range trajs {
		r := totals[i]
		if t.Outcome.Failed() {
			r = math.NaN()
		}
		if err := w.Write(newTrajectoryRecord(0, t, r, 0)); err != nil {
			return err
		}
	}
	return nil
}

// evalName is a model's name as a directory name: the last element of its
// path or repo id (Qwen/Qwen3-4B → Qwen3-4B).
func evalName(modelPath string) string {
	name := filepath.Base(filepath.Clean(modelPath))
	name = strings.Map(func(r rune) rune {
		if r == '-' || r == '_' || r == '.' || unicode.IsLetter(r) || unicode.IsDigit(r) {
			return r
		}
		return '-'
	}, name)
	if name == "" || name == "." || name == ".." {
		return "model"
	}
	return name
}
