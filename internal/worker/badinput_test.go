//go:build cgo

package worker

import (
	"context"
	"encoding/binary"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/ortrain/ortrain/internal/grpo"
	"github.com/ortrain/ortrain/internal/model"
	"github.com/stretchr/testify/require"
)

// copyModel copies a model directory so a test can break it.
func copyModel(t *testing.T, src string) string {
	t.Helper()
	dst := filepath.Join(t.TempDir(), "model")
	require.NoError(t, os.MkdirAll(dst, 0o755))
	entries, err := os.ReadDir(src)
	require.NoError(t, err)
	for _, e := range entries {
		require.NoError(t, copyFile(filepath.Join(src, e.Name()), filepath.Join(dst, e.Name())))
	}
	return dst
}

func TestLoadModelBadInputs(t *testing.T) {
	lib := testLib(t)
	ctx := context.Background()
	tiny := tinyDir(t, 1)

	corrupt := copyModel(t, tiny)
	f, err := os.OpenFile(filepath.Join(corrupt, "model.safetensors"), os.O_WRONLY, 0)
	require.NoError(t, err)
	var hdr [8]byte
	binary.LittleEndian.PutUint64(hdr[:], 1<<40) // header length past the end of the file
	_, err = f.WriteAt(hdr[:], 0)
	require.NoError(t, err)
	require.NoError(t, f.Close())

	wrongShape := copyModel(t, tiny)
	_, tensors, err := model.ReadSafetensors(filepath.Join(tiny, "model.safetensors"))
	require.NoError(t, err)
	for i, tt := range tensors {
		if tt.Name == "model.layers.1.mlp.up_proj.weight" {
			tensors[i].Shape = []int64{tt.Shape[1], tt.Shape[0]}
		}
	}
	require.NoError(t, model.WriteSafetensors(filepath.Join(wrongShape, "model.safetensors"), tensors, nil))

	missing := copyModel(t, tiny)
	_, tensors, err = model.ReadSafetensors(filepath.Join(tiny, "model.safetensors"))
	require.NoError(t, err)
	var kept []model.Tensor
	for _, tt := range tensors {
		if tt.Name != "model.layers.0.self_attn.k_norm.weight" {
			kept = append(kept, tt)
		}
	}
	require.NoError(t, model.WriteSafetensors(filepath.Join(missing, "model.safetensors"), kept, nil))

	unsupported := copyModel(t, tiny)
	cfg, err := model.LoadConfig(tiny)
	require.NoError(t, err)
	cfg.Architectures = []string{"GPT2LMHeadModel"}
	b, err := cfg.Encode()
	require.NoError(t, err)
	require.NoError(t, os.WriteFile(filepath.Join(unsupported, "config.json"), b, 0o644))

	for _, tc := range []struct {
		name string
		opts ModelOptions
		want string
	}{
		{"missing dir", ModelOptions{Dir: filepath.Join(t.TempDir(), "nope")}, "config.json"},
		{"corrupt safetensors header", ModelOptions{Dir: corrupt}, "safetensors"},
		{"wrong shape", ModelOptions{Dir: wrongShape}, "model.layers.1.mlp.up_proj.weight has shape [64, 128]"},
		{"missing tensor", ModelOptions{Dir: missing}, "lacks tensor model.layers.0.self_attn.k_norm.weight"},
		{"unsupported architecture", ModelOptions{Dir: unsupported}, "GPT2LMHeadModel"},
		{"bad device", ModelOptions{Dir: tiny, Device: "tpu"}, "device"},
		{"absent cuda device", ModelOptions{Dir: tiny, Device: "cuda:7"}, "cuda:7"},
		{"bad dtype", ModelOptions{Dir: tiny, DType: "int8"}, "dtype"},
		{"fp16 on old CPU libtorch", ModelOptions{Dir: tiny, DType: "float16"}, "float16 on CPU needs libtorch >= 2.1"},
		{"bad lora target", ModelOptions{Dir: tiny, LoRA: &LoRAOptions{Rank: 2, Alpha: 2, TargetModules: []string{"qkv"}}}, "qkv"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if tc.opts.DType == "float16" && !strings.HasPrefix(lib.Info().LibtorchVersion, "1.") {
				t.Skip("libtorch >= 2 runs float16 on CPU")
			}
			_, err := lib.LoadModel(ctx, tc.opts)
			require.ErrorContains(t, err, tc.want)
		})
	}
}

