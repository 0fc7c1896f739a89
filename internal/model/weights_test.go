package model

import (
	"encoding/json"
	"os"
	"path/filepath"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// writeSharded writes a two-shard checkpoint with an index into dir.
func writeSharded(t *testing.T, dir string, weightMap map[string]string) {
	t.Helper()
	require.NoError(t, os.WriteFile(filepath.Join(dir, ConfigFile), []byte(qwen3Small), 0o644))
	shards := map[string][]Tensor{}
	for _, name := range []string{"a", "b", "c"} {
		f := "model-00001-of-00002.safetensors"
		if name == "c" {
			f = "model-00002-of-00002.safetensors"
		}
		shards[f] = append(shards[f], Tensor{Name: name, DType: F32, Shape: []int64{1}, Data: EncodeF32([]float32{1})})
	}
	for f, ts := range shards {
		require.NoError(t, WriteSafetensors(filepath.Join(dir, f), ts, nil))
	}
	idx, err := json.Marshal(WeightIndex{Metadata: map[string]any{"total_size": 12}, WeightMap: weightMap})
	require.NoError(t, err)
	require.NoError(t, os.WriteFile(filepath.Join(dir, ShardedWeightsFile), idx, 0o644))
}

func TestReadModelTensorsSharded(t *testing.T) {
	good := map[string]string{"a": "model-00001-of-00002.safetensors", "b": "model-00001-of-00002.safetensors", "c": "model-00002-of-00002.safetensors"}
	tests := []struct {
		name      string
		weightMap map[string]string
		err       string
	}{
		{"consistent", good, ""},
		{"index names wrong shard", map[string]string{"a": "model-00002-of-00002.safetensors", "b": "model-00001-of-00002.safetensors", "c": "model-00002-of-00002.safetensors"}, `tensor "a" is in model-00002-of-00002.safetensors, but it is not there`},
		{"tensor missing from index", map[string]string{"a": "model-00001-of-00002.safetensors", "c": "model-00002-of-00002.safetensors"}, `tensor "b" in model-00001-of-00002.safetensors is missing`},
		{"path escapes dir", map[string]string{"a": "../x.safetensors"}, "not a file name in the model directory"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			dir := t.TempDir()
			writeSharded(t, dir, tt.weightMap)
			got, err := ReadModelTensors(dir)
			if tt.err != "" {
				require.Error(t, err)
				assert.Contains(t, err.Error(), tt.err)
				return
			}
			require.NoError(t, err)
			require.Len(t, got, 3)
			assert.Equal(t, "model-00002-of-00002.safetensors", got["c"].File)
			assert.Equal(t, []int64{1}, got["a"].Shape)
			files, err := WeightFiles(dir)
			require.NoError(t, err)
			assert.Equal(t, []string{"model-00001-of-00002.safetensors", "model-00002-of-00002.safetensors"}, files)
		})
	}
}

func TestWeightFilesMissing(t *testing.T) {
	dir := t.TempDir()
	_, err := WeightFiles(dir)
	require.Error(t, err)
	assert.Contains(t, err.Error(), "neither model.safetensors nor model.safetensors.index.json")
}

func TestHash(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "m")
	tiny, _ := PresetByName("tiny")
	require.NoError(t, Init(dir, tiny, 1))

	h1, err := Hash(dir)
	require.NoError(t, err)
	assert.Len(t, h1, 64)

	// Tokenizer files are not part of the fingerprint.
	require.NoError(t, os.WriteFile(filepath.Join(dir, "tokenizer.json"), []byte("{}"), 0o644))
	h2, err := Hash(dir)
	require.NoError(t, err)
	assert.Equal(t, h1, h2)

	// Weights and config are.
	other := filepath.Join(t.TempDir(), "m")
	require.NoError(t, Init(other, tiny, 2))
	h3, err := Hash(other)
	require.NoError(t, err)
	assert.NotEqual(t, h1, h3, "different seed, different weights")

	cfg, err := os.ReadFile(filepath.Join(dir, ConfigFile))
	require.NoError(t, err)
	require.NoError(t, os.WriteFile(filepath.Join(dir, ConfigFile), append(cfg, ' '), 0o644))
	h4, err := Hash(dir)
	require.NoError(t, err)
	assert.NotEqual(t, h1, h4, "config change changes the hash")

	sharded := t.TempDir()
	writeSharded(t, sharded, map[string]string{"a": "model-00001-of-00002.safetensors", "b": "model-00001-of-00002.safetensors", "c": "model-00002-of-00002.safetensors"})
	hs, err := Hash(sharded)
	require.NoError(t, err)
	require.NoError(t, os.WriteFile(filepath.Join(sharded, "model-00002-of-00002.safetensors"), []byte("x"), 0o644))
	hs2, err := Hash(sharded)
	require.NoError(t, err)
	assert.NotEqual(t, hs, hs2, "every shard is hashed")
}
