// Package ors is the Open Reward Standard client: target and catalog
// resolution, authentication, SSE, sessions, pings, retries and resume.
//
// A Client talks to one environment:
//
//	c, err := ors.NewClient("http://127.0.0.1:8080", ors.Options{Getenv: os.Getenv})
//	n, err := c.NumTasks(ctx, "train")
//	s, err := c.OpenSession(ctx, ors.SessionSpec{Split: "train", Index: 3})
//	defer s.Close(context.WithoutCancel(ctx))
//	prompt, err := s.Prompt(ctx)
//	tools, err := s.Tools(ctx) // shared + task-scoped
//	out, err := s.CallTool(ctx, "echo", json.RawMessage(`{"text":"hi"}`))
//
// Targets are URLs (one origin for everything, optionally /ENV for a
// non-default env) or catalog names (Owner/Env on the hosted platform, via
// https://sessions.<host> and https://api.<host>, needing OPENREWARD_API_KEY).
//
// Errors callers branch on: *AuthError (401/403 or no key), *UnreachableError
// (connection refused; names the origin), *NotFoundError (unknown env, route,
// deployment), *InvalidRequestError (bad split/index/body: 400/422),
// *ToolCallError (ok:false, with Reason), *ToolFailedError (the tool raised),
// *SessionTerminatedError (pings failed, reaped, 410, or closed).
//
// Retries follow the Python SDK (ors-protocol.md §8): plain requests 3
// attempts (1 s, 2 s), /call streams 5 retries resumed by task id with
// 0.5·2^(n-1) s waits capped at 10 s and a 30 s silence timeout, only network
// errors and 429/502/503/504 retried. The Client holds no lock on the request
// path and shares one connection pool, so thousands of sessions may run at once.
package ors
