package train

import (
	"context"
	"fmt"
	"math"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"

	"github.com/rs/zerolog"

	"github.com/ortrain/ortrain/internal/config"
	"github.com/ortrain/ortrain/internal/model"
)

// BenchmarkCurriculum measures what dynamic sampling and the curriculum
// buy on the ladder env (configs/ladder.yaml: nine levels of one skill,
// binary rewards, the tiny model from its random init, where most groups
// start uniform): plain GRPO, grpo.dynamic_sampling, and dynamic sampling
// with the curriculum, with the same seeds. Every EvalEvery steps the
// policy's checkpoint is evaluated on the validation split (every level,
// 8 rollouts per task, one eval seed), which is the same yardstick for
// all three (the training reward is not: the curriculum picks its tasks).
// It prints one JSON line per run (the eval curve, the completion tokens
// generated so far at each eval, what was dropped and skipped) and a
// summary per variant: the steps and generated tokens each needed to
// reach Threshold on the eval, as ratios to plain GRPO's (a run that
// never reaches it counts as max_steps and its tokens, so the ratio is a
// bound, marked), and the final eval reward. Run it with
// scripts/bench-curriculum (ORTRAIN_BENCH_SEEDS="42 7 3" for other seeds).
func BenchmarkCurriculum(b *testing.B) {
	if _, _, err := findWorker(); err != nil {
		b.Skipf("worker library not built: %v", err)
	}
	const evalEvery, threshold = 5, 0.6
	seeds := []int64{42, 7}
	if s := os.Getenv("ORTRAIN_BENCH_SEEDS"); s != "" {
		seeds = nil
		for _, f := range strings.Fields(s) {
			n, err := strconv.ParseInt(f, 10, 64)
			if err != nil {
				b.Fatalf("ORTRAIN_BENCH_SEEDS: %v", err)
			}
			seeds = append(seeds, n)
		}
	}
	variants := []struct {
		name        string
		dyn, curric bool
	}{{"plain", false, false}, {"dynamic_sampling", true, false}, {"dynamic_sampling+curriculum", true, true}}
	work := b.TempDir()
	modelDir := filepath.Join(work, "model")
	preset, _ := model.PresetByName("tiny")
	if err := model.Init(modelDir, preset, 42); err != nil {
		b.Fatal(err)
	}
	for b.Loop() {
		type result struct {
			steps, tokens, final float64
			reached              bool
		}
		results := map[string][]result{}
		for _, seed := range seeds {
			for _, v := range variants {
				out := filepath.Join(work, fmt.Sprintf("%s-%d", v.name, seed))
				curve, err := benchLadderRun(modelDir, out, seed, v.dyn, v.curric, evalEvery)
				if err != nil {
					b.Fatal(err)
				}
				r := result{steps: math.NaN()}
				for _, p := range curve.points {
					if p.eval >= threshold {
						r.steps, r.tokens = float64(p.step), p.tokens
						break
					}
				}
				last := curve.points[len(curve.points)-1]
				r.final = last.eval
				r.reached = !math.IsNaN(r.steps)
				if !r.reached {
					r.steps, r.tokens = float64(last.step), last.tokens
				}
				results[v.name] = append(results[v.name], r)
				line := map[string]any{"bench": "curriculum", "variant": v.name, "seed": seed, "threshold": threshold,
					"steps_to_threshold": r.steps, "tokens_to_threshold": r.tokens, "reached": r.reached,
					"final_eval_reward": r.final, "final_train_reward": curve.finalTrain, "generated_tokens": last.tokens,
					"dropped_groups": curve.dropped, "filled_groups": curve.filled, "skipped_draws": curve.skipped}
				var evals, tokens []float64
				for _, p := range curve.points {
					evals, tokens = append(evals, p.eval), append(tokens, p.tokens)
				}
				line["eval_steps"], line["eval_reward"], line["eval_generated_tokens"] = curve.steps(), evals, tokens
				printJSON(b, line)
			}
		}
		base := results["plain"]
		for _, v := range variants {
			var stepRatio, tokenRatio, dynTokenRatio, final float64
			lower := false
			for i, r := range results[v.name] {
				stepRatio += base[i].steps / r.steps / float64(len(seeds))
				tokenRatio += base[i].tokens / r.tokens / float64(len(seeds))
				dynTokenRatio += results["dynamic_sampling"][i].tokens / r.tokens / float64(len(seeds))
				final += r.final / float64(len(seeds))
				lower = lower || !base[i].reached || !r.reached
			}
			printJSON(b, map[string]any{"bench": "curriculum", "summary": v.name, "seeds": seeds, "threshold": threshold,
				"plain_steps_over_these": stepRatio, "plain_tokens_over_these": tokenRatio, "dynamic_sampling_tokens_over_these": dynTokenRatio,
				"final_eval_reward": final,
				"ratios_are_bounds": lower && v.name != "plain"})
			if v.name == "dynamic_sampling+curriculum" {
				b.ReportMetric(tokenRatio, "plain_tokens/curriculum_tokens")
			}
		}
	}
}

