// Package reward turns trajectories into rewards: a weighted list of
// functions, as TRL's reward_funcs with reward_weights. It knows nothing of
// rollouts or training: the trainer fills a Trajectory per rollout, calls
// (*Set).Score once per batch, and uses Scores.Total as the rollout's
// reward (advantages as before).
//
// Four kinds of function (Spec.Kind):
//
//   - env: the environment's own rewards, aggregated last|sum|max|mean with
//     grpo.RewardAggregation (today's behaviour; DefaultSpecs is this alone).
//   - expression: a CEL expression (cel.dev/cel-go) over the variables of
//     Variables(), compiled and type-checked by Compile. It must be a number;
//     dyn(null) declines.
//   - builtin: overlong_penalty (DAPO's soft overlong punishment),
//     tool_call_format (fraction of tool-call turns that parsed),
//     length_penalty (-min(1, tokens/max_length)).
//   - http: a remote scorer. The batch is POSTed as a Request; the answer is
//     a Response, {"rewards": [...]}, one number or null per trajectory. Each
//     request has a deadline (Spec.Timeout); 5xx, 429, connection errors and
//     timeouts are retried with internal/backoff. A scorer that still fails
//     fails the batch's rollouts (Scores.Err, OutcomeRewardError), never a 0.
//
// The weighted sum skips NaN values (a function that declines), as TRL's
// nansum; a row with no value at all is NaN ("unscorable": advantage 0).
package reward
