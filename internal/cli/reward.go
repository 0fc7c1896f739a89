package cli

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/http"
	"strconv"
	"time"

	"github.com/rs/zerolog"
	"github.com/spf13/cobra"

	"github.com/ortrain/ortrain/internal/reward"
)

// RewardServeExampleOptions are the inputs of `ortrain reward serve-example`.
type RewardServeExampleOptions struct {
	IO     *IOStreams
	Logger zerolog.Logger

	Host string
	Port int
}

// newRewardCmd groups the reward commands.
func newRewardCmd(deps *Deps) *cobra.Command {
	cmd := &cobra.Command{
		Use:   "reward",
		Short: "Tools for reward functions (the config's rewards: list)",
		Long: `Reward functions beyond the environment's own rewards: CEL expressions,
builtins and remote scorers over HTTP, weighted as TRL's reward_funcs and
reward_weights. See the README's "Rewards" section.`,
		Example: `  ortrain reward serve-example --port 9000`,
		Args:    cobra.NoArgs,
	}
	cmd.AddCommand(newRewardServeExampleCmd(deps, nil))
	return cmd
}

func newRewardServeExampleCmd(deps *Deps, runF func(context.Context, *RewardServeExampleOptions) error) *cobra.Command {
	opts := &RewardServeExampleOptions{}
	cmd := &cobra.Command{
		Use:   "serve-example",
		Short: "Serve a tiny http reward scorer that shows the contract",
		Long: `Serve an example remote scorer for a reward of kind http, and print its
scoring URL on stdout. It answers POST /score with {"rewards": [...]}: 1 when a
trajectory's final assistant text contains its task's "answer" (ignoring case),
0 when it does not, and null (declines) when the task has no string "answer".

The request is {"reward": NAME, "trajectories": [{"task", "prompt", "messages",
"completion", "env_rewards", "env_reward", "finished", "outcome", "truncated",
"num_turns", "num_tool_calls", "tool_failures", "completion_tokens",
"metadata"}, ...]}; the answer must hold exactly one number or null per
trajectory, in order. Replace it with your own server (a reward model, a
Python function) speaking the same JSON.`,
		Example: `  ortrain reward serve-example --port 9000 &
  # then, in the config:
  #   rewards:
  #     - {name: env, kind: env}
  #     - {name: judge, kind: http, url: "http://127.0.0.1:9000/score", timeout: 30s}`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, args []string) error {
			opts.IO = deps.IO
			opts.Logger = deps.Logger.With().Str("component", "reward-serve-example").Logger()
			if runF != nil {
				return runF(cmd.Context(), opts)
			}
			return runRewardServeExample(cmd.Context(), opts)
		},
	}
	cmd.Flags().StringVar(&opts.Host, "host", "127.0.0.1", "address to listen on")
	cmd.Flags().IntVar(&opts.Port, "port", 9000, "TCP port (0 picks a free one)")
	return cmd
}

func runRewardServeExample(ctx context.Context, opts *RewardServeExampleOptions) error {
	if opts.Port < 0 || opts.Port > 65535 {
		return usageErrorf("--port %d is not a TCP port (0-65535)", opts.Port)
	}
	var lc net.ListenConfig
	ln, err := lc.Listen(ctx, "tcp", net.JoinHostPort(opts.Host, strconv.Itoa(opts.Port)))
	if err != nil {
		return fmt.Errorf("serve example scorer: %w (is the port in use? try --port 0)", err)
	}
	srv := &http.Server{Handler: reward.ExampleScorer(), ReadHeaderTimeout: 30 * time.Second}
	served := make(chan error, 1)
	go func() { served <- srv.Serve(ln) }()
	url := "http://" + ln.Addr().String() + "/score"
	fmt.Fprintln(opts.IO.Out, url)
	opts.Logger.Info().Str("url", url).Msg("serving; stop with Ctrl-C")
	select {
	case err := <-served:
		return fmt.Errorf("serve example scorer: %w", err)
	case <-ctx.Done():
	}
	sctx, cancel := context.WithTimeout(context.Background(), shutdownGrace)
	defer cancel()
	if err := srv.Shutdown(sctx); err != nil {
		return fmt.Errorf("stop example scorer: %w", err)
	}
	if err := <-served; !errors.Is(err, http.ErrServerClosed) {
		return fmt.Errorf("serve example scorer: %w", err)
	}
	opts.Logger.Info().Msg("stopped")
	return nil
}
