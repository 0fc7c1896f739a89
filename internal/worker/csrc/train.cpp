// train.cpp: gradient clipping by global norm and AdamW, following PyTorch's
// torch.nn.utils.clip_grad_norm_ and torch.optim.AdamW
// (https://pytorch.org/docs/stable/generated/torch.optim.AdamW.html).
#include <cmath>

#include "model.h"

namespace ort {

void zero_grad(Model& m) {
  for (auto& p : trainable(m)) {
    if (p.second.grad().defined()) p.second.mutable_grad() = at::Tensor();
  }
}

double optimizer_step(Model& m, double lr) {
  at::NoGradGuard ng;
  m.weights_version++;
  const auto& params = trainable(m);
  std::vector<at::Tensor> sq;
  for (const auto& p : params) {
    const auto& g = p.second.grad();
    if (g.defined()) sq.push_back(g.to(acc_dtype(m)).pow(2).sum());
  }
  const double norm = sq.empty() ? 0.0 : at::stack(sq).sum().sqrt().item<double>();
  const auto& o = m.opts;
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
  if (o.max_grad_norm > 0 && norm > o.max_grad_norm) {
    at::_foreach_mul_(gs, at::Scalar(o.max_grad_norm / (norm + 1e-6)));
  }
  m.step++;
  const double bc1 = 1 - std::pow(o.beta1, static_cast<double>(m.step));
  const double bc2 = 1 - std::pow(o.beta2, static_cast<double>(m.step));
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
  zero_grad(m);
  return norm;
}

}  // namespace ort
