// decoder.cpp: continuous batching. Live sequences occupy slots 0..n-1 of
// per-layer key/value tensors [S, nkv, Lcap, hd]; a decode step runs the
// model over the view [0, n) x [0, longest live length), so nothing is
// gathered per step and attention spans the live length, not a padded
// maximum. A sequence that finishes leaves at once: the last slot moves into
// its place. Prompts are prefilled one at a time at batch size 1 (attention
// over exactly the prompt), and a prompt identical to a live sequence's is
// not prefilled again: its keys/values are copied. A finished sequence with a
// cache key is parked (its keys/values copied out of the slot) so the next
// turn of the same rollout, whose prompt extends those tokens, prefills only
// the new ones. Parked entries are evicted least recently used first under a
// byte budget, and all of them are dropped when the weights change.
#include <algorithm>
#include <list>
#include <stdexcept>
#include <string>
#include <unordered_map>

#include <ATen/CPUGeneratorImpl.h>

#include "model.h"

namespace ort {

namespace {

struct Seq {
  int64_t id = 0;
  std::vector<int32_t> tokens;  // tokens whose keys/values are in the slot
  std::vector<int32_t> prompt;
  at::Tensor prompt_h;  // hidden state after the prompt, for an identical prompt
  RowSampling sampling;
  std::vector<int32_t> stop;
  int32_t max_new = 0, n_new = 0;
  at::Generator gen;
  std::string key;
};

struct Parked {
  std::vector<int32_t> tokens;
  std::vector<at::Tensor> k, v;  // per layer [nkv, len, hd]
  int64_t bytes = 0;
  std::list<std::string>::iterator lru;
};

}  // namespace

struct Decoder {
  Model* m = nullptr;
  int64_t budget = 0;
  std::vector<at::Tensor> k, v;  // per layer [S, nkv, Lcap, hd]
  at::Tensor h;                  // [S, H]: the hidden state that predicts each live row's next token
  int64_t slots = 0, cap = 0;
  std::vector<Seq> rows;  // rows[i] lives in slot i
  std::unordered_map<std::string, Parked> parked;
  std::list<std::string> lru;  // most recently used first
  int64_t next_id = 1, weights_version = 0;
  ort_decoder_stats stats{};

  int64_t token_bytes() const {
    return 2LL * m->arch.num_layers * m->arch.num_kv_heads * m->arch.head_dim * at::elementSize(m->dtype);
  }

  // reserve makes room for rows live rows of up to len tokens each.
  void reserve(int64_t nrows, int64_t len) {
    if (nrows <= slots && len <= cap) return;
    const int64_t ns = nrows <= slots ? slots : std::max<int64_t>(nrows, slots * 2);
    const int64_t nc = len <= cap ? cap : std::max<int64_t>(len, cap + cap / 2);
    const auto& a = m->arch;
    const auto opts = at::TensorOptions().dtype(m->dtype).device(m->device);
    for (int l = 0; l < a.num_layers; l++) {
      auto nk = at::zeros({ns, a.num_kv_heads, nc, a.head_dim}, opts);
      auto nv = at::zeros({ns, a.num_kv_heads, nc, a.head_dim}, opts);
      if (slots > 0) {
        nk.narrow(0, 0, slots).narrow(2, 0, cap).copy_(k[l]);
        nv.narrow(0, 0, slots).narrow(2, 0, cap).copy_(v[l]);
        k[l] = nk;
        v[l] = nv;
      } else {
        k.push_back(nk);
        v.push_back(nv);
      }
    }
    auto nh = at::zeros({ns, a.hidden_size}, opts);
    if (slots > 0) nh.narrow(0, 0, slots).copy_(h);
    h = nh;
    slots = ns;
    cap = nc;
    stats.slot_bytes = ns * nc * token_bytes();
  }

  // copy_slot copies the first len positions of slot from into slot to.
  void copy_slot(int64_t from, int64_t to, int64_t len) {
    for (size_t l = 0; l < k.size(); l++) {
      k[l][to].narrow(1, 0, len).copy_(k[l][from].narrow(1, 0, len));
      v[l][to].narrow(1, 0, len).copy_(v[l][from].narrow(1, 0, len));
    }
    h[to].copy_(h[from]);
  }