func TestBatchBadInputs(t *testing.T) {
	m := loadTiny(t, ModelOptions{})
	ctx := context.Background()
	cfg := grpo.DefaultLossConfig()
	good := grpo.Row{Tokens: []int32{1, 2, 3}, PromptLen: 1, LossMask: []uint8{1, 1}}
	for _, tc := range []struct {
		name string
		rows []grpo.Row
		want string
	}{
		{"empty batch", nil, "empty batch"},
		{"out-of-vocab id", []grpo.Row{{Tokens: []int32{1, 99999}, PromptLen: 1, LossMask: []uint8{1}}}, "outside the vocabulary"},
		{"negative id", []grpo.Row{{Tokens: []int32{-1, 2}, PromptLen: 1, LossMask: []uint8{1}}}, "outside the vocabulary"},
		{"empty prompt", []grpo.Row{{Tokens: []int32{1, 2}, PromptLen: 0, LossMask: []uint8{1, 1}}}, "PromptLen"},
		{"mask length", []grpo.Row{good, {Tokens: []int32{1, 2}, PromptLen: 1, LossMask: []uint8{1, 1}}}, "row 1: LossMask"},
		{"old length", []grpo.Row{{Tokens: []int32{1, 2}, PromptLen: 1, LossMask: []uint8{1}, OldLogprobs: []float32{1, 2}}}, "OldLogprobs"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, err := m.ForwardBackward(ctx, grpo.MicroBatch{Rows: tc.rows, RoundTokens: 1, GradAccumSteps: 1}, cfg)
			require.ErrorContains(t, err, tc.want)
			_, _, err = m.Logprobs(ctx, tc.rows, 1, false)
			require.ErrorContains(t, err, tc.want)
		})
	}
	beta := cfg
	beta.Beta = 0.1
	_, err := m.ForwardBackward(ctx, grpo.MicroBatch{Rows: []grpo.Row{good}, RoundTokens: 1}, beta)
	require.ErrorContains(t, err, "reference log-probs")
	_, err = m.ForwardBackward(ctx, grpo.MicroBatch{Rows: []grpo.Row{good}, RoundTokens: 0}, cfg)
	require.ErrorContains(t, err, "round_tokens")
	bad := cfg
	bad.Temperature = 0
	_, err = m.ForwardBackward(ctx, grpo.MicroBatch{Rows: []grpo.Row{good}, RoundTokens: 1}, bad)
	require.ErrorContains(t, err, "temperature")
	for _, r := range []SampleRequest{
		{PromptIDs: nil, MaxNewTokens: 3},
		{PromptIDs: []int32{1, 5000}, MaxNewTokens: 3},
		{PromptIDs: []int32{1}, MaxNewTokens: 0},
		{PromptIDs: []int32{1}, MaxNewTokens: 3, TopP: 1.5},
		{PromptIDs: []int32{1}, MaxNewTokens: 3, Temperature: -1},
	} {
		_, err := m.Sample(ctx, []SampleRequest{r})
		require.Error(t, err, "%+v", r)
	}
	_, err = m.Sample(ctx, nil)
	require.ErrorContains(t, err, "empty batch")
	// The model still works after all of the above.
	_, err = m.ForwardBackward(ctx, grpo.MicroBatch{Rows: []grpo.Row{good}, RoundTokens: 1}, cfg)
	require.NoError(t, err)
	require.NoError(t, m.Close())
	_, err = m.Sample(ctx, []SampleRequest{{PromptIDs: []int32{1}, MaxNewTokens: 1}})
	require.ErrorIs(t, err, ErrClosed)
}

func TestOpenBadLibrary(t *testing.T) {
	_, err := Open(filepath.Join(t.TempDir(), "missing.so"))
	require.ErrorContains(t, err, "build-worker.sh")
	notLib := filepath.Join(t.TempDir(), "x.so")
	require.NoError(t, os.WriteFile(notLib, []byte("not an ELF"), 0o644))
	_, err = Open(notLib)
	require.Error(t, err)
	_, searched, err := FindLibrary("", func(string) string { return "" })
	if err != nil {
		require.True(t, IsNotFound(err))
		require.NotEmpty(t, searched)
	}
	_, _, err = FindLibrary("/nonexistent/lib.so", nil)
	require.ErrorContains(t, err, "/nonexistent/lib.so")
	_, _, err = FindLibrary("", func(string) string { return "/nonexistent/env.so" })
	require.ErrorContains(t, err, EnvLibrary)
}
