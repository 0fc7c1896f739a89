package gateway

import (
	"slices"
	"sync"
	"time"

	"github.com/ortrain/ortrain/internal/engine"
)

// CallKind says which endpoint served a call.
type CallKind string

const (
	KindChat CallKind = "chat" // POST chat/completions
	KindText CallKind = "text" // POST completions
)

// Call is one successful completion served to a rollout, token-exact: the
// prompt ids the engine was given and the ids and log-probs it sampled.
type Call struct {
	Kind          CallKind
	PromptIDs     []int32
	CompletionIDs []int32 // up to and including a stop token or the token completing a stop string
	// Logprobs are the sampler's (after temperature and truncation), one
	// per completion id.
	Logprobs []float32
	// WeightVersion is the trainer's weight version when the call was
	// dispatched to the engine.
	WeightVersion int
	FinishReason  string // "stop", "length" or "tool_calls"
	// MalformedToolCalls counts tool calls the model wrote that did not
	// parse; the reply then carries the whole text as content.
	MalformedToolCalls int
	Sampling           engine.SamplingParams // what the engine sampled with
	// SamplingOverridden: the request asked for other sampling settings and
	// Defaults.ForceSampling applied the trainer's.
	SamplingOverridden bool
	// Seed is the seed the engine sampled with; SeedOverridden: the
	// request sent a seed of its own and Defaults.ForceSampling replaced it
	// with the rollout's (so a group's rollouts differ).
	Seed           int64
	SeedOverridden bool
	Start, End     time.Time
}

// Rejection is one refused request (4xx) or failed call (5xx).
type Rejection struct {
	Status int
	// Route is the method and path the agent called ("POST /rollouts/…").
	Route   string
	Param   string // the request field at fault, if any
	Message string
	At      time.Time
}

// maxRejections bounds the rejections kept for diagnosis; the counts go on.
const maxRejections = 32

// Recorder holds a rollout's calls in the order they were dispatched. It is
// safe for concurrent use.
type Recorder struct {
	mu         sync.Mutex
	nextSeq    int
	calls      []recordedCall
	rejected   int
	failed     int
	invalid    int
	rejections []Rejection
	closed     bool
	anthropic  messagesState // the Messages API's counters and notes (messages.go)
	responses  respCounters  // the Responses API's counters (responses.go)
}

type recordedCall struct {
	seq  int
	call Call
}

func newRecorder() *Recorder { return &Recorder{} }

// Calls returns the successful calls in dispatch order (concurrent calls
// are ordered by when they reached the engine, not when they finished).
func (r *Recorder) Calls() []Call {
	r.mu.Lock()
	defer r.mu.Unlock()
	out := make([]Call, len(r.calls))
	for i, c := range r.calls {
		out[i] = c.call
	}
	return out
}

// Rejected counts requests refused with a 4xx status (bad key, malformed
// body, unsupported field, a conversation the template cannot render).
func (r *Recorder) Rejected() int {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.rejected
}

// Failed counts calls that failed on the server side (5xx: the engine
// failed or timed out). A rollout with failures is incomplete: its
// recorded calls lack what the agent never got.
func (r *Recorder) Failed() int {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.failed
}

// InvalidResults counts the failed calls whose completion the engine could
// not train on (a null or missing log-prob or token id from the server).
func (r *Recorder) InvalidResults() int {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.invalid
}

// Rejections returns the first refusals and failures, for diagnosis.
func (r *Recorder) Rejections() []Rejection {
	r.mu.Lock()
	defer r.mu.Unlock()
	return slices.Clone(r.rejections)
}

// dispatch reserves the next position in the call order.
func (r *Recorder) dispatch() int {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.nextSeq++
	return r.nextSeq
}

// add records a finished call at its dispatch position; a closed recorder
// takes nothing, so Calls is final after Close.
func (r *Recorder) add(seq int, c Call) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.closed {
		return
	}
	i, _ := slices.BinarySearchFunc(r.calls, seq, func(rc recordedCall, s int) int { return rc.seq - s })
	r.calls = slices.Insert(r.calls, i, recordedCall{seq: seq, call: c})
}

func (r *Recorder) reject(e *apiError, at time.Time) { r.rejectRoute(e, "", at) }

// rejectRoute counts a refusal of a request to route (its method and path).
func (r *Recorder) rejectRoute(e *apiError, route string, at time.Time) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.closed {
		return
	}
	if e.status >= 500 {
		r.failed++
		if e.code == codeGenerationInvalid {
			r.invalid++
		}
	} else {
		r.rejected++
	}
	if len(r.rejections) < maxRejections {
		r.rejections = append(r.rejections, Rejection{Status: e.status, Route: route, Param: e.param, Message: e.message, At: at})
	}
}

func (r *Recorder) close() {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.closed = true
}
