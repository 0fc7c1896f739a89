package worker

import (
	"context"
	"encoding/json"
	"math/rand/v2"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/ortrain/ortrain/internal/model"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// The tiny preset ties lm_head to the embedding, so lm_head and
// embed_tokens name one trained matrix, stored under both PEFT keys.
const (
	peftEmbedKey  = "base_model.model.model.embed_tokens.weight"
	peftLMHeadKey = "base_model.model.lm_head.weight"
	peftNormKey   = "base_model.model.model.norm.weight"
)

func savingLoRA(modules ...string) *LoRAOptions {
	return &LoRAOptions{Rank: 4, Alpha: 8, TargetModules: []string{"q_proj", "v_proj"}, ModulesToSave: modules}
}

// TestModulesToSaveTrainCopiesAndKeepBase: the saved modules' weights move
// with training, the reference (adapters off) stays the loaded base, and
// the AdamW state covers the copies.
func TestModulesToSaveTrainCopiesAndKeepBase(t *testing.T) {
	ctx := context.Background()
	base := loadTiny(t, ModelOptions{})
	m := loadTiny(t, ModelOptions{LoRA: savingLoRA("lm_head", "norm", "input_layernorm")})
	require.True(t, m.Config().TieWordEmbeddings, "the tiny preset ties its embeddings")
	rows := randomRows(rand.New(rand.NewPCG(3, 3)), 4, 300)
	want, _, err := base.Logprobs(ctx, rows, 1, false)
	require.NoError(t, err)
	got, _, err := m.Logprobs(ctx, rows, 1, false)
	require.NoError(t, err)
	require.Equal(t, want, got, "untrained copies reproduce the base")

	baseWeights := tensorBytes(t, base, KindWeight)
	trainSteps(t, m, 2, 7)
	trained := tensorBytes(t, m, KindWeight)
	for _, name := range []string{"model.embed_tokens.weight", "model.norm.weight", "model.layers.0.input_layernorm.weight", "model.layers.1.input_layernorm.weight"} {
		assert.NotEqual(t, baseWeights[name], trained[name], "%s is trained (and exported merged)", name)
	}
	for _, name := range []string{"model.layers.0.post_attention_layernorm.weight", "model.layers.0.mlp.up_proj.weight", "model.layers.1.self_attn.k_proj.weight"} {
		assert.Equal(t, baseWeights[name], trained[name], "%s is neither saved nor adapted", name)
	}
	ref, _, err := m.Logprobs(ctx, rows, 1, true)
	require.NoError(t, err)
	require.Equal(t, want, ref, "the reference uses the frozen originals")

	optim, err := m.Tensors(KindOptim)
	require.NoError(t, err)
	var names []string
	for _, o := range optim {
		names = append(names, o.Name)
	}
	for _, key := range []string{peftEmbedKey, peftNormKey, "base_model.model.model.layers.1.input_layernorm.weight"} {
		assert.Contains(t, names, "exp_avg."+key)
		assert.Contains(t, names, "exp_avg_sq."+key)
	}
	assert.NotContains(t, names, "exp_avg."+peftLMHeadKey, "the tied lm_head has no state of its own")
}

// TestModulesToSaveSavePEFTLoadIsBitExact: SavePEFT writes the copies under
// PEFT's keys and config; LoadPEFT into a fresh model restores the policy
// exactly, and resuming with the optimizer state continues bit-exactly.
func TestModulesToSaveSavePEFTLoadIsBitExact(t *testing.T) {
	ctx := context.Background()
	opts := ModelOptions{LoRA: savingLoRA("lm_head", "norm", "q_norm")}
	m := loadTiny(t, opts)
	trainSteps(t, m, 2, 8)
	dir := filepath.Join(t.TempDir(), "adapter")
	require.NoError(t, m.SavePEFT(ctx, dir))
	optimPath := filepath.Join(t.TempDir(), "optimizer.safetensors")
	require.NoError(t, m.SaveOptimizer(ctx, optimPath))

	raw, err := os.ReadFile(filepath.Join(dir, "adapter_config.json"))
	require.NoError(t, err)
	var cfg map[string]any
	require.NoError(t, json.Unmarshal(raw, &cfg))
	assert.Equal(t, []any{"lm_head", "norm", "q_norm", "embed_tokens"}, cfg["modules_to_save"], "the tied partner is listed too")

	_, tensors, err := model.ReadSafetensors(filepath.Join(dir, "adapter_model.safetensors"))
	require.NoError(t, err)
	byName := map[string]model.Tensor{}
	for _, tt := range tensors {
		byName[tt.Name] = tt
	}
	c := m.Config()
	require.Len(t, byName, c.NumHiddenLayers*2*2+3+c.NumHiddenLayers)
	require.Contains(t, byName, peftEmbedKey)
	require.Contains(t, byName, peftLMHeadKey)
	assert.Equal(t, byName[peftEmbedKey].Data, byName[peftLMHeadKey].Data, "one tied matrix under both keys")
	assert.Equal(t, []int64{int64(c.VocabSize), int64(c.HiddenSize)}, byName[peftLMHeadKey].Shape)
	assert.Equal(t, []int64{int64(c.HiddenSize)}, byName[peftNormKey].Shape)
	for l := range c.NumHiddenLayers {
		assert.Contains(t, byName, "base_model.model.model.layers."+itoa(l)+".self_attn.q_norm.weight")
	}
	for name := range byName {
		assert.False(t, strings.Contains(name, "modules_to_save"), "%s: PEFT strips the wrapper from saved keys", name)
	}
	weights := tensorBytes(t, m, KindWeight)
	assert.Equal(t, weights["model.norm.weight"], byName[peftNormKey].Data)

	loaded := loadTiny(t, opts)
	require.NoError(t, loaded.LoadPEFT(ctx, dir))
	require.Equal(t, tensorBytes(t, m, KindLoRA), tensorBytes(t, loaded, KindLoRA))
	require.Equal(t, weights, tensorBytes(t, loaded, KindWeight))
	rows := randomRows(rand.New(rand.NewPCG(4, 4)), 4, 300)
	want, _, err := m.Logprobs(ctx, rows, 1, false)
	require.NoError(t, err)
	got, _, err := loaded.Logprobs(ctx, rows, 1, false)
	require.NoError(t, err)
	require.Equal(t, want, got)

	require.NoError(t, loaded.LoadOptimizer(ctx, optimPath))
	require.Equal(t, tensorBytes(t, m, KindOptim), tensorBytes(t, loaded, KindOptim))
	trainSteps(t, m, 2, 9)
	trainSteps(t, loaded, 2, 9)
	require.Equal(t, tensorBytes(t, m, KindLoRA), tensorBytes(t, loaded, KindLoRA), "resume continues bit-exactly")
}

// TestModulesToSaveGradientFiniteDifference checks the gradient of saved
// modules in float64, the tied embedding (input and output use) included.
func TestModulesToSaveGradientFiniteDifference(t *testing.T) {
	m := loadTiny(t, ModelOptions{DType: "float64", LoRA: &LoRAOptions{Rank: 2, Alpha: 4, TargetModules: []string{"v_proj"}, ModulesToSave: []string{"embed_tokens", "norm", "k_norm", "post_attention_layernorm"}}})
	infos, err := m.Tensors(KindLoRA)
	require.NoError(t, err)
	rng := rand.New(rand.NewPCG(2, 2))
	for _, info := range infos { // nonzero B, and norms away from their initial value
		b, err := m.ReadTensor(KindLoRA, info)
		require.NoError(t, err)
		v := f64s(b)
		for k := range v {
			v[k] += 0.1 * rng.NormFloat64()
		}
		require.NoError(t, m.WriteTensor(KindLoRA, model.Tensor{Name: info.Name, DType: info.DType, Shape: info.Shape, Data: f64bytes(v)}))
	}
	lc := lossCases()[0]
	mb, _ := lossBatch(t, m, lc, 5)
	saved := 0
	gradCheck(t, m, KindLoRA, mb, lc.cfg, func(i TensorInfo) bool {
		ok := !strings.Contains(i.Name, ".lora_") && i.Name != peftLMHeadKey // the alias has no gradient of its own
		if ok {
			saved++
		}
		return ok
	})
	assert.Equal(t, 2+2*m.Config().NumHiddenLayers, saved, "embed_tokens, norm, and per layer k_norm and post_attention_layernorm")
}

func TestModulesToSaveBadOptions(t *testing.T) {
	lib := testLib(t)
	for _, tc := range []struct {
		name    string
		modules []string
		want    string
	}{
		{"unknown module", []string{"norm", "o_proj"}, `module to save "o_proj"`},
		{"empty name", []string{""}, `module to save ""`},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, err := lib.LoadModel(context.Background(), ModelOptions{Dir: tinyDir(t, 1), Threads: 2, LoRA: savingLoRA(tc.modules...)})
			require.ErrorContains(t, err, tc.want)
		})
	}
}
