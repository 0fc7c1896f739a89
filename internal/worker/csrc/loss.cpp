// loss.cpp: token log-probs (chunked over the vocab projection) and the GRPO
// losses of grpo-reference.md §4. Shapes: B rows, T = longest completion,
// N = completion tokens in the batch, V vocab, H hidden.
#include <algorithm>
#include <torch/csrc/autograd/autograd.h>
#include <torch/csrc/autograd/custom_function.h>

#include <cmath>
#include <limits>
#include <stdexcept>
#include <string>

#include "model.h"

namespace ort {

namespace {

bool round_normalised(int t) { return t == ORT_LOSS_DAPO || t == ORT_LOSS_CISPO || t == ORT_LOSS_VESPO || t == ORT_LOSS_SFT; }

bool sequence_correction(const ort_loss_config& c) {
  return c.is_correction == ORT_IS_SEQUENCE_TRUNCATE || c.is_correction == ORT_IS_SEQUENCE_MASK;
}

// Rows per chunk so that one chunk's logits stay under 16M elements on CPU
// (64 MiB fp32, cache-friendly) or 64M on a GPU (fewer, larger matmuls).
int64_t chunk_rows(const at::Tensor& w, int64_t fixed) {
  if (fixed > 0) return fixed;
  const int64_t budget = w.is_cuda() ? (int64_t{1} << 26) : (int64_t{1} << 24);
  return std::max<int64_t>(1, budget / std::max<int64_t>(1, w.size(0)));
}

// ChunkedLogprob computes log softmax(h W^T / tau)[target] and the entropy of
// that distribution, one row chunk at a time, and recomputes the chunk's
// logits in backward, so the [N, V] logits never exist at once.
// d logp/dz = onehot - p; dH/dz = -p (log p + H) (grpo-reference.md §4.1).
// A third output, not differentiable, is 1 where the target is the argmax
// of the logits (token accuracy): one more read of a chunk already at hand.
struct ChunkedLogprob : public torch::autograd::Function<ChunkedLogprob> {
  static torch::autograd::variable_list forward(torch::autograd::AutogradContext* ctx, const at::Tensor& h,
                                                const at::Tensor& w, const at::Tensor& targets, double inv_temp,
                                                int64_t chunk) {
    ctx->set_materialize_grads(false);
    ctx->save_for_backward({h, w, targets});
    ctx->saved_data["inv_temp"] = inv_temp;
    ctx->saved_data["chunk"] = chunk;
    const auto acc = h.scalar_type() == at::kDouble ? at::kDouble : at::kFloat;
    const int64_t N = h.size(0), step = chunk_rows(w, chunk);
    auto logp = at::empty({N}, h.options().dtype(acc));
    auto ent = at::empty({N}, h.options().dtype(acc));
    auto correct = at::empty({N}, h.options().dtype(acc));
    for (int64_t s = 0; s < N; s += step) {
      const int64_t n = std::min(step, N - s);
      auto z = at::matmul(h.narrow(0, s, n), w.t()).to(acc) * inv_temp;
      auto tgt = targets.narrow(0, s, n);
      correct.narrow(0, s, n).copy_(z.argmax(-1).eq(tgt));
      auto ls = at::log_softmax(z, -1);
      logp.narrow(0, s, n).copy_(ls.gather(1, tgt.unsqueeze(1)).squeeze(1));
      ent.narrow(0, s, n).copy_(-(ls.exp() * ls).sum(-1));
    }
    ctx->mark_non_differentiable({correct});
    return {logp, ent, correct};
  }

