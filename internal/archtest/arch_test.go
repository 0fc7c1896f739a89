// Package archtest enforces the architecture of design.md mechanically: the
// import arrows, who may import the CLI, and that only internal/worker uses cgo.
package archtest

import (
	"bytes"
	"encoding/json"
	"io"
	"os/exec"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"
)

const mod = "github.com/ortrain/ortrain/"

type pkg struct {
	ImportPath string
	Imports    []string
	CgoFiles   []string
}

func listPackages(t *testing.T) map[string]pkg {
	t.Helper()
	cmd := exec.Command("go", "list", "-json", mod+"...")
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

// forbidden lists, per package prefix, imports it must not have and why.
var forbidden = []struct {
	from, to, why string
}{
	{"internal/ors", "internal/train", "the ORS client must not know about training"},
	{"internal/ors", "internal/rollout", "the ORS client must not know about rollouts"},
	{"internal/ors", "internal/grpo", "the ORS client must not know about training"},
	{"internal/ors", "internal/worker", "the ORS client must not know about training"},
	{"internal/ors", "internal/engine", "the ORS client must not know about generation"},
	{"internal/envs", "internal/train", "built-in envs must not import the trainer"},
	{"internal/envs", "internal/rollout", "built-in envs must not import the trainer"},
	{"internal/chat", "net/http", "chat must not call the network"},
	{"internal/chat", "internal/ors", "chat is below ors in the arrows"},
	{"internal/grpo", "internal/worker", "grpo must not call cgo"},
	{"internal/grpo", "internal/rollout", "grpo computes advantages from trajectories it is given"},
	{"internal/rollout", "internal/grpo", "rollout must not compute advantages"},
	{"internal/rollout", "internal/worker", "rollout generates only through engine.Generator"},
	{"internal/rollout", "internal/train", "arrows point down: train uses rollout"},
	{"internal/engine", "internal/grpo", "the engine must not compute losses"},
	{"internal/engine", "internal/train", "arrows point down: train uses engine"},
	{"internal/vllm", "internal/train", "vllm must not import the trainer"},
	{"internal/vllm", "internal/rollout", "vllm must not import the trainer"},
	{"internal/config", "net/http", "config does no I/O beyond reading the file"},
	{"internal/model", "internal/worker", "model directories are read in pure Go"},
}

func TestImportArrows(t *testing.T) {
	pkgs := listPackages(t)
	require.NotEmpty(t, pkgs)
	for name, p := range pkgs {
		for _, imp := range p.Imports {
			target := strings.TrimPrefix(imp, mod)
			if target == "internal/cli" && name != "cmd/ortrain" {
				t.Errorf("%s imports internal/cli: only cmd/ortrain may", name)
			}
			for _, f := range forbidden {
				if (name == f.from || strings.HasPrefix(name, f.from+"/")) &&
					(target == f.to || strings.HasPrefix(target, f.to+"/")) {
					t.Errorf("%s imports %s: %s", name, target, f.why)
				}
			}
		}
	}
}

func TestOnlyWorkerUsesCgo(t *testing.T) {
	for name, p := range listPackages(t) {
		if len(p.CgoFiles) > 0 && name != "internal/worker" {
			t.Errorf("%s has cgo files %v: only internal/worker may use cgo", name, p.CgoFiles)
		}
	}
}

func TestMainHoldsNoLogic(t *testing.T) {
	p, ok := listPackages(t)["cmd/ortrain"]
	require.True(t, ok)
	for _, imp := range p.Imports {
		if strings.HasPrefix(imp, mod) && imp != mod+"internal/cli" {
			t.Errorf("cmd/ortrain imports %s: main only builds the root command", imp)
		}
	}
}
