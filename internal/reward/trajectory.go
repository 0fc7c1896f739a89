package reward

import "encoding/json"

// Trajectory is what reward functions see of one rollout: plain values the
// trainer fills from its rollout record. An http scorer receives it as a
// RequestItem.
type Trajectory struct {
	// Env is the environment's key (as in the run's env list) and Task its
	// task spec (ORS task, OpenEnv reset kwargs or dataset row).
	Env  string         `json:"env,omitempty"`
	Task map[string]any `json:"task"`
	// Prompt is the first user message; Turns the transcript after it.
	Prompt string `json:"prompt"`
	Turns  []Turn `json:"turns"`
	// EnvRewards holds the env's reward per tool call or step; nil means
	// that call returned none (it is ignored, as by grpo.Aggregate).
	EnvRewards []*float64 `json:"env_rewards"`
	// Finished: the env said the episode is done.
	Finished bool `json:"finished"`
	// AgentReward is the reward a user's agent reported (nil: none, or not
	// an agent rollout).
	AgentReward *float64 `json:"agent_reward,omitempty"`
	// Outcome is how the rollout ended (rollout.Outcome's string).
	Outcome string `json:"outcome"`
	// Truncated: the completion budget ran out.
	Truncated bool `json:"truncated"`
	// NumToolCalls and ToolFailures count the tool calls made and those
	// that failed.
	NumToolCalls int `json:"num_tool_calls"`
	ToolFailures int `json:"tool_failures"`
	// CompletionTokens is the completion's length in tokens, tool results
	// included: the count the run's max completion tokens bounds.
	CompletionTokens int `json:"completion_tokens"`
	// Metadata is the env's last metadata (nil when it sent none).
	Metadata map[string]any `json:"metadata"`
	// Failed marks an infrastructure failure the trainer already excludes
	// from the loss: it is not scored (every value NaN) and not sent to
	// http scorers.
	Failed bool `json:"failed,omitempty"`
}

// Turn is one message after the prompt: an assistant turn (with the tool
// calls parsed from it) or a tool result.
type Turn struct {
	Role string `json:"role"` // "assistant" or "tool"
	Text string `json:"text"`
	// ToolCalls are the calls parsed from an assistant turn.
	ToolCalls []ToolCall `json:"tool_calls,omitempty"`
	// FormatError: the assistant turn wrote a tool call that did not parse.
	FormatError bool `json:"format_error,omitempty"`
	// Tool names the tool a tool turn answers; Reward is its reward.
	Tool   string   `json:"tool,omitempty"`
	Reward *float64 `json:"reward,omitempty"`
}

// ToolCall is one parsed call.
type ToolCall struct {
	Name      string          `json:"name"`
	Arguments json.RawMessage `json:"arguments"`
}

// NumTurns counts the assistant turns.
func (t *Trajectory) NumTurns() int {
	n := 0
	for _, turn := range t.Turns {
		if turn.Role == "assistant" {
			n++
		}
	}
	return n
}

// Text is the final assistant turn's text ("" when there is none).
func (t *Trajectory) Text() string {
	for i := len(t.Turns) - 1; i >= 0; i-- {
		if t.Turns[i].Role == "assistant" {
			return t.Turns[i].Text
		}
	}
	return ""
}

// envRewardValues are the non-null env rewards, in order.
func (t *Trajectory) envRewardValues() []float64 {
	out := make([]float64, 0, len(t.EnvRewards))
	for _, r := range t.EnvRewards {
		if r != nil && *r == *r {
			out = append(out, *r)
		}
	}
	return out
}
