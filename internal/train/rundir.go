package train

import (
	"bufio"
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"sort"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/ortrain/ortrain/internal/config"
	"github.com/ortrain/ortrain/internal/model"
	"github.com/ortrain/ortrain/internal/runlock"
	"github.com/ortrain/ortrain/internal/tfevents"
	"github.com/ortrain/ortrain/internal/worker"
)

// A run directory holds everything a run leaves behind:
//
//	config.yaml         the resolved configuration
//	manifest.json       versions, model hash, envs, task indices, seed
//	metrics.jsonl       one JSON object per logged step
//	trajectories.jsonl  every rollout: prompt, tool calls, outputs, rewards
//	checkpoints/step-N/ complete checkpoints (DONE marker written last)

// Manifest records what a run was made of, for reproducibility.
type manifest struct {
	OrtrainVersion  string        `json:"ortrain_version"`
	WorkerVersion   string        `json:"worker_version,omitempty"`
	LibtorchVersion string        `json:"libtorch_version,omitempty"`
	Model           string        `json:"model"`
	ModelHash       string        `json:"model_hash"`
	Seed            int64         `json:"seed"`
	Envs            []manifestEnv `json:"envs"`
	StartedAt       string        `json:"started_at"`
	// ResumedAt lists when --resume continued the run (started_at stays
	// the run's first start).
	ResumedAt []string        `json:"resumed_at,omitempty"`
	Extra     json.RawMessage `json:"extra,omitempty"`
}

// ManifestEnv is one env of the run with the task indices it draws from.
type manifestEnv struct {
	Key      string `json:"key"`
	Target   string `json:"target"`
	Name     string `json:"name"`
	Protocol string `json:"protocol"`
	Split    string `json:"split"`
	Indices  []int  `json:"indices"`
	// Secrets are the names of the secrets the env was given, never values.
	Secrets []string `json:"secrets,omitempty"`
}

// WriteJSONAtomic writes v as indented JSON through a temp file and rename.
func writeJSONAtomic(path string, v any) error {
	b, err := json.MarshalIndent(v, "", "  ")
	if err != nil {
		return fmt.Errorf("encode %s: %w", filepath.Base(path), err)
	}
	return writeFileAtomic(path, append(b, '\n'))
}

// WriteFileAtomic writes data so readers see the old file or the new one,
// never a partial one.
func writeFileAtomic(path string, data []byte) error {
	tmp, err := os.CreateTemp(filepath.Dir(path), "."+filepath.Base(path)+".tmp-*")
	if err != nil {
		return fmt.Errorf("write %s: %w", path, err)
	}
	defer os.Remove(tmp.Name())
	if _, err := tmp.Write(data); err != nil {
		tmp.Close()
		return fmt.Errorf("write %s: %w", path, err)
	}
	if err := tmp.Sync(); err != nil {
		tmp.Close()
		return fmt.Errorf("sync %s: %w", path, err)
	}
	if err := tmp.Close(); err != nil {
		return fmt.Errorf("close %s: %w", path, err)
	}
	if err := os.Rename(tmp.Name(), path); err != nil {
		return fmt.Errorf("publish %s: %w", path, err)
	}
	return nil
}

// JSONLWriter appends one JSON object per line and flushes each line, so an
// interrupted run loses nothing it has logged. Safe for concurrent use.
type jsonlWriter struct {
	mu sync.Mutex
	f  *os.File
	w  *bufio.Writer
}

// OpenJSONL opens path for appending (resume continues the same file).
func openJSONL(path string) (*jsonlWriter, error) {
	f, err := os.OpenFile(path, os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o644)
	if err != nil {
		return nil, fmt.Errorf("open log: %w", err)
	}
	return &jsonlWriter{f: f, w: bufio.NewWriter(f)}, nil
}

// truncateJSONL keeps the lines of a JSONL log whose "step" is at most step
// and drops the rest, torn lines of a killed writer included; the file is
// replaced atomically. A missing file is left missing.
func truncateJSONL(path string, step int) error {
	b, err := os.ReadFile(path)
	if errors.Is(err, os.ErrNotExist) {
		return nil
	}
	if err != nil {
		return err
	}
	var kept bytes.Buffer
	for line := range bytes.Lines(b) {
		var rec struct {
			Step *float64 `json:"step"`
		}
		if json.Unmarshal(line, &rec) != nil || rec.Step == nil || *rec.Step > float64(step) || !bytes.HasSuffix(line, []byte("\n")) {
			continue
		}
		kept.Write(line)
	}
	if kept.Len() == len(b) {
		return nil
	}
	return writeFileAtomic(path, kept.Bytes())
}

// Write appends v as one line.
func (j *jsonlWriter) Write(v any) error {
	b, err := json.Marshal(v)
	if err != nil {
		return fmt.Errorf("encode %s line: %w", filepath.Base(j.f.Name()), err)
	}
	j.mu.Lock()
	defer j.mu.Unlock()
	if _, err := j.w.Write(append(b, '\n')); err != nil {
		return err
	}
	return j.w.Flush()
}

