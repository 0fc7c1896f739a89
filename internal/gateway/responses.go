package gateway

import "net/http"

// handleResponses serves POST responses (OpenAI's Responses API).
func (g *Gateway) handleResponses(w http.ResponseWriter, r *http.Request, ro *rollout) {
	g.fail(w, ro, notFound("unknown_url", "the Responses API is not served yet"))
}
