// Package launch says which rank of a data-parallel run this process is
// and starts the local ranks of a single-node run. A process learns its
// place from the launcher's variables — torchrun, Kubeflow's PyTorchJob and
// JobSet (RANK, WORLD_SIZE, LOCAL_RANK, MASTER_ADDR, MASTER_PORT) or SLURM's
// srun (SLURM_PROCID, SLURM_NTASKS, SLURM_LOCALID, the first host of
// SLURM_JOB_NODELIST) — so `srun ortrain run …` and a PyTorchJob need no
// wrapper; `ortrain run --nproc-per-node N` sets the same variables for N
// supervised children (RunLocal).
package launch

import (
	"fmt"
	"strconv"
	"strings"
)

// DefaultMasterPort is torchrun's default rendezvous port.
const DefaultMasterPort = 29500

// World is this process's place in a data-parallel run.
type World struct {
	Rank, WorldSize           int
	LocalRank, LocalWorldSize int
	// MasterAddr and MasterPort locate rank 0's rendezvous store.
	MasterAddr string
	MasterPort int
	// Source names where the values came from: "torchrun" (the RANK
	// family), "nproc-per-node" (ortrain's own local ranks), "slurm", or
	// "single" (no launcher: one process).
	Source string
}

// Distributed reports whether more than one rank takes part.
func (w World) Distributed() bool { return w.WorldSize > 1 }

// Single is the world of a run without a launcher.
func Single() World {
	return World{Rank: 0, WorldSize: 1, LocalRank: 0, LocalWorldSize: 1, MasterAddr: "127.0.0.1", MasterPort: DefaultMasterPort, Source: "single"}
}

// EnvError names a launcher variable whose value cannot be used.
type EnvError struct {
	Var, Value, Want string
}

func (e *EnvError) Error() string {
	return fmt.Sprintf("launcher variable %s=%q: %s", e.Var, e.Value, e.Want)
}

// FromEnv reads the launcher's variables. The RANK family wins over
// SLURM's (torchrun inside an srun allocation sets both); SLURM's count
// only inside a job step (SLURM_STEP_ID set: under srun, not in the batch
// script itself, where SLURM_NTASKS describes the allocation and no other
// rank would ever join).
func FromEnv(getenv func(string) string) (World, error) {
	switch {
	case getenv("RANK") != "" || getenv("WORLD_SIZE") != "":
		return fromTorchrun(getenv)
	case getenv("SLURM_PROCID") != "" && (getenv("SLURM_STEP_ID") != "" || getenv("SLURM_STEPID") != ""):
		return fromSlurm(getenv)
	}
	return Single(), nil
}

func fromTorchrun(getenv func(string) string) (World, error) {
	w := World{Source: "torchrun"}
	if l := getenv(LauncherVar); l != "" {
		w.Source = l // ortrain's --nproc-per-node sets the same variables
	}
	var err error
	if w.WorldSize, err = intVar(getenv, "WORLD_SIZE", -1, 1); err != nil {
		return World{}, err
	}
	if w.Rank, err = intVar(getenv, "RANK", -1, 0); err != nil {
		return World{}, err
	}
	if w.Rank >= w.WorldSize {
		return World{}, &EnvError{Var: "RANK", Value: strconv.Itoa(w.Rank), Want: fmt.Sprintf("below WORLD_SIZE (%d)", w.WorldSize)}
	}
	// One process per pod (PyTorchJob) sets no LOCAL_* variables.
	if w.LocalRank, err = intVar(getenv, "LOCAL_RANK", 0, 0); err != nil {
		return World{}, err
	}
	if w.LocalWorldSize, err = intVar(getenv, "LOCAL_WORLD_SIZE", w.LocalRank+1, 1); err != nil {
		return World{}, err
	}
	return w.withMaster(getenv, getenv("MASTER_ADDR"), DefaultMasterPort)
}

