// Package smoke is `ortrain run --smoke`: a user's own config run for
// real on CPU in a minute, for CI before GPU hours are spent. The model is
// replaced by a tiny random one of the same family that keeps the
// config model's tokenizer and chat template (model.InitSmoke), so the
// prompts, tool definitions and tool-call parser are the real ones; the
// envs, chat settings, rewards and loss are the config's. Each stage is a
// verdict.Check: model files, chat template, each env's session and
// tools, a few training steps, the checkpoint, a resume, the rewards.
package smoke

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"sort"
	"strings"
	"sync"
	"time"

	"github.com/ortrain/ortrain/internal/config"
	"github.com/ortrain/ortrain/internal/model"
	"github.com/ortrain/ortrain/internal/rollout"
	"github.com/ortrain/ortrain/internal/train"
	"github.com/ortrain/ortrain/internal/verdict"
)

// Options shape a smoke run.
type Options struct {
	train.RunOptions
	// Dir holds the smoke model and run directory; "" uses a temporary
	// directory removed afterwards.
	Dir string
	// Steps is how many optimizer steps to train before the resume adds
	// one more (default 2).
	Steps int
	// Tasks bounds each env's tasks (default 4).
	Tasks int
	// EnvTimeout bounds each env call of the session check (default 2m).
	EnvTimeout time.Duration
}

// Run smoke-runs cfg. The error is for what stops the suite itself (a
// cancelled context, a directory it cannot create); everything cfg or its
// envs get wrong is a failed check in the verdict.
func Run(ctx context.Context, cfg *config.Config, o Options) (*verdict.Verdict, error) {
	if o.Steps <= 0 {
		o.Steps = 2
	}
	if o.Tasks <= 0 {
		o.Tasks = 4
	}
	if o.EnvTimeout <= 0 {
		o.EnvTimeout = 2 * time.Minute
	}
	if o.Getenv == nil {
		o.Getenv = func(string) string { return "" }
	}
	dir := o.Dir
	if dir == "" {
		tmp, err := os.MkdirTemp("", "ortrain-smoke-*")
		if err != nil {
			return nil, fmt.Errorf("smoke: %w", err)
		}
		defer os.RemoveAll(tmp)
		dir = tmp
	} else if err := os.MkdirAll(dir, 0o755); err != nil {
		return nil, fmt.Errorf("smoke: %w", err)
	}
	start := time.Now()
	s := &suite{ctx: ctx, cfg: cfg, o: o, dir: dir, v: &verdict.Verdict{Suite: "smoke run", Target: cfg.Model}}
	s.modelFiles()
	s.chatTemplate()
	for i := range cfg.Envs {
		s.env(i)
	}
	s.train()
	s.v.Duration = time.Since(start)
	return s.v, ctx.Err()
}

// suite carries what later checks need from earlier ones; a "why" is set
// when the check providing it failed, and checks needing it are skipped.
type suite struct {
	ctx context.Context
	cfg *config.Config
	o   Options
	dir string
	v   *verdict.Verdict

	tiny, tinyWhy string // the smoke model's directory
}

func (s *suite) check(name, expected string, f func() (string, bool)) bool {
	start := time.Now()
	observed, ok := "not run: "+errString(s.ctx.Err()), false
	if s.ctx.Err() == nil {
		observed, ok = f()
	}
	st := verdict.Pass
	if !ok {
		st = verdict.Fail
	}
	s.v.Checks = append(s.v.Checks, verdict.Check{Name: name, Status: st, Expected: expected, Observed: observed, Duration: time.Since(start)})
	return ok
}

func (s *suite) skip(name, why string) {
	s.v.Checks = append(s.v.Checks, verdict.Check{Name: name, Status: verdict.Skip, Observed: why})
}

func errString(err error) string {
	if err == nil {
		return ""
	}
	return err.Error()
}

