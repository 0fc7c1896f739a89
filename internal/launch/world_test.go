package launch

import (
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

func envOf(m map[string]string) func(string) string { return func(k string) string { return m[k] } }

func TestFromEnv(t *testing.T) {
	tests := []struct {
		name string
		env  map[string]string
		want World
	}{
		{"no launcher", map[string]string{}, Single()},
		{"torchrun", map[string]string{"RANK": "3", "WORLD_SIZE": "8", "LOCAL_RANK": "1", "LOCAL_WORLD_SIZE": "2", "MASTER_ADDR": "node-a", "MASTER_PORT": "29400"},
			World{Rank: 3, WorldSize: 8, LocalRank: 1, LocalWorldSize: 2, MasterAddr: "node-a", MasterPort: 29400, Source: "torchrun"}},
		{"pytorchjob (one process per pod, default port)", map[string]string{"RANK": "1", "WORLD_SIZE": "4", "MASTER_ADDR": "job-master-0"},
			World{Rank: 1, WorldSize: 4, LocalRank: 0, LocalWorldSize: 1, MasterAddr: "job-master-0", MasterPort: 29500, Source: "torchrun"}},
		{"torchrun wins over slurm", map[string]string{"RANK": "0", "WORLD_SIZE": "2", "MASTER_ADDR": "h", "SLURM_PROCID": "5", "SLURM_STEP_ID": "0", "SLURM_NTASKS": "9"},
			World{Rank: 0, WorldSize: 2, LocalRank: 0, LocalWorldSize: 1, MasterAddr: "h", MasterPort: 29500, Source: "torchrun"}},
		{"srun step", map[string]string{"SLURM_PROCID": "5", "SLURM_STEP_ID": "0", "SLURM_NTASKS": "8", "SLURM_LOCALID": "1",
			"SLURM_STEP_TASKS_PER_NODE": "4(x2)", "SLURM_JOB_NODELIST": "gpu[007-008]", "SLURM_JOB_ID": "123456"},
			World{Rank: 5, WorldSize: 8, LocalRank: 1, LocalWorldSize: 4, MasterAddr: "gpu007", MasterPort: 10000 + 123456%20000, Source: "slurm"}},
		{"srun step with its own counts and MASTER_*", map[string]string{"SLURM_PROCID": "1", "SLURM_STEPID": "2", "SLURM_NTASKS": "16", "SLURM_STEP_NUM_TASKS": "2",
			"SLURM_STEP_NODELIST": "a1,b2", "SLURM_JOB_NODELIST": "z[1-9]", "MASTER_ADDR": "10.0.0.1", "MASTER_PORT": "4000"},
			World{Rank: 1, WorldSize: 2, LocalRank: 0, LocalWorldSize: 1, MasterAddr: "10.0.0.1", MasterPort: 4000, Source: "slurm"}},
		{"batch script without srun is one process", map[string]string{"SLURM_PROCID": "0", "SLURM_NTASKS": "8", "SLURM_JOB_NODELIST": "n[1-2]"}, Single()},
		{"ortrain --nproc-per-node", map[string]string{"RANK": "1", "WORLD_SIZE": "2", "LOCAL_RANK": "1", "LOCAL_WORLD_SIZE": "2", "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": "29400", "ORTRAIN_LAUNCHER": "nproc-per-node"},
			World{Rank: 1, WorldSize: 2, LocalRank: 1, LocalWorldSize: 2, MasterAddr: "127.0.0.1", MasterPort: 29400, Source: "nproc-per-node"}},
		{"world of one needs no master", map[string]string{"RANK": "0", "WORLD_SIZE": "1"},
			World{Rank: 0, WorldSize: 1, LocalRank: 0, LocalWorldSize: 1, MasterAddr: "127.0.0.1", MasterPort: 29500, Source: "torchrun"}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got, err := FromEnv(envOf(tt.env))
			require.NoError(t, err)
			assert.Equal(t, tt.want, got)
			assert.Equal(t, tt.want.WorldSize > 1, got.Distributed())
		})
	}
}

