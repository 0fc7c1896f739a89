package worker

import (
	"context"
	"encoding/json"
	"math/rand/v2"
	"os"
	"path/filepath"
	"testing"

	"github.com/ortrain/ortrain/internal/grpo"
	"github.com/ortrain/ortrain/internal/model"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// trainSteps takes n optimizer steps on random rows.
func trainSteps(t *testing.T, m *Model, n int, seed uint64) {
	t.Helper()
	ctx := context.Background()
	cfg := grpo.DefaultLossConfig()
	cfg.ISCorrection = grpo.ISCorrectionOff
	rng := rand.New(rand.NewPCG(seed, 1))
	for range n {
		rows := randomRows(rng, 4, 300)
		_, err := m.ForwardBackward(ctx, grpo.MicroBatch{Rows: rows, RoundTokens: 10, GradAccumSteps: 1}, cfg)
		require.NoError(t, err)
		_, err = m.OptimizerStep(ctx, 1e-2)
		require.NoError(t, err)
	}
}

func tensorBytes(t *testing.T, m *Model, kind TensorKind) map[string][]byte {
	t.Helper()
	infos, err := m.Tensors(kind)
	require.NoError(t, err)
	out := map[string][]byte{}
	for _, info := range infos {
		b, err := m.ReadTensor(kind, info)
		require.NoError(t, err)
		out[info.Name] = b
	}
	return out
}

func TestSaveHFLoadIsBitExact(t *testing.T) {
	m := loadTiny(t, ModelOptions{})
	trainSteps(t, m, 2, 1)
	dir := filepath.Join(t.TempDir(), "ckpt")
	require.NoError(t, m.SaveHF(context.Background(), dir))
	require.NoError(t, m.SaveHF(context.Background(), dir), "saving over an existing checkpoint replaces it")
	for _, f := range []string{"config.json", "model.safetensors", "tokenizer.json"} {
		assert.FileExists(t, filepath.Join(dir, f))
	}
	entries, err := os.ReadDir(filepath.Dir(dir))
	require.NoError(t, err)
	assert.Len(t, entries, 1, "no temporary directories left behind")
	loaded := loadTiny(t, ModelOptions{Dir: dir})
	require.Equal(t, tensorBytes(t, m, KindWeight), tensorBytes(t, loaded, KindWeight))
	tensors, err := model.ReadModelTensors(dir)
	require.NoError(t, err)
	_, tied := tensors["lm_head.weight"]
	assert.False(t, tied, "tied embeddings are saved once, as transformers does")
}

// TestSaveHFWritesTheConfiguredChatTemplate: with ChatTemplatePath set, a
// saved model carries that template as chat_template.jinja (which loaders
// prefer over tokenizer_config.json), so it renders as it was trained.
func TestSaveHFWritesTheConfiguredChatTemplate(t *testing.T) {
	tmpl := filepath.Join(t.TempDir(), "compact.jinja")
	const src = "{% for m in messages %}{{ m.content }}{% endfor %}"
	require.NoError(t, os.WriteFile(tmpl, []byte(src), 0o644))
	m := loadTiny(t, ModelOptions{ChatTemplatePath: tmpl})
	dir := filepath.Join(t.TempDir(), "ckpt")
	require.NoError(t, m.SaveHF(context.Background(), dir))
	got, err := os.ReadFile(filepath.Join(dir, chatTemplateFile))
	require.NoError(t, err)
	assert.Equal(t, src, string(got))

	plain := loadTiny(t, ModelOptions{})
	dir = filepath.Join(t.TempDir(), "plain")
	require.NoError(t, plain.SaveHF(context.Background(), dir))
	assert.NoFileExists(t, filepath.Join(dir, chatTemplateFile), "without one, the source's files only")
}

func TestLoRAZeroBReproducesBase(t *testing.T) {
	base := loadTiny(t, ModelOptions{})
	lora := loadTiny(t, ModelOptions{LoRA: &LoRAOptions{Rank: 4, Alpha: 8, Dropout: 0.1}})
	rows := randomRows(rand.New(rand.NewPCG(9, 9)), 4, 300)
	want, _, err := base.Logprobs(context.Background(), rows, 1, false)
	require.NoError(t, err)
	got, _, err := lora.Logprobs(context.Background(), rows, 1, false)
	require.NoError(t, err)
	require.Equal(t, want, got)
	// After training, the adapter moves the policy but the reference (adapters
	// off) is still the base model.
	trainSteps(t, lora, 2, 2)
	moved, _, err := lora.Logprobs(context.Background(), rows, 1, false)
	require.NoError(t, err)
	require.NotEqual(t, want, moved)
	ref, _, err := lora.Logprobs(context.Background(), rows, 1, true)
	require.NoError(t, err)
	require.Equal(t, want, ref)
}

func TestFullFineTuneReferenceIsFrozen(t *testing.T) {
	m := loadTiny(t, ModelOptions{Reference: true})
	rows := randomRows(rand.New(rand.NewPCG(9, 9)), 3, 300)
	want, _, err := m.Logprobs(context.Background(), rows, 1, false)
	require.NoError(t, err)
	trainSteps(t, m, 2, 3)
	ref, _, err := m.Logprobs(context.Background(), rows, 1, true)
	require.NoError(t, err)
	require.Equal(t, want, ref)
	noRef := loadTiny(t, ModelOptions{})
	_, _, err = noRef.Logprobs(context.Background(), rows, 1, true)
	require.ErrorContains(t, err, "without a reference")
}

func TestSavePEFTAdapter(t *testing.T) {
	m := loadTiny(t, ModelOptions{LoRA: &LoRAOptions{Rank: 4, Alpha: 8, TargetModules: []string{"q_proj", "v_proj", "gate_proj"}}})
	trainSteps(t, m, 1, 4)
	dir := filepath.Join(t.TempDir(), "adapter")
	require.NoError(t, m.SavePEFT(context.Background(), dir))
	raw, err := os.ReadFile(filepath.Join(dir, "adapter_config.json"))
	require.NoError(t, err)
	var cfg map[string]any
	require.NoError(t, json.Unmarshal(raw, &cfg))
	assert.Equal(t, "LORA", cfg["peft_type"])
	assert.Equal(t, 4.0, cfg["r"])
	assert.Equal(t, 8.0, cfg["lora_alpha"])
	assert.ElementsMatch(t, []any{"q_proj", "v_proj", "gate_proj"}, cfg["target_modules"])
	_, tensors, err := model.ReadSafetensors(filepath.Join(dir, "adapter_model.safetensors"))
	require.NoError(t, err)
	c := m.Config()
	shapes := map[string][]int64{}
	for _, tt := range tensors {
		shapes[tt.Name] = tt.Shape
	}
	require.Len(t, shapes, c.NumHiddenLayers*3*2)
	H, q, kv, I := int64(c.HiddenSize), int64(c.NumAttentionHeads*c.HeadDim), int64(c.NumKeyValueHeads*c.HeadDim), int64(c.IntermediateSize)
	for l := range c.NumHiddenLayers {
		p := "base_model.model.model.layers." + itoa(l) + "."
		assert.Equal(t, []int64{4, H}, shapes[p+"self_attn.q_proj.lora_A.weight"])
		assert.Equal(t, []int64{q, 4}, shapes[p+"self_attn.q_proj.lora_B.weight"])
		assert.Equal(t, []int64{kv, 4}, shapes[p+"self_attn.v_proj.lora_B.weight"])
		assert.Equal(t, []int64{I, 4}, shapes[p+"mlp.gate_proj.lora_B.weight"])
	}
	again := loadTiny(t, ModelOptions{LoRA: &LoRAOptions{Rank: 4, Alpha: 8, TargetModules: []string{"q_proj", "v_proj", "gate_proj"}}})
	require.NoError(t, again.LoadPEFT(context.Background(), dir))
	require.Equal(t, tensorBytes(t, m, KindLoRA), tensorBytes(t, again, KindLoRA))
	full := loadTiny(t, ModelOptions{})
	require.ErrorContains(t, full.SavePEFT(context.Background(), dir), "without LoRA")
}

// TestOptimizerResumeIsExact: stopping after 2 steps, saving weights and
// AdamW state, and resuming gives the same weights after step 4 as running
// 4 steps straight.
func TestOptimizerResumeIsExact(t *testing.T) {
	ctx := context.Background()
	straight := loadTiny(t, ModelOptions{})
	trainSteps(t, straight, 2, 5)
	trainSteps(t, straight, 2, 6)

	first := loadTiny(t, ModelOptions{})
	trainSteps(t, first, 2, 5)
	dir := filepath.Join(t.TempDir(), "step2")
	require.NoError(t, first.SaveHF(ctx, dir))
	require.NoError(t, first.SaveOptimizer(ctx, filepath.Join(dir, "optimizer.safetensors")))
	resumed := loadTiny(t, ModelOptions{Dir: dir})
	require.NoError(t, resumed.LoadOptimizer(ctx, filepath.Join(dir, "optimizer.safetensors")))
	trainSteps(t, resumed, 2, 6)
	require.Equal(t, tensorBytes(t, straight, KindWeight), tensorBytes(t, resumed, KindWeight))
}

func itoa(i int) string { return string(rune('0' + i)) }
