package train

import (
	"github.com/ortrain/ortrain/internal/rollout"
)

// trajectoryRecord is one line of trajectories.jsonl: what the model saw,
// what it did, what the env answered, and what the trainer made of it.
type trajectoryRecord struct {
	Step      int            `json:"step"`
	Env       int            `json:"env"`
	Split     string         `json:"split"`
	TaskIndex int            `json:"task_index"`
	Prompt    string         `json:"prompt"`
	Turns     []rollout.Turn `json:"turns"`
	Rewards   []*float64     `json:"rewards"`
	Reward    float64        `json:"reward"`
	Advantage float64        `json:"advantage"`
	Outcome   string         `json:"outcome"`
	Error     string         `json:"error,omitempty"`
	// AgentStderr is the tail of a failed agent's stderr (key redacted).
	AgentStderr  string  `json:"agent_stderr,omitempty"`
	ToolCalls    int     `json:"tool_calls"`
	ToolFailures int     `json:"tool_failures"`
	FormatErrors int     `json:"format_errors"`
	Divergences  int     `json:"template_divergences,omitempty"`
	PromptTokens int     `json:"prompt_tokens"`
	Completion   int     `json:"completion_tokens"`
	Sampled      int     `json:"sampled_tokens"`
	Seconds      float64 `json:"seconds"`
	// The tools the session offered, whether the prompt showed them and a
	// digest of the definitions it showed (task-scoped tools included).
	ToolsOffered  []string `json:"tools_offered"`
	ToolsRendered bool     `json:"tools_rendered"`
	ToolsSHA256   string   `json:"tools_sha256,omitempty"`
	// PromptText is the rendered prompt (logging.log_prompts).
	PromptText string `json:"prompt_text,omitempty"`
	Retries    int    `json:"retries,omitempty"`
	// PolicyVersion is the optimizer step of the weights that generated
	// the rollout (async runs; the oldest one across its turns).
	PolicyVersion *int `json:"policy_version,omitempty"`
}

// newTrajectoryRecord builds the JSONL record of t. A NaN reward (failed
// rollout) is written as 0 with the outcome saying why.
func newTrajectoryRecord(step int, t *rollout.Trajectory, reward, adv float64) trajectoryRecord {
	r := trajectoryRecord{
		Step: step, Env: t.Task.Env, Split: t.Task.Split, TaskIndex: t.Task.Index,
		Prompt: t.Prompt, Turns: t.Turns, Rewards: t.Rewards, Reward: reward, Advantage: adv,
		Outcome: string(t.Outcome), ToolCalls: t.ToolCalls, ToolFailures: t.ToolFailures,
		FormatErrors: t.FormatErrors, Divergences: t.Divergences,
		PromptTokens: t.PromptLen, Completion: max(0, len(t.Tokens)-t.PromptLen), Seconds: t.Duration.Seconds(),
		ToolsOffered: t.ToolsOffered, ToolsRendered: t.ToolsRendered, ToolsSHA256: t.ToolsSHA256, PromptText: t.PromptText,
		Retries: t.Retries, AgentStderr: t.AgentStderr,
	}
	if reward != reward {
		r.Reward = 0
	}
	if t.Err != nil {
		r.Error = t.Err.Error()
	}
	for _, m := range t.LossMask {
		r.Sampled += int(m)
	}
	if r.Rewards == nil {
		r.Rewards = []*float64{}
	}
	if r.Turns == nil {
		r.Turns = []rollout.Turn{}
	}
	return r
}