  void drop_parked(std::unordered_map<std::string, Parked>::iterator it) {
    stats.cached_bytes -= it->second.bytes;
    lru.erase(it->second.lru);
    parked.erase(it);
  }

  void clear_parked() {
    parked.clear();
    lru.clear();
    stats.cached_bytes = 0;
  }

  // check_weights drops parked keys/values computed with older weights.
  void check_weights() {
    if (m->weights_version == weights_version) return;
    clear_parked();
    weights_version = m->weights_version;
  }

  void park(Seq& s, int64_t slot) {
    if (s.key.empty()) return;
    auto old = parked.find(s.key);
    if (old != parked.end()) drop_parked(old);
    const int64_t len = static_cast<int64_t>(s.tokens.size());
    const int64_t bytes = len * token_bytes();
    if (bytes > budget) return;
    Parked p;
    p.tokens = s.tokens;
    for (size_t l = 0; l < k.size(); l++) {
      p.k.push_back(k[l][slot].narrow(1, 0, len).clone());
      p.v.push_back(v[l][slot].narrow(1, 0, len).clone());
    }
    p.bytes = bytes;
    lru.push_front(s.key);
    p.lru = lru.begin();
    parked[s.key] = std::move(p);
    stats.cached_bytes += bytes;
    while (stats.cached_bytes > budget && !lru.empty()) {
      drop_parked(parked.find(lru.back()));
      stats.evictions++;
    }
  }

  // remove takes row i out of the batch, moving the last row into its slot.
  void remove(int64_t i) {
    const int64_t last = static_cast<int64_t>(rows.size()) - 1;
    if (i != last) {
      copy_slot(last, i, static_cast<int64_t>(rows[last].tokens.size()));
      rows[i] = std::move(rows[last]);
    }
    rows.pop_back();
  }

  // prefill runs the prompts of the rows in slots [first, first + from.size())
  // through the model in one right-padded batch, row r from its token
  // from[r] on (the keys/values before it are already in its slot). Queries
  // go in chunks that attend over only the keys written so far, so a
  // chunk's attention scores ([rows, heads, chunk, keys]) stay about 16 MiB:
  // whole-prompt scores of long prompts are hundreds of MiB per layer, and
  // allocating, faulting in and reading them dominated long-prompt
  // generation. A padding query of row r sits at a position at or after
  // the row's prompt (never attended before decoding overwrites it).
  void prefill(int64_t first, const std::vector<int64_t>& from, const volatile int32_t* cancel) {
    const int64_t R = static_cast<int64_t>(from.size());
    if (R == 0) return;
    std::vector<int64_t> P(R), fresh(R);
    int64_t longest = 0, widest = 0;
    for (int64_t r = 0; r < R; r++) {
      P[r] = static_cast<int64_t>(rows[first + r].prompt.size());
      fresh[r] = P[r] - from[r];
      longest = std::max(longest, fresh[r]);
      widest = std::max(widest, P[r] + 1);
      stats.prefill_tokens += fresh[r];
    }
    const int64_t per_query = std::max<int64_t>(1, R * m->arch.num_heads * widest);
    const int64_t chunk = std::max<int64_t>(16, (int64_t{4} << 20) / per_query);
    const auto lo = at::TensorOptions().dtype(at::kLong);
    for (int64_t c0 = 0; c0 < longest; c0 += chunk) {
      const int64_t c1 = std::min(longest, c0 + chunk);
      const int64_t L = c1 - c0;
      // Keys span every position written so far; a padded row needs one
      // past its prompt for its padding queries.
      int64_t span = 0;
      for (int64_t r = 0; r < R; r++) {
        span = std::max(span, c1 >= fresh[r] ? P[r] + 1 : from[r] + c1);
      }
      std::vector<int64_t> ids(R * L), pos(R * L);
      for (int64_t r = 0; r < R; r++) {
        for (int64_t q = c0; q < c1; q++) {
          const bool real = q < fresh[r];
          ids[r * L + q - c0] = real ? rows[first + r].prompt[from[r] + q] : 0;
          pos[r * L + q - c0] = real ? from[r] + q : std::min(from[r] + q, span - 1);
        }
      }
      KVCache view;
      for (size_t l = 0; l < k.size(); l++) {
        view.k.push_back(k[l].narrow(0, first, R).narrow(2, 0, span));
        view.v.push_back(v[l].narrow(0, first, R).narrow(2, 0, span));
      }
      auto x = at::tensor(ids, lo).view({R, L}).to(m->device);
      auto ps = at::tensor(pos, lo).view({R, L}).to(m->device);
      auto out = forward(*m, m->view, true, x, ps, at::Tensor(), &view, cancel);
      for (int64_t r = 0; r < R; r++) {
        const int64_t last = fresh[r] - 1;
        if (last >= c0 && last < c1) h[first + r].copy_(out[r][last - c0]);
      }
    }
  }

