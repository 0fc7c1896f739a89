// sampling.cpp: picking the next token of every row of a batch with tensor
// ops (no per-row host round trips), shared by the static sampler
// (sample.cpp) and the continuous decoder (decoder.cpp) so both give the same
// tokens for the same logits and seeds. Log-probs are those of the processed
// distribution (temperature, top-k, top-p, min-p applied, in that order), as
// vLLM's processed_logprobs.
#include <ATen/CPUGeneratorImpl.h>

#include <algorithm>
#include <limits>
#include <mutex>
#include <stdexcept>
#include <string>

#include "model.h"

namespace ort {

void validate_sampling(const Model& m, const ort_sample_request& r, const std::string& where) {
  if (r.prompt_len < 1) throw std::runtime_error(where + "empty prompt");
  if (r.prompt == nullptr) throw std::runtime_error(where + "prompt is missing");
  if (r.max_new_tokens < 1) throw std::runtime_error(where + "max_new_tokens must be >= 1");
  for (int32_t j = 0; j < r.prompt_len; j++) {
    if (r.prompt[j] < 0 || r.prompt[j] >= m.arch.vocab_size) {
      throw std::runtime_error(where + "prompt token " + std::to_string(j) + ": id " + std::to_string(r.prompt[j]) +
                               " is outside the vocabulary [0, " + std::to_string(m.arch.vocab_size) + ")");
    }
  }
  if (r.n_stop < 0 || (r.n_stop > 0 && r.stop_ids == nullptr)) throw std::runtime_error(where + "stop ids are missing");
  if (!(r.temperature >= 0)) throw std::runtime_error(where + "temperature must be >= 0");
  if (!(r.top_p > 0 && r.top_p <= 1)) throw std::runtime_error(where + "top_p must be in (0, 1]");
  if (r.top_k < 0) throw std::runtime_error(where + "top_k must be >= 0 (0 = off)");
  if (!(r.min_p >= 0 && r.min_p < 1)) throw std::runtime_error(where + "min_p must be in [0, 1)");
}

double row_uniform(at::Generator& gen) {
  auto* g = at::check_generator<at::CPUGeneratorImpl>(gen);
  std::lock_guard<std::mutex> lock(gen.mutex());
  return static_cast<double>(g->random64() >> 11) * (1.0 / 9007199254740992.0);
}

void sample_rows(const at::Tensor& logits, const std::vector<RowSampling>& rows, const std::vector<double>& u,
                 std::vector<int64_t>* tokens, std::vector<double>* logps) {
  const int64_t n = logits.size(0), V = logits.size(1);
  const double ninf = -std::numeric_limits<double>::infinity();
  const auto dev = logits.device();
  const auto acc = logits.scalar_type();
  std::vector<double> temp(n), top_p(n), min_p(n);
  std::vector<int64_t> kth_idx(n);
  std::vector<uint8_t> greedy(n), k_on(n), p_on(n);
  bool any_greedy = false, any_sampled = false, any_k = false, any_p = false, any_min_p = false;
  for (int64_t i = 0; i < n; i++) {
    const auto& r = rows[i];
    greedy[i] = r.temperature == 0;
    any_greedy = any_greedy || greedy[i];
    any_sampled = any_sampled || !greedy[i];
    // Greedy rows divide by 1 and filter nothing: their log-prob is that of
    // the raw distribution, as before.
    temp[i] = greedy[i] ? 1.0 : r.temperature;
    k_on[i] = !greedy[i] && r.top_k > 0 && r.top_k < V;
    kth_idx[i] = k_on[i] ? r.top_k - 1 : 0;
    p_on[i] = !greedy[i] && r.top_p < 1;
    top_p[i] = p_on[i] ? r.top_p : 1.0;
    min_p[i] = greedy[i] ? 0.0 : r.min_p;
    any_k = any_k || k_on[i];
    any_p = any_p || p_on[i];
    any_min_p = any_min_p || min_p[i] > 0;
  }
  const auto f64 = at::TensorOptions().dtype(at::kDouble);
  const auto i64 = at::TensorOptions().dtype(at::kLong);
  const auto u8 = at::TensorOptions().dtype(at::kByte);
  auto column = [&](const std::vector<double>& v) { return at::tensor(v, f64).to(dev, acc).view({n, 1}); };
  auto flags = [&](const std::vector<uint8_t>& v) { return at::tensor(v, u8).to(dev).to(at::kBool).view({n, 1}); };

  // Dividing by 1 changes nothing: skip the op when no row tempers.
  const bool tempered = std::any_of(temp.begin(), temp.end(), [](double t) { return t != 1.0; });
  auto z = tempered ? logits / column(temp) : logits;
  if (any_k || any_p) {
    auto sorted = at::sort(z, 1, true);
    auto sv = std::get<0>(sorted);
    const auto& si = std::get<1>(sorted);
    if (any_k) {
      // Ties with the k-th value stay, as topk(z, k).min() masking did.
      auto kth = sv.gather(1, at::tensor(kth_idx, i64).to(dev).view({n, 1}));
      auto on = flags(k_on);
      z = z.masked_fill(z.lt(kth).logical_and(on), ninf);
      sv = sv.masked_fill(sv.lt(kth).logical_and(on), ninf);
    }
    if (any_p) {
      auto probs = at::softmax(sv, 1);
      auto before = probs.cumsum(1) - probs;  // mass of strictly more likely tokens
      auto drop = before.ge(column(top_p)).logical_and(flags(p_on));
      z = z.masked_fill(at::zeros_like(drop).scatter(1, si, drop), ninf);
    }
  }
  if (any_min_p) {
    auto p = at::softmax(z, 1);
    z = z.masked_fill(p.lt(std::get<0>(p.max(1, true)) * column(min_p)), ninf);
  }
  auto lp = at::log_softmax(z, 1);
  at::Tensor tok;
  if (any_sampled) {
    // Inverse CDF over token ids: the row's uniform picks the smallest id
    // whose cumulative processed probability exceeds u times the total.
    auto cdf = lp.exp().cumsum(1, at::kDouble);  // as .to(kDouble).cumsum(1), one call
    auto target = at::tensor(u, f64).to(dev).view({n, 1}) * cdf.narrow(1, V - 1, 1);
    tok = at::searchsorted(cdf, target, false, true).clamp_max(V - 1);
  }
  if (any_greedy) {
    auto best = z.argmax(1, true);
    tok = any_sampled ? at::where(flags(greedy), best, tok) : best;
  }
  auto chosen = lp.gather(1, tok);
  tokens->resize(n);
  logps->resize(n);
  if (dev.is_cpu()) {  // read both in place: no cast, concatenation or copy
    auto t = tok.contiguous();
    auto c = chosen.to(at::kDouble).contiguous();
    const int64_t* pt = t.data_ptr<int64_t>();
    const double* pc = c.data_ptr<double>();
    for (int64_t i = 0; i < n; i++) {
      (*tokens)[i] = pt[i];
      (*logps)[i] = pc[i];
    }
    return;
  }
  // One device-to-host copy for both.
  auto host = at::cat({tok.to(at::kDouble), chosen.to(at::kDouble)}, 1).to(at::kCPU).contiguous();
  const double* h = host.data_ptr<double>();
  for (int64_t i = 0; i < n; i++) {
    (*tokens)[i] = static_cast<int64_t>(h[2 * i]);
    (*logps)[i] = h[2 * i + 1];
  }
}

}  // namespace ort
