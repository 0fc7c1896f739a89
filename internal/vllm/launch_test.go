package vllm_test

import (
	"strconv"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/ortrain/ortrain/internal/vllm"
)

func itoa(n int) string { return strconv.Itoa(n) }

func TestGPUPlanAssign(t *testing.T) {
	tests := []struct {
		name    string
		plan    vllm.GPUPlan
		want    [][]int
		wantErr string
	}{
		{"one per replica", vllm.GPUPlan{GPUs: []int{2, 3}}, [][]int{{2}, {3}}, ""},
		{"tp2 one replica", vllm.GPUPlan{GPUs: []int{2, 3}, TensorParallelSize: 2}, [][]int{{2, 3}}, ""},
		{"tp2 two replicas", vllm.GPUPlan{GPUs: []int{4, 5, 6, 7}, Replicas: 2, TensorParallelSize: 2}, [][]int{{4, 5}, {6, 7}}, ""},
		{"cpu replicas", vllm.GPUPlan{Replicas: 2}, [][]int{nil, nil}, ""},
		{"no gpus one replica", vllm.GPUPlan{}, [][]int{nil}, ""},
		{"colocated", vllm.GPUPlan{GPUs: []int{0}, TrainerGPUs: []int{0}, Colocate: true}, [][]int{{0}}, ""},
		{"duplicate", vllm.GPUPlan{GPUs: []int{2, 2}}, nil, "GPU 2 is listed twice"},
		{"shared with trainer", vllm.GPUPlan{GPUs: []int{1, 2}, TrainerGPUs: []int{0, 1}}, nil, "GPU 1 is also a trainer GPU (worker.gpus 0,1)"},
		{"uneven split", vllm.GPUPlan{GPUs: []int{1, 2, 3}, TensorParallelSize: 2}, nil, "do not split into 1 replica(s) × tensor parallel size 2"},
		{"replicas mismatch", vllm.GPUPlan{GPUs: []int{1, 2}, Replicas: 3}, nil, "do not split into 3 replica(s)"},
		{"negative tp", vllm.GPUPlan{GPUs: []int{1}, TensorParallelSize: -1}, nil, "vllm_tensor_parallel_size"},
		{"negative gpu", vllm.GPUPlan{GPUs: []int{-1}}, nil, "not a GPU index"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got, err := tt.plan.Assign()
			if tt.wantErr != "" {
				var ge *vllm.GPUAssignmentError
				require.ErrorAs(t, err, &ge)
				assert.Contains(t, err.Error(), tt.wantErr)
				assert.Contains(t, ge.Field, "engine.vllm_")
				return
			}
			require.NoError(t, err)
			assert.Equal(t, tt.want, got)
		})
	}
}

func TestParseGPUs(t *testing.T) {
	tests := []struct {
		in      string
		want    []int
		wantErr bool
	}{
		{"2,3", []int{2, 3}, false},
		{" 0 , 1 ", []int{0, 1}, false},
		{"", nil, false},
		{"2,x", nil, true},
		{"-1", nil, true},
		{"1,,2", nil, true},
	}
	for _, tt := range tests {
		got, err := vllm.ParseGPUs(tt.in)
		if tt.wantErr {
			assert.Error(t, err, tt.in)
			continue
		}
		require.NoError(t, err, tt.in)
		assert.Equal(t, tt.want, got, tt.in)
	}
}

func FuzzParseGPUs(f *testing.F) {
	for _, s := range []string{"2,3", "", "0", "1,,2", "x", " 4 ,5"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		gpus, err := vllm.ParseGPUs(s)
		if err != nil {
			return
		}
		// What parses round-trips through the CUDA_VISIBLE_DEVICES form.
		again, err := vllm.ParseGPUs(vllm.JoinGPUs(gpus))
		require.NoError(t, err)
		assert.Equal(t, gpus, again)
	})
}

