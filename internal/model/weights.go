package model

import (
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"slices"
	"strconv"
)

// File names of the weights inside a model directory.
const (
	SingleWeightsFile  = "model.safetensors"
	ShardedWeightsFile = "model.safetensors.index.json"
)

// WeightIndex is a sharded checkpoint's model.safetensors.index.json.
type WeightIndex struct {
	Metadata  map[string]any    `json:"metadata"`
	WeightMap map[string]string `json:"weight_map"`
}

// WeightFiles lists a model directory's safetensors files (names relative
// to dir, sorted): model.safetensors, or the shards its index names. When
// both exist the index wins, as in transformers.
func WeightFiles(dir string) ([]string, error) {
	indexPath := filepath.Join(dir, ShardedWeightsFile)
	idx, err := readWeightIndex(indexPath)
	switch {
	case err == nil:
		var files []string
		for _, f := range idx.WeightMap {
			if !slices.Contains(files, f) {
				files = append(files, f)
			}
		}
		slices.Sort(files)
		return files, nil
	case !errors.Is(err, fs.ErrNotExist):
		return nil, err
	}
	if _, err := os.Stat(filepath.Join(dir, SingleWeightsFile)); err != nil {
		return nil, &IncompleteError{Dir: dir, Missing: "weights: neither " + SingleWeightsFile + " nor " + ShardedWeightsFile}
	}
	return []string{SingleWeightsFile}, nil
}

func readWeightIndex(path string) (*WeightIndex, error) {
	data, err := os.ReadFile(path)
	if err != nil {
		return nil, err
	}
	var idx WeightIndex
	if err := json.Unmarshal(data, &idx); err != nil {
		return nil, fmt.Errorf("%s: %w", path, err)
	}
	if len(idx.WeightMap) == 0 {
		return nil, fmt.Errorf("%s: weight_map is empty", path)
	}
	for name, f := range idx.WeightMap {
		if f == "" || filepath.Base(f) != f {
			return nil, fmt.Errorf("%s: weight_map[%q] = %q is not a file name in the model directory", path, name, f)
		}
	}
	return &idx, nil
}

// ModelTensor is a tensor of a model directory and the file holding it.
type ModelTensor struct {
	File string // relative to the model directory
	TensorInfo
}

// ReadModelTensors parses every safetensors header of a model directory and
// returns its tensors by name. For a sharded checkpoint it checks that the
// index and the shards agree: every indexed tensor is in the named shard,
// and no shard holds a tensor the index does not list.
func ReadModelTensors(dir string) (map[string]ModelTensor, error) {
	files, err := WeightFiles(dir)
	if err != nil {
		return nil, err
	}
	out := map[string]ModelTensor{}
	for _, f := range files {
		h, err := ReadSafetensorsHeader(filepath.Join(dir, f))
		if err != nil {
			return nil, err
		}
		for _, t := range h.Tensors {
			if prev, ok := out[t.Name]; ok {
				return nil, fmt.Errorf("model %s: tensor %q appears in both %s and %s", dir, t.Name, prev.File, f)
			}
			out[t.Name] = ModelTensor{File: f, TensorInfo: t}
		}
	}
	if files[0] == SingleWeightsFile && len(files) == 1 {
		if _, err := os.Stat(filepath.Join(dir, ShardedWeightsFile)); err != nil {
			return out, nil
		}
	}
	idx, err := readWeightIndex(filepath.Join(dir, ShardedWeightsFile))
	if err != nil {
		return nil, err
	}
	for name, f := range idx.WeightMap {
		t, ok := out[name]
		if !ok || t.File != f {
			return nil, fmt.Errorf("model %s: index says tensor %q is in %s, but it is not there", dir, name, f)
		}
	}
	for name, t := range out {
		if _, ok := idx.WeightMap[name]; !ok {
			return nil, fmt.Errorf("model %s: tensor %q in %s is missing from %s", dir, name, t.File, ShardedWeightsFile)
		}
	}
	return out, nil
}

// Hash fingerprints a model for run manifests: the hex SHA-256 over
// config.json and every weight file (index included when sharded), each
// framed by its name and size, streamed so checkpoints of any size hash in
// constant memory.
func Hash(dir string) (string, error) {
	files, err := WeightFiles(dir)
	if err != nil {
		return "", err
	}
	names := []string{ConfigFile}
	if _, err := os.Stat(filepath.Join(dir, ShardedWeightsFile)); err == nil {
		names = append(names, ShardedWeightsFile)
	}
	names = append(names, files...)
	h := sha256.New()
	for _, name := range names {
		if err := hashFile(h, dir, name); err != nil {
			return "", err
		}
	}
	return hex.EncodeToString(h.Sum(nil)), nil
}

func hashFile(h io.Writer, dir, name string) error {
	f, err := os.Open(filepath.Join(dir, name))
	if err != nil {
		return fmt.Errorf("hash model: %w", err)
	}
	defer f.Close()
	st, err := f.Stat()
	if err != nil {
		return fmt.Errorf("hash model: %w", err)
	}
	io.WriteString(h, name+"\x00"+strconv.FormatInt(st.Size(), 10)+"\x00")
	if _, err := io.Copy(h, f); err != nil {
		return fmt.Errorf("hash model file %s: %w", f.Name(), err)
	}
	return nil
}

// IncompleteError: a model directory lacks files every load needs (its
// weights). A user's fix, like a missing model: the command exits 3.
type IncompleteError struct {
	Dir, Missing string
}

func (e *IncompleteError) Error() string {
	return fmt.Sprintf("model directory %s is incomplete: it has no %s; a model directory holds config.json, the weights and the tokenizer "+
		"(`hf download ORG/NAME` fetches them all; `ortrain init-model` makes a random one)", e.Dir, e.Missing)
}
