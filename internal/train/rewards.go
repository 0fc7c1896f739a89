package train

import (
	"context"
	"encoding/json"
	"fmt"

	"github.com/ortrain/ortrain/internal/config"
	"github.com/ortrain/ortrain/internal/grpo"
	"github.com/ortrain/ortrain/internal/reward"
	"github.com/ortrain/ortrain/internal/rollout"
)

// compileRewards builds the run's reward functions (the env's rewards alone
// when the config names none); every expression is type-checked here, so a
// bad one stops the run before any rollout.
func compileRewards(cfg *config.Config) (*reward.Set, error) {
	agg, err := grpo.ParseRewardAggregation(cfg.GRPO.RewardAggregation)
	if err != nil {
		return nil, err
	}
	specs := cfg.Rewards
	if len(specs) == 0 && cfg.Agent.Enabled() {
		// An agent's rollout is scored by the env's rewards (through its
		// MCP tools) and by the reward it reports itself; usually only one
		// of them is there. rewards: chooses otherwise.
		specs = []reward.Spec{{Name: "env", Kind: reward.KindEnv}, {Name: "agent", Kind: reward.KindAgent}}
	}
	set, err := reward.Compile(specs, reward.Options{Aggregation: agg})
	if err != nil {
		return nil, fmt.Errorf("rewards: %w", err)
	}
	return set, nil
}

// scoreRollouts scores a batch with the reward functions. A rollout a
// function failed for becomes a failed rollout (reward_error), excluded
// from the loss and counted, never a 0. The error is only ctx's.
func scoreRollouts(ctx context.Context, set *reward.Set, trajs []*rollout.Trajectory, keys []string) ([]reward.Scores, error) {
	views := make([]reward.Trajectory, len(trajs))
	for i, t := range trajs {
		views[i] = rewardView(t, keys[t.Task.Env])
	}
	scores, err := set.Score(ctx, views)
	if err != nil {
		return nil, err
	}
	for i, s := range scores {
		if s.Err != nil && !trajs[i].Outcome.Failed() {
			trajs[i].Outcome, trajs[i].Err = rollout.OutcomeRewardError, s.Err
		}
	}
	return scores, nil
}

// rewardView is what reward functions see of a rollout.
func rewardView(t *rollout.Trajectory, key string) reward.Trajectory {
	v := reward.Trajectory{
		Env: key, Prompt: t.Prompt, EnvRewards: t.Rewards, Outcome: string(t.Outcome),
		Truncated: t.Outcome == rollout.OutcomeTruncated, NumToolCalls: t.ToolCalls, ToolFailures: t.ToolFailures,
		CompletionTokens: max(0, len(t.Tokens)-t.PromptLen), Failed: t.Outcome.Failed(), AgentReward: t.AgentReward,
	}
	for _, turn := range t.Turns {
		rt := reward.Turn{Role: turn.Role, Text: turn.Text, FormatError: turn.FormatError, Tool: turn.Tool, Reward: turn.Reward}
		for _, c := range turn.ToolCalls {
			rt.ToolCalls = append(rt.ToolCalls, reward.ToolCall{Name: c.Name, Arguments: c.Arguments})
		}
		v.Turns = append(v.Turns, rt)
		v.Finished = v.Finished || turn.Finished
	}
	if len(t.Metadata) > 0 {
		_ = json.Unmarshal(t.Metadata, &v.Metadata) // an object, or left nil
	}
	return v
}
