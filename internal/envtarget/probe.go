package envtarget

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"strings"
	"sync"
	"time"

	"github.com/ortrain/ortrain/internal/openenv"
	"github.com/ortrain/ortrain/internal/ors"
)

// defaultProbeTimeout bounds each protocol probe (all of its requests): a
// probe asks a live server for a few bytes, so a slow answer is no answer.
const defaultProbeTimeout = 5 * time.Second

// Probe is what one protocol probe of a URL asked and what came back.
type Probe struct {
	Protocol Protocol
	// Request is the request that decided ("GET /health").
	Request string
	// Want is what a server of Protocol answers.
	Want string
	// Status, ContentType and FirstLine describe the answer; Status 0
	// means none came and Err says why.
	Status      int
	ContentType string
	FirstLine   string
	Err         error
	// OK: the server speaks Protocol.
	OK bool

	url    string          // the request's full URL
	detail string          // a 401/403 body's detail, for the auth error
	schema *openenv.Schema // OpenEnv: GET /schema, when OK
}

func (p Probe) String() string {
	if p.OK {
		return fmt.Sprintf("%s: %s answered as an %s server does", p.Protocol.Name(), p.Request, p.Protocol.Name())
	}
	if p.Status == 0 {
		return fmt.Sprintf("%s: %s got no answer (%v)", p.Protocol.Name(), p.Request, p.Err)
	}
	return fmt.Sprintf("%s: %s answered HTTP %d, %s, first line %q; want %s",
		p.Protocol.Name(), p.Request, p.Status, p.ContentType, p.FirstLine, p.Want)
}

func (p Probe) auth() bool {
	return p.Status == http.StatusUnauthorized || p.Status == http.StatusForbidden
}

// Name is the protocol's written name.
func (p Protocol) Name() string {
	switch p {
	case ORS:
		return "ORS"
	case OpenEnv:
		return "OpenEnv"
	}
	return string(p)
}

// ProtocolError is a URL that answers HTTP but not the protocol asked for
// (Pinned, from the config's protocol or --protocol) or, when detecting,
// neither protocol. Probes says what each probe asked and got.
type ProtocolError struct {
	Target string
	// Pinned is the protocol asked for ("" when detecting); Speaks is the
	// other protocol when the server does speak it.
	Pinned, Speaks Protocol
	Probes         []Probe
	// UnsentToken names the token variable that applied but was not set:
	// a private server may hide behind a plain error page.
	UnsentToken string
}

func (e *ProtocolError) Error() string {
	parts := make([]string, len(e.Probes))
	for i, p := range e.Probes {
		parts[i] = p.String()
	}
	tried := strings.Join(parts, "; ")
	if e.UnsentToken != "" {
		tried += fmt.Sprintf("; no token was sent: if the server is private, set %s", e.UnsentToken)
	}
	switch {
	case e.Pinned == "":
		return fmt.Sprintf("env target %q speaks neither OpenEnv nor ORS (%s)", e.Target, tried)
	case e.Speaks != "":
		return fmt.Sprintf("env target %q speaks %s, not %s: set protocol %s, or leave protocol unset to detect it (%s)",
			e.Target, e.Speaks.Name(), e.Pinned.Name(), e.Speaks, tried)
	}
	return fmt.Sprintf("env target %q speaks neither %s (protocol %s is set) nor %s (%s)",
		e.Target, e.Pinned.Name(), e.Pinned, otherProtocol(e.Pinned).Name(), tried)
}

func otherProtocol(p Protocol) Protocol {
	if p == ORS {
		return OpenEnv
	}
	return ORS
}

// prober asks one URL whether it speaks OpenEnv or ORS, each probe bounded.
type prober struct {
	target   string
	http     *http.Client
	timeout  time.Duration
	token    string
	tokenEnv string
	apiKey   string
}

