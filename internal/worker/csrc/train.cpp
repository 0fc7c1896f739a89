// train.cpp: gradient clipping by global norm and AdamW, following PyTorch's
// torch.nn.utils.clip_grad_norm_ and torch.optim.AdamW
// (https://pytorch.org/docs/stable/generated/torch.optim.AdamW.html).
#include <ATen/Dispatch.h>
#include <ATen/Parallel.h>

#include <algorithm>
#include <cmath>

#include "model.h"

namespace ort {

namespace {

// adamw_kernel is the AdamW update of one element range, written so the
// compiler vectorises it (an AVX2 clone is picked at load time where the CPU
// has it; build-worker.sh passes -fno-math-errno so sqrt vectorises).
template <class T>
__attribute__((target_clones("avx2", "default"), optimize("O3"))) void adamw_kernel(
    T* __restrict pw, const T* __restrict pg, T* __restrict pm, T* __restrict pv, int64_t begin, int64_t end, T scale,
    T decay, T b1, T c1, T b2, T c2, T root_bc2, T eps, T step) {
  for (int64_t i = begin; i < end; i++) {
    const T gi = pg[i] * scale;
    const T mi = pm[i] * b1 + c1 * gi;
    const T vi = pv[i] * b2 + c2 * gi * gi;
    pm[i] = mi;
    pv[i] = vi;
    pw[i] = pw[i] * decay + step * mi / (std::sqrt(vi) / root_bc2 + eps);
  }
}

// adamw_one_pass applies the AdamW update below to one contiguous CPU
// tensor in a single pass over w, g, m and v (the multi-tensor kernels
// sweep memory about ten times, which dominates on CPU), element by element
// with the same arithmetic in the tensor's dtype.
void adamw_one_pass(const at::Tensor& w, const at::Tensor& g, const at::Tensor& m1, const at::Tensor& v, double clip,
                    double lr, const ort_model_options& o, double bc1, double bc2) {
  AT_DISPATCH_FLOATING_TYPES(w.scalar_type(), "adamw_one_pass", [&] {
    scalar_t* pw = w.data_ptr<scalar_t>();
    const scalar_t* pg = g.data_ptr<scalar_t>();
    scalar_t* pm = m1.data_ptr<scalar_t>();
    scalar_t* pv = v.data_ptr<scalar_t>();
    at::parallel_for(0, w.numel(), int64_t{1} << 15, [&](int64_t begin, int64_t end) {
      adamw_kernel<scalar_t>(pw, pg, pm, pv, begin, end, clip, 1 - lr * o.weight_decay, o.beta1, 1 - o.beta1, o.beta2,
                             1 - o.beta2, std::sqrt(bc2), o.adam_eps, -lr / bc1);
    });
  });
}

bool one_pass_ok(const at::Tensor& w, const at::Tensor& g, const at::Tensor& m1, const at::Tensor& v) {
  for (const auto* t : {&w, &g, &m1, &v}) {
    if (!t->device().is_cpu() || !t->is_contiguous() || t->scalar_type() != w.scalar_type()) return false;
  }
  return w.scalar_type() == at::kFloat || w.scalar_type() == at::kDouble;
}

}  // namespace

void zero_grad(Model& m) {
  for (auto& p : trainable(m)) {
    if (p.second.grad().defined()) p.second.mutable_grad() = at::Tensor();
  }
  for (auto& b : m.shard.buckets) {
    if (b.grad.defined()) b.grad.zero_();
  }
  std::fill(m.shard.has_grad.begin(), m.shard.has_grad.end(), 0);
}

double clip_factor(const Model& m, double norm) {
  const auto& o = m.opts;
  return o.max_grad_norm > 0 && norm > o.max_grad_norm ? o.max_grad_norm / (norm + 1e-6) : 1.0;
}

void adamw_update(Model& m, const std::vector<at::Tensor>& ws, const std::vector<at::Tensor>& gs_in,
                  const std::vector<at::Tensor>& m1s, const std::vector<at::Tensor>& vs, double clip, double lr) {
  const auto& o = m.opts;
  const double bc1 = 1 - std::pow(o.beta1, static_cast<double>(m.step));
  const double bc2 = 1 - std::pow(o.beta2, static_cast<double>(m.step));
  bool all_one_pass = true;
  for (size_t i = 0; i < ws.size(); i++) all_one_pass = all_one_pass && one_pass_ok(ws[i], gs_in[i], m1s[i], vs[i]);
  if (all_one_pass) {
    for (size_t i = 0; i < ws.size(); i++) adamw_one_pass(ws[i], gs_in[i], m1s[i], vs[i], clip, lr, o, bc1, bc2);
    return;
  }
  auto gs = gs_in;
  if (clip != 1.0) {
    for (auto& g : gs) g = g * clip;  // the callers' gradients stay as they were
  }
  // Multi-tensor (foreach) kernels over groups of up to 16M elements: few
  // launches, and the temporary denominators stay bounded.
  constexpr int64_t kGroup = int64_t{1} << 24;
  for (size_t begin = 0; begin < ws.size();) {
    size_t end = begin;
    for (int64_t n = 0; end < ws.size() && (end == begin || n + ws[end].numel() <= kGroup); end++) n += ws[end].numel();
    auto part = [&](const std::vector<at::Tensor>& v) { return std::vector<at::Tensor>(v.begin() + begin, v.begin() + end); };
    auto w = part(ws), g = part(gs), m1 = part(m1s), v = part(vs);
    at::_foreach_mul_(w, at::Scalar(1 - lr * o.weight_decay));
    at::_foreach_mul_(m1, at::Scalar(o.beta1));
    at::_foreach_add_(m1, g, at::Scalar(1 - o.beta1));
    at::_foreach_mul_(v, at::Scalar(o.beta2));
    at::_foreach_addcmul_(v, g, g, at::Scalar(1 - o.beta2));
    auto denom = at::_foreach_sqrt(v);
    at::_foreach_div_(denom, at::Scalar(std::sqrt(bc2)));
    at::_foreach_add_(denom, at::Scalar(o.adam_eps));
    at::_foreach_addcdiv_(w, m1, denom, at::Scalar(-lr / bc1));
    begin = end;
  }
}

double optimizer_step(Model& m, double lr) {
  if (m.shard.stage != ORT_SHARD_NONE) {
    throw std::runtime_error("the optimizer state is sharded over a process group: step with ort_group_optimizer_step");
  }
  at::NoGradGuard ng;
  m.weights_version++;
  const auto& params = trainable(m);
  std::vector<at::Tensor> sq;
  for (const auto& p : params) {
    const auto& g = p.second.grad();
    if (!g.defined()) continue;
    auto n = at::linalg_vector_norm(g, 2, c10::nullopt, false, acc_dtype(m));  // one pass, no squared copy
    sq.push_back(n * n);
  }
  const double norm = sq.empty() ? 0.0 : at::stack(sq).sum().sqrt().item<double>();
  std::vector<at::Tensor> ws, gs, m1s, vs;  // params with a gradient, and their state
  forget_listings(m);  // the loop below may create optimizer state
  for (const auto& p : params) {
    const auto& g = p.second.grad();
    if (!g.defined()) continue;  // as torch.optim: no gradient, no update
    auto& m1 = m.exp_avg[p.first];
    auto& v = m.exp_avg_sq[p.first];
    if (!m1.defined()) m1 = at::zeros_like(p.second.detach());
    if (!v.defined()) v = at::zeros_like(p.second.detach());
    ws.push_back(p.second.detach());
    gs.push_back(g);
    m1s.push_back(m1);
    vs.push_back(v);
  }
  const double clip = clip_factor(m, norm);
  m.step++;
  adamw_update(m, ws, gs, m1s, vs, clip, lr);
  zero_grad(m);
  return norm;
}

}  // namespace ort
