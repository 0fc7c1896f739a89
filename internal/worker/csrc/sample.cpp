// sample.cpp: batched generation with a KV cache. Prompts of different
// lengths are right-padded; each row then writes its next key/value at its
// own position, so rows advance independently. Log-probs returned are those
// of the processed distribution (temperature, top-k, top-p, min-p applied, in
// that order), as vLLM's processed_logprobs.
#include <ATen/CPUGeneratorImpl.h>

#include <algorithm>
#include <limits>
#include <stdexcept>
#include <string>

#include "model.h"

namespace ort {

namespace {

void validate(const Model& m, const ort_sample_request& r, const ort_sample_result& out, int32_t i) {
  const std::string where = "sample request " + std::to_string(i) + ": ";
  if (r.prompt_len < 1) throw std::runtime_error(where + "empty prompt");
  if (r.max_new_tokens < 1) throw std::runtime_error(where + "max_new_tokens must be >= 1");
  if (out.ids == nullptr || out.logps == nullptr) throw std::runtime_error(where + "result buffers are missing");
  if (out.cap < r.max_new_tokens) {
    throw std::runtime_error(where + "result buffers have room for " + std::to_string(out.cap) + " tokens, max_new_tokens is " +
                             std::to_string(r.max_new_tokens));
  }
  for (int32_t j = 0; j < r.prompt_len; j++) {
    if (r.prompt[j] < 0 || r.prompt[j] >= m.arch.vocab_size) {
      throw std::runtime_error(where + "prompt token " + std::to_string(j) + ": id " + std::to_string(r.prompt[j]) +
                               " is outside the vocabulary [0, " + std::to_string(m.arch.vocab_size) + ")");
    }
  }
  if (!(r.temperature >= 0)) throw std::runtime_error(where + "temperature must be >= 0");
  if (!(r.top_p > 0 && r.top_p <= 1)) throw std::runtime_error(where + "top_p must be in (0, 1]");
  if (r.top_k < 0) throw std::runtime_error(where + "top_k must be >= 0 (0 = off)");
  if (!(r.min_p >= 0 && r.min_p < 1)) throw std::runtime_error(where + "min_p must be in [0, 1)");
}

// processed_logprobs applies temperature, top-k, top-p and min-p to one row
// of logits z [V] and returns the log-probs of what is left.
at::Tensor processed_logprobs(at::Tensor z, const ort_sample_request& r) {
  const double ninf = -std::numeric_limits<double>::infinity();
  z = z / r.temperature;
  const int64_t V = z.size(0);
  if (r.top_k > 0 && r.top_k < V) {
    auto kth = std::get<0>(at::topk(z, r.top_k)).min();
    z = z.masked_fill(z.lt(kth), ninf);
  }
  if (r.top_p < 1) {
    auto sorted = at::sort(z, 0, true);
    auto probs = at::softmax(std::get<0>(sorted), 0);
    auto before = probs.cumsum(0) - probs;  // mass of strictly more likely tokens
    auto drop = before.ge(r.top_p);
    z = z.masked_fill(at::zeros_like(drop).scatter(0, std::get<1>(sorted), drop), ninf);
  }
  if (r.min_p > 0) {
    auto p = at::softmax(z, 0);
    z = z.masked_fill(p.lt(p.max() * r.min_p), ninf);
  }
  return at::log_softmax(z, 0);
}

// pick draws the next token of one row; temperature 0 is greedy.
std::pair<int64_t, double> pick(const at::Tensor& z, const ort_sample_request& r, at::Generator& gen) {
  if (r.temperature == 0) {
    const int64_t tok = z.argmax().item<int64_t>();
    return {tok, at::log_softmax(z, 0)[tok].item<double>()};
  }
  // Filtering runs where the logits are; the draw runs on the CPU with the
  // request's own generator, so a seed gives the same sample on any device.
  auto lp = processed_logprobs(z, r).to(at::kCPU);
  const int64_t tok = at::multinomial(lp.exp(), 1, false, gen).item<int64_t>();
  return {tok, lp[tok].item<double>()};
}

}  // namespace

void sample(Model& m, const ort_sample_request* reqs, int32_t n, ort_sample_result* out,
            const volatile int32_t* cancel) {
  if (n <= 0) throw std::runtime_error("empty batch: no sample requests");
  for (int32_t i = 0; i < n; i++) validate(m, reqs[i], out[i], i);
  at::NoGradGuard ng;
  m.training = false;
  const auto& a = m.arch;
  int64_t P = 0, total = 0;
  for (int32_t i = 0; i < n; i++) {
    P = std::max<int64_t>(P, reqs[i].prompt_len);
    total = std::max<int64_t>(total, reqs[i].prompt_len + reqs[i].max_new_tokens);
  }
  const auto topts = at::TensorOptions().dtype(m.dtype).device(m.device);
  KVCache cache;
  for (int l = 0; l < a.num_layers; l++) {
    cache.k.push_back(at::zeros({n, a.num_kv_heads, total, a.head_dim}, topts));
    cache.v.push_back(at::zeros({n, a.num_kv_heads, total, a.head_dim}, topts));
  }
  std::vector<int64_t> ids(n * P, 0), last(n), cur(n);
  std::vector<at::Generator> gens;
  std::vector<bool> done(n, false);
  for (int32_t i = 0; i < n; i++) {
    std::copy(reqs[i].prompt, reqs[i].prompt + reqs[i].prompt_len, ids.begin() + i * P);
    last[i] = i * P + reqs[i].prompt_len - 1;
    cur[i] = reqs[i].prompt_len;
    gens.push_back(at::detail::createCPUGenerator(static_cast<uint64_t>(reqs[i].seed)));
    out[i].n = 0;
    out[i].stop_reason = 0;
  }
  auto lo = at::TensorOptions().dtype(at::kLong);
  auto x = at::tensor(ids, lo).view({n, P}).to(m.device);
  auto pos = at::arange(P, lo).view({1, P}).expand({n, P}).contiguous().to(m.device);
  auto h = forward(m, m.view, true, x, pos, &cache, cancel);
  h = h.reshape({n * P, a.hidden_size}).index_select(0, at::tensor(last, lo).to(m.device));
  const auto acc = acc_dtype(m);
  for (int64_t step = 0;; step++) {
    check_cancel(cancel);
    auto logits = at::matmul(h, lm_head(m.view).t()).to(acc);  // [n, V], on the model's device
    std::vector<int64_t> next(n, 0), next_pos(n, 0);
    bool all_done = true;
    for (int32_t i = 0; i < n; i++) {
      if (done[i]) {
        next_pos[i] = std::min<int64_t>(cur[i], total - 1);
        continue;
      }
      auto t = pick(logits[i], reqs[i], gens[i]);
      out[i].ids[out[i].n] = static_cast<int32_t>(t.first);
      out[i].logps[out[i].n] = static_cast<float>(t.second);
      out[i].n++;
      if (std::find(reqs[i].stop_ids, reqs[i].stop_ids + reqs[i].n_stop, t.first) != reqs[i].stop_ids + reqs[i].n_stop) {
        out[i].stop_reason = ORT_STOP_TOKEN;
        done[i] = true;
      } else if (out[i].n >= reqs[i].max_new_tokens) {
        out[i].stop_reason = ORT_STOP_LENGTH;
        done[i] = true;
      }
      next[i] = t.first;
      next_pos[i] = std::min<int64_t>(cur[i], total - 1);
      cur[i]++;
      all_done = all_done && done[i];
    }
    if (all_done) break;
    auto xs = at::tensor(next, lo).view({n, 1}).to(m.device);
    auto ps = at::tensor(next_pos, lo).view({n, 1}).to(m.device);
    h = forward(m, m.view, true, xs, ps, &cache, cancel).view({n, a.hidden_size});
  }
}

}  // namespace ort
