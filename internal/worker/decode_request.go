package worker

// DecoderOptions configure a continuous-batching decoder.
type DecoderOptions struct {
	// KVCacheBudget bounds the bytes of keys/values parked under cache keys
	// between a rollout's turns; the least recently used entries go first.
	// 0 keeps none.
	KVCacheBudget int64
}

// DecodeRequest is one sequence for a Decoder. CacheKey (optional) names
// the rollout it belongs to: when the sequence finishes, its keys/values are
// kept under the key, and a later request with the same key whose prompt
// extends those tokens prefills only the new ones.
type DecodeRequest struct {
	SampleRequest
	CacheKey string
}

// DecodeEvent is one sampled token of a live sequence. Stop is 0 while the
// sequence goes on; otherwise it says why the sequence finished (and left
// the batch).
type DecodeEvent struct {
	Seq     int64
	Token   int32
	Logprob float32
	Stop    StopReason
}
