package gateway

import (
	"slices"
	"sync"

	"github.com/ortrain/ortrain/internal/chat"
)

// maxStoredResponses bounds the responses a tenant keeps for
// previous_response_id; the oldest is dropped first. An agent continues
// its latest responses, so a bound this size loses nothing in practice
// and keeps a long rollout's memory flat.
const maxStoredResponses = 256

// responseStore is a tenant's kept responses: each one's conversation (its
// input, after the conversation it continued, then its output) as the chat
// messages it was rendered from, without instructions, which OpenAI does
// not carry over to a continuation. It is safe for concurrent use.
type responseStore struct {
	mu    sync.Mutex
	byID  map[string][]chat.Message
	order []string // insertion order, oldest first
}

func newResponseStore() *responseStore {
	return &responseStore{byID: map[string][]chat.Message{}}
}

// get returns the conversation of a kept response. The slice is shared:
// callers append to a copy (slices.Concat), never in place.
func (s *responseStore) get(id string) ([]chat.Message, bool) {
	if s == nil {
		return nil, false
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	msgs, ok := s.byID[id]
	return msgs, ok
}

// put keeps a response's conversation, dropping the oldest beyond the
// bound.
func (s *responseStore) put(id string, msgs []chat.Message) {
	if s == nil {
		return
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if _, ok := s.byID[id]; !ok {
		s.order = append(s.order, id)
	}
	s.byID[id] = msgs
	for len(s.order) > maxStoredResponses {
		delete(s.byID, s.order[0])
		s.order = slices.Delete(s.order, 0, 1)
	}
}

// len counts the kept responses.
func (s *responseStore) len() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return len(s.byID)
}
