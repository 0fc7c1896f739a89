//go:build cgo

package worker

import (
	"context"
	"maps"
	"slices"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// decodeAll runs d until the sequences of ids finish, adding late[k] just
// before step k (continuous joins), and returns the results by sequence id.
func decodeAll(t *testing.T, d *Decoder, late map[int][]DecodeRequest) map[int64]*SampleResult {
	t.Helper()
	ctx := context.Background()
	out := map[int64]*SampleResult{}
	live := 0
	for step := 0; ; step++ {
		if reqs := late[step]; len(reqs) > 0 {
			ids, err := d.Add(ctx, reqs)
			require.NoError(t, err)
			for _, id := range ids {
				out[id] = &SampleResult{}
			}
			live += len(ids)
		}
		if live == 0 && step > maxKey(late) {
			return out
		}
		evs, err := d.Step(ctx, live)
		require.NoError(t, err)
		require.Len(t, evs, live)
		for _, e := range evs {
			r := out[e.Seq]
			require.NotNil(t, r, "event for unknown sequence %d", e.Seq)
			r.IDs = append(r.IDs, e.Token)
			r.Logprobs = append(r.Logprobs, e.Logprob)
			if e.Stop != 0 {
				r.StopReason = e.Stop
				live--
			}
		}
	}
}

func maxKey(m map[int][]DecodeRequest) int {
	k := 0
	for s := range m {
		k = max(k, s)
	}
	return k
}

func newDecoder(t *testing.T, m *Model, budget int64) *Decoder {
	t.Helper()
	d, err := m.NewDecoder(context.Background(), DecoderOptions{KVCacheBudget: budget})
	require.NoError(t, err)
	t.Cleanup(func() { d.Close() })
	return d
}

func requireSameSamples(t *testing.T, want []SampleResult, got []*SampleResult) {
	t.Helper()
	require.Len(t, got, len(want))
	for i := range want {
		require.Equal(t, want[i].IDs, got[i].IDs, "request %d", i)
		require.Equal(t, want[i].StopReason, got[i].StopReason, "request %d", i)
		for j := range want[i].Logprobs {
			require.InDelta(t, want[i].Logprobs[j], got[i].Logprobs[j], 1e-5, "request %d token %d", i, j)
		}
	}
}

// TestDecoderMatchesStaticSample: continuous batching (rows joining between
// steps, leaving when done) gives the static sampler's tokens for the same
// requests and seeds, greedy and sampled with every filter.
func TestDecoderMatchesStaticSample(t *testing.T) {
	m := loadTiny(t, ModelOptions{})
	ctx := context.Background()
	prompts := mixedPrompts()
	var reqs []SampleRequest
	for i, p := range prompts {
		reqs = append(reqs,
			SampleRequest{PromptIDs: p, MaxNewTokens: 9 + i, Temperature: 0, Seed: int64(i)},
			SampleRequest{PromptIDs: p, MaxNewTokens: 14, Temperature: 1, Seed: int64(10 + i)},
			SampleRequest{PromptIDs: p, MaxNewTokens: 7, Temperature: 0.7, TopP: 0.9, TopK: 20, Seed: int64(20 + i)},
			SampleRequest{PromptIDs: p, MaxNewTokens: 11, Temperature: 1.3, MinP: 0.05, StopIDs: []int32{7, 9}, Seed: int64(30 + i)},
		)
	}
	want, err := m.Sample(ctx, reqs)
	require.NoError(t, err)

	for _, tc := range []struct {
		name  string
		split func([]DecodeRequest) map[int][]DecodeRequest
	}{
		{"all at once", func(r []DecodeRequest) map[int][]DecodeRequest { return map[int][]DecodeRequest{0: r} }},
		{"joining between steps", func(r []DecodeRequest) map[int][]DecodeRequest {
			late := map[int][]DecodeRequest{}
			for i, q := range r {
				late[3*(i%4)] = append(late[3*(i%4)], q)
			}
			return late
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			d := newDecoder(t, m, 0)
			dreqs := make([]DecodeRequest, len(reqs))
			for i, r := range reqs {
				dreqs[i] = DecodeRequest{SampleRequest: r}
			}
			late := tc.split(dreqs)
			res := decodeAll(t, d, late)
			// Sequence ids are given in add order: map them back to requests.
			order := []int{}
			for s := 0; s <= maxKey(late); s++ {
				for _, q := range late[s] {
					for i := range dreqs {
						if &dreqs[i].PromptIDs[0] == &q.PromptIDs[0] && dreqs[i].Seed == q.Seed {
							order = append(order, i)
						}
					}
				}
			}
			got := make([]*SampleResult, len(reqs))
			for k, i := range order {
				got[i] = res[int64(k+1)]
			}
			requireSameSamples(t, want, got)
		})
	}
}

// TestDecoderSharedPrefill: G identical prompts are prefilled once, and
// each sample is the one the static sampler gives for its seed.
func TestDecoderSharedPrefill(t *testing.T) {
	m := loadTiny(t, ModelOptions{})
	ctx := context.Background()
	prompt := []int32{1, 60, 61, 62, 63, 64, 65, 66, 67, 68, 69, 70}
	const G = 6
	var reqs []SampleRequest
	var dreqs []DecodeRequest
	for g := range G {
		r := SampleRequest{PromptIDs: prompt, MaxNewTokens: 10, Temperature: 1, Seed: int64(100 + g)}
		reqs = append(reqs, r)
		dreqs = append(dreqs, DecodeRequest{SampleRequest: r})
	}
	want, err := m.Sample(ctx, reqs)
	require.NoError(t, err)
	d := newDecoder(t, m, 0)
	res := decodeAll(t, d, map[int][]DecodeRequest{0: dreqs[:2], 2: dreqs[2:]})
	got := make([]*SampleResult, G)
	for g := range G {
		got[g] = res[int64(g+1)]
	}
	requireSameSamples(t, want, got)
	st, err := d.Stats(ctx)
	require.NoError(t, err)
	assert.Equal(t, int64(len(prompt)), st.PrefillTokens, "one prefill for the group")
	assert.Equal(t, int64((G-1)*len(prompt)), st.SharedTokens)
	assert.Equal(t, int64(0), st.Live)
}

// TestDecoderReuseAcrossTurns: the second turn of a rollout, whose prompt
// extends the first turn's prompt and completion, prefills only the new
// tokens and gives the tokens and log-probs of a full prefill.
func TestDecoderReuseAcrossTurns(t *testing.T) {
	m := loadTiny(t, ModelOptions{})
	ctx := context.Background()
	turn1 := DecodeRequest{SampleRequest: SampleRequest{PromptIDs: []int32{1, 60, 61, 62, 63}, MaxNewTokens: 8, Temperature: 1, Seed: 5}, CacheKey: "rollout-a"}
	cached := newDecoder(t, m, 1<<30)
	r1 := only(t, decodeAll(t, cached, map[int][]DecodeRequest{0: {turn1}}))
	st, err := cached.Stats(ctx)
	require.NoError(t, err)
	require.Equal(t, int64(1), st.CachedEntries)

	for _, tc := range []struct {
		name        string
		prompt      []int32
		wantReused  int64
		wantPrefill int64
	}{
		// The sampled last token was never fed, so its key/value is not cached.
		{"extends the cached tokens", concat(turn1.PromptIDs, r1.IDs, []int32{9, 8, 7}), int64(len(turn1.PromptIDs) + len(r1.IDs) - 1), 4},
		{"differs after two tokens", concat(turn1.PromptIDs[:2], []int32{99}, r1.IDs), 2, int64(1 + len(r1.IDs))},
	} {
		t.Run(tc.name, func(t *testing.T) {
			before, err := cached.Stats(ctx)
			require.NoError(t, err)
			// Park turn 1 again under its own key for this case.
			key := "rollout-" + tc.name
			again := only(t, decodeAll(t, cached, map[int][]DecodeRequest{0: {{SampleRequest: turn1.SampleRequest, CacheKey: key}}}))
			require.Equal(t, r1.IDs, again.IDs)
			require.Equal(t, int64(0), before.Live)
			turn2 := SampleRequest{PromptIDs: tc.prompt, MaxNewTokens: 6, Temperature: 0.8, TopK: 30, Seed: 11}
			mid, err := cached.Stats(ctx)
			require.NoError(t, err)
			one := only(t, decodeAll(t, cached, map[int][]DecodeRequest{0: {{SampleRequest: turn2, CacheKey: key}}}))
			after, err := cached.Stats(ctx)
			require.NoError(t, err)
			assert.Equal(t, tc.wantReused, after.ReusedTokens-mid.ReusedTokens)
			assert.Equal(t, tc.wantPrefill, after.PrefillTokens-mid.PrefillTokens)

			full, err := m.Sample(ctx, []SampleRequest{turn2})
			require.NoError(t, err)
			require.Equal(t, full[0].IDs, one.IDs)
			for j := range full[0].Logprobs {
				require.InDelta(t, full[0].Logprobs[j], one.Logprobs[j], 2e-6, "token %d", j)
			}
		})
	}
}

func only(t *testing.T, res map[int64]*SampleResult) *SampleResult {
	t.Helper()
	require.Len(t, res, 1)
	for _, r := range res {
		return r
	}
	return nil
}

func concat(parts ...[]int32) []int32 {
	var out []int32
	for _, p := range parts {
		out = append(out, p...)
	}
	return out
}

// TestDecoderBudgetEvictsLeastRecentlyUsed: parked entries stay under the
// budget, the oldest leaving first; a zero budget keeps none.
func TestDecoderBudgetEvictsLeastRecentlyUsed(t *testing.T) {
	m := loadTiny(t, ModelOptions{})
	ctx := context.Background()
	req := func(key string, seed int64) DecodeRequest {
		return DecodeRequest{SampleRequest: SampleRequest{PromptIDs: []int32{1, 2, 3, 4}, MaxNewTokens: 5, Temperature: 1, Seed: seed}, CacheKey: key}
	}
	probe := newDecoder(t, m, 1<<30)
	decodeAll(t, probe, map[int][]DecodeRequest{0: {req("a", 1)}})
	st, err := probe.Stats(ctx)
	require.NoError(t, err)
	one := st.CachedBytes
	require.Positive(t, one)

	d := newDecoder(t, m, 2*one)
	for i, k := range []string{"a", "b", "c"} {
		decodeAll(t, d, map[int][]DecodeRequest{0: {req(k, int64(i))}})
	}
	st, err = d.Stats(ctx)
	require.NoError(t, err)
	assert.Equal(t, int64(2), st.CachedEntries)
	assert.Equal(t, 2*one, st.CachedBytes)
	assert.Equal(t, int64(1), st.Evictions)
	require.NoError(t, d.Forget(ctx, "c"))
	st, err = d.Stats(ctx)
	require.NoError(t, err)
	assert.Equal(t, int64(1), st.CachedEntries)

	none := newDecoder(t, m, 0)
	decodeAll(t, none, map[int][]DecodeRequest{0: {req("a", 1)}})
	st, err = none.Stats(ctx)
	require.NoError(t, err)
	assert.Equal(t, int64(0), st.CachedEntries)
}

// TestDecoderReleaseDropsOneRow: releasing a sequence leaves the others'
// tokens unchanged.
func TestDecoderReleaseDropsOneRow(t *testing.T) {
	m := loadTiny(t, ModelOptions{})
	ctx := context.Background()
	a := SampleRequest{PromptIDs: []int32{1, 50, 51}, MaxNewTokens: 10, Temperature: 1, Seed: 1}
	b := SampleRequest{PromptIDs: []int32{1, 70}, MaxNewTokens: 10, Temperature: 1, Seed: 2}
	want, err := m.Sample(ctx, []SampleRequest{b})
	require.NoError(t, err)
	d := newDecoder(t, m, 0)
	ids, err := d.Add(ctx, []DecodeRequest{{SampleRequest: a}, {SampleRequest: b}})
	require.NoError(t, err)
	var got []int32
	for step := 0; len(got) < 10; step++ {
		if step == 3 {
			require.NoError(t, d.Release(ctx, ids[0]))
		}
		live := 2
		if step >= 3 {
			live = 1
		}
		evs, err := d.Step(ctx, live)
		require.NoError(t, err)
		require.Len(t, evs, live)
		for _, e := range evs {
			if e.Seq == ids[1] {
				got = append(got, e.Token)
			}
		}
	}
	require.Equal(t, want[0].IDs, got)
	_, err = d.Step(ctx, 1)
	require.NoError(t, err)
}

// TestDecoderDropsCacheWhenWeightsChange: keys/values computed with old
// weights are never reused.
func TestDecoderDropsCacheWhenWeightsChange(t *testing.T) {
	m := loadTiny(t, ModelOptions{})
	ctx := context.Background()
	d := newDecoder(t, m, 1<<30)
	r := DecodeRequest{SampleRequest: SampleRequest{PromptIDs: []int32{1, 2, 3}, MaxNewTokens: 4, Temperature: 1, Seed: 1}, CacheKey: "k"}
	first := only(t, decodeAll(t, d, map[int][]DecodeRequest{0: {r}}))
	_, err := m.OptimizerStep(ctx, 1e-3)
	require.NoError(t, err)
	r.PromptIDs = concat(r.PromptIDs, first.IDs)
	decodeAll(t, d, map[int][]DecodeRequest{0: {r}})
	st, err := d.Stats(ctx)
	require.NoError(t, err)
	assert.Equal(t, int64(0), st.ReusedTokens)
	assert.Equal(t, int64(3+3+len(first.IDs)), st.PrefillTokens, "both turns prefilled in full")
}

// TestDecoderLongPromptMatchesStatic: two prompts long enough to be
// prefilled in three chunks (the tiny model's chunk is 4Mi scores / (2 rows
// x 4 heads x 1101 keys) = 476 queries), the shorter one padded in the
// last, give the static sampler's tokens, which prefills them whole.
func TestDecoderLongPromptMatchesStatic(t *testing.T) {
	m := loadTiny(t, ModelOptions{})
	ctx := context.Background()
	prompt := make([]int32, 1100)
	for i := range prompt {
		prompt[i] = int32(1 + (i*37)%250)
	}
	reqs := []SampleRequest{
		{PromptIDs: prompt, MaxNewTokens: 8, Temperature: 0, Seed: 1},
		{PromptIDs: prompt[:1050], MaxNewTokens: 8, Temperature: 1, Seed: 2},
	}
	want, err := m.Sample(ctx, reqs)
	require.NoError(t, err)
	d := newDecoder(t, m, 0)
	res := decodeAll(t, d, map[int][]DecodeRequest{0: {{SampleRequest: reqs[0]}, {SampleRequest: reqs[1]}}})
	requireSameSamples(t, want, []*SampleResult{res[1], res[2]})
}

// TestDecoderMixedAdd: one add holding a next turn (a short suffix after a
// parked prefix), a new long prompt and a copy of it gives the static
// sampler's tokens for each; the two prefills run in separate batches.
func TestDecoderMixedAdd(t *testing.T) {
	m := loadTiny(t, ModelOptions{})
	ctx := context.Background()
	d := newDecoder(t, m, 1<<30)
	turn1 := SampleRequest{PromptIDs: []int32{1, 60, 61, 62}, MaxNewTokens: 6, Temperature: 1, Seed: 3}
	first := only(t, decodeAll(t, d, map[int][]DecodeRequest{0: {{SampleRequest: turn1, CacheKey: "a"}}}))
	long := make([]int32, 300)
	for i := range long {
		long[i] = int32(1 + (i*13)%250)
	}
	reqs := []SampleRequest{
		{PromptIDs: concat(turn1.PromptIDs, first.IDs, []int32{7, 8}), MaxNewTokens: 5, Temperature: 1, Seed: 4},
		{PromptIDs: long, MaxNewTokens: 7, Temperature: 0.9, TopP: 0.95, Seed: 5},
		{PromptIDs: long, MaxNewTokens: 7, Temperature: 0.9, TopP: 0.95, Seed: 6},
	}
	want, err := m.Sample(ctx, reqs)
	require.NoError(t, err)
	before, err := d.Stats(ctx)
	require.NoError(t, err)
	res := decodeAll(t, d, map[int][]DecodeRequest{0: {{SampleRequest: reqs[0], CacheKey: "a"}, {SampleRequest: reqs[1], CacheKey: "b"}, {SampleRequest: reqs[2]}}})
	requireSameSamples(t, want, []*SampleResult{res[2], res[3], res[4]})
	after, err := d.Stats(ctx)
	require.NoError(t, err)
	assert.Equal(t, int64(len(turn1.PromptIDs)+len(first.IDs)-1), after.ReusedTokens-before.ReusedTokens)
	assert.Equal(t, int64(3+len(long)), after.PrefillTokens-before.PrefillTokens)
	assert.Equal(t, int64(len(long)), after.SharedTokens-before.SharedTokens)
}

// TestDecoderAdvanceMatchesStep: several steps per call give every sequence
// the tokens and log-probs of one step per call, and a call ends with the
// step in which a sequence finished (so the caller answers it at once).
func TestDecoderAdvanceMatchesStep(t *testing.T) {
	m := loadTiny(t, ModelOptions{})
	ctx := context.Background()
	reqs := []DecodeRequest{
		{SampleRequest: SampleRequest{PromptIDs: []int32{1, 50, 51}, MaxNewTokens: 3, Temperature: 1, Seed: 1}},
		{SampleRequest: SampleRequest{PromptIDs: []int32{1, 70}, MaxNewTokens: 11, Temperature: 1, Seed: 2}},
		{SampleRequest: SampleRequest{PromptIDs: []int32{1, 80, 81, 82}, MaxNewTokens: 20, Temperature: 0.7, TopK: 20, Seed: 3}},
	}
	want := decodeAll(t, newDecoder(t, m, 0), map[int][]DecodeRequest{0: reqs})

	d := newDecoder(t, m, 0)
	ids, err := d.Add(ctx, reqs)
	require.NoError(t, err)
	got := map[int64]*SampleResult{}
	for _, id := range ids {
		got[id] = &SampleResult{}
	}
	calls := 0
	for live := len(reqs); live > 0; calls++ {
		d.stepsPerCall.Store(8) // the pacing adapts to timing; fix it here
		evs, err := d.Advance(ctx, live)
		require.NoError(t, err)
		require.NotEmpty(t, evs)
		step := map[int64]int{} // the step of each event within this call
		last, stopped := 0, -1
		for _, e := range evs {
			s := step[e.Seq]
			step[e.Seq]++
			last = max(last, s)
			r := got[e.Seq]
			r.IDs = append(r.IDs, e.Token)
			r.Logprobs = append(r.Logprobs, e.Logprob)
			if e.Stop != 0 {
				r.StopReason = e.Stop
				live--
				stopped = s
			}
		}
		if stopped >= 0 {
			require.Equal(t, last, stopped, "call %d went on after a sequence finished", calls)
		} else {
			require.Equal(t, 7, last, "call %d: 8 steps fit and none finished", calls)
		}
	}
	require.Len(t, got, len(want))
	wantIDs := slices.Sorted(maps.Keys(want)) // ids are handed out in request order
	for i, id := range ids {
		w := want[wantIDs[i]]
		require.Equal(t, w.IDs, got[id].IDs, "sequence %d", i)
		require.Equal(t, w.Logprobs, got[id].Logprobs, "sequence %d", i)
		require.Equal(t, w.StopReason, got[id].StopReason, "sequence %d", i)
	}
	require.Less(t, calls, 11, "11 + 9 tokens should take fewer calls than steps")
}