func (s *suite) modelFiles() {
	s.tinyWhy = "model files failed"
	s.check("model files", "the config model's config.json, tokenizer and chat template (weights are not needed)", func() (string, bool) {
		// As run resolves it (an init_model_preset model is created first).
		src, err := train.PrepareModel(s.cfg, s.o.Getenv, s.o.Logger)
		if err != nil {
			return err.Error(), false
		}
		tiny := filepath.Join(s.dir, "model")
		_ = os.RemoveAll(tiny) // a --smoke-dir reused: a fresh model each time
		mc, err := model.InitSmoke(tiny, src, s.cfg.Seed)
		if err != nil {
			return err.Error(), false
		}
		s.tiny, s.tinyWhy = tiny, ""
		return fmt.Sprintf("%s: a %d-layer %s of vocabulary %d with its tokenizer and template", src, mc.NumHiddenLayers, mc.ModelType, mc.VocabSize), true
	})
}

func (s *suite) chatTemplate() {
	const name = "chat template and tool-call format"
	if s.tiny == "" {
		s.skip(name, s.tinyWhy)
		return
	}
	if !s.check(name, "the model's template renders and its tool-call format is known (chat.tool_call_format)", func() (string, bool) {
		spec, err := train.LoadChat(s.tiny, s.cfg.Chat)
		if err != nil {
			return err.Error(), false
		}
		return "tool calls parsed as " + spec.Format.String(), true
	}) {
		s.tiny, s.tinyWhy = "", name+" failed"
	}
}

// smokeConfig is cfg shrunk to a smoke run in dir: the tiny model on the
// builtin engine on CPU, a few steps of two rollouts per task, a handful
// of tasks, truncated rollouts trained (see below), every other setting
// (envs, chat, rewards, loss, LoRA) as cfg.
func smokeConfig(cfg *config.Config, tiny, dir string, steps, tasks int) *config.Config {
	c := *cfg
	c.Model, c.InitModelPreset, c.OutputDir = tiny, "", filepath.Join(dir, "run")
	c.Engine.Kind = "builtin"
	c.Worker.Device, c.Worker.DType, c.Worker.Threads, c.Worker.GPUs = "cpu", "float32", 1, nil
	g := &c.GRPO
	g.NumGenerations, g.PerDeviceTrainBatchSize, g.GradientAccumulationSteps = 2, 2, 1
	g.StepsPerGeneration, g.GenerationBatchSize, g.NumIterations = 0, 0, 1
	g.MaxSteps, g.SaveSteps, g.LoggingSteps = steps, steps, 1
	g.MaxCompletionLength = min(g.MaxCompletionLength, 48)
	g.MaxToolCallingIterations = min(g.MaxToolCallingIterations, 2)
	g.GradientCheckpointing = false
	// A random model never ends a turn within the smoke budget: with its
	// cut rollouts masked out, no token would reach the loss.
	g.MaskTruncatedCompletions = false
	c.Rollout.MaxConcurrency = min(max(c.Rollout.MaxConcurrency, 1), 8)
	c.Envs = append([]config.EnvConfig(nil), cfg.Envs...)
	for i := range c.Envs {
		e := &c.Envs[i]
		if len(e.Indices) > tasks {
			e.Indices = e.Indices[:tasks]
		}
		if e.NumTasks == 0 || e.NumTasks > tasks {
			e.NumTasks = tasks
		}
	}
	return &c
}