  // todo_len is how many prompt tokens the g-th leader of an add (in slot
  // before + g) still has to run.
  int64_t todo_len(const std::vector<int64_t>& from, size_t g, int64_t before) const {
    return static_cast<int64_t>(rows[before + static_cast<int64_t>(g)].prompt.size()) - from[g];
  }

  void add(const ort_sample_request* reqs, const char* const* keys, int32_t n, int64_t* ids,
           const volatile int32_t* cancel) {
    at::NoGradGuard ng;
    DecodeGemmScope gemm(*m);
    m->training = false;
    check_weights();
    int64_t need = cap;
    for (int32_t j = 0; j < n; j++) need = std::max<int64_t>(need, reqs[j].prompt_len + reqs[j].max_new_tokens);
    for (const auto& r : rows) need = std::max<int64_t>(need, static_cast<int64_t>(r.prompt.size()) + r.max_new);
    reserve(static_cast<int64_t>(rows.size()) + n, need);
    const int64_t before = static_cast<int64_t>(rows.size());
    std::vector<Seq> fresh(n);
    for (int32_t j = 0; j < n; j++) {
      const auto& r = reqs[j];
      Seq& s = fresh[j];
      s.id = next_id++;
      s.prompt.assign(r.prompt, r.prompt + r.prompt_len);
      s.sampling = RowSampling{r.temperature, r.top_p, r.min_p, r.top_k};
      s.stop.assign(r.stop_ids, r.stop_ids + r.n_stop);
      s.max_new = r.max_new_tokens;
      s.gen = at::detail::createCPUGenerator(static_cast<uint64_t>(r.seed));
      if (keys != nullptr && keys[j] != nullptr) s.key = keys[j];
      ids[j] = s.id;
    }
    // Leaders are prefilled (from a parked prefix when their key has one);
    // a follower's prompt equals a live row's or a leader's, whose
    // keys/values it copies. Leaders take the first new slots, so their
    // batch is one view of the slot tensors.
    auto twin_of = [&](const std::vector<int32_t>& prompt, int64_t upto) -> int64_t {
      for (int64_t t = 0; t < upto; t++) {
        if (rows[t].prompt == prompt) return t;
      }
      return -1;
    };
    std::vector<int32_t> followers, leaders;
    std::vector<int64_t> reuse(n, 0);
    for (int32_t j = 0; j < n; j++) {
      Seq& s = fresh[j];
      bool follows = twin_of(s.prompt, before) >= 0;
      for (int32_t l : leaders) follows = follows || fresh[l].prompt == s.prompt;
      if (follows) {
        followers.push_back(j);
        continue;
      }
      leaders.push_back(j);
      auto hit = s.key.empty() ? parked.end() : parked.find(s.key);
      if (hit != parked.end()) {
        // Keys/values at position j depend on tokens 0..j only, so any
        // matching prefix is reusable; at least one token is run to get
        // the hidden state that predicts the first new token.
        const auto& ct = hit->second.tokens;
        const int64_t limit = std::min<int64_t>(static_cast<int64_t>(ct.size()), static_cast<int64_t>(s.prompt.size()) - 1);
        while (reuse[j] < limit && ct[reuse[j]] == s.prompt[reuse[j]]) reuse[j]++;
      }
    }
    // Longest prefill first, so each padded batch below holds prompts of
    // similar length: a new 900-token prompt and a 20-token next turn are
    // not padded to one length.
    auto todo = [&](int32_t j) { return static_cast<int64_t>(fresh[j].prompt.size()) - reuse[j]; };
    std::stable_sort(leaders.begin(), leaders.end(), [&](int32_t x, int32_t y) { return todo(x) > todo(y); });
    std::vector<int64_t> from;
    for (int32_t j : leaders) {
      const int64_t i = static_cast<int64_t>(rows.size());
      Seq& s = fresh[j];
      if (reuse[j] > 0) {
        const auto& hit = parked.at(s.key);
        for (size_t l = 0; l < k.size(); l++) {
          k[l][i].narrow(1, 0, reuse[j]).copy_(hit.k[l].narrow(1, 0, reuse[j]));
          v[l][i].narrow(1, 0, reuse[j]).copy_(hit.v[l].narrow(1, 0, reuse[j]));
        }
        stats.reused_tokens += reuse[j];
      }
      from.push_back(reuse[j]);
      rows.push_back(std::move(s));
    }
    // Every row parks again under its key when it finishes.
    for (int64_t i = before; i < static_cast<int64_t>(rows.size()); i++) forget(rows[i].key);
    for (int32_t j : followers) forget(fresh[j].key);
    for (size_t g0 = 0; g0 < leaders.size();) {
      size_t g1 = g0 + 1;
      while (g1 < leaders.size() && 2 * todo_len(from, g1, before) >= todo_len(from, g0, before)) g1++;
      prefill(before + static_cast<int64_t>(g0), std::vector<int64_t>(from.begin() + g0, from.begin() + g1), cancel);
      g0 = g1;
    }
    for (int64_t i = before; i < static_cast<int64_t>(rows.size()); i++) {
      rows[i].prompt_h = h[i].clone();
      rows[i].tokens = rows[i].prompt;
    }
    for (int32_t j : followers) {
      Seq& s = fresh[j];
      const int64_t i = static_cast<int64_t>(rows.size());
      const int64_t t = twin_of(s.prompt, i);
      const int64_t P = static_cast<int64_t>(s.prompt.size());
      copy_slot(t, i, P);
      h[i].copy_(rows[t].prompt_h);
      stats.shared_tokens += P;
      s.prompt_h = rows[t].prompt_h;
      s.tokens = s.prompt;
      rows.push_back(std::move(s));
    }
    stats.live = static_cast<int64_t>(rows.size());
  }