// ladderCurve is one run's eval rewards at its checkpoints.
type ladderCurve struct {
	points                   []ladderPoint
	finalTrain               float64
	dropped, filled, skipped float64
}

type ladderPoint struct {
	step         int
	eval, tokens float64
}

func (c ladderCurve) steps() []int {
	var out []int
	for _, p := range c.points {
		out = append(out, p.step)
	}
	return out
}

// benchLadderRun trains configs/ladder.yaml with one variant, then
// evaluates each of its checkpoints on the validation split.
func benchLadderRun(modelDir, out string, seed int64, dyn, curric bool, evalEvery int) (ladderCurve, error) {
	data, err := os.ReadFile(filepath.Join("..", "..", "configs", "ladder.yaml"))
	if err != nil {
		return ladderCurve{}, err
	}
	cfg, err := config.Load(config.Source{Data: data, Getenv: os.Getenv})
	if err != nil {
		return ladderCurve{}, err
	}
	cfg.Model, cfg.InitModelPreset, cfg.OutputDir, cfg.Seed = modelDir, "", out, seed
	cfg.GRPO.SaveSteps = evalEvery
	cfg.GRPO.DynamicSampling, cfg.Curriculum.Enabled = dyn, curric
	if err := cfg.Validate(); err != nil {
		return ladderCurve{}, err
	}
	if _, err := Run(context.Background(), cfg, RunOptions{Logger: zerolog.Nop(), Getenv: os.Getenv}); err != nil {
		return ladderCurve{}, fmt.Errorf("ladder run (dynamic sampling %v, curriculum %v): %w", dyn, curric, err)
	}
	lines, err := readMetricsFile(filepath.Join(out, "metrics.jsonl"))
	if err != nil {
		return ladderCurve{}, err
	}
	var c ladderCurve
	tokens := make([]float64, len(lines)+1)
	for i, m := range lines {
		tokens[i+1] = tokens[i] + m["tokens/generated"]
		c.dropped += m["dynamic_sampling/groups_dropped"]
		c.filled += m["dynamic_sampling/filled_groups"]
		c.skipped += m["curriculum/skipped_draws"]
	}
	c.finalTrain = lines[len(lines)-1]["reward"]
	for step := evalEvery; step <= len(lines); step += evalEvery {
		ecfg := *cfg
		ecfg.Model = filepath.Join(out, "checkpoints", checkpointName(step), "model")
		ecfg.Envs = append([]config.EnvConfig(nil), cfg.Envs...)
		ecfg.Envs[0].Split = "validation"
		ecfg.Seed = 1
		res, err := Evaluate(context.Background(), &ecfg, EvalOptions{Logger: zerolog.Nop(), Getenv: os.Getenv, NumGenerations: 8,
			PassThreshold: 1, Dir: filepath.Join(out, "eval", strconv.Itoa(step))})
		if err != nil {
			return ladderCurve{}, fmt.Errorf("eval step %d: %w", step, err)
		}
		c.points = append(c.points, ladderPoint{step: step, eval: res.MeanReward, tokens: tokens[step]})
	}
	return c, nil
}