func (s *suite) train() {
	names := []string{"train", "checkpoint", "resume", "rewards"}
	if s.tiny == "" {
		for _, n := range names {
			s.skip(n, s.tinyWhy)
		}
		return
	}
	c := smokeConfig(s.cfg, s.tiny, s.dir, s.o.Steps, s.o.Tasks)
	out := &outcomes{}
	ro := s.o.RunOptions
	ro.Overwrite, ro.Resume, ro.ResumeWithChanges = true, false, false
	ro.OnRollout = out.add
	var last train.StepMetrics
	ro.OnMetrics = func(m train.StepMetrics) { last = m }
	var res *train.Result
	ok := s.check("train", fmt.Sprintf("%d optimizer steps on the config's envs, rewards and loss; not every rollout failed", s.o.Steps), func() (string, bool) {
		var err error
		if res, err = train.Run(s.ctx, c, ro); err != nil {
			return err.Error(), false
		}
		if out.total > 0 && out.failed == out.total {
			return fmt.Sprintf("every rollout failed: %s (first: %s)", out, out.firstErr), false
		}
		return fmt.Sprintf("%d steps, %d rollouts (%s), reward %.3f, loss %.4g over %d tokens", res.Steps, out.total, out, last.Round.Reward, last.Loss, last.NumTokens), res.Steps == s.o.Steps
	})
	if !ok {
		for _, n := range names[1:] {
			s.skip(n, "train failed")
		}
		return
	}
	s.check("checkpoint", "a complete checkpoint at the last step", func() (string, bool) {
		if res.Checkpoint == "" {
			return "no checkpoint written", false
		}
		if _, err := os.Stat(filepath.Join(res.Checkpoint, "DONE")); err != nil {
			return res.Checkpoint + " is not complete (no DONE marker)", false
		}
		return res.Checkpoint, true
	})
	s.check("resume", "--resume continues the run from its checkpoint for one more step", func() (string, bool) {
		more := *c
		more.GRPO.MaxSteps = s.o.Steps + 1
		ro2 := ro
		ro2.Overwrite, ro2.Resume, ro2.ResumeWithChanges = false, true, true // max_steps changed on purpose
		r2, err := train.Run(s.ctx, &more, ro2)
		if err != nil {
			return err.Error(), false
		}
		return fmt.Sprintf("resumed at step %d, ended at step %d", s.o.Steps, r2.Steps), r2.Steps == s.o.Steps+1
	})
	s.check("rewards", "every configured reward function scored the rollouts; no rollout failed on a reward", func() (string, bool) {
		if n := out.by[string(rollout.OutcomeRewardError)]; n > 0 {
			return fmt.Sprintf("%d rollouts failed scoring (first: %s)", n, out.firstRewardErr), false
		}
		var missing, seen []string
		for _, r := range s.cfg.Rewards {
			if _, ok := last.Extra["rewards/"+r.Name+"/mean"]; !ok {
				missing = append(missing, r.Name)
			} else {
				seen = append(seen, r.Name)
			}
		}
		if len(missing) > 0 {
			return "no score from " + strings.Join(missing, ", "), false
		}
		if len(seen) == 0 {
			return fmt.Sprintf("the env's rewards (mean %.3f)", last.Round.Reward), true
		}
		return "scored by " + strings.Join(seen, ", "), true
	})
}

// outcomes counts rollouts by outcome (rollouts finish concurrently).
type outcomes struct {
	mu                       sync.Mutex
	by                       map[string]int
	total, failed            int
	firstErr, firstRewardErr string
}

func (o *outcomes) add(t *rollout.Trajectory) {
	o.mu.Lock()
	defer o.mu.Unlock()
	if o.by == nil {
		o.by = map[string]int{}
	}
	o.by[string(t.Outcome)]++
	o.total++
	if t.Outcome.Failed() {
		o.failed++
		if o.firstErr == "" && t.Err != nil {
			o.firstErr = t.Err.Error()
		}
		if t.Outcome == rollout.OutcomeRewardError && o.firstRewardErr == "" && t.Err != nil {
			o.firstRewardErr = t.Err.Error()
		}
	}
}

func (o *outcomes) String() string {
	o.mu.Lock()
	defer o.mu.Unlock()
	keys := make([]string, 0, len(o.by))
	for k := range o.by {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	parts := make([]string, len(keys))
	for i, k := range keys {
		parts[i] = fmt.Sprintf("%s %d", k, o.by[k])
	}
	return strings.Join(parts, ", ")
}
