// Package report turns a run directory into one self-contained HTML file:
// metric plots rendered server-side to SVG, eval results, and a bounded
// sample of trajectories rendered as conversations.
package report

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"sort"
)

// Files of a run directory the report reads (see internal/train/rundir.go).
const (
	metricsFile      = "metrics.jsonl"
	trajectoriesFile = "trajectories.jsonl"
	manifestFile     = "manifest.json"
	evalDir          = "eval"
	// evalResultFile is the file each eval/<name>/ directory holds: the
	// JSON of train.EvalResult plus optional checkpoint_step, model and
	// model_hash fields.
	evalResultFile = "result.json"
)

// maxLineBytes bounds one JSONL line; a longer line is skipped and counted
// instead of failing the whole report.
const maxLineBytes = 64 << 20

// manifest is the part of manifest.json the report shows.
type manifest struct {
	OrtrainVersion  string `json:"ortrain_version"`
	WorkerVersion   string `json:"worker_version"`
	LibtorchVersion string `json:"libtorch_version"`
	Model           string `json:"model"`
	ModelHash       string `json:"model_hash"`
	Seed            int64  `json:"seed"`
	StartedAt       string `json:"started_at"`
	Envs            []struct {
		Target string `json:"target"`
		Name   string `json:"name"`
		Split  string `json:"split"`
	} `json:"envs"`
	// Extra is what a kind of run adds; free-form, so it is decoded
	// leniently (runKind): a shape the report does not know never stops it.
	Extra json.RawMessage `json:"extra"`
}

// envName is the name of env index i, or its index when the manifest does
// not list it.
func (m *manifest) envName(i int) string {
	if m != nil && i >= 0 && i < len(m.Envs) && m.Envs[i].Name != "" {
		return m.Envs[i].Name
	}
	return fmt.Sprintf("env %d", i)
}

func readManifest(dir string) (*manifest, error) {
	b, err := os.ReadFile(filepath.Join(dir, manifestFile))
	if errors.Is(err, os.ErrNotExist) {
		return nil, nil
	}
	if err != nil {
		return nil, fmt.Errorf("read manifest: %w", err)
	}
	var m manifest
	if err := json.Unmarshal(b, &m); err != nil {
		return nil, fmt.Errorf("decode %s: %w", manifestFile, err)
	}
	return &m, nil
}

// metricsTable is metrics.jsonl: one row per logged step, numeric values
// only, rows sorted by step; a step logged twice (resume) keeps its last row.
type metricsTable struct {
	steps   []float64
	rows    []map[string]float64
	skipped int // lines that were not JSON objects
}

func readMetrics(ctx context.Context, dir string) (*metricsTable, error) {
	f, err := os.Open(filepath.Join(dir, metricsFile))
	if errors.Is(err, os.ErrNotExist) {
		return &metricsTable{}, nil
	}
	if err != nil {
		return nil, fmt.Errorf("open metrics: %w", err)
	}
	defer f.Close()
	byStep := map[float64]map[string]float64{}
	t := &metricsTable{}
	n := 0
	tooLong, err := eachLine(ctx, f, maxLineBytes, func(line []byte) {
		n++
		var raw map[string]any
		if err := json.Unmarshal(line, &raw); err != nil {
			t.skipped++
			return
		}
		row := make(map[string]float64, len(raw))
		for k, v := range raw {
			if f, ok := v.(float64); ok {
				row[k] = f
			}
		}
		step, ok := row["step"]
		if !ok {
			step = float64(n)
		}
		byStep[step] = row
	})
	if err != nil {
		return nil, fmt.Errorf("read %s: %w", metricsFile, err)
	}
	t.skipped += tooLong
	for s := range byStep {
		t.steps = append(t.steps, s)
	}
	sort.Float64s(t.steps)
	for _, s := range t.steps {
		t.rows = append(t.rows, byStep[s])
	}
	return t, nil
}

// keys returns every metric name in the table, sorted.
func (t *metricsTable) keys() []string {
	seen := map[string]bool{}
	for _, r := range t.rows {
		for k := range r {
			seen[k] = true
		}
	}
	out := make([]string, 0, len(seen))
	for k := range seen {
		out = append(out, k)
	}
	sort.Strings(out)
	return out
}

// series returns the steps and values of key, only where it was logged.
func (t *metricsTable) series(key string) (xs, ys []float64) {
	for i, r := range t.rows {
		if v, ok := r[key]; ok {
			xs = append(xs, t.steps[i])
			ys = append(ys, v)
		}
	}
	return xs, ys
}