// Close flushes and closes the file.
func (j *jsonlWriter) Close() error {
	j.mu.Lock()
	defer j.mu.Unlock()
	if err := j.w.Flush(); err != nil {
		j.f.Close()
		return err
	}
	return j.f.Close()
}

// doneMarker is written last into a checkpoint; only checkpoints that have
// it are complete.
const doneMarker = "DONE"

func checkpointName(step int) string { return fmt.Sprintf("step-%06d", step) }

// SaveCheckpoint writes checkpoint step under dir/checkpoints: fill writes
// the model and optimizer files into a temp directory, then the trainer state
// and the DONE marker are added and the directory is renamed into place.
func writeCheckpoint(dir string, step int, state any, fill func(tmp string) error) (string, error) {
	root := filepath.Join(dir, "checkpoints")
	if err := os.MkdirAll(root, 0o755); err != nil {
		return "", fmt.Errorf("create checkpoints dir: %w", err)
	}
	tmp, err := os.MkdirTemp(root, ".tmp-"+checkpointName(step)+"-")
	if err != nil {
		return "", fmt.Errorf("create checkpoint temp dir: %w", err)
	}
	defer os.RemoveAll(tmp)
	if err := fill(tmp); err != nil {
		return "", fmt.Errorf("write checkpoint %d: %w", step, err)
	}
	if err := writeJSONAtomic(filepath.Join(tmp, "trainer_state.json"), state); err != nil {
		return "", err
	}
	if err := os.WriteFile(filepath.Join(tmp, doneMarker), []byte(strconv.Itoa(step)+"\n"), 0o644); err != nil {
		return "", fmt.Errorf("write checkpoint marker: %w", err)
	}
	final := filepath.Join(root, checkpointName(step))
	if err := os.RemoveAll(final); err != nil {
		return "", fmt.Errorf("replace checkpoint %s: %w", final, err)
	}
	if err := os.Rename(tmp, final); err != nil {
		return "", fmt.Errorf("publish checkpoint %s: %w", final, err)
	}
	return final, nil
}

// ErrNoCheckpoint means a run directory has no complete checkpoint.
var ErrNoCheckpoint = errors.New("no complete checkpoint")

// LatestCheckpoint finds the complete checkpoint with the highest step.
func LatestCheckpoint(dir string) (path string, step int, err error) {
	root := filepath.Join(dir, "checkpoints")
	entries, err := os.ReadDir(root)
	if errors.Is(err, os.ErrNotExist) {
		return "", 0, fmt.Errorf("%w in %s", ErrNoCheckpoint, dir)
	}
	if err != nil {
		return "", 0, fmt.Errorf("list checkpoints: %w", err)
	}
	type ck struct {
		step int
		path string
	}
	var found []ck
	for _, e := range entries {
		name := e.Name()
		if !e.IsDir() || !strings.HasPrefix(name, "step-") {
			continue
		}
		n, err := strconv.Atoi(strings.TrimPrefix(name, "step-"))
		if err != nil {
			continue
		}
		p := filepath.Join(root, name)
		if _, err := os.Stat(filepath.Join(p, doneMarker)); err != nil {
			continue // incomplete: never resume from it
		}
		found = append(found, ck{n, p})
	}
	if len(found) == 0 {
		return "", 0, fmt.Errorf("%w in %s", ErrNoCheckpoint, root)
	}
	sort.Slice(found, func(i, j int) bool { return found[i].step > found[j].step })
	return found[0].path, found[0].step, nil
}

// ReadJSON decodes a JSON file into v.
func ReadJSON(path string, v any) error {
	b, err := os.ReadFile(path)
	if err != nil {
		return err
	}
	if err := json.Unmarshal(b, v); err != nil {
		return fmt.Errorf("decode %s: %w", path, err)
	}
	return nil
}

// ErrRunDirInUse: output_dir holds an earlier run and neither --resume nor
// --overwrite was given.
var ErrRunDirInUse = errors.New("output_dir holds an earlier run")

// runFiles are what a run writes; an earlier run is detected by them.
var runFiles = []string{"metrics.jsonl", "trajectories.jsonl", "checkpoints", "manifest.json", "config.yaml"}

// earlierRun lists the files of an earlier run in dir.
func earlierRun(dir string) []string {
	var found []string
	for _, f := range runFiles {
		if _, err := os.Stat(filepath.Join(dir, f)); err == nil {
			found = append(found, f)
		}
	}
	return found
}

// checkFreshRunDir refuses to mix a new run into an earlier one's files
// (it deletes nothing: see clearEarlierRun).
func checkFreshRunDir(dir string, ro RunOptions) error {
	if he := runlock.Held(dir); he != nil {
		return he // a live run: neither --resume nor --overwrite may touch it
	}
	if ro.Resume || ro.Overwrite {
		return nil
	}
	if found := earlierRun(dir); len(found) > 0 {
		return fmt.Errorf("%w: %s has %v; pass --resume to continue it, --overwrite to start over, or another --output-dir", ErrRunDirInUse, dir, found)
	}
	return nil
}

