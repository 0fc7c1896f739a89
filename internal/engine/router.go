package engine

import (
	"hash/fnv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/ortrain/ortrain/internal/vllm"
)

// RouterOptions shape how the vLLM backend spreads requests over replicas.
type RouterOptions struct {
	// AffinitySlack is how many more in-flight requests than the least
	// loaded replica a session's preferred replica may carry before a new
	// session goes elsewhere (default 4). Turns of a session already placed
	// always stay on its replica while it is healthy.
	AffinitySlack int
	// FailCooldown is how long a replica whose connection failed (refused,
	// reset, timed out) is passed over (default 2s).
	FailCooldown time.Duration
	// MaxSessions bounds the remembered session placements (default 65536;
	// the oldest placement is forgotten first).
	MaxSessions int
}

func (o *RouterOptions) defaults() {
	if o.AffinitySlack <= 0 {
		o.AffinitySlack = 4
	}
	if o.FailCooldown <= 0 {
		o.FailCooldown = 2 * time.Second
	}
	if o.MaxSessions <= 0 {
		o.MaxSessions = 1 << 16
	}
}

// RouterStats count routing decisions since the backend started.
type RouterStats struct {
	// Requests per replica, by endpoint index.
	Requests []int64
	// Moved counts sessions sent to another replica because theirs was not
	// ready or had failed.
	Moved int64
}

// router places requests on replicas. A session (all turns of one rollout,
// Request.SessionKey) stays on one replica so its prefix cache stays warm;
// a new session goes to the first replica of its rendezvous-hash order
// (the same order on every rank and after a restart) that is healthy and
// not much busier than the least loaded one. Requests without a key go to
// the least loaded healthy replica.
type router struct {
	opts        RouterOptions
	endpoints   []vllm.Endpoint
	outstanding []atomic.Int64
	requests    []atomic.Int64
	failedUntil []atomic.Int64 // unix nanoseconds
	moved       atomic.Int64
	now         func() time.Time

	mu      sync.Mutex
	placed  map[string]int
	order   []string // placement keys, oldest first (ring of MaxSessions)
	ringPos int
}

func newRouter(eps []vllm.Endpoint, opts RouterOptions) *router {
	opts.defaults()
	return &router{opts: opts, endpoints: eps, outstanding: make([]atomic.Int64, len(eps)),
		requests: make([]atomic.Int64, len(eps)), failedUntil: make([]atomic.Int64, len(eps)),
		now: time.Now, placed: map[string]int{}}
}

// healthy: ready (a supervised replica not restarting) and not in its
// failure cooldown.
func (r *router) healthy(i int, now int64) bool {
	return r.endpoints[i].Ready() && r.failedUntil[i].Load() <= now
}

// pick returns the replica for a request of session key ("" for none) and
// marks one more request outstanding there; done releases it.
func (r *router) pick(key string) (i int, done func(), err error) {
	now := r.now().UnixNano()
	minLoad := int64(-1)
	least := -1
	for j := range r.endpoints {
		if !r.healthy(j, now) {
			continue
		}
		if l := r.outstanding[j].Load(); least < 0 || l < minLoad {
			least, minLoad = j, l
		}
	}
	if least < 0 {
		return 0, nil, errNoReplica
	}
	i = least
	if key != "" {
		i = r.place(key, now, minLoad, least)
	}
	r.outstanding[i].Add(1)
	r.requests[i].Add(1)
	return i, func() { r.outstanding[i].Add(-1) }, nil
}

// place keeps a session on its replica while that is healthy, else picks
// one by rendezvous hash among the healthy ones within the load slack;
// when loads or health changed since least was chosen and none qualifies,
// least it is.
func (r *router) place(key string, now, minLoad int64, least int) int {
	r.mu.Lock()
	defer r.mu.Unlock()
	prev, had := r.placed[key]
	if had && r.healthy(prev, now) {
		return prev
	}
	best, bestScore := -1, uint64(0)
	for j := range r.endpoints {
		if !r.healthy(j, now) || r.outstanding[j].Load() > minLoad+int64(r.opts.AffinitySlack) {
			continue
		}
		if s := rendezvous(key, j); best < 0 || s > bestScore {
			best, bestScore = j, s
		}
	}
	if best < 0 {
		best = least
	}
	if had {
		r.moved.Add(1)
	} else {
		r.remember(key)
	}
	r.placed[key] = best
	return best
}

// remember records key in the bounded ring, forgetting the oldest.
func (r *router) remember(key string) {
	if len(r.order) < r.opts.MaxSessions {
		r.order = append(r.order, key)
		return
	}
	delete(r.placed, r.order[r.ringPos])
	r.order[r.ringPos] = key
	r.ringPos = (r.ringPos + 1) % len(r.order)
}

// failed passes replica i over for the cooldown.
func (r *router) failed(i int) {
	r.failedUntil[i].Store(r.now().Add(r.opts.FailCooldown).UnixNano())
}

func (r *router) stats() RouterStats {
	s := RouterStats{Requests: make([]int64, len(r.requests)), Moved: r.moved.Load()}
	for i := range r.requests {
		s.Requests[i] = r.requests[i].Load()
	}
	return s
}

// rendezvous is the highest-random-weight score of (key, replica index).
// Indexes, not URLs: a restarted replica may come back on another port.
func rendezvous(key string, replica int) uint64 {
	h := fnv.New64a()
	h.Write([]byte(key))
	h.Write([]byte{0, byte(replica), byte(replica >> 8)})
	x := h.Sum64()
	// fnv's low bits mix poorly for short inputs; finish with splitmix64.
	x ^= x >> 30
	x *= 0xbf58476d1ce4e5b9
	x ^= x >> 27
	x *= 0x94d049bb133111eb
	return x ^ (x >> 31)
}