func TestFromEnvErrors(t *testing.T) {
	tests := []struct {
		name    string
		env     map[string]string
		varName string
	}{
		{"rank without world size", map[string]string{"RANK": "1"}, "WORLD_SIZE"},
		{"world size without rank", map[string]string{"WORLD_SIZE": "2", "MASTER_ADDR": "h"}, "RANK"},
		{"rank too large", map[string]string{"RANK": "2", "WORLD_SIZE": "2", "MASTER_ADDR": "h"}, "RANK"},
		{"not a number", map[string]string{"RANK": "one", "WORLD_SIZE": "2"}, "RANK"},
		{"no master", map[string]string{"RANK": "0", "WORLD_SIZE": "2"}, "MASTER_ADDR"},
		{"bad port", map[string]string{"RANK": "0", "WORLD_SIZE": "2", "MASTER_ADDR": "h", "MASTER_PORT": "70000"}, "MASTER_PORT"},
		{"slurm procid too large", map[string]string{"SLURM_PROCID": "4", "SLURM_STEP_ID": "0", "SLURM_NTASKS": "4", "SLURM_JOB_NODELIST": "n1"}, "SLURM_PROCID"},
		{"slurm bad node list", map[string]string{"SLURM_PROCID": "0", "SLURM_STEP_ID": "0", "SLURM_NTASKS": "2", "SLURM_JOB_NODELIST": "n[1-"}, "SLURM_JOB_NODELIST"},
		{"slurm bad tasks per node", map[string]string{"SLURM_PROCID": "0", "SLURM_STEP_ID": "0", "SLURM_NTASKS": "2", "SLURM_JOB_NODELIST": "n1", "SLURM_STEP_TASKS_PER_NODE": "x"}, "SLURM_STEP_TASKS_PER_NODE"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			_, err := FromEnv(envOf(tt.env))
			var ee *EnvError
			require.ErrorAs(t, err, &ee)
			assert.Equal(t, tt.varName, ee.Var, err.Error())
		})
	}
}

func TestExpandNodeList(t *testing.T) {
	tests := []struct {
		in   string
		want []string
	}{
		{"node1", []string{"node1"}},
		{"node[01-03]", []string{"node01", "node02", "node03"}},
		{"node[01-02,07],gpu5", []string{"node01", "node02", "node07", "gpu5"}},
		{"n[8-10]", []string{"n8", "n9", "n10"}},
		{"rack[1-2]-n[1-2]", []string{"rack1-n1", "rack1-n2", "rack2-n1", "rack2-n2"}},
		{"a,b,c", []string{"a", "b", "c"}},
		{"10.0.0.[1-2]", []string{"10.0.0.1", "10.0.0.2"}},
	}
	for _, tt := range tests {
		got, err := ExpandNodeList(tt.in)
		require.NoError(t, err, tt.in)
		assert.Equal(t, tt.want, got, tt.in)
	}
	for _, bad := range []string{"", "n[1-", "n]1", "n[3-1]", "n[a-b]", "a,,b", "n[[1]]", "n[1-999999]"} {
		_, err := ExpandNodeList(bad)
		assert.Error(t, err, "%q", bad)
	}
}

func FuzzExpandNodeList(f *testing.F) {
	for _, s := range []string{"node[01-03]", "a,b", "r[1-2]-n[1-2]", "n[1-", "x[0001-0010,12]"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		hosts, err := ExpandNodeList(s)
		if err != nil {
			return
		}
		require.NotEmpty(t, hosts)
		require.LessOrEqual(t, len(hosts), maxHosts)
		for _, h := range hosts {
			require.NotContains(t, h, "[")
			require.NotContains(t, h, "]")
			require.NotContains(t, h, ",")
		}
	})
}
