package model

import (
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"strings"
)

// NotFoundError says a model could be found neither as a directory nor in
// the local Hugging Face cache. Searched lists every path looked at.
type NotFoundError struct {
	Name     string
	Searched []string
	Reason   string // why the last candidate was rejected, if one existed
	// Path: Name is a local path (it exists, or looks like one), so the fix
	// is a directory, not a download.
	Path bool
	// Steps are the checkpoints beside a missing RUN/checkpoints/step-N
	// path (their model or adapter directories), newest last.
	Steps []string
}

// checkpointSiblings lists the step-* checkpoints (those holding a model/
// or adapter/ directory) of the checkpoints directory a path points into,
// for a path such as runs/x/checkpoints/step-000100/model that is missing.
func checkpointSiblings(name string) []string {
	clean := filepath.Clean(name)
	for dir := clean; dir != "." && dir != string(filepath.Separator); dir = filepath.Dir(dir) {
		if filepath.Base(dir) != "checkpoints" {
			continue
		}
		entries, err := os.ReadDir(dir)
		if err != nil {
			return nil
		}
		var out []string
		for _, e := range entries {
			if !e.IsDir() || !strings.HasPrefix(e.Name(), "step-") {
				continue
			}
			for _, sub := range []string{"model", "adapter"} {
				p := filepath.Join(dir, e.Name(), sub)
				if st, err := os.Stat(p); err == nil && st.IsDir() {
					out = append(out, p)
				}
			}
		}
		return out // ReadDir sorts by name: step-000002 before step-000010
	}
	return nil
}

func (e *NotFoundError) Error() string {
	var b strings.Builder
	fmt.Fprintf(&b, "model %q not found", e.Name)
	if e.Reason != "" {
		fmt.Fprintf(&b, " (%s)", e.Reason)
	}
	fmt.Fprintf(&b, "; searched: %s", strings.Join(e.Searched, ", "))
	switch {
	case e.Path && len(e.Steps) > 0:
		fmt.Fprintf(&b, "; the checkpoints there are: %s", strings.Join(e.Steps, ", "))
	case e.Path && strings.Contains(filepath.ToSlash(e.Name), "checkpoints/"):
		b.WriteString("; that run has no checkpoint yet (`ortrain run --resume` continues it once one is saved)")
	case e.Path:
		fmt.Fprintf(&b, "; pass a directory holding config.json and model.safetensors, or create one with `ortrain init-model --preset tiny --out %s`", e.Name)
	case repoIDPattern.MatchString(e.Name):
		fmt.Fprintf(&b, "; ortrain never downloads: run `hf download %s` on a machine with network access (set HF_HUB_CACHE or HF_HOME to share the cache), or pass a local model directory", e.Name)
	default:
		b.WriteString("; pass a directory holding config.json and model.safetensors, a Hugging Face repo id (Org/Name) present in the local cache, or create one with `ortrain init-model --preset tiny --out DIR`")
	}
	return b.String()
}

