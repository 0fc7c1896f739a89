// Package archtest enforces the architecture of docs/design.md mechanically:
// an allow-list of the module's imports per package (a new arrow is a
// deliberate edit of that list and of the design), that only internal/worker
// uses cgo, and that the package tables of the README and docs/design.md
// name exactly the packages of the tree.
package archtest

import (
	"bytes"
	"encoding/json"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"sort"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

const mod = "github.com/ortrain/ortrain/"

// allowed lists, per package, every package of this module it may import.
// Arrows point one way: cli → train → {rollout, grpo, engine, worker} →
// {envtarget, chat, vllm} → {ors, envs} → leaves.
var allowed = map[string][]string{
	"cmd/ortrain": {"internal/cli"},
	"configs":     {},
	// a user's own agent run once per rollout (a process group or an HTTP service).
	"internal/agent": {},
	// rollouts played by a user's agent: gateway + MCP + the agent process, assembled into trajectories.
	"internal/agentrollout": {"internal/agent", "internal/engine", "internal/envmcp", "internal/envtarget", "internal/gateway", "internal/rollout"},
	"internal/archtest":     {},
	"internal/backoff":      {},
	"internal/chat":         {"internal/chat/jinja"},
	"internal/chat/jinja":   {},
	"internal/childproc":    {},
	"internal/cli": {"configs", "internal/chat", "internal/config", "internal/curriculum", "internal/demos", "internal/engine", "internal/engineserver", "internal/envcheck", "internal/envs", "internal/openenv", "internal/openenv/openenvserver", "internal/report", "internal/reward",
		"internal/envtarget", "internal/launch", "internal/model", "internal/ors", "internal/ors/orsserver", "internal/rollout", "internal/runlock",
		"internal/sft", "internal/smoke", "internal/train", "internal/verdict", "internal/vllm", "internal/worker"},
	"internal/config": {"internal/curriculum", "internal/grpo", "internal/reward"},
	// which tasks a run trains on: the epoch sampler, pass rates and the curriculum, dynamic sampling's group choice (pure Go, no rollouts).
	"internal/curriculum": {},
	// scripted demonstrations (SFT data) played through the env-target interfaces.
	"internal/demos":  {"internal/envtarget"},
	"internal/engine": {"internal/backoff", "internal/vllm", "internal/worker"},
	// serve-engine: the vLLM HTTP subset over the builtin backend, a room above engine and gateway; only cli imports it.
	"internal/engineserver": {"internal/chat", "internal/engine", "internal/gateway", "internal/model", "internal/vllm", "internal/worker"},
	// the pure-Go toy backend of serve's and engine's tests.
	"internal/engineserver/servetest": {"internal/engine"},
	"internal/envcheck":               {"internal/jsonschema", "internal/verdict"},
	// an env session's tools served to an agent over MCP (streamable HTTP), calls recorded.
	"internal/envmcp":    {"internal/envtarget", "internal/peercred"},
	"internal/envs":      {"internal/openenv", "internal/openenv/openenvserver", "internal/ors", "internal/ors/orsserver"},
	"internal/envtarget": {"internal/envs", "internal/openenv", "internal/openenv/openenvserver", "internal/ors", "internal/ors/orsserver"},
	// the OpenAI-compatible API served from the engine, per-rollout keys, token-exact recording.
	"internal/gateway":    {"internal/chat", "internal/engine", "internal/peercred"},
	"internal/grpo":       {},
	"internal/jsonschema": {},
	"internal/launch":     {"internal/childproc"},
	// this process's resident memory and its peak, from /proc.
	"internal/memstat": {},
	"internal/model":   {},
	"internal/openenv": {"internal/backoff"},
	// the OpenEnv kit also serves orsserver envs over OpenEnv (one Go env, both standards).
	"internal/openenv/openenvserver": {"internal/openenv", "internal/ors", "internal/ors/orsserver"},
	"internal/ors":                   {"internal/backoff"},
	"internal/ors/orsserver":         {"internal/ors"},
	// which local process holds a TCP connection's client end, and its ancestry, from /proc (pure Go).
	"internal/peercred": {},
	// the run report reads a run directory with its own types (no trainer, no cgo).
	"internal/report": {},
	// reward functions see trajectories through their own view type, not rollout's.
	"internal/reward":  {"internal/backoff", "internal/grpo"},
	"internal/rollout": {"internal/backoff", "internal/chat", "internal/engine", "internal/envtarget"},
	// one live writer per run directory: an flock held for the run's life.
	"internal/runlock": {},
	// SFT: data, tokens through the chat pipeline, batches; it plugs into train's step (train.Trainer).
	"internal/sft":   {"internal/chat", "internal/config", "internal/grpo", "internal/train", "internal/worker"},
	"internal/smoke": {"internal/config", "internal/envtarget", "internal/jsonschema", "internal/model", "internal/rollout", "internal/train", "internal/verdict"},
	// the real npm clients and agent CLIs the tests run (only tests import it).
	"internal/testclients": {},
	"internal/tfevents":    {},
	"internal/train": {"internal/agent", "internal/agentrollout", "internal/chat", "internal/config", "internal/curriculum", "internal/engine", "internal/envtarget", "internal/gateway", "internal/grpo",
		"internal/launch", "internal/memstat", "internal/model", "internal/reward", "internal/rollout", "internal/runlock", "internal/tfevents", "internal/vllm", "internal/worker"},
	"internal/verdict": {},
	"internal/vllm":    {"internal/backoff", "internal/childproc", "internal/vllmguard"},
	// the proxy that requires the API key on every route of a replica bound beyond loopback.
	"internal/vllmguard":          {},
	"internal/worker":             {"internal/grpo", "internal/model"},
	"internal/worker/benchworker": {"internal/grpo", "internal/model", "internal/worker"},
	// the worker's log-probs (float64-exact, PEFT adapters) for scripts/check-hf-parity.
	"scripts/hfparity/wlogprobs": {"internal/grpo", "internal/worker"},
}

// forbiddenStd lists standard-library imports some packages must not have.
var forbiddenStd = map[string]map[string]string{
	"internal/chat":       {"net/http": "chat must not call the network", "net": "chat must not call the network"},
	"internal/config":     {"net/http": "config does no I/O beyond reading the file"},
	"internal/grpo":       {"net/http": "grpo is pure math over trajectories"},
	"internal/curriculum": {"net/http": "curriculum decides from rewards, it calls no env"},
}

type pkg struct {
	ImportPath string
	Imports    []string
	CgoFiles   []string
}

// listPackages runs go list over the module; overlay (may be "") is passed
// as -overlay so tests can add files without touching the tree.
func listPackages(t *testing.T, overlay string) map[string]pkg {
	t.Helper()
	args := []string{"list", "-json"}
	if overlay != "" {
		args = append(args, "-overlay", overlay)
	}
	cmd := exec.Command("go", append(args, mod+"...")...)
	cmd.Dir = "../.."
	var out, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &stderr
	require.NoError(t, cmd.Run(), "go list: %s", stderr.String())
	pkgs := map[string]pkg{}
	dec := json.NewDecoder(&out)
	for {
		var p pkg
		err := dec.Decode(&p)
		if err == io.EOF {
			break
		}
		require.NoError(t, err)
		pkgs[strings.TrimPrefix(p.ImportPath, mod)] = p
	}
	return pkgs
}

// violations checks every package's imports against the allow-list.
func violations(pkgs map[string]pkg) []string {
	var out []string
	for name, p := range pkgs {
		allow, known := allowed[name]
		if !known {
			out = append(out, fmt.Sprintf("%s is not in the allow-list: add it (and its row in docs/design.md and the README)", name))
			continue
		}
		for _, imp := range p.Imports {
			if target, ours := strings.CutPrefix(imp, mod); ours {
				if !slices.Contains(allow, target) {
					out = append(out, fmt.Sprintf("%s imports %s, which its allow-list does not name", name, target))
				}
				continue
			}
			if why, bad := forbiddenStd[name][imp]; bad {
				out = append(out, fmt.Sprintf("%s imports %s: %s", name, imp, why))
			}
		}
	}
	sort.Strings(out)
	return out
}

func TestImportsFollowTheAllowList(t *testing.T) {
	pkgs := listPackages(t, "")
	require.NotEmpty(t, pkgs)
	for _, v := range violations(pkgs) {
		t.Error(v)
	}
	for name := range allowed {
		assert.Contains(t, pkgs, name, "the allow-list names %s, which is not in the tree: remove it", name)
	}
}

// The check itself catches a new arrow: files added (through a go list
// overlay, the tree is untouched) that make internal/backoff import the
// worker and internal/grpo import net/http.
func TestAllowListCatchesForbiddenImports(t *testing.T) {
	dir := t.TempDir()
	overlay := map[string]map[string]string{"Replace": {}}
	for i, add := range []struct{ pkg, imp string }{{"backoff", mod + "internal/worker"}, {"grpo", "net/http"}} {
		src := filepath.Join(dir, fmt.Sprintf("forbidden%d.go", i))
		require.NoError(t, os.WriteFile(src, fmt.Appendf(nil, "package %s\n\nimport _ %q\n", add.pkg, add.imp), 0o644))
		abs, err := filepath.Abs(fmt.Sprintf("../%s/zz_forbidden.go", add.pkg))
		require.NoError(t, err)
		overlay["Replace"][abs] = src
	}
	ob, err := json.Marshal(overlay)
	require.NoError(t, err)
	path := filepath.Join(dir, "overlay.json")
	require.NoError(t, os.WriteFile(path, ob, 0o644))

	before := violations(listPackages(t, ""))
	var added []string
	for _, v := range violations(listPackages(t, path)) {
		if !slices.Contains(before, v) {
			added = append(added, v)
		}
	}
	assert.Equal(t, []string{
		"internal/backoff imports internal/worker, which its allow-list does not name",
		"internal/grpo imports net/http: grpo is pure math over trajectories",
	}, added)
}

func TestOnlyWorkerUsesCgo(t *testing.T) {
	for name, p := range listPackages(t, "") {
		if len(p.CgoFiles) > 0 && name != "internal/worker" {
			t.Errorf("%s has cgo files %v: only internal/worker may use cgo", name, p.CgoFiles)
		}
	}
}

func TestNothingImportsCLI(t *testing.T) {
	for name, allow := range allowed {
		if name != "cmd/ortrain" {
			assert.NotContains(t, allow, "internal/cli", "%s: only cmd/ortrain may import internal/cli", name)
		}
	}
}

func TestMainHoldsNoLogic(t *testing.T) {
	assert.Equal(t, []string{"internal/cli"}, allowed["cmd/ortrain"], "main only builds the root command")
}

// tableRow matches the first cell of a package-table row: | `internal/x` |.
var tableRow = regexp.MustCompile("(?m)^\\| `((?:cmd|internal|scripts)/[a-z0-9_/]+|configs)/?` \\|")

// documentedPackages returns the packages named in the first column of the
// package table under heading in a markdown file.
func documentedPackages(t *testing.T, path, heading string) []string {
	t.Helper()
	b, err := os.ReadFile(path)
	require.NoError(t, err)
	text := string(b)
	i := strings.Index(text, heading)
	require.GreaterOrEqual(t, i, 0, "%s has no %q section", path, heading)
	text = text[i:]
	if j := strings.Index(text[len(heading):], "\n## "); j >= 0 {
		text = text[:len(heading)+j]
	}
	var out []string
	for _, m := range tableRow.FindAllStringSubmatch(text, -1) {
		out = append(out, m[1])
	}
	sort.Strings(out)
	return out
}

// The maps people read name exactly the packages of the tree.
func TestDocsNameEveryPackage(t *testing.T) {
	var tree []string
	for name := range listPackages(t, "") {
		tree = append(tree, name)
	}
	// csrc is the worker's C++ source: a directory, not a Go package.
	tree = append(tree, "internal/worker/csrc")
	sort.Strings(tree)
	for _, doc := range []struct{ path, heading string }{
		{"../../README.md", "## Architecture"},
		{"../../docs/design.md", "## Packages"},
	} {
		assert.Equal(t, tree, documentedPackages(t, doc.path, doc.heading), "%s: the package table must match go list", doc.path)
	}
}
