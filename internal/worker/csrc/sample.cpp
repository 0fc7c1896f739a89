// sample.cpp: static batched generation with a KV cache (ort_sample): the
// batch runs until its slowest row finishes. Prompts of different lengths are
// right-padded; each row then writes its next key/value at its own position,
// so rows advance independently. Tokens are picked by sample_rows
// (sampling.cpp), as the continuous decoder picks them.
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
  validate_sampling(m, r, where);
  if (out.ids == nullptr || out.logps == nullptr) throw std::runtime_error(where + "result buffers are missing");
  if (out.cap < r.max_new_tokens) {
    throw std::runtime_error(where + "result buffers have room for " + std::to_string(out.cap) + " tokens, max_new_tokens is " +
                             std::to_string(r.max_new_tokens));
  }
}

}  // namespace

void sample(Model& m, const ort_sample_request* reqs, int32_t n, ort_sample_result* out,
            const volatile int32_t* cancel) {
  if (n <= 0) throw std::runtime_error("empty batch: no sample requests");
  need_full_weights(m, "sample");
  for (int32_t i = 0; i < n; i++) validate(m, reqs[i], out[i], i);
  at::NoGradGuard ng;
  DecodeGemmScope gemm(m);
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
  auto h = forward(m, m.view, true, x, pos, at::Tensor(), &cache, cancel);
  h = h.reshape({n * P, a.hidden_size}).index_select(0, at::tensor(last, lo).to(m.device));
  const auto acc = acc_dtype(m);
  std::vector<RowSampling> rs(n);
  for (int32_t i = 0; i < n; i++) rs[i] = RowSampling{reqs[i].temperature, reqs[i].top_p, reqs[i].min_p, reqs[i].top_k};
  std::vector<double> u(n, 0.0), lps;
  std::vector<int64_t> toks;
  SerialScope serial(serial_decode(m, n));
  for (;;) {
    check_cancel(cancel);
    auto logits = cast(matmul_nt(m, h, lm_head(m.view)), acc);  // [n, V], on the model's device
    // Finished rows draw nothing, so every row's stream is its own.
    for (int32_t i = 0; i < n; i++) u[i] = done[i] || reqs[i].temperature == 0 ? 0.0 : row_uniform(gens[i]);
    sample_rows(logits, rs, u, &toks, &lps);
    std::vector<int64_t> next(n, 0), next_pos(n, 0);
    bool all_done = true;
    for (int32_t i = 0; i < n; i++) {
      if (done[i]) {
        next_pos[i] = std::min<int64_t>(cur[i], total - 1);
        continue;
      }
      const int64_t tok = toks[i];
      out[i].ids[out[i].n] = static_cast<int32_t>(tok);
      out[i].logps[out[i].n] = static_cast<float>(lps[i]);
      out[i].n++;
      if (std::find(reqs[i].stop_ids, reqs[i].stop_ids + reqs[i].n_stop, tok) != reqs[i].stop_ids + reqs[i].n_stop) {
        out[i].stop_reason = ORT_STOP_TOKEN;
        done[i] = true;
      } else if (out[i].n >= reqs[i].max_new_tokens) {
        out[i].stop_reason = ORT_STOP_LENGTH;
        done[i] = true;
      }
      next[i] = tok;
      next_pos[i] = std::min<int64_t>(cur[i], total - 1);
      cur[i]++;
      all_done = all_done && done[i];
    }
    if (all_done) break;
    auto xs = at::tensor(next, lo).view({n, 1}).to(m.device);
    auto ps = at::tensor(next_pos, lo).view({n, 1}).to(m.device);
    h = forward(m, m.view, true, xs, ps, at::Tensor(), &cache, cancel).view({n, a.hidden_size});
  }
}

}  // namespace ort