  static torch::autograd::variable_list backward(torch::autograd::AutogradContext* ctx,
                                                 torch::autograd::variable_list grads) {
    auto saved = ctx->get_saved_variables();
    const auto &h = saved[0], &w = saved[1], &targets = saved[2];
    const double inv_temp = ctx->saved_data["inv_temp"].toDouble();
    const auto &g_lp = grads[0], &g_ent = grads[1];
    const bool need_h = ctx->needs_input_grad(0), need_w = ctx->needs_input_grad(1);
    const auto acc = h.scalar_type() == at::kDouble ? at::kDouble : at::kFloat;
    at::Tensor gh = need_h ? at::zeros_like(h) : at::Tensor();
    at::Tensor gw = need_w ? at::zeros(w.sizes(), w.options().dtype(acc)) : at::Tensor();
    if (!g_lp.defined() && !g_ent.defined()) return {gh, gw, at::Tensor(), at::Tensor(), at::Tensor()};
    const int64_t N = h.size(0), step = chunk_rows(w, ctx->saved_data["chunk"].toInt());
    for (int64_t s = 0; s < N; s += step) {
      const int64_t n = std::min(step, N - s);
      auto hc = h.narrow(0, s, n);
      auto z = at::matmul(hc, w.t()).to(acc) * inv_temp;
      auto ls = at::log_softmax(z, -1);
      auto p = ls.exp();
      at::Tensor dz;
      if (g_lp.defined()) {
        auto g = g_lp.narrow(0, s, n).to(acc).unsqueeze(1);
        dz = p * (-g);
        dz.scatter_add_(1, targets.narrow(0, s, n).unsqueeze(1), g);
      } else {
        dz = at::zeros_like(z);
      }
      if (g_ent.defined()) {
        auto H = -(p * ls).sum(-1, true);
        dz = dz - g_ent.narrow(0, s, n).to(acc).unsqueeze(1) * p * (ls + H);
      }
      dz = (dz * inv_temp).to(h.scalar_type());
      if (need_h) gh.narrow(0, s, n).copy_(at::matmul(dz, w));
      if (need_w) gw.add_(at::matmul(dz.t(), hc).to(acc));
    }
    if (need_w) gw = gw.to(w.scalar_type());
    return {gh, gw, at::Tensor(), at::Tensor(), at::Tensor()};
  }
};

// Restores Model::training on every exit path.
struct TrainingScope {
  Model& m;
  TrainingScope(Model& mm, bool on) : m(mm) { m.training = on; }
  ~TrainingScope() { m.training = false; }
};

}  // namespace

// Returns {logp, entropy, correct} (ChunkedLogprob); callers may use the first two only.
std::vector<at::Tensor> chunked_logprobs(const at::Tensor& h, const at::Tensor& w, const at::Tensor& targets,
                                         double temperature, int64_t chunk) {
  if (!(temperature > 0)) throw std::runtime_error("temperature must be > 0, got " + std::to_string(temperature));
  return ChunkedLogprob::apply(h, w, targets, 1.0 / temperature, chunk);
}

Batch decode_batch(const Model& m, const ort_batch* b) {
  if (b == nullptr || b->n_rows <= 0) throw std::runtime_error("empty batch: no rows");
  Batch bt;
  bt.B = b->n_rows;
  const int64_t V = m.arch.vocab_size;
  std::vector<int64_t> gather, targets, rows, cols;
  for (int64_t i = 0; i < bt.B; i++) {
    const int64_t len = b->token_off[i + 1] - b->token_off[i], P = b->prompt_len[i];
    if (P < 1 || P > len) {
      throw std::runtime_error("row " + std::to_string(i) + ": prompt length " + std::to_string(P) +
                               " must be in [1, " + std::to_string(len) + "]");
    }
    if (b->comp_off[i + 1] - b->comp_off[i] != len - P) {
      throw std::runtime_error("row " + std::to_string(i) + ": completion arrays do not match its length");
    }
    bt.L = std::max(bt.L, len);
    bt.T = std::max(bt.T, len - P);
    bt.comp_len.push_back(len - P);
  }
  // Where each row starts: its own right-padded sequence, or (packed) its
  // sequence and offset after the rows placed there before it.
  int64_t S = bt.B;
  std::vector<int64_t> seq_of(bt.B), off_of(bt.B, 0);
  for (int64_t i = 0; i < bt.B; i++) seq_of[i] = i;
  if (b->pack_seq != nullptr) {
    S = 0;
    std::vector<int64_t> fill;
    for (int64_t i = 0; i < bt.B; i++) {
      const int64_t s = b->pack_seq[i];
      if (s < 0 || s >= bt.B) {
        throw std::runtime_error("row " + std::to_string(i) + ": packed sequence " + std::to_string(s) +
                                 " must be in [0, " + std::to_string(bt.B) + ")");
      }
      if (s >= S) {
        S = s + 1;
        fill.resize(S, 0);
      }
      seq_of[i] = s;
      off_of[i] = fill[s];
      fill[s] += b->token_off[i + 1] - b->token_off[i];
    }
    bt.L = *std::max_element(fill.begin(), fill.end());
  }
  std::vector<int64_t> ids(S * bt.L, 0), pos, seg;
  if (b->pack_seq != nullptr) {
    pos.assign(S * bt.L, 0);
    seg.assign(S * bt.L, -1);
  }
  for (int64_t i = 0; i < bt.B; i++) {
    const int32_t* t = b->tokens + b->token_off[i];
    const int64_t len = b->token_off[i + 1] - b->token_off[i], P = b->prompt_len[i];
    const int64_t at0 = seq_of[i] * bt.L + off_of[i];
    for (int64_t j = 0; j < len; j++) {
      if (t[j] < 0 || t[j] >= V) {
        throw std::runtime_error("row " + std::to_string(i) + " token " + std::to_string(j) + ": id " +
                                 std::to_string(t[j]) + " is outside the vocabulary [0, " + std::to_string(V) + ")");
      }
      ids[at0 + j] = t[j];
      if (!pos.empty()) {
        pos[at0 + j] = j;
        seg[at0 + j] = i;
      }
    }
    for (int64_t j = P; j < len; j++) {
      gather.push_back(at0 + j - 1);
      targets.push_back(t[j]);
      rows.push_back(i);
      cols.push_back(j - P);
    }
  }
  auto lo = at::TensorOptions().dtype(at::kLong);
  auto vec = [&](std::vector<int64_t>& v) { return at::tensor(v, lo).to(m.device); };
  bt.ids = at::tensor(ids, lo).view({S, bt.L}).to(m.device);
  if (b->pack_seq != nullptr) {
    bt.pos = at::tensor(pos, lo).view({S, bt.L}).to(m.device);
    bt.seg = at::tensor(seg, lo).view({S, bt.L}).to(m.device);
  } else {
    bt.pos = at::arange(bt.L, lo).view({1, bt.L}).expand({bt.B, bt.L}).contiguous().to(m.device);
  }
  bt.gather_idx = vec(gather);
  bt.targets = vec(targets);
  bt.row_idx = vec(rows);
  bt.col_idx = vec(cols);
  return bt;
}

namespace {

// completion_hidden runs the decoder and returns the final hidden state
// predicting each completion token, [N, H].
at::Tensor completion_hidden(Model& m, const Batch& bt, const Weights& w, bool lora_on, const volatile int32_t* cancel) {
  auto h = forward(m, w, lora_on, bt.ids, bt.pos, bt.seg, nullptr, cancel);
  auto hs = h.reshape({-1, h.size(-1)}).index_select(0, bt.gather_idx);
  check_cancel(cancel);
  return hs;
}

}  // namespace

std::vector<at::Tensor> token_logprobs(Model& m, const Batch& bt, double temperature, bool reference,
                                       const volatile int32_t* cancel) {
  const bool lora = m.opts.lora_rank > 0;
  if (reference && !lora && !m.opts.reference) {
    throw std::runtime_error("reference log-probs requested but the model was loaded without a reference (set Reference)");
  }
  // With LoRA the reference is the base: adapters off and the frozen
  // originals of any modules_to_save (ref_view).
  if (params_sharded(m)) {
    at::NoGradGuard ng;  // log-probs only: training goes through forward_backward's pass
    auto p = begin_sharded_pass(m, reference, cancel);
    auto hs = sharded_hidden(*p, bt, false);
    auto out = chunked_logprobs(hs, sharded_lm_head(*p, false), bt.targets, temperature, m.opts.logprob_chunk_rows);
    sharded_head_done(*p);
    finish_sharded_pass(*p, false);
    return out;
  }
  const Weights& w = reference ? m.ref_view : m.view;
  auto hs = completion_hidden(m, bt, w, !reference, cancel);
  return chunked_logprobs(hs, lm_head(w), bt.targets, temperature, m.opts.logprob_chunk_rows);
}

namespace {

// LossTerms holds the padded [B, T] inputs of the loss.
struct LossTerms {
  at::Tensor logp, ent, mask, adv, old, ref, rho;
};

// completion_array returns a completion-aligned float array as [N], taking
// fallback where the row lacks it; undefined when the array is absent.
at::Tensor completion_array(const Batch& bt, const float* data, const uint8_t* has, const at::Tensor& fallback) {
  if (data == nullptr) return at::Tensor();
  const int64_t N = bt.targets.size(0);
  auto vals = at::from_blob(const_cast<float*>(data), {N}, at::kFloat).to(fallback.options());
  if (has == nullptr) return vals;
  std::vector<uint8_t> tok;
  for (int64_t i = 0; i < bt.B; i++) tok.insert(tok.end(), bt.comp_len[i], has[i] ? 1 : 0);
  auto present = at::tensor(at::ArrayRef<uint8_t>(tok)).to(at::kBool).to(fallback.device());
  return at::where(present, vals, fallback);
}

bool any_row(const uint8_t* has, int64_t B) {
  if (has == nullptr) return true;
  for (int64_t i = 0; i < B; i++) {
    if (has[i]) return true;
  }
  return false;
}

// is_weight is the vLLM importance-sampling correction rho (§4.9), detached.
at::Tensor is_weight(const ort_loss_config& c, const at::Tensor& old, const at::Tensor& q, const at::Tensor& mask) {
  auto d = (old - q) * mask;
  auto rho = sequence_correction(c) ? d.sum(1, true).exp() : d.exp();
  const double lo = c.is_clip_min, hi = c.is_clip_max;
  if (c.is_correction == ORT_IS_TOKEN_TRUNCATE || c.is_correction == ORT_IS_SEQUENCE_TRUNCATE) {
    rho = rho.clamp(lo > 0 ? c10::optional<at::Scalar>(lo) : c10::nullopt,
                    std::isfinite(hi) ? c10::optional<at::Scalar>(hi) : c10::nullopt);
  } else {
    rho = at::where(rho.lt(lo).logical_or(rho.gt(hi)), at::zeros_like(rho), rho);
  }
  return rho.detach();
}

// vespo_phi is §4.4's per-sequence weight phi(W), detached.
at::Tensor vespo_phi(const ort_loss_config& c, const LossTerms& t, const at::Tensor& lr) {
  auto lam_seq = (t.mask * lr.detach().clamp(-20, 20)).sum(1, true);
  if (t.rho.defined()) lam_seq = lam_seq + t.rho.log().clamp(std::log(1e-8), 20).sum(1, true);
  auto logW = lam_seq.clamp(std::log(1e-8), 20);
  auto W = logW.exp();
  auto pos = t.adv.ge(0);
  auto k = at::where(pos, at::full_like(W, c.vespo_k_pos), at::full_like(W, c.vespo_k_neg));
  auto lam = at::where(pos, at::full_like(W, c.vespo_lambda_pos), at::full_like(W, c.vespo_lambda_neg)).clamp_min(1e-4);
  auto phi = (lam + k * logW - lam * W).exp();
  return at::nan_to_num(phi, 0.0, 0.0, 0.0).detach();
}

void clip_stats(const ort_loss_config& c, const at::Tensor& wt, const LossTerms& t, bool seq, ort_loss_stats* st) {
  auto low = wt.lt(1 - c.epsilon).logical_and(t.adv.lt(0)).to(t.mask.scalar_type());
  auto high = wt.gt(1 + c.epsilon_high).logical_and(t.adv.gt(0)).to(t.mask.scalar_type());
  auto region = (low + high).clamp_max(1);
  at::Tensor low_row, high_row;
  if (seq) {  // each row counts once (§5)
    st->clip_low = low.sum().item<double>();
    st->clip_high = high.sum().item<double>();
    st->clip_region = region.sum().item<double>();
    st->clip_denom = static_cast<double>(t.mask.size(0));
    low_row = low.view(-1);
    high_row = high.view(-1);
  } else {
    auto rows = t.mask.sum(1).clamp_min(1);
    st->clip_low = (low * t.mask).sum().item<double>();
    st->clip_high = (high * t.mask).sum().item<double>();
    st->clip_region = (region * t.mask).sum().item<double>();
    st->clip_denom = t.mask.sum().item<double>();
    low_row = (low * t.mask).sum(1) / rows;
    high_row = (high * t.mask).sum(1) / rows;
  }
  st->clip_low_min = low_row.min().item<double>();
  st->clip_high_max = high_row.max().item<double>();
}

// per_token_objective is §4.4's l_{i,t} before the modifiers of §4.5. With
// st null it records no metrics, so it also runs on flat token chunks.
at::Tensor per_token_objective(const ort_loss_config& c, const LossTerms& t, const at::Tensor& w,
                               const at::Tensor& lr, ort_loss_stats* st) {
  const auto& A = t.adv;
  switch (c.loss_type) {
    case ORT_LOSS_DAPO:
    case ORT_LOSS_GRPO:
    case ORT_LOSS_BNPO:
    case ORT_LOSS_DR_GRPO:
    case ORT_LOSS_LUSPO: {
      auto wt = c.delta > 0 ? w.clamp_max(c.delta) : w;
      auto clipped = w.clamp(1 - c.epsilon, 1 + c.epsilon_high);
      if (st != nullptr) clip_stats(c, wt.detach(), t, c.is_level == ORT_IS_LEVEL_SEQUENCE, st);
      return -at::min(wt * A, clipped * A);
    }
    case ORT_LOSS_CISPO:
      if (st != nullptr) st->cispo_clip = (w.detach().gt(c.epsilon_high).logical_and(A.gt(0)) * t.mask).sum().item<double>();
      return -w.clamp_max(c.epsilon_high).detach() * A * t.logp;
    case ORT_LOSS_SAPO: {
      auto kappa = at::where(A.gt(0), at::full_like(A, c.sapo_temp_pos), at::full_like(A, c.sapo_temp_neg));
      return -at::sigmoid(kappa * (w - 1)) * (4.0 / kappa) * A;
    }
    case ORT_LOSS_SFT:  // cross-entropy of the label; no ratio, advantages unused
      return -t.logp;
    case ORT_LOSS_VESPO: {
      if (sequence_correction(c)) {
        if (t.rho.defined()) throw std::runtime_error("loss_type vespo needs a token-level importance sampling correction (token_truncate or token_mask)");
      }
      auto phi = vespo_phi(c, t, lr);
      st->vespo_phi_sum = phi.sum().item<double>();
      return -phi * A * t.logp;
    }
  }
  throw std::runtime_error("loss_type " + std::to_string(c.loss_type) + " is not supported by this worker");
}

// aggregate is §4.6's micro-batch loss for loss_type.
at::Tensor aggregate(const ort_loss_config& c, const ort_batch* b, const at::Tensor& per_tok, const at::Tensor& mask) {
  const double GA = std::max<int32_t>(1, b->grad_accum);
  const double B = static_cast<double>(mask.size(0));
  auto masked = per_tok * mask;
  switch (c.loss_type) {
    case ORT_LOSS_GRPO:
    case ORT_LOSS_SAPO:
      return (masked.sum(1) / mask.sum(1).clamp_min(1)).mean() / GA;
    case ORT_LOSS_BNPO:
      return masked.sum() / mask.sum().clamp_min(1) / GA;
    case ORT_LOSS_DR_GRPO:
      return masked.sum() / (B * c.max_completion_length) / GA;
    case ORT_LOSS_LUSPO:  // (1/B) sum_i l_i |o_i|: the row's mean loss times its length
      return masked.sum(1).mean() / GA;
    default:
      return masked.sum() / b->round_tokens;
  }
}

// entropy_bonus is §4.7's bonus before its coefficient.
at::Tensor entropy_bonus(const ort_loss_config& c, const ort_batch* b, const at::Tensor& ent, const at::Tensor& mask) {
  auto hsum = (ent * mask).sum();
  return round_normalised(c.loss_type) ? hsum / b->round_tokens
                                       : hsum / mask.sum().clamp_min(1) / std::max<int32_t>(1, b->grad_accum);
}

bool row_has(const uint8_t* has, int64_t i) { return has == nullptr || has[i] != 0; }

// correction_on says whether the vLLM importance-sampling correction applies
// (never to sft: its labels are data, not samples to reweight).
bool correction_on(const ort_loss_config& c, const ort_batch* b) {
  return c.loss_type != ORT_LOSS_SFT && c.is_correction != ORT_IS_OFF && b->sampler_logps != nullptr &&
         any_row(b->has_sampler, b->n_rows);
}

void validate(const ort_loss_config& c, const ort_batch* b) {
  if (c.loss_type < 0 || c.loss_type > ORT_LOSS_SFT) throw std::runtime_error("loss_type " + std::to_string(c.loss_type) + " is unknown");
  if (!(c.temperature > 0)) throw std::runtime_error("temperature must be > 0");
  if (round_normalised(c.loss_type) && !(b->round_tokens > 0)) {
    throw std::runtime_error("round_tokens must be > 0 for loss types dapo, cispo, vespo and sft");
  }
  if (c.loss_type == ORT_LOSS_SFT && c.beta != 0) {
    throw std::runtime_error("beta must be 0 for loss_type sft (it has no KL term to a reference), got " + std::to_string(c.beta));
  }
  if (c.loss_type == ORT_LOSS_DR_GRPO && c.max_completion_length <= 0) {
    throw std::runtime_error("max_completion_length must be > 0 for dr_grpo");
  }
  if (c.logprob_path < ORT_LOGPROB_AUTO || c.logprob_path > ORT_LOGPROB_FUSED) {
    throw std::runtime_error("logprob_path " + std::to_string(c.logprob_path) + " is unknown");
  }
  if (c.beta != 0) {
    if (b->ref_logps == nullptr) throw std::runtime_error("beta != 0 needs reference log-probs on every row");
    for (int64_t i = 0; i < b->n_rows; i++) {
      if (!row_has(b->has_ref, i)) throw std::runtime_error("beta != 0 but row " + std::to_string(i) + " has no reference log-probs");
    }
  }
}

// fused_blocker says why a config's loss is not separable per token, so the
// fused pass cannot give its gradient (a token's d loss / d logp would need
// log-probs of other tokens, known only after the pass); nullptr when it is.
const char* fused_blocker(const ort_loss_config& c, const ort_batch* b) {
  if (c.loss_type == ORT_LOSS_SFT) return nullptr;  // no ratio, so is_level does not matter
  if (c.loss_type == ORT_LOSS_VESPO) return "loss_type vespo weights each token by phi of its sequence's summed log-ratio";
  if (c.is_level == ORT_IS_LEVEL_SEQUENCE) return "importance_sampling_level sequence uses each sequence's mean log-ratio";
  if (sequence_correction(c) && correction_on(c, b)) {
    for (int64_t i = 0; i < b->n_rows; i++) {
      if (row_has(b->has_sampler, i) && !(b->old_logps != nullptr && row_has(b->has_old, i))) {
        return "a sequence-level importance-sampling correction on a row with sampler but no old log-probs sums the "
               "policy's own log-probs over the row";
      }
    }
  }
  return nullptr;
}

at::Tensor pad_tokens(const Batch& bt, const at::Tensor& flat) {
  return at::zeros({bt.B, bt.T}, flat.options()).index_put({bt.row_idx, bt.col_idx}, flat);
}

at::Tensor token_mask(const ort_batch* b, int64_t N, const at::TensorOptions& opts) {
  return at::from_blob(const_cast<uint8_t*>(b->loss_mask), {N}, at::kByte).to(opts).clamp_max(1);
}

// batch_loss is the micro-batch loss of the completion tokens' log-probs
// and entropies ([N] each), with its metrics written to st; correct [N] is
// 1 where the label is the argmax.
at::Tensor batch_loss(const ort_loss_config& c, const ort_batch* b, const Batch& bt, const at::Tensor& logp,
                      const at::Tensor& entropy, const at::Tensor& correct, ort_loss_stats* st) {
  const auto opts = logp.options();
  auto pad = [&](const at::Tensor& flat) { return pad_tokens(bt, flat); };
  LossTerms t;
  const int64_t N = bt.targets.size(0);
  t.mask = pad(token_mask(b, N, opts));
  t.logp = pad(logp);
  t.ent = pad(c.entropy_coef != 0 ? entropy : entropy.detach());
  t.adv = at::from_blob(const_cast<float*>(b->advantages), {bt.B}, at::kFloat).to(opts).view({bt.B, 1});
  auto old_flat = completion_array(bt, b->old_logps, b->has_old, logp.detach());
  t.old = old_flat.defined() ? pad(old_flat) : t.logp.detach();
  if (correction_on(c, b)) {
    auto q = pad(completion_array(bt, b->sampler_logps, b->has_sampler, old_flat.defined() ? old_flat : logp.detach()));
    t.rho = is_weight(c, t.old, q, t.mask);
  }
  auto lr = t.logp - t.old;
  auto logw = c.is_level == ORT_IS_LEVEL_SEQUENCE ? (lr * t.mask).sum(1, true) / t.mask.sum(1, true).clamp_min(1) : lr;
  auto w = logw.exp();
  auto per_tok = per_token_objective(c, t, w, lr, st);
  if (t.rho.defined() && c.loss_type != ORT_LOSS_VESPO) per_tok = per_tok * t.rho;
  if (c.beta != 0) {
    auto diff = pad(completion_array(bt, b->ref_logps, nullptr, logp)) - t.logp;
    auto k3 = diff.exp() - diff - 1;
    per_tok = per_tok + c.beta * k3;
    st->kl_sum = (k3 * t.mask).sum().item<double>();
  }
  auto loss = aggregate(c, b, per_tok, t.mask);
  if (c.entropy_coef != 0) loss = loss - c.entropy_coef * entropy_bonus(c, b, t.ent, t.mask);
  st->loss = loss.item<double>();
  st->active_tokens = t.mask.sum().item<double>();
  st->rows = static_cast<double>(bt.B);
  st->rows_with_tokens = t.mask.sum(1).gt(0).sum().item<double>();
  st->entropy_sum = (t.ent.detach() * t.mask).sum().item<double>();
  st->correct_tokens = (pad(correct.detach().to(opts)) * t.mask).sum().item<double>();
  return loss;
}

// TokenLoss is the loss of a separable config as a function of each
// token's log-prob alone, over the completion tokens [N] in batch order:
// everything batch_loss uses except the policy's log-probs, which the fused
// pass supplies one chunk at a time. coef is d loss / d l_t (§4.6's
// aggregation is linear in the per-token loss l_t, so this needs only the
// masks), ent_coef d loss / d H_t (undefined without an entropy bonus).
struct TokenLoss {
  const ort_loss_config* c = nullptr;
  at::Tensor adv, mask, coef, ent_coef;
  at::Tensor old, old_given;          // old log-probs; elsewhere old is the policy's own (ratio 1)
  at::Tensor sampler, sampler_given;  // token-level correction; elsewhere q = old
  at::Tensor seq_rho;                 // sequence-level correction: rho of each token's row
  at::Tensor ref;                     // beta != 0

