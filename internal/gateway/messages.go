package gateway

import "net/http"

// handleMessages serves POST messages (Anthropic's Messages API).
func (g *Gateway) handleMessages(w http.ResponseWriter, r *http.Request, ro *rollout) {
	g.fail(w, ro, notFound("unknown_url", "the Messages API is not served yet"))
}
