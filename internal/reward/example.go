package reward

import (
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"strings"
)

// ExampleScorer is a tiny http scorer implementing the contract of Request
// and Response, for `ortrain reward serve-example` and tests: POST /score
// rewards 1 when the completion contains the task's "answer" (a string,
// compared case-insensitively), 0 when it does not, and declines (null)
// when the task has no string "answer". GET /health answers 200.
func ExampleScorer() http.Handler {
	mux := http.NewServeMux()
	mux.HandleFunc("GET /health", func(w http.ResponseWriter, _ *http.Request) {
		w.WriteHeader(http.StatusOK)
	})
	mux.HandleFunc("POST /score", func(w http.ResponseWriter, r *http.Request) {
		var req Request
		if err := json.NewDecoder(io.LimitReader(r.Body, 64<<20)).Decode(&req); err != nil {
			http.Error(w, fmt.Sprintf("want a JSON body {\"trajectories\": [...]}: %v", err), http.StatusBadRequest)
			return
		}
		resp := Response{Rewards: make([]*float64, len(req.Trajectories))}
		for i, t := range req.Trajectories {
			resp.Rewards[i] = exampleReward(t)
		}
		w.Header().Set("Content-Type", "application/json")
		_ = json.NewEncoder(w).Encode(resp) // a failed write is the client's broken connection
	})
	return mux
}

func exampleReward(t RequestItem) *float64 {
	answer, ok := t.Task["answer"].(string)
	if !ok {
		return nil
	}
	v := 0.0
	if strings.Contains(strings.ToLower(t.Completion), strings.ToLower(answer)) {
		v = 1
	}
	return &v
}
