package engine

import (
	"context"
	"fmt"

	"github.com/ortrain/ortrain/internal/vllm"
)

// warnShared says what a server ortrain did not start exposes or does
// differently, once at start: the control routes vLLM serves without its
// API key, and a pause that aborts other clients' requests.
func (v *VLLM) warnShared(ctx context.Context, c *vllm.Client) {
	ver := v.serverVersions[c.URL()]
	if open, err := vllm.OpenRoutes(ctx, c); err == nil && len(open) > 0 {
		v.opts.Logger.Warn().Str("url", c.URL()).Str("vllm", ver).Strs("open_routes", open).
			Msg("this server answers its control routes without the API key (vLLM's --api-key guards only /v1 and a few other prefixes): " +
				"anyone who reaches it can pause it or call any worker method; keep it on a private network, or let ortrain launch it " +
				"(beyond loopback ortrain puts a proxy that requires the key on every route in front)")
	}
	if v.opts.SyncMode == SyncFull && vllm.PauseIgnoresMode(ver) {
		v.opts.Logger.Warn().Str("url", c.URL()).Str("vllm", ver).
			Msg("this vLLM has no /pause?mode=: every weight sync pauses with abort, so other clients of this server lose their requests in flight " +
				"(ortrain drains its own first); use a newer vLLM if the server is shared")
	}
}

// describeRequest names a completion request in errors: enough to find it
// in the server's log, never its tokens.
func describeRequest(body *vllm.CompletionRequest, session string) string {
	d := fmt.Sprintf("POST /v1/completions model=%s, %d prompt tokens, max_tokens %d", body.Model, len(body.Prompt), body.MaxTokens)
	if body.Seed != nil {
		d += fmt.Sprintf(", seed %d", *body.Seed)
	}
	if session != "" {
		d += ", session " + session
	}
	return d
}
