package agent

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/url"
)

// maxResponseBytes bounds a URL agent's answer, which is one small object.
const maxResponseBytes = 1 << 20

// serviceRequest is the body POSTed to a URL agent.
type serviceRequest struct {
	RolloutID string `json:"rollout_id"`
	BaseURL   string `json:"base_url"`
	// AnthropicBaseURL is base_url without /v1, for Anthropic's clients.
	AnthropicBaseURL string          `json:"anthropic_base_url"`
	APIKey           string          `json:"api_key"`
	Model            string          `json:"model"`
	MCPURL           string          `json:"mcp_url"`
	Task             json.RawMessage `json:"task"`
}

// runService POSTs the facts to a URL agent and reads {"reward": …} back,
// all within spec.Timeout.
func runService(ctx context.Context, spec Spec, facts Facts) Result {
	task, err := facts.taskJSON()
	if err != nil {
		return Result{Outcome: OutcomeAgentError, Err: err}
	}
	body, err := json.Marshal(serviceRequest{
		RolloutID: facts.RolloutID, BaseURL: facts.BaseURL, AnthropicBaseURL: facts.AnthropicBaseURL(), APIKey: facts.APIKey,
		Model: facts.Model, MCPURL: facts.MCPURL, Task: task,
	})
	if err != nil {
		return Result{Outcome: OutcomeAgentError, Err: fmt.Errorf("encode agent request: %w", err)}
	}
	target := redactedURL(spec.URL)

	runCtx, cancel := context.WithTimeout(ctx, spec.Timeout)
	defer cancel()
	req, err := http.NewRequestWithContext(runCtx, http.MethodPost, spec.URL, bytes.NewReader(body))
	if err != nil {
		return Result{Outcome: OutcomeAgentError, Err: fmt.Errorf("agent request to %s: %w", target, unwrapURLError(err))}
	}
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("Accept", "application/json")
	client := spec.HTTPClient
	if client == nil {
		// Redirects are not followed: the body carries the API key.
		client = &http.Client{CheckRedirect: func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse }}
	}

	resp, err := client.Do(req)
	if err != nil {
		outcome := serviceFailure(ctx, runCtx, err)
		err = unwrapURLError(err)
		if runCtx.Err() != nil {
			err = stopError(ctx, spec.Timeout)
		}
		return Result{Outcome: outcome, Err: fmt.Errorf("agent request to %s: %w", target, err)}
	}
	defer resp.Body.Close()
	// The body is read under runCtx as well: a server that stalls mid-body
	// times out like one that never answers.
	raw, err := io.ReadAll(io.LimitReader(resp.Body, maxResponseBytes+1))
	tail := newTailBuffer(spec.tailBytes())
	tail.write(raw)
	res := Result{StdoutTail: tail.String()}
	if err != nil {
		res.Outcome = serviceFailure(ctx, runCtx, err)
		if runCtx.Err() != nil {
			err = stopError(ctx, spec.Timeout)
		}
		res.Err = fmt.Errorf("read agent response from %s: %w", target, err)
		return res
	}
	if resp.StatusCode < 200 || resp.StatusCode > 299 {
		res.Outcome = OutcomeAgentError
		res.Err = fmt.Errorf("agent %s answered %s", target, resp.Status)
		return res
	}
	if len(raw) > maxResponseBytes {
		res.Outcome = OutcomeBadOutput
		res.Err = fmt.Errorf("%w: agent %s answered more than %d bytes", errBadOutput, target, maxResponseBytes)
		return res
	}
	if !validUTF8(raw, false) {
		res.Outcome = OutcomeBadOutput
		res.Err = fmt.Errorf("%w: agent %s answered invalid UTF-8", errBadOutput, target)
		return res
	}
	reward, err := parseReward(raw, false)
	if err != nil {
		res.Outcome = OutcomeBadOutput
		res.Err = fmt.Errorf("%w: agent %s answer: %w", errBadOutput, target, err)
		return res
	}
	res.Outcome, res.Reward = OutcomeOK, reward
	return res
}

// serviceFailure classifies a failed exchange: the run's deadline or the
// caller's cancel if either ended it, a timeout of the HTTP client's own,
// else the agent's error (refused connection, reset, bad TLS, ...).
func serviceFailure(callerCtx, runCtx context.Context, err error) Outcome {
	if runCtx.Err() != nil {
		return endedBy(callerCtx)
	}
	var netErr net.Error
	if errors.As(err, &netErr) && netErr.Timeout() {
		return OutcomeTimeout
	}
	return OutcomeAgentError
}

// unwrapURLError drops *url.Error's copy of the URL (it may carry
// credentials); callers name the redacted URL themselves.
func unwrapURLError(err error) error {
	var uerr *url.Error
	if errors.As(err, &uerr) {
		return uerr.Err
	}
	return err
}

// redactedURL is rawURL with any password and query removed, for messages.
func redactedURL(rawURL string) string {
	u, err := url.Parse(rawURL)
	if err != nil {
		return "agent.url"
	}
	u.RawQuery, u.Fragment = "", ""
	return u.Redacted()
}