// derivedFiles are what a run, its evals and its tools add beside runFiles.
// ranks/ holds the local launcher's rank logs: a launch with --overwrite
// starts them afresh itself (launch.LocalOptions.FreshLogs), so a rank of a
// distributed run leaves them alone.
var derivedFiles = []string{"eval", "report.html", "tb", "resume-changes.jsonl", "vllm-logs", "weight-sync", "ranks"}

// clearEarlierRun deletes an earlier run's files for --overwrite: what it
// wrote and what was derived from it (evals, the report, TensorBoard
// events, rank logs). It runs only once the new run has passed its startup
// checks and is about to write, so a run that cannot start leaves the
// earlier one intact.
func clearEarlierRun(dir string, distributed bool) error {
	for _, f := range append(slices.Clone(runFiles), derivedFiles...) {
		if f == "ranks" && distributed {
			continue
		}
		if err := os.RemoveAll(filepath.Join(dir, f)); err != nil {
			return fmt.Errorf("--overwrite: %w", err)
		}
	}
	return nil
}

// runDir holds the run directory's open files.
type runDir struct {
	metrics, trajectories *jsonlWriter
	// tb writes every metric as TensorBoard scalars (logging.tensorboard).
	tb *tfevents.Writer
}

// close closes the open logs (a rank other than 0 opens none).
func (r *runDir) close() {
	if r.metrics != nil {
		r.metrics.Close()
	}
	if r.trajectories != nil {
		r.trajectories.Close()
	}
	if r.tb != nil {
		r.tb.Close()
	}
}

// writeMetrics appends one step to metrics.jsonl and, with TensorBoard on,
// to RUN_DIR/tb under Hugging Face Trainer's tag names (train/reward, …).
func (r *runDir) writeMetrics(step int, m map[string]float64) error {
	if r.metrics == nil {
		return nil
	}
	err := r.metrics.Write(m)
	if r.tb != nil {
		if terr := r.tb.AddScalars(step, time.Now(), tfevents.TrainerTags(m)); terr != nil {
			err = errors.Join(err, fmt.Errorf("tensorboard: %w", terr))
		} else if terr := r.tb.Flush(); terr != nil {
			err = errors.Join(err, fmt.Errorf("tensorboard: %w", terr))
		}
	}
	return err
}

// openRunDir writes config.yaml and manifest.json and opens the JSONL logs
// (appending, so a resumed run continues them).
// On resume both logs are first cut back to the checkpoint's step, so a
// reader sees every step once (a killed run may have logged steps past it).
func openRunDir(cfg *config.Config, modelDir string, envList []*runEnv, ro RunOptions, lib *worker.Library, step int) (*runDir, error) {
	y, err := cfg.YAML()
	if err != nil {
		return nil, fmt.Errorf("render config: %w", err)
	}
	if err := writeFileAtomic(filepath.Join(cfg.OutputDir, "config.yaml"), y); err != nil {
		return nil, err
	}
	hash, err := model.Hash(modelDir)
	if err != nil {
		return nil, fmt.Errorf("hash model %s: %w", modelDir, err)
	}
	info := lib.Info()
	man := manifest{
		OrtrainVersion: ro.Version, LibtorchVersion: info.LibtorchVersion, WorkerVersion: fmt.Sprint(info.ABIVersion),
		Model: modelDir, ModelHash: hash, Seed: cfg.Seed, StartedAt: time.Now().UTC().Format(time.RFC3339),
	}
	if ro.Resume {
		var prev manifest
		if err := ReadJSON(filepath.Join(cfg.OutputDir, "manifest.json"), &prev); err == nil && prev.StartedAt != "" {
			man.StartedAt, man.ResumedAt = prev.StartedAt, append(prev.ResumedAt, man.StartedAt)
		}
	}
	for _, e := range envList {
		man.Envs = append(man.Envs, manifestEnv{Key: e.Key, Target: e.Config.Target, Name: e.Name, Protocol: string(e.Conn.Protocol()),
			Split: e.Config.Split, Indices: e.Indices, Secrets: e.Config.SecretNames()})
	}
	if err := writeJSONAtomic(filepath.Join(cfg.OutputDir, "manifest.json"), man); err != nil {
		return nil, err
	}
	rd := &runDir{}
	metrics, trajectories := filepath.Join(cfg.OutputDir, "metrics.jsonl"), filepath.Join(cfg.OutputDir, "trajectories.jsonl")
	if ro.Resume {
		for _, path := range []string{metrics, trajectories} {
			if err := truncateJSONL(path, step); err != nil {
				return nil, fmt.Errorf("--resume: %w", err)
			}
		}
	}
	if rd.metrics, err = openJSONL(metrics); err != nil {
		return nil, err
	}
	if cfg.Logging.TensorBoard {
		// A resumed run adds a new event file; TensorBoard reads them all.
		if rd.tb, err = tfevents.Create(filepath.Join(cfg.OutputDir, "tb")); err != nil {
			rd.metrics.Close()
			return nil, err
		}
	}
	if cfg.Logging.LogCompletions {
		if rd.trajectories, err = openJSONL(trajectories); err != nil {
			rd.close()
			return nil, err
		}
	}
	return rd, nil
}