// looksLikePath reports whether a name that does not exist was meant as a
// local path rather than a Hugging Face repo id: it starts with . / or ~,
// is not of the Org/Name form, or its first component is a directory here
// (models/nope when models/ exists).
func looksLikePath(name string) bool {
	if strings.HasPrefix(name, ".") || strings.HasPrefix(name, "/") || strings.HasPrefix(name, "~") || strings.Contains(name, `\`) {
		return true
	}
	if !repoIDPattern.MatchString(name) {
		return strings.Contains(name, "/")
	}
	first, _, _ := strings.Cut(name, "/")
	st, err := os.Stat(first)
	return err == nil && st.IsDir()
}

// dirContents names up to a few entries of dir, for an error message.
func dirContents(dir string) string {
	entries, err := os.ReadDir(dir)
	if err != nil {
		return ""
	}
	if len(entries) == 0 {
		return "it is empty"
	}
	var names []string
	for _, e := range entries[:min(len(entries), 6)] {
		n := e.Name()
		if e.IsDir() {
			n += "/"
		}
		names = append(names, n)
	}
	if len(entries) > 6 {
		names = append(names, fmt.Sprintf("and %d more", len(entries)-6))
	}
	return "it holds " + strings.Join(names, ", ")
}

// repoIDPattern matches a Hugging Face repo id such as Qwen/Qwen3-4B.
var repoIDPattern = regexp.MustCompile(`^[A-Za-z0-9][A-Za-z0-9._-]*/[A-Za-z0-9][A-Za-z0-9._-]*$`)

// HubCacheDir returns the Hugging Face hub cache directory that
// huggingface_hub would use, from the environment: $HF_HUB_CACHE, else the
// legacy $HUGGINGFACE_HUB_CACHE, else $HF_HOME/hub, else
// $XDG_CACHE_HOME/huggingface/hub, else ~/.cache/huggingface/hub.
func HubCacheDir(getenv func(string) string) string {
	if v := getenv("HF_HUB_CACHE"); v != "" {
		return v
	}
	if v := getenv("HUGGINGFACE_HUB_CACHE"); v != "" {
		return v
	}
	if v := getenv("HF_HOME"); v != "" {
		return filepath.Join(v, "hub")
	}
	if v := getenv("XDG_CACHE_HOME"); v != "" {
		return filepath.Join(v, "huggingface", "hub")
	}
	return filepath.Join(getenv("HOME"), ".cache", "huggingface", "hub")
}

// Resolve finds a model directory. nameOrDir is either a directory holding
// config.json, or a Hugging Face repo id (Org/Name) looked up in the local
// hub cache (models--Org--Name/refs/main names the snapshot to use). It
// never downloads. searched lists the paths looked at, in order; on failure
// err is a *NotFoundError carrying the same list.
func Resolve(nameOrDir string, getenv func(string) string) (dir string, searched []string, err error) {
	if nameOrDir == "" {
		return "", nil, fmt.Errorf("model name is empty; pass a model directory or a Hugging Face repo id such as Qwen/Qwen3-0.6B")
	}
	searched = append(searched, nameOrDir)
	if st, statErr := os.Stat(nameOrDir); statErr == nil && st.IsDir() {
		if hasConfig(nameOrDir) {
			return nameOrDir, searched, nil
		}
		reason := "directory " + nameOrDir + " has no " + ConfigFile
		if what := dirContents(nameOrDir); what != "" {
			reason += "; " + what
		}
		return "", searched, &NotFoundError{Name: nameOrDir, Searched: searched, Reason: reason, Path: true, Steps: checkpointSiblings(nameOrDir)}
	}
	if !repoIDPattern.MatchString(nameOrDir) {
		if looksLikePath(nameOrDir) {
			return "", searched, &NotFoundError{Name: nameOrDir, Searched: searched, Reason: "directory " + nameOrDir + " does not exist", Path: true, Steps: checkpointSiblings(nameOrDir)}
		}
		return "", searched, &NotFoundError{Name: nameOrDir, Searched: searched, Reason: "no such directory, and not a repo id of the form Org/Name"}
	}
	org, name, _ := strings.Cut(nameOrDir, "/")
	repoDir := filepath.Join(HubCacheDir(getenv), "models--"+org+"--"+name)
	snap, looked, reason := snapshotDir(repoDir)
	searched = append(searched, looked...)
	if snap == "" {
		if looksLikePath(nameOrDir) {
			// models/nope with models/ here: a mistyped path, not a repo id.
			first, _, _ := strings.Cut(nameOrDir, "/")
			reason = "directory " + nameOrDir + " does not exist, and it is not in the local Hugging Face cache"
			if what := dirContents(first); what != "" {
				reason += "; " + first + "/: " + what
			}
			return "", searched, &NotFoundError{Name: nameOrDir, Searched: searched, Reason: reason, Path: true, Steps: checkpointSiblings(nameOrDir)}
		}
		return "", searched, &NotFoundError{Name: nameOrDir, Searched: searched, Reason: reason}
	}
	return snap, searched, nil
}

// snapshotDir picks the snapshot refs/main points at; when refs/main is
// missing but exactly one snapshot exists (a cache copied by hand), it uses
// that one.
func snapshotDir(repoDir string) (dir string, looked []string, reason string) {
	ref := filepath.Join(repoDir, "refs", "main")
	looked = append(looked, ref)
	if b, err := os.ReadFile(ref); err == nil {
		sha := strings.TrimSpace(string(b))
		if sha == "" || strings.ContainsAny(sha, `/\`) || sha == "." || sha == ".." {
			return "", looked, fmt.Sprintf("%s holds %q, not a commit hash", ref, sha)
		}
		snap := filepath.Join(repoDir, "snapshots", sha)
		looked = append(looked, snap)
		if hasConfig(snap) {
			return snap, looked, ""
		}
		return "", looked, fmt.Sprintf("snapshot %s has no %s (incomplete download?)", snap, ConfigFile)
	}
	snaps := filepath.Join(repoDir, "snapshots")
	looked = append(looked, snaps)
	entries, err := os.ReadDir(snaps)
	if err != nil {
		return "", looked, "no such directory, and not in the local Hugging Face cache"
	}
	var candidates []string
	for _, e := range entries {
		if p := filepath.Join(snaps, e.Name()); e.IsDir() && hasConfig(p) {
			candidates = append(candidates, p)
		}
	}
	if len(candidates) == 1 {
		return candidates[0], looked, ""
	}
	return "", looked, fmt.Sprintf("%s has no refs/main and %d complete snapshots; cannot choose", repoDir, len(candidates))
}

func hasConfig(dir string) bool {
	st, err := os.Stat(filepath.Join(dir, ConfigFile))
	return err == nil && !st.IsDir()
}
