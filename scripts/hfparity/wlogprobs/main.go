// Command wlogprobs prints the libtorch worker's log-probs for rows read
// from a JSON file, for scripts/hf_parity.py (issue 24: parity with
// Hugging Face transformers). It is benchworker --logprobs plus what that
// mode lacks:
//
//   - --adapter DIR loads a PEFT adapter written by `ortrain run` over its
//     base model (the LoRA settings come from adapter_config.json, as
//     `ortrain eval` reads them);
//   - --exact also prints each log-prob to float64 precision. The worker's
//     Logprobs returns float32 whatever the model's dtype, so a float64
//     model could only be compared to float32 rounding (~1e-7). The exact
//     value is read through the loss instead, which the worker returns as
//     a float64: for a row whose loss mask selects the one token t, with
//     advantage 1, old log-prob o (the float32 log-prob) and the dapo loss
//     normalised by 1 token, the loss is -exp(lp_t - o) (inside the clip
//     range), so lp_t = o + log(-loss), computed in the model's dtype.
//
// Input: [{"tokens": [...], "prompt_len": P}, ...]. Output (one JSON
// object): {"logprobs": [[float32 per completion token] per row],
// "exact": [[float64 ...] ...] (with --exact)}.
package main

import (
	"context"
	"encoding/json"
	"flag"
	"fmt"
	"math"
	"os"
	"path/filepath"

	"github.com/ortrain/ortrain/internal/grpo"
	"github.com/ortrain/ortrain/internal/worker"
)

func main() {
	modelDir := flag.String("model", "", "Hugging Face model directory (with --adapter: default the adapter's base_model_name_or_path)")
	adapter := flag.String("adapter", "", "PEFT adapter directory (adapter_config.json, adapter_model.safetensors)")
	dtype := flag.String("dtype", "float32", "float32 or float64 (or bfloat16, float16)")
	rowsPath := flag.String("rows", "", "rows JSON file")
	threads := flag.Int("threads", 0, "libtorch intra-op threads (0: one per CPU)")
	exact := flag.Bool("exact", false, "also print float64 log-probs read through the loss")
	flag.Parse()
	if err := run(context.Background(), *modelDir, *adapter, *dtype, *rowsPath, *threads, *exact); err != nil {
		fmt.Fprintln(os.Stderr, "wlogprobs:", err)
		os.Exit(1)
	}
}

type peftConfig struct {
	Base          string   `json:"base_model_name_or_path"`
	R             int      `json:"r"`
	Alpha         float64  `json:"lora_alpha"`
	Dropout       float64  `json:"lora_dropout"`
	TargetModules []string `json:"target_modules"`
	ModulesToSave []string `json:"modules_to_save"`
}

func run(ctx context.Context, modelDir, adapter, dtype, rowsPath string, threads int, exact bool) error {
	raw, err := os.ReadFile(rowsPath)
	if err != nil {
		return err
	}
	var in []struct {
		Tokens    []int32 `json:"tokens"`
		PromptLen int     `json:"prompt_len"`
	}
	if err := json.Unmarshal(raw, &in); err != nil {
		return fmt.Errorf("%s: %w", rowsPath, err)
	}
	opts := worker.ModelOptions{Dir: modelDir, DType: dtype, Threads: threads}
	if adapter != "" {
		b, err := os.ReadFile(filepath.Join(adapter, "adapter_config.json"))
		if err != nil {
			return err
		}
		var pc peftConfig
		if err := json.Unmarshal(b, &pc); err != nil {
			return fmt.Errorf("%s/adapter_config.json: %w", adapter, err)
		}
		if opts.Dir == "" {
			opts.Dir = pc.Base
		}
		opts.LoRA = &worker.LoRAOptions{Rank: pc.R, Alpha: pc.Alpha, Dropout: pc.Dropout,
			TargetModules: pc.TargetModules, ModulesToSave: pc.ModulesToSave}
	}
	path, _, err := worker.FindLibrary("", os.Getenv)
	if err != nil {
		return err
	}
	lib, err := worker.Open(path)
	if err != nil {
		return err
	}
	m, err := lib.LoadModel(ctx, opts)
	if err != nil {
		return err
	}
	defer m.Close()
	if adapter != "" {
		if err := m.LoadPEFT(ctx, adapter); err != nil {
			return err
		}
	}
	rows := make([]grpo.Row, len(in))
	for i, r := range in {
		rows[i] = grpo.Row{Tokens: r.Tokens, PromptLen: r.PromptLen, LossMask: make([]uint8, len(r.Tokens)-r.PromptLen)}
	}
	lp, _, err := m.Logprobs(ctx, rows, 1, false)
	if err != nil {
		return err
	}
	out := map[string]any{"logprobs": lp, "dtype": string(m.DType())}
	if exact {
		ex, err := exactLogprobs(ctx, m, rows, lp)
		if err != nil {
			return err
		}
		out["exact"] = ex
	}
	return json.NewEncoder(os.Stdout).Encode(out)
}

// exactLogprobs reads each completion token's log-prob through the loss
// (see the package comment): one EvalLoss per token.
func exactLogprobs(ctx context.Context, m *worker.Model, rows []grpo.Row, lp [][]float32) ([][]float64, error) {
	cfg := grpo.DefaultLossConfig()
	cfg.Type = grpo.LossDAPO
	cfg.ISCorrection = grpo.ISCorrectionOff
	out := make([][]float64, len(rows))
	for i, r := range rows {
		T := r.CompletionLen()
		out[i] = make([]float64, T)
		for t := 0; t < T; t++ {
			mask := make([]uint8, T)
			mask[t] = 1
			row := r
			row.LossMask = mask
			row.OldLogprobs = lp[i]
			row.Advantage = 1
			st, err := m.EvalLoss(ctx, grpo.MicroBatch{Rows: []grpo.Row{row}, RoundTokens: 1, GradAccumSteps: 1}, cfg)
			if err != nil {
				return nil, fmt.Errorf("row %d token %d: %w", i, t, err)
			}
			if !(st.Loss < 0) || st.ClipLow+st.ClipHigh != 0 {
				return nil, fmt.Errorf("row %d token %d: loss %v (clipped %v/%v): not -exp(lp - old)", i, t, st.Loss, st.ClipLow, st.ClipHigh)
			}
			out[i][t] = float64(lp[i][t]) + math.Log(-st.Loss)
		}
	}
	return out, nil
}