func TestLaunchConfigArgvAndEnv(t *testing.T) {
	seed := int64(7)
	c := vllm.LaunchConfig{
		Model: "/models/q", TensorParallelSize: 2, GPUMemoryUtilization: 0.45, MaxModelLen: 4096, Seed: &seed,
		LoRA:      &vllm.LoRALaunch{MaxRank: 32, MaxLoras: 3},
		ExtraArgs: []string{"--enforce-eager"},
		Environ:   []string{"PATH=/bin", "HOME=/root", "OPENREWARD_API_KEY=sk-secret", "HF_TOKEN=hf_x", "HF_HOME=/hf", "CUDA_VISIBLE_DEVICES=0,1,2,3", "EDITOR=vi"},
		ExtraEnv:  []string{"VLLM_CACHE_ROOT=/cache"},
	}
	argv := strings.Join(c.Argv(8100), " ")
	assert.True(t, strings.HasPrefix(argv, "vllm serve /models/q --host 127.0.0.1 --port 8100 "), argv)
	for _, want := range []string{"--logprobs-mode processed_logprobs", "--generation-config vllm", "--tensor-parallel-size 2",
		"--gpu-memory-utilization 0.45", "--max-model-len 4096", "--seed 7", "--enable-lora --max-lora-rank 32 --max-loras 3"} {
		assert.Contains(t, argv, want)
	}
	assert.True(t, strings.HasSuffix(argv, "--enforce-eager"), "extra args come last so they win")

	env := c.Env([]int{2, 3})
	assert.Contains(t, env, "CUDA_VISIBLE_DEVICES=2,3")
	assert.Contains(t, env, "VLLM_SERVER_DEV_MODE=1")
	assert.Contains(t, env, "VLLM_ALLOW_RUNTIME_LORA_UPDATING=1")
	assert.Contains(t, env, "HF_HOME=/hf")
	assert.Contains(t, env, "VLLM_CACHE_ROOT=/cache")
	joined := strings.Join(env, "\n")
	assert.NotContains(t, joined, "sk-secret")
	assert.NotContains(t, joined, "hf_x")
	assert.NotContains(t, joined, "EDITOR")
	assert.NotContains(t, joined, "CUDA_VISIBLE_DEVICES=0,1,2,3")

	plain := vllm.LaunchConfig{Command: []string{"ortrain", "serve-engine"}, Model: "m"}
	assert.Equal(t, "ortrain serve-engine m --host 127.0.0.1 --port 1 --logprobs-mode processed_logprobs --generation-config vllm --tensor-parallel-size 1 --disable-uvicorn-access-log",
		strings.Join(plain.Argv(1), " "))
	assert.NotContains(t, strings.Join(plain.Env(nil), " "), "LORA")
	plain.Self = "/opt/ortrain/bin/ortrain"
	assert.Equal(t, []string{"/opt/ortrain/bin/ortrain", "serve-engine", "m"}, plain.Argv(1)[:3], "ortrain means this very binary")
	other := vllm.LaunchConfig{Command: []string{"/usr/bin/vllm", "serve"}, Model: "m", Self: "/x/ortrain"}
	assert.Equal(t, "/usr/bin/vllm", other.Argv(1)[0])
}

func TestLoRARank(t *testing.T) {
	tests := []struct{ rank, want int }{
		{1, 1}, {2, 8}, {4, 8}, {8, 8}, {9, 16}, {16, 16}, {33, 64}, {257, 320}, {320, 320}, {321, 512}, {512, 512},
		{600, 600}, // above vLLM's largest size: passed on for vLLM to refuse
	}
	for _, tt := range tests {
		t.Run(itoa(tt.rank), func(t *testing.T) {
			assert.Equal(t, tt.want, vllm.LoRARank(tt.rank))
		})
	}
}

// TestLaunchExposure: a bind beyond loopback needs an API key, which
// reaches the replica through its environment, never its command line.
func TestLaunchExposure(t *testing.T) {
	for _, tc := range []struct {
		host, key string
		exposed   bool
	}{
		{"", "", false},
		{"127.0.0.1", "", false},
		{"localhost", "", false},
		{"::1", "", false},
		{"[::1]", "", false},
		{"0.0.0.0", "", true},
		{"10.1.2.3", "", true},
		{"node-7.cluster", "", true},
		{"0.0.0.0", "k", false},
	} {
		c := vllm.LaunchConfig{Model: "m", Host: tc.host, APIKey: tc.key}
		err := c.CheckExposure()
		if !tc.exposed {
			assert.NoError(t, err, "host %q key %q", tc.host, tc.key)
			continue
		}
		var ee *vllm.ExposedError
		require.ErrorAs(t, err, &ee, "host %q", tc.host)
		assert.Contains(t, err.Error(), "engine.vllm_api_key")
	}
	c := vllm.LaunchConfig{Model: "m", Host: "0.0.0.0", APIKey: "sk-replica"}
	assert.NotContains(t, strings.Join(c.Argv(9000), " "), "sk-replica")
	// vLLM itself binds loopback beyond it; ortrain's guard takes the host.
	for host, bind := range map[string]string{"0.0.0.0": "127.0.0.1", "10.1.2.3": "127.0.0.1", "": "127.0.0.1", "localhost": "localhost", "::1": "::1"} {
		c := vllm.LaunchConfig{Model: "m", Host: host, APIKey: "k"}
		assert.Contains(t, strings.Join(c.Argv(9000), " "), " --host "+bind+" --port 9000 ", "host %q", host)
	}
	assert.Contains(t, c.Env(nil), "VLLM_API_KEY=sk-replica")
	assert.Equal(t, "127.0.0.1", vllm.ClientHost("0.0.0.0"))
	assert.Equal(t, "127.0.0.1", vllm.ClientHost("::"))
	assert.Equal(t, "10.0.0.5", vllm.ClientHost("10.0.0.5"))
	// An inherited key never leaks through ChildEnv; only APIKey sets it.
	inherited := vllm.LaunchConfig{Model: "m", Environ: []string{"VLLM_API_KEY=from-parent", "PATH=/bin"}}
	assert.NotContains(t, strings.Join(inherited.Env(nil), " "), "from-parent")
}