// eachLine calls fn with every complete line of r and returns how many
// lines it skipped for being longer than maxLine. A last line without a
// newline is a line a running trainer is still writing: it is dropped, so
// --watch never reads half a record. It stops early when ctx is done.
func eachLine(ctx context.Context, r io.Reader, maxLine int, fn func([]byte)) (skipped int, err error) {
	br := bufio.NewReaderSize(r, 1<<20)
	var long []byte
	tooLong := false
	for n := 0; ; n++ {
		// A run's files can be large: let Ctrl-C through between lines.
		if n%1024 == 0 {
			if err := ctx.Err(); err != nil {
				return skipped, err
			}
		}
		chunk, err := br.ReadSlice('\n')
		switch {
		case err == bufio.ErrBufferFull:
			if !tooLong && len(long)+len(chunk) <= maxLine {
				long = append(long, chunk...)
			} else {
				tooLong, long = true, long[:0]
			}
			continue
		case err == io.EOF:
			return skipped, nil
		case err != nil:
			return skipped, err
		}
		line := chunk
		if len(long) > 0 {
			line = append(long, chunk...)
			long = long[:0]
		}
		if !tooLong && len(line)-1 > maxLine {
			tooLong = true
		}
		switch {
		case tooLong:
			skipped++
		case len(line) > 1:
			fn(line[:len(line)-1])
		}
		tooLong = false
	}
}

// evalRun is one eval/<name>/result.json.
type evalRun struct {
	Name           string             `json:"-"`
	CheckpointStep *int               `json:"checkpoint_step"`
	Model          string             `json:"model"`
	ModelHash      string             `json:"model_hash"`
	MeanReward     float64            `json:"mean_reward"`
	PassAtK        map[string]float64 `json:"pass_at_k"`
	Rollouts       int                `json:"rollouts"`
	Failures       int                `json:"failed_rollouts"`
	Seconds        float64            `json:"seconds"`
	Tasks          []struct {
		Env  string  `json:"env"`
		Mean float64 `json:"mean_reward"`
	} `json:"tasks"`
}

// envMeans is the mean task reward per env of an eval.
func (e evalRun) envMeans() map[string]float64 {
	sum, n := map[string]float64{}, map[string]int{}
	for _, t := range e.Tasks {
		sum[t.Env] += t.Mean
		n[t.Env]++
	}
	for k := range sum {
		sum[k] /= float64(n[k])
	}
	return sum
}

// readEvals reads every eval/*/result.json, ordered by checkpoint step then
// name. A directory without the file (an eval still running) is skipped.
func readEvals(dir string) ([]evalRun, error) {
	entries, err := os.ReadDir(filepath.Join(dir, evalDir))
	if errors.Is(err, os.ErrNotExist) {
		return nil, nil
	}
	if err != nil {
		return nil, fmt.Errorf("list evals: %w", err)
	}
	var out []evalRun
	for _, e := range entries {
		if !e.IsDir() {
			continue
		}
		b, err := os.ReadFile(filepath.Join(dir, evalDir, e.Name(), evalResultFile))
		if errors.Is(err, os.ErrNotExist) {
			continue
		}
		if err != nil {
			return nil, fmt.Errorf("read eval %s: %w", e.Name(), err)
		}
		var r evalRun
		if err := json.Unmarshal(b, &r); err != nil {
			return nil, fmt.Errorf("decode eval %s/%s: %w", e.Name(), evalResultFile, err)
		}
		r.Name = e.Name()
		out = append(out, r)
	}
	sort.SliceStable(out, func(i, j int) bool {
		si, sj := -1, -1
		if out[i].CheckpointStep != nil {
			si = *out[i].CheckpointStep
		}
		if out[j].CheckpointStep != nil {
			sj = *out[j].CheckpointStep
		}
		if si != sj {
			return si < sj
		}
		return out[i].Name < out[j].Name
	})
	return out, nil
}

// logged reports whether key was logged at any step.
func (t *metricsTable) logged(key string) bool {
	for _, r := range t.rows {
		if _, ok := r[key]; ok {
			return true
		}
	}
	return false
}

// at is key's value at step, 0 where it was not logged.
func (t *metricsTable) at(step float64, key string) float64 {
	i := sort.SearchFloat64s(t.steps, step)
	if i < len(t.steps) && t.steps[i] == step {
		return t.rows[i][key]
	}
	return 0
}