func newProber(target string, opts Options) *prober {
	timeout := opts.ProbeTimeout
	if timeout <= 0 {
		timeout = defaultProbeTimeout
	}
	env, token := tokenFor(target, opts)
	return &prober{target: target, timeout: timeout, token: token, tokenEnv: env,
		apiKey: opts.Getenv("OPENREWARD_API_KEY"),
		http:   &http.Client{Transport: http.DefaultTransport.(*http.Transport).Clone()}}
}

func (p *prober) close() { p.http.CloseIdleConnections() }

// run probes one protocol.
func (p *prober) run(ctx context.Context, proto Protocol) Probe {
	ctx, cancel := context.WithTimeout(ctx, p.timeout)
	defer cancel()
	if proto == OpenEnv {
		return p.openEnv(ctx)
	}
	return p.ors(ctx)
}

// both probes the two protocols at once.
func (p *prober) both(ctx context.Context) (oe, or Probe) {
	var wg sync.WaitGroup
	wg.Add(1)
	go func() { defer wg.Done(); oe = p.run(ctx, OpenEnv) }()
	or = p.run(ctx, ORS)
	wg.Wait()
	return oe, or
}

// openEnv: GET /health must say {"status":"healthy"} and GET /schema carry
// an action schema (an ORS server's /health says {"status":"ok"}).
func (p *prober) openEnv(ctx context.Context) Probe {
	base := strings.TrimRight(p.target, "/")
	pr := Probe{Protocol: OpenEnv, Request: "GET /health", Want: `200 and {"status":"healthy"}`}
	body := p.get(ctx, base+"/health", &pr, false)
	var h struct {
		Status string `json:"status"`
	}
	if pr.Status != http.StatusOK || json.Unmarshal(body, &h) != nil || h.Status != "healthy" {
		return pr
	}
	pr = Probe{Protocol: OpenEnv, Request: "GET /schema", Want: "200 and a JSON object with an action schema"}
	body = p.get(ctx, base+"/schema", &pr, false)
	var s openenv.Schema
	if pr.Status != http.StatusOK || json.Unmarshal(body, &s) != nil {
		return pr
	}
	var action map[string]json.RawMessage
	if json.Unmarshal(s.Action, &action) != nil || action == nil {
		return pr
	}
	pr.OK, pr.schema = true, &s
	return pr
}

// ors: GET /list_environments, a root endpoint of every ORS server, must
// answer a JSON list of env names.
func (p *prober) ors(ctx context.Context) Probe {
	pr := Probe{Protocol: ORS, Request: "GET /list_environments", Want: "200 and a JSON list of environment names"}
	u, err := url.Parse(p.target)
	if err != nil {
		pr.Err = err
		return pr
	}
	body := p.get(ctx, u.Scheme+"://"+u.Host+"/list_environments", &pr, true)
	var names []string
	pr.OK = pr.Status == http.StatusOK && json.Unmarshal(body, &names) == nil
	return pr
}

// maxProbeBody bounds what a probe reads: a schema, or the head of a page.
const maxProbeBody = 4 << 20

// get runs one GET and records what came back in pr; apiKey adds the
// OpenReward key, as the ORS client would send it.
func (p *prober) get(ctx context.Context, u string, pr *Probe, apiKey bool) []byte {
	pr.url = u
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, u, nil)
	if err != nil {
		pr.Err = err
		return nil
	}
	req.Header.Set("Accept", "application/json")
	if p.token != "" {
		req.Header.Set("Authorization", "Bearer "+p.token)
	}
	if apiKey && p.apiKey != "" {
		req.Header.Set("X-API-Key", p.apiKey)
	}
	resp, err := p.http.Do(req)
	if err != nil {
		if ctx.Err() != nil {
			err = fmt.Errorf("no answer within %s", p.timeout)
		}
		pr.Err = err
		return nil
	}
	defer resp.Body.Close()
	body, _ := io.ReadAll(io.LimitReader(resp.Body, maxProbeBody))
	pr.Status = resp.StatusCode
	pr.ContentType = resp.Header.Get("Content-Type")
	if pr.ContentType == "" {
		pr.ContentType = "no content type"
	}
	pr.FirstLine = openenv.TextLine(pr.ContentType, body)
	if pr.auth() {
		pr.detail = detailOf(body)
	}
	return body
}