  // logp_grad returns d loss / d logp for tokens [s, s + n) at log-probs lp
  // by differentiating batch_loss's per-token terms on the chunk.
  at::Tensor logp_grad(int64_t s, int64_t n, const at::Tensor& lp) const {
    const auto& cfg = *c;
    auto part = [&](const at::Tensor& x) { return x.narrow(0, s, n); };
    at::AutoGradMode on(true);
    LossTerms t;
    t.logp = lp.detach().requires_grad_(true);
    t.mask = part(mask);
    t.adv = part(adv);
    t.old = old.defined() ? at::where(part(old_given), part(old), lp) : lp.detach();
    if (seq_rho.defined()) t.rho = part(seq_rho);
    if (sampler.defined()) t.rho = is_weight(cfg, t.old, at::where(part(sampler_given), part(sampler), t.old), t.mask);
    auto lr = t.logp - t.old;
    auto per_tok = per_token_objective(cfg, t, lr.exp(), lr, nullptr);
    if (t.rho.defined()) per_tok = per_tok * t.rho;
    if (cfg.beta != 0) {
      auto diff = part(ref) - t.logp;
      per_tok = per_tok + cfg.beta * (diff.exp() - diff - 1);
    }
    auto g = torch::autograd::grad({per_tok}, {t.logp}, {part(coef)}, false, false, true)[0];
    return g.defined() ? g : at::zeros_like(lp);
  }
};

// linear_coef returns d f(x) / dx for a scalar f linear in x (so constant).
template <class F>
at::Tensor linear_coef(F&& f, const at::Tensor& like) {
  at::AutoGradMode on(true);
  auto x = at::zeros_like(like).requires_grad_(true);
  return torch::autograd::grad({f(x)}, {x})[0];
}

TokenLoss make_token_loss(const ort_loss_config& c, const ort_batch* b, const Batch& bt, const at::TensorOptions& opts) {
  TokenLoss tl;
  tl.c = &c;
  const int64_t N = bt.targets.size(0);
  auto from = [&](const float* data) { return at::from_blob(const_cast<float*>(data), {N}, at::kFloat).to(opts); };
  auto token_rows = [&](const uint8_t* has) {  // per token: its row carries the array
    std::vector<uint8_t> tok;
    for (int64_t i = 0; i < bt.B; i++) tok.insert(tok.end(), bt.comp_len[i], row_has(has, i) ? 1 : 0);
    return at::tensor(at::ArrayRef<uint8_t>(tok)).to(at::kBool).to(opts.device());
  };
  auto at_tokens = [&](const at::Tensor& padded) { return padded.index({bt.row_idx, bt.col_idx}); };
  tl.mask = token_mask(b, N, opts);
  auto mask = pad_tokens(bt, tl.mask);
  tl.adv = at::from_blob(const_cast<float*>(b->advantages), {bt.B}, at::kFloat).to(opts).index_select(0, bt.row_idx);
  tl.coef = at_tokens(linear_coef([&](const at::Tensor& x) { return aggregate(c, b, x, mask); }, mask));
  if (c.entropy_coef != 0) {
    tl.ent_coef = at_tokens(linear_coef([&](const at::Tensor& x) { return -c.entropy_coef * entropy_bonus(c, b, x, mask); }, mask));
  }
  if (b->old_logps != nullptr) {
    tl.old = from(b->old_logps);
    tl.old_given = token_rows(b->has_old);
  }
  if (correction_on(c, b)) {
    auto q = from(b->sampler_logps);
    auto q_given = token_rows(b->has_sampler);
    if (sequence_correction(c)) {
      // fused_blocker let this through only when every row with sampler
      // log-probs has old ones, so old - q is known now; on other rows it is
      // 0 (q = old), as in batch_loss.
      auto old_k = tl.old.defined() ? at::where(tl.old_given, tl.old, at::zeros_like(q)) : at::zeros_like(q);
      auto q_k = at::where(q_given, q, old_k);
      tl.seq_rho = is_weight(c, pad_tokens(bt, old_k), pad_tokens(bt, q_k), mask).view(-1).index_select(0, bt.row_idx);
    } else {
      tl.sampler = q;
      tl.sampler_given = q_given;
    }
  }
  if (c.beta != 0) tl.ref = from(b->ref_logps);
  return tl;
}

// FusedPass is what fused_logprobs returns: log-probs and entropies [N],
// and the loss gradient w.r.t. the hidden rows (undefined where not
// needed). The LM head's gradient is added to its .grad by the pass itself.
struct FusedPass {
  at::Tensor logp, ent, correct, grad_h;
};

// fused_logprobs is ChunkedLogprob's forward that also back-propagates the
// loss through each chunk while its logits are at hand (the fused
// linear-cross-entropy idea): with g = d loss / d logp and g_H = d loss / d H
// per token, d loss / dz = (g (onehot - p) - g_H p (log p + H)) / tau, then
// grad_h = dz W and grad_w = sum over chunks of dz^T h. Three vocab-sized
// matmuls per chunk instead of four, and the [N, V] logits never exist.
FusedPass fused_logprobs(const at::Tensor& h, const at::Tensor& w, const at::Tensor& targets, double inv_temp,
                         int64_t chunk, const TokenLoss& tl, bool need_h, bool need_w, const volatile int32_t* cancel) {
  at::NoGradGuard ng;
  const auto acc = h.scalar_type() == at::kDouble ? at::kDouble : at::kFloat;
  const int64_t N = h.size(0), step = chunk_rows(w, chunk);
  FusedPass out;
  out.logp = at::empty({N}, h.options().dtype(acc));
  out.ent = at::empty({N}, h.options().dtype(acc));
  out.correct = at::empty({N}, h.options().dtype(acc));
  if (need_h) out.grad_h = at::empty_like(h, at::MemoryFormat::Contiguous);
  // The LM head's gradient goes straight into its .grad (addmm_ per chunk)
  // when that already holds an earlier micro-batch's sum in the right dtype,
  // rather than into a V x H buffer added afterwards.
  const auto& wg = w.grad();
  const bool into_grad = need_w && wg.defined() && wg.scalar_type() == acc && wg.is_contiguous();
  at::Tensor grad_w;  // the chunks' sum when not into_grad
  for (int64_t s = 0; s < N; s += step) {
    check_cancel(cancel);
    const int64_t n = std::min(step, N - s);
    auto hc = h.narrow(0, s, n);
    auto tgt = targets.narrow(0, s, n).unsqueeze(1);
    at::Tensor ls;
    {
      auto z = at::matmul(hc, w.t()).to(acc);
      if (inv_temp != 1.0) z.mul_(inv_temp);  // as ChunkedLogprob, which multiplies out of place
      out.correct.narrow(0, s, n).copy_(z.argmax(-1).eq(tgt.squeeze(1)));
      ls = at::log_softmax(z, -1);
    }
    auto lp = ls.gather(1, tgt).squeeze(1);
    auto p = ls.exp();
    auto ent = (p * ls).sum(-1).neg_();
    out.logp.narrow(0, s, n).copy_(lp);
    out.ent.narrow(0, s, n).copy_(ent);
    if (!need_h && !need_w) continue;
    auto g = tl.logp_grad(s, n, lp).unsqueeze(1);
    // dz, in place over p (and ls as scratch): -p (g + g_H (log p + H)) / tau,
    // plus g / tau at the target.
    at::Tensor dz;
    if (tl.ent_coef.defined()) {
      auto ge = tl.ent_coef.narrow(0, s, n).unsqueeze(1);
      dz = p.mul_(ls.add_(ent.unsqueeze(1)).mul_(ge).add_(g)).mul_(-inv_temp);
    } else {
      dz = p.mul_(g * -inv_temp);
    }
    dz.scatter_add_(1, tgt, g * inv_temp);
    ls = at::Tensor();
    if (dz.scalar_type() != h.scalar_type()) dz = dz.to(h.scalar_type());
    if (need_h) {
      auto gh = out.grad_h.narrow(0, s, n);
      at::mm_out(gh, dz, w);
    }
    if (need_w) {
      if (into_grad) {
        w.mutable_grad().addmm_(dz.t(), hc);
      } else if (!grad_w.defined()) {
        grad_w = at::mm(dz.t(), hc).to(acc);
      } else if (w.scalar_type() == acc) {
        grad_w.addmm_(dz.t(), hc);
      } else {
        grad_w.add_(at::mm(dz.t(), hc).to(acc));
      }
    }
  }
  if (need_w && !into_grad) {
    // Into .grad as AccumulateGrad would: the first micro-batch's gradient
    // becomes .grad, later ones add to it.
    auto g = grad_w.defined() ? grad_w.to(w.scalar_type()) : at::zeros_like(w);
    auto& dst = w.mutable_grad();
    if (dst.defined()) {
      dst.add_(g);
    } else {
      dst = g;
    }
  }
  return out;
}

}  // namespace

void forward_backward(Model& m, const ort_batch* b, const ort_loss_config& c, bool backward, ort_loss_stats* st,
                      const volatile int32_t* cancel) {
  validate(c, b);
  const char* blocker = fused_blocker(c, b);
  if (c.logprob_path == ORT_LOGPROB_FUSED && blocker != nullptr) {
    throw std::runtime_error(std::string("logprob_path fused does not apply to this loss: ") + blocker);
  }
  Batch bt = decode_batch(m, b);
  TrainingScope scope(m, backward);
  at::AutoGradMode grad_mode(backward);
  // Stage 3: the pass gathers each unit as it runs and reduce-scatters
  // each gradient when it is whole.
  ShardedPassPtr sp = params_sharded(m) ? begin_sharded_pass(m, false, cancel) : nullptr;
  if (backward && blocker == nullptr && c.logprob_path != ORT_LOGPROB_RECOMPUTE) {
    auto h = sp ? sharded_hidden(*sp, bt, true) : completion_hidden(m, bt, m.view, true, cancel);
    auto w = sp ? sharded_lm_head(*sp, true) : lm_head(m.view);
    const bool need_h = h.requires_grad(), need_w = w.requires_grad();
    auto tl = make_token_loss(c, b, bt, h.options().dtype(acc_dtype(m)));
    auto pass = fused_logprobs(h, w, bt.targets, 1.0 / c.temperature, m.opts.logprob_chunk_rows, tl, need_h, need_w, cancel);
    if (sp) sharded_head_done(*sp);
    {
      at::NoGradGuard ng;  // the value and metrics only: the gradient is in pass
      batch_loss(c, b, bt, pass.logp, pass.ent, pass.correct, st);
    }
    check_cancel(cancel);
    std::vector<at::Tensor> roots, grads;
    if (need_h) {
      roots.push_back(h);
      grads.push_back(pass.grad_h);
    }
    if (!roots.empty()) torch::autograd::backward(roots, grads);
    if (sp) finish_sharded_pass(*sp, true);
    return;
  }
  if (sp) {
    auto hs = sharded_hidden(*sp, bt, backward);
    auto w = sharded_lm_head(*sp, backward);
    auto lpe = chunked_logprobs(hs, w, bt.targets, c.temperature, m.opts.logprob_chunk_rows);
    auto loss = batch_loss(c, b, bt, lpe[0], lpe[1], lpe[2], st);
    check_cancel(cancel);
    if (backward && loss.requires_grad()) loss.backward();
    sharded_head_done(*sp);
    finish_sharded_pass(*sp, backward);
    return;
  }
  auto lpe = token_logprobs(m, bt, c.temperature, false, cancel);
  auto loss = batch_loss(c, b, bt, lpe[0], lpe[1], lpe[2], st);
  check_cancel(cancel);
  if (backward && loss.requires_grad()) loss.backward();
}

}  // namespace ort
