package train

import "math/rand/v2"

// seeds derives every random stream of a run from the config seed, here and
// nowhere else, so no two streams collide and each one is a pure function
// of (seed, position): a resumed run re-derives exactly the streams an
// uninterrupted one would use.
type seeds int64

// rollout seeds rollout i of round's attempt (the turn-level streams
// derive from it inside the rollout package). Attempt 0 is the round's own
// tasks; dynamic sampling's refills (attempt >= 1) hash into their own
// space.
func (s seeds) rollout(round int64, i, attempt int) int64 {
	if attempt == 0 {
		return (int64(s)+1)*1_000_003 + round*100_003 + int64(i) + 1
	}
	x := uint64(s)*0x9e3779b97f4a7c15 ^ uint64(round)<<20 ^ uint64(attempt)<<52 ^ uint64(i)
	x = (x ^ x>>30) * 0xbf58476d1ce4e5b9
	x = (x ^ x>>27) * 0x94d049bb133111eb
	return int64((x ^ x>>31) >> 1)
}

// eval seeds the i-th rollout of an evaluation.
func (s seeds) eval(i int) int64 { return (int64(s)+7)*1_000_003 + int64(i) + 1 }

// roundShuffle orders the micro-batches of round.
func (s seeds) roundShuffle(round int64) *rand.Rand {
	return rand.New(rand.NewPCG(uint64(s), uint64(round)+0x5eed))
}