// detailOf is FastAPI's "detail" string, else the first line.
func detailOf(body []byte) string {
	var d struct {
		Detail string `json:"detail"`
	}
	if json.Unmarshal(body, &d) == nil && d.Detail != "" {
		return d.Detail
	}
	return openenv.TextLine("", body)
}

// failure turns probes that all failed into the error to report: an auth
// error when a server refused the credentials (OpenEnv's first when a
// token variable applies to the target), an unreachable server when no
// probe got an answer, else a *ProtocolError.
func (p *prober) failure(ctx context.Context, pinned Protocol, probes ...Probe) error {
	if err := ctx.Err(); err != nil {
		return fmt.Errorf("probe env target %q: %w", p.target, err)
	}
	var oeAuth, orsAuth *Probe
	answered := false
	for i := range probes {
		pr := &probes[i]
		answered = answered || pr.Status != 0
		if pr.auth() && pr.Protocol == OpenEnv {
			oeAuth = pr
		} else if pr.auth() {
			orsAuth = pr
		}
	}
	switch {
	case oeAuth != nil && (p.tokenEnv != "" || orsAuth == nil):
		return &openenv.AuthError{Method: http.MethodGet, URL: oeAuth.url, Status: oeAuth.Status, TokenEnv: p.tokenEnv, TokenSent: p.token != ""}
	case orsAuth != nil:
		return &ors.AuthError{URL: orsAuth.url, Detail: orsAuth.detail}
	case !answered:
		var reqs []string
		for _, pr := range probes {
			reqs = append(reqs, pr.Protocol.Name()+" "+pr.Request)
		}
		errs := probeErrs(probes)
		msgs := make([]string, len(errs))
		for i, e := range errs {
			msgs[i] = e.Error()
		}
		return &UnreachableError{Target: p.target, Err: &probeFailure{msg: fmt.Sprintf("cannot reach %s (probed %s): %s",
			p.target, strings.Join(reqs, " and "), strings.Join(msgs, "; ")), errs: errs}}
	}
	return p.protocolError(pinned, probes...)
}

func (p *prober) protocolError(pinned Protocol, probes ...Probe) *ProtocolError {
	pe := &ProtocolError{Target: p.target, Pinned: pinned, Probes: probes}
	if p.tokenEnv != "" && p.token == "" {
		pe.UnsentToken = p.tokenEnv
	}
	return pe
}

// probeFailure is why no probe got an answer; it unwraps to the transport
// errors.
type probeFailure struct {
	msg  string
	errs []error
}

func (e *probeFailure) Error() string   { return e.msg }
func (e *probeFailure) Unwrap() []error { return e.errs }

// probeErrs are the probes' transport errors without the request URL,
// deduplicated (both probes of a dead server see the same refusal).
func probeErrs(probes []Probe) []error {
	var out []error
	seen := map[string]bool{}
	for _, pr := range probes {
		err := pr.Err
		var ue *url.Error
		if errors.As(err, &ue) {
			err = ue.Err
		}
		if err != nil && !seen[err.Error()] {
			seen[err.Error()] = true
			out = append(out, err)
		}
	}
	return out
}

// hfSpaceSuffix marks a Hugging Face Space host, whose private Spaces take
// the user's HF token.
const hfSpaceSuffix = ".hf.space"

// tokenFor names the variable holding target's bearer token and reads it:
// opts.TokenEnv, else HF_TOKEN for a *.hf.space host, else none.
func tokenFor(target string, opts Options) (env, token string) {
	env = opts.TokenEnv
	if env == "" {
		if u, err := url.Parse(target); err == nil && strings.HasSuffix(strings.ToLower(u.Hostname()), hfSpaceSuffix) {
			env = "HF_TOKEN"
		}
	}
	if env == "" {
		return "", ""
	}
	return env, opts.Getenv(env)
}