func fromSlurm(getenv func(string) string) (World, error) {
	w := World{Source: "slurm"}
	tasks := "SLURM_STEP_NUM_TASKS"
	if getenv(tasks) == "" {
		tasks = "SLURM_NTASKS"
	}
	var err error
	if w.WorldSize, err = intVar(getenv, tasks, -1, 1); err != nil {
		return World{}, err
	}
	if w.Rank, err = intVar(getenv, "SLURM_PROCID", -1, 0); err != nil {
		return World{}, err
	}
	if w.Rank >= w.WorldSize {
		return World{}, &EnvError{Var: "SLURM_PROCID", Value: strconv.Itoa(w.Rank), Want: fmt.Sprintf("below %s (%d)", tasks, w.WorldSize)}
	}
	if w.LocalRank, err = intVar(getenv, "SLURM_LOCALID", 0, 0); err != nil {
		return World{}, err
	}
	w.LocalWorldSize = w.LocalRank + 1
	if per := getenv("SLURM_STEP_TASKS_PER_NODE"); per != "" {
		// "4(x2),3": the first node's count; ranks fill nodes in order.
		n, err := strconv.Atoi(strings.SplitN(strings.SplitN(per, "(", 2)[0], ",", 2)[0])
		if err != nil || n < 1 {
			return World{}, &EnvError{Var: "SLURM_STEP_TASKS_PER_NODE", Value: per, Want: `a task count such as "4" or "4(x2)"`}
		}
		w.LocalWorldSize = max(n, w.LocalRank+1)
	}
	addr := getenv("MASTER_ADDR")
	if addr == "" {
		list := getenv("SLURM_STEP_NODELIST")
		name := "SLURM_STEP_NODELIST"
		if list == "" {
			list, name = getenv("SLURM_JOB_NODELIST"), "SLURM_JOB_NODELIST"
		}
		hosts, err := ExpandNodeList(list)
		if err != nil || len(hosts) == 0 {
			return World{}, &EnvError{Var: name, Value: list, Want: fmt.Sprintf("a SLURM host list such as node[01-04] (%v); or set MASTER_ADDR", err)}
		}
		addr = hosts[0]
	}
	// Two jobs sharing a node must not share a port: derive it from the job
	// id, as PyTorch Lightning does, unless MASTER_PORT says otherwise.
	port := DefaultMasterPort
	if id, err := strconv.Atoi(getenv("SLURM_JOB_ID")); err == nil && id >= 0 {
		port = 10000 + id%20000
	}
	return w.withMaster(getenv, addr, port)
}

func (w World) withMaster(getenv func(string) string, addr string, port int) (World, error) {
	if addr == "" {
		if w.WorldSize > 1 {
			return World{}, &EnvError{Var: "MASTER_ADDR", Value: "", Want: "the address of rank 0's node (set it, or launch with torchrun/srun, which do)"}
		}
		addr = "127.0.0.1"
	}
	w.MasterAddr = addr
	var err error
	if w.MasterPort, err = intVar(getenv, "MASTER_PORT", port, 1); err != nil {
		return World{}, err
	}
	if w.MasterPort > 65535 {
		return World{}, &EnvError{Var: "MASTER_PORT", Value: strconv.Itoa(w.MasterPort), Want: "a TCP port (1-65535)"}
	}
	return w, nil
}

// intVar reads an integer variable; def < 0 makes it required.
func intVar(getenv func(string) string, name string, def, min int) (int, error) {
	s := strings.TrimSpace(getenv(name))
	if s == "" {
		if def < 0 {
			return 0, &EnvError{Var: name, Value: "", Want: "set by the launcher; it is missing"}
		}
		return def, nil
	}
	n, err := strconv.Atoi(s)
	if err != nil || n < min {
		return 0, &EnvError{Var: name, Value: s, Want: fmt.Sprintf("a whole number >= %d", min)}
	}
	return n, nil
}