  int32_t step(ort_decode_event* events, int32_t cap_events, const volatile int32_t* cancel) {
    const int64_t n = static_cast<int64_t>(rows.size());
    if (n > cap_events) {
      throw std::runtime_error("step: room for " + std::to_string(cap_events) + " events, " + std::to_string(n) +
                               " sequences are live");
    }
    if (n == 0) return 0;
    check_cancel(cancel);
    at::NoGradGuard ng;
    SerialScope serial(serial_decode(*m, n));
    DecodeGemmScope gemm(*m);
    m->training = false;
    auto logits = cast(matmul_nt(*m, h.narrow(0, 0, n), lm_head(m->view)), acc_dtype(*m));
    std::vector<RowSampling> rs(n);
    std::vector<double> u(n, 0.0), lps;
    std::vector<int64_t> toks;
    for (int64_t i = 0; i < n; i++) {
      rs[i] = rows[i].sampling;
      if (rs[i].temperature != 0) u[i] = row_uniform(rows[i].gen);
    }
    sample_rows(logits, rs, u, &toks, &lps);
    std::vector<uint8_t> finished(n, 0);
    for (int64_t i = 0; i < n; i++) {
      auto& r = rows[i];
      r.n_new++;
      int32_t stop = 0;
      if (std::find(r.stop.begin(), r.stop.end(), toks[i]) != r.stop.end()) {
        stop = ORT_STOP_TOKEN;
      } else if (r.n_new >= r.max_new) {
        stop = ORT_STOP_LENGTH;
      }
      events[i] = ort_decode_event{r.id, static_cast<int32_t>(toks[i]), static_cast<float>(lps[i]), stop};
      finished[i] = stop != 0;
    }
    // Finished rows leave before the forward pass; the rest feed their token.
    std::vector<int64_t> next_tok(n);
    for (int64_t i = 0; i < n; i++) next_tok[i] = toks[i];
    for (int64_t i = n - 1; i >= 0; i--) {
      if (!finished[i]) continue;
      park(rows[i], i);
      const int64_t last = static_cast<int64_t>(rows.size()) - 1;
      next_tok[i] = next_tok[last];
      remove(i);
    }
    const int64_t live = static_cast<int64_t>(rows.size());
    stats.live = live;
    if (live == 0) return static_cast<int32_t>(n);
    std::vector<int64_t> pos(live);
    int64_t span = 0;
    for (int64_t i = 0; i < live; i++) {
      pos[i] = static_cast<int64_t>(rows[i].tokens.size());
      span = std::max(span, pos[i] + 1);
    }
    KVCache view;
    // Rows of one length see every key of the span: no mask to build.
    view.all_keys = std::all_of(pos.begin(), pos.end(), [&](int64_t p) { return p == span - 1; });
    for (size_t l = 0; l < k.size(); l++) {
      view.k.push_back(k[l].narrow(0, 0, live).narrow(2, 0, span));
      view.v.push_back(v[l].narrow(0, 0, live).narrow(2, 0, span));
    }
    const auto lo = at::TensorOptions().dtype(at::kLong);
    next_tok.resize(live);
    auto x = at::tensor(next_tok, lo).view({live, 1}).to(m->device);
    auto ps = at::tensor(pos, lo).view({live, 1}).to(m->device);
    auto out = forward(*m, m->view, true, x, ps, at::Tensor(), &view, cancel);
    h.narrow(0, 0, live).copy_(out.view({live, m->arch.hidden_size}));
    for (int64_t i = 0; i < live; i++) rows[i].tokens.push_back(static_cast<int32_t>(next_tok[i]));
    return static_cast<int32_t>(n);
  }

