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
  auto params = trainable(m);
  std::vector<at::Tensor> sq;
  for (auto& p : params) {
    const auto& g = p.second.grad();
    if (g.defined()) sq.push_back(g.to(acc_dtype(m)).pow(2).sum());
  }
  const double norm = sq.empty() ? 0.0 : at::stack(sq).sum().sqrt().item<double>();
  const auto& o = m.opts;
  if (o.max_grad_norm > 0 && norm > o.max_grad_norm) {
    const double coef = o.max_grad_norm / (norm + 1e-6);
    for (auto& p : params) {
      if (p.second.grad().defined()) p.second.mutable_grad().mul_(coef);
    }
  }
  m.step++;
  const double bc1 = 1 - std::pow(o.beta1, static_cast<double>(m.step));
  const double bc2 = 1 - std::pow(o.beta2, static_cast<double>(m.step));
  for (auto& p : params) {
    const auto& g = p.second.grad();
    if (!g.defined()) continue;
    auto w = p.second.detach();
    auto& m1 = m.exp_avg[p.first];
    auto& v = m.exp_avg_sq[p.first];
    if (!m1.defined()) m1 = at::zeros_like(w);
    if (!v.defined()) v = at::zeros_like(w);
    w.mul_(1 - lr * o.weight_decay);
    m1.mul_(o.beta1).add_(g, 1 - o.beta1);
    v.mul_(o.beta2).addcmul_(g, g, 1 - o.beta2);
    auto denom = (v.sqrt() / std::sqrt(bc2)).add_(o.adam_eps);
    w.addcdiv_(m1, denom, -lr / bc1);
  }
  zero_grad(m);
  return norm;
}

}  // namespace ort