  void release(int64_t seq) {
    for (size_t i = 0; i < rows.size(); i++) {
      if (rows[i].id == seq) {
        remove(static_cast<int64_t>(i));
        stats.live = static_cast<int64_t>(rows.size());
        return;
      }
    }
  }

  void forget(const std::string& key) {
    auto it = parked.find(key);
    if (it != parked.end()) drop_parked(it);
  }

  // fail drops every live sequence after an error left them half-advanced.
  void fail() {
    rows.clear();
    stats.live = 0;
  }

  ort_decoder_stats snapshot() {
    auto s = stats;
    s.cached_entries = static_cast<int64_t>(parked.size());
    return s;
  }
};

Decoder* new_decoder(Model& m, const ort_decoder_options& o) {
  if (o.kv_cache_budget < 0) throw std::runtime_error("kv_cache_budget must be >= 0 bytes");
  need_full_weights(m, "decoder");
  auto* d = new Decoder();
  d->m = &m;
  d->budget = o.kv_cache_budget;
  d->weights_version = m.weights_version;
  return d;
}

void free_decoder(Decoder* d) { delete d; }

void decoder_add(Decoder& d, const ort_sample_request* reqs, const char* const* keys, int32_t n, int64_t* ids,
                 const volatile int32_t* cancel) {
  if (n < 0) throw std::runtime_error("add: negative request count");
  // A bad request fails the call before any live sequence is touched.
  for (int32_t j = 0; j < n; j++) validate_sampling(*d.m, reqs[j], "decode request " + std::to_string(j) + ": ");
  try {
    d.add(reqs, keys, n, ids, cancel);
  } catch (...) {
    d.fail();
    throw;
  }
}

int32_t decoder_step(Decoder& d, ort_decode_event* events, int32_t cap, const volatile int32_t* cancel) {
  if (static_cast<int64_t>(d.rows.size()) > cap) {
    throw std::runtime_error("step: room for " + std::to_string(cap) + " events, " + std::to_string(d.rows.size()) +
                             " sequences are live");
  }
  try {
    // Steps while one more fits in the caller's room (rows never grow here),
    // stopping after a step where a sequence finished so the caller can
    // answer it and admit others. cap = live count runs exactly one step.
    int32_t n = 0;
    while (true) {
      const int32_t k = d.step(events + n, cap - n, cancel);
      const bool finished = std::any_of(events + n, events + n + k, [](const ort_decode_event& e) { return e.stop_reason != 0; });
      n += k;
      if (k == 0 || finished || static_cast<int64_t>(d.rows.size()) > cap - n) return n;
    }
  } catch (...) {
    d.fail();
    throw;
  }
}

void decoder_release(Decoder& d, int64_t seq) { d.release(seq); }
void decoder_forget(Decoder& d, const std::string& key) { d.forget(key); }
ort_decoder_stats decoder_stats(Decoder& d) { return d.snapshot(); }

}  // namespace ort
