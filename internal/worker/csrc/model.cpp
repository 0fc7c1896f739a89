// model.cpp: the decoder (Llama / Qwen2 / Qwen3 / Mistral family), LoRA and
// the reference copy. Mirrors transformers' modeling_llama / modeling_qwen3:
// pre-norm blocks, RoPE (rotate_half), GQA, SwiGLU MLP, optional q/k RMSNorm.
#include <ATen/CPUGeneratorImpl.h>
#include <ATen/Parallel.h>
#include <torch/csrc/autograd/autograd.h>
#include <torch/csrc/autograd/custom_function.h>

#include <algorithm>
#include <cmath>
#include <sstream>
#include <stdexcept>

#include "model.h"

namespace ort {

void check_cancel(const volatile int32_t* cancel) {
  if (cancel != nullptr && *cancel != 0) throw std::runtime_error("cancelled");
}

SerialScope::SerialScope(bool on) {
  if (!on || omp_set_num_threads == nullptr || omp_get_max_threads == nullptr) return;
  const int n = omp_get_max_threads();
  if (n <= 1) return;
  saved_ = n;
  omp_set_num_threads(1);
}

SerialScope::~SerialScope() {
  if (saved_ > 1) omp_set_num_threads(saved_);
}

bool serial_decode(const Model& m, int64_t rows) { return m.device.is_cpu() && serial_decode_arch(m.arch, rows); }

bool serial_decode_arch(const ort_arch& a, int64_t rows) {
  const int64_t widest = std::max<int64_t>({a.vocab_size, a.intermediate_size, int64_t{a.num_heads} * a.head_dim});
  constexpr int64_t kSerialMACs = int64_t{2} << 20;
  return rows * a.hidden_size * widest < kSerialMACs;
}

at::ScalarType acc_dtype(const Model& m) { return m.dtype == at::kDouble ? at::kDouble : at::kFloat; }

std::string layer_prefix(int i) { return "model.layers." + std::to_string(i) + "."; }

std::vector<std::pair<std::string, std::vector<int64_t>>> expected_weights(const ort_arch& a) {
  const int64_t H = a.hidden_size, I = a.intermediate_size, V = a.vocab_size, hd = a.head_dim;
  const int64_t q = a.num_heads * hd, kv = a.num_kv_heads * hd;
  std::vector<std::pair<std::string, std::vector<int64_t>>> out;
  out.push_back({"model.embed_tokens.weight", {V, H}});
  for (int i = 0; i < a.num_layers; i++) {
    const std::string p = layer_prefix(i);
    out.push_back({p + "input_layernorm.weight", {H}});
    out.push_back({p + "self_attn.q_proj.weight", {q, H}});
    out.push_back({p + "self_attn.k_proj.weight", {kv, H}});
    out.push_back({p + "self_attn.v_proj.weight", {kv, H}});
    if (a.attention_bias) {
      out.push_back({p + "self_attn.q_proj.bias", {q}});
      out.push_back({p + "self_attn.k_proj.bias", {kv}});
      out.push_back({p + "self_attn.v_proj.bias", {kv}});
    }
    out.push_back({p + "self_attn.o_proj.weight", {H, q}});
    if (a.o_bias) out.push_back({p + "self_attn.o_proj.bias", {H}});
    if (a.qk_norm) {
      out.push_back({p + "self_attn.q_norm.weight", {hd}});
      out.push_back({p + "self_attn.k_norm.weight", {hd}});
    }
    out.push_back({p + "post_attention_layernorm.weight", {H}});
    out.push_back({p + "mlp.gate_proj.weight", {I, H}});
    out.push_back({p + "mlp.up_proj.weight", {I, H}});
    out.push_back({p + "mlp.down_proj.weight", {H, I}});
  }
  out.push_back({"model.norm.weight", {H}});
  if (!a.tie_embeddings) out.push_back({"lm_head.weight", {V, H}});
  return out;
}

static at::Tensor get(std::map<std::string, at::Tensor>& w, const std::string& name) {
  auto it = w.find(name);
  if (it == w.end()) throw std::runtime_error("missing tensor " + name);
  return it->second;
}

static Lin make_lin(std::map<std::string, at::Tensor>& w, const std::map<std::string, LoraPair>* lora,
                    const std::string& module, bool bias) {
  Lin l;
  l.w = get(w, module + ".weight");
  if (bias) l.b = get(w, module + ".bias");
  if (lora != nullptr) {
    auto it = lora->find(module);
    if (it != lora->end()) {
      l.lora_a = it->second.a;
      l.lora_b = it->second.b;
    }
  }
  return l;
}

LayerW make_layer(const Model& m, std::map<std::string, at::Tensor>& w, const std::map<std::string, LoraPair>* lora,
                  int i) {
  const std::string p = layer_prefix(i);
  LayerW L;
  L.ln1 = get(w, p + "input_layernorm.weight");
  L.ln2 = get(w, p + "post_attention_layernorm.weight");
  if (m.arch.qk_norm) {
    L.q_norm = get(w, p + "self_attn.q_norm.weight");
    L.k_norm = get(w, p + "self_attn.k_norm.weight");
  }
  const bool ab = m.arch.attention_bias != 0;
  L.q = make_lin(w, lora, p + "self_attn.q_proj", ab);
  L.k = make_lin(w, lora, p + "self_attn.k_proj", ab);
  L.v = make_lin(w, lora, p + "self_attn.v_proj", ab);
  L.o = make_lin(w, lora, p + "self_attn.o_proj", m.arch.o_bias != 0);
  L.gate = make_lin(w, lora, p + "mlp.gate_proj", false);
  L.up = make_lin(w, lora, p + "mlp.up_proj", false);
  L.down = make_lin(w, lora, p + "mlp.down_proj", false);
  return L;
}

Weights make_view(Model& m, std::map<std::string, at::Tensor>& w, bool with_lora) {
  Weights v;
  v.embed = get(w, "model.embed_tokens.weight");
  v.norm = get(w, "model.norm.weight");
  v.lm_head = m.arch.tie_embeddings ? v.embed : get(w, "lm_head.weight");
  for (int i = 0; i < m.arch.num_layers; i++) v.layers.push_back(make_layer(m, w, with_lora ? &m.lora : nullptr, i));
  return v;
}

static std::vector<std::string> split_targets(const std::string& s) {
  std::vector<std::string> out;
  std::stringstream ss(s);
  std::string item;
  while (std::getline(ss, item, ',')) {
    if (!item.empty()) out.push_back(item);
  }
  return out;
}

// make_lora adds PEFT-initialised adapters: A kaiming-uniform(a=sqrt(5)),
// i.e. U(-1/sqrt(in), 1/sqrt(in)); B zero, so the adapted model starts equal
// to the base.
static void make_lora(Model& m) {
  const auto targets = split_targets(m.lora_targets);
  if (targets.empty()) throw std::runtime_error("lora: no target modules");
  const int64_t r = m.opts.lora_rank;
  m.lora_scale = m.opts.lora_alpha / static_cast<double>(r);
  for (const auto& t : targets) {
    bool found = false;
    for (int i = 0; i < m.arch.num_layers; i++) {
      for (const char* group : {"self_attn.", "mlp."}) {
        const std::string module = layer_prefix(i) + group + t;
        auto it = m.weights.find(module + ".weight");
        if (it == m.weights.end()) continue;
        found = true;
        const int64_t out = it->second.size(0), in = it->second.size(1);
        const double bound = 1.0 / std::sqrt(static_cast<double>(in));
        auto opts = at::TensorOptions().dtype(m.dtype).device(m.device);
        auto a = at::empty({r, in}, at::TensorOptions().dtype(at::kDouble)).uniform_(-bound, bound, m.gen);
        LoraPair p;
        p.a = a.to(opts).set_requires_grad(true);
        p.b = at::zeros({out, r}, opts).set_requires_grad(true);
        m.lora[module] = p;
      }
    }
    if (!found) throw std::runtime_error("lora: target module " + t + " matches no projection (allowed: q_proj, k_proj, v_proj, o_proj, gate_proj, up_proj, down_proj)");
  }
}

// saved_weight_names maps a modules_to_save entry to the HF weights it
// covers. lm_head of a tied model is the embedding matrix.
static std::vector<std::string> saved_weight_names(const Model& m, const std::string& module) {
  std::vector<std::string> out;
  auto per_layer = [&](const std::string& suffix) {
    for (int i = 0; i < m.arch.num_layers; i++) out.push_back(layer_prefix(i) + suffix);
  };
  if (module == "embed_tokens") {
    out.push_back("model.embed_tokens.weight");
  } else if (module == "lm_head") {
    out.push_back(m.arch.tie_embeddings ? "model.embed_tokens.weight" : "lm_head.weight");
  } else if (module == "norm") {
    out.push_back("model.norm.weight");
  } else if (module == "input_layernorm" || module == "post_attention_layernorm") {
    per_layer(module + ".weight");
  } else if ((module == "q_norm" || module == "k_norm") && m.arch.qk_norm) {
    per_layer("self_attn." + module + ".weight");
  } else {
    throw std::runtime_error("lora: module to save " + module +
                             " is not one of embed_tokens, lm_head, norm, input_layernorm, post_attention_layernorm, "
                             "q_norm, k_norm (q_norm/k_norm only with qk norms)");
  }
  return out;
}

// make_saved gives each module to save a trainable copy of its weights, as
// PEFT's ModulesToSaveWrapper does; the originals stay frozen (the base and
// the reference policy). In a tied model the embedding and lm_head are one
// matrix, so saving either (or both) trains that one copy and the adapter
// carries it under both PEFT names.
static void make_saved(Model& m) {
  at::NoGradGuard ng;
  bool tied_saved = false;
  for (const auto& module : split_targets(m.lora_save)) {
    if (m.arch.tie_embeddings && (module == "embed_tokens" || module == "lm_head")) tied_saved = true;
    for (const auto& name : saved_weight_names(m, module)) {
      if (m.saved.count(name) != 0) continue;
      m.saved[name] = m.weights.at(name).detach().clone().set_requires_grad(true);
    }
  }
  if (tied_saved) m.saved_alias["base_model.model.lm_head.weight"] = "base_model.model.model.embed_tokens.weight";
}

void finalize(Model& m) {
  for (const auto& e : expected_weights(m.arch)) {
    if (m.weights.find(e.first) == m.weights.end()) throw std::runtime_error("checkpoint lacks tensor " + e.first);
  }
  const bool full = m.opts.lora_rank <= 0;
  for (auto& kv : m.weights) kv.second.set_requires_grad(full);
  if (!full && m.lora.empty()) make_lora(m);
  if (!full && m.saved.empty() && !m.lora_save.empty()) make_saved(m);
  if (full && m.opts.reference) {
    for (auto& kv : m.weights) m.ref_weights[kv.first] = kv.second.detach().clone();
    m.ref_view = make_view(m, m.ref_weights, false);
  }
  if (!full) m.ref_view = make_view(m, m.weights, false);  // adapters off, originals of saved modules
  auto active = m.weights;  // tensor handles: the saved copies replace their originals
  for (const auto& kv : m.saved) active[kv.first] = kv.second;
  m.view = make_view(m, active, true);
  index_trainable(m);
  m.finalized = true;
}

// rms_norm follows transformers' LlamaRMSNorm: normalise in fp32 (fp64 stays
// fp64), cast back, then scale.
// Without autograd (sampling) the temporaries are updated in place and the
// casts that would change nothing are skipped: the same arithmetic in fewer
// dispatcher calls, which is what a small model's decode step is made of.
at::Tensor rms_norm(const at::Tensor& x, const at::Tensor& w, double eps) {
  const auto in = x.scalar_type();
  const bool wide = in == at::kDouble || in == at::kFloat;
  if (wide && !at::GradMode::is_enabled()) {
    auto y = x * x.pow(2).mean(-1, true).add_(eps).rsqrt_();
    return y.mul_(w);  // w * y: the product commutes bit for bit
  }
  auto xf = wide ? x : x.to(at::kFloat);
  auto var = xf.pow(2).mean(-1, true);
  xf = xf * at::rsqrt(var + eps);
  return w * (wide ? xf : xf.to(in));
}

static at::Tensor inv_freq(const Model& m) {
  const auto& a = m.arch;
  const auto acc = acc_dtype(m);
  auto idx = at::arange(0, a.head_dim, 2, at::TensorOptions().dtype(at::kLong)).to(acc) / a.head_dim;
  auto inv = 1.0 / at::pow(a.rope_theta, idx);
  if (a.rope_scaling == ORT_ROPE_LINEAR) inv = inv / a.rope_factor;
  if (a.rope_scaling == ORT_ROPE_LLAMA3) {  // transformers' _compute_llama3_parameters
    const double old_len = a.rope_original_max_pos;
    const double low_wl = old_len / a.rope_low_freq_factor, high_wl = old_len / a.rope_high_freq_factor;
    auto wavelen = 2 * M_PI / inv;
    auto llama = at::where(wavelen > low_wl, inv / a.rope_factor, inv);
    auto smooth = (old_len / wavelen - a.rope_low_freq_factor) / (a.rope_high_freq_factor - a.rope_low_freq_factor);
    auto smoothed = (1 - smooth) * llama / a.rope_factor + smooth * llama;
    auto medium = (wavelen >= high_wl).logical_and(wavelen <= low_wl);
    inv = at::where(medium, smoothed, llama);
  }
  return inv.to(m.device);
}

// swap_halves(x) * sin_rot is transformers' rotate_half(x) * sin with the
// negation moved onto the table: (-a) b and a (-b) are the same float.
static at::Tensor swap_halves(const at::Tensor& x) {
  const int64_t h = x.size(-1) / 2;
  return at::cat({x.narrow(-1, h, h), x.narrow(-1, 0, h)}, -1);
}

// rope_tables makes m.rope_cos / m.rope_sin_rot cover positions [0, need):
// rows p of cat(cos f, cos f) and of cat(-sin f, sin f) for f = p * inv_freq,
// as transformers computes them per call, grown by doubling.
static void rope_tables(Model& m, int64_t need) {
  if (m.rope_cos.defined() && m.rope_cos.size(0) >= need) return;
  int64_t n = 64;
  while (n < need) n *= 2;
  at::NoGradGuard ng;
  auto p = at::arange(n, at::TensorOptions().dtype(at::kLong).device(m.device)).to(acc_dtype(m));
  auto f = p.unsqueeze(-1) * inv_freq(m).view({1, -1});  // [n, hd/2]
  m.rope_cos = cast(at::cat({f, f}, -1).cos(), m.dtype);
  auto sin = cast(f.sin(), m.dtype);
  m.rope_sin_rot = at::cat({-sin, sin}, -1);
}

// A contiguous [.., in] input is multiplied as one [rows, in] matrix: the
// mm (addmm with a bias) that at::linear folds it to anyway, in two
// dispatcher calls instead of six.
static at::Tensor dense(const Model& m, const at::Tensor& x, const at::Tensor& w, const at::Tensor& b) {
  if (x.dim() < 2 || !x.is_contiguous()) return at::linear(x, w, b.defined() ? c10::optional<at::Tensor>(b) : c10::nullopt);
  auto x2 = x.dim() == 2 ? x : x.view({-1, x.size(-1)});
  auto y = matmul_nt(m, x2, w, b);
  if (x.dim() == 2) return y;
  auto sizes = x.sizes().vec();
  sizes.back() = w.size(0);
  return y.view(sizes);
}

static at::Tensor linear(const Model& m, const Lin& l, const at::Tensor& x, bool lora_on) {
  auto y = dense(m, x, l.w, l.b);
  if (lora_on && l.lora_a.defined()) {
    auto xd = x;
    const double p = m.opts.lora_dropout;
    if (p > 0 && m.training) {
      // The model's CPU generator makes masks reproducible (and replayable
      // under activation recomputation); CUDA tensors use the device RNG.
      auto keep = x.is_cuda() ? at::empty_like(x).bernoulli_(1 - p)
                              : at::empty_like(x).bernoulli_(1 - p, const_cast<Model&>(m).gen);
      xd = x * keep / (1 - p);
    }
    y = y + at::linear(at::linear(xd, l.lora_a), l.lora_b) * m.lora_scale;
  }
  return y;
}


// attention_masks fills c.allowed and c.bias for keys at key_pos [B, Lk].
static void attention_masks(LayerCtx& c, const at::Tensor& key_pos, at::ScalarType acc) {
  const int64_t B = c.pos.size(0), L = c.pos.size(1), Lk = key_pos.size(1);
  c.allowed = key_pos.view({B, 1, 1, Lk}).le(c.pos.view({B, 1, L, 1}));
  if (c.seg.defined()) c.allowed = c.allowed.logical_and(c.seg.view({B, 1, 1, Lk}).eq(c.seg.view({B, 1, L, 1})));
  c.bias = at::zeros({B, 1, 1, L, Lk}, c.pos.options().dtype(acc))
               .masked_fill(c.allowed.view({B, 1, 1, L, Lk}).logical_not(), -std::numeric_limits<double>::infinity());
}

at::Tensor aten_attention(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v, const at::Tensor& allowed,
                          const at::Tensor& bias, bool cached, bool packed, at::ScalarType acc) {
  const int64_t B = q.size(0), nh = q.size(1), L = q.size(2), hd = q.size(3), nkv = k.size(1), Lk = k.size(2);
  const int64_t g = nh / nkv;
#if ORT_TORCH_AT_LEAST(2, 0)
  // Fused attention (flash / memory-efficient kernels on CUDA); GQA by
  // expanding k/v to the query heads.
  auto heads = [&](const at::Tensor& t) {
    return g == 1 ? t : t.unsqueeze(2).expand({B, nkv, g, Lk, hd}).reshape({B, nh, Lk, hd});
  };
  auto out = !cached && packed
                 ? at::scaled_dot_product_attention(q, heads(k), heads(v), allowed, 0.0, false)
             : !cached ? at::scaled_dot_product_attention(q, heads(k), heads(v), c10::nullopt, 0.0, true)
             : allowed.defined()
                 ? at::scaled_dot_product_attention(q, heads(k), heads(v), allowed, 0.0, false)
                 : at::scaled_dot_product_attention(q, heads(k), heads(v), c10::nullopt, 0.0, false);
  out = out.transpose(1, 2).reshape({B, L, nh * hd});
#else
  // GQA without copying k/v: the g query heads of each kv head become rows.
  // Scale q (smaller than the scores) and add the precomputed mask bias.
  auto q4 = (q * (1.0 / std::sqrt(static_cast<double>(hd)))).reshape({B, nkv, g * L, hd});
  auto scores = at::matmul(q4, k.transpose(-1, -2)).view({B, nkv, g, L, Lk});
  scores = cast(scores, acc);
  if (bias.defined()) scores = scores + bias;
  auto probs = cast(at::softmax(scores, -1), q.scalar_type()).view({B, nkv, g * L, Lk});
  auto out = at::matmul(probs, v).view({B, nh, L, hd}).transpose(1, 2).reshape({B, L, nh * hd});
#endif
  return out;
}

static at::Tensor attention(const LayerCtx& c, const at::Tensor& x) {
  const auto& a = c.m->arch;
  const int64_t B = x.size(0), L = x.size(1), hd = a.head_dim, nh = a.num_heads, nkv = a.num_kv_heads;
  auto q = linear(*c.m, c.w->q, x, c.lora_on).view({B, L, nh, hd});
  auto k = linear(*c.m, c.w->k, x, c.lora_on).view({B, L, nkv, hd});
  auto v = linear(*c.m, c.w->v, x, c.lora_on).view({B, L, nkv, hd}).transpose(1, 2);
  if (a.qk_norm) {
    q = rms_norm(q, c.w->q_norm, a.rms_eps);
    k = rms_norm(k, c.w->k_norm, a.rms_eps);
  }
  q = q.transpose(1, 2);
  k = k.transpose(1, 2);
  q = q * c.cos + swap_halves(q) * c.sin_rot;
  k = k * c.cos + swap_halves(k) * c.sin_rot;
  if (c.cache != nullptr) {
    auto& ck = c.cache->k[c.layer];
    auto& cv = c.cache->v[c.layer];
    auto idx = c.pos.view({B, 1, L, 1}).expand({B, nkv, L, hd});
    ck.scatter_(2, idx, k);
    cv.scatter_(2, idx, v);
    k = ck;
    v = cv;
  }
  if (L == 1 && c.cache != nullptr && c.m->kernels.fused_attention && decode_attention_applies(q, k, v, c.bias)) {
    auto out = decode_attention(q, k, v, c.bias, 1.0 / std::sqrt(static_cast<double>(hd)));
    return linear(*c.m, c.w->o, out, c.lora_on);
  }
  auto out = aten_attention(q, k, v, c.allowed, c.bias, c.cache != nullptr, c.seg.defined(), acc_dtype(*c.m));
  return linear(*c.m, c.w->o, out, c.lora_on);
}

at::Tensor layer_forward(const LayerCtx& c, const at::Tensor& x) {
  const double eps = c.m->arch.rms_eps;
  auto h = x + attention(c, rms_norm(x, c.w->ln1, eps));
  auto n = rms_norm(h, c.w->ln2, eps);
  auto act = at::silu(linear(*c.m, c.w->gate, n, c.lora_on)) * linear(*c.m, c.w->up, n, c.lora_on);
  return h + linear(*c.m, c.w->down, act, c.lora_on);
}

// LayerCheckpoint recomputes a block in backward instead of keeping its
// activations (activation recomputation). The LoRA dropout generator is
// snapshotted so the recomputation draws the same masks.
struct LayerCheckpoint : public torch::autograd::Function<LayerCheckpoint> {
  static torch::autograd::variable_list forward(torch::autograd::AutogradContext* ctx, const at::Tensor& x,
                                                at::TensorList params, int64_t ctx_ptr) {
    // The LayerCtx lives on forward()'s stack, so copy what backward needs;
    // the Model and its LayerW views outlive the step.
    auto* c = reinterpret_cast<const LayerCtx*>(ctx_ptr);
    ctx->saved_data["m"] = reinterpret_cast<int64_t>(c->m);
    ctx->saved_data["w"] = reinterpret_cast<int64_t>(c->w);
    ctx->saved_data["lora"] = c->lora_on;
    ctx->saved_data["gen"] = c->m->gen.clone();
    ctx->save_for_backward({x, c->cos, c->sin_rot, c->pos, c->allowed, c->bias, c->seg});
    (void)params;
    at::NoGradGuard ng;
    return {layer_forward(*c, x)};
  }
  static torch::autograd::variable_list backward(torch::autograd::AutogradContext* ctx,
                                                 torch::autograd::variable_list grad_out) {
    auto saved = ctx->get_saved_variables();
    auto& m = *reinterpret_cast<Model*>(ctx->saved_data["m"].toInt());
    const auto* w = reinterpret_cast<const LayerW*>(ctx->saved_data["w"].toInt());
    LayerCtx c{&m, w, ctx->saved_data["lora"].toBool(), saved[1], saved[2], saved[3], saved[6], nullptr, 0, saved[4], saved[5]};
    auto x = saved[0].detach().set_requires_grad(true);
    auto live_gen = m.gen;
    m.gen = ctx->saved_data["gen"].toGenerator();
    at::Tensor y;
    {
      at::AutoGradMode g(true);
      y = layer_forward(c, x);
    }
    m.gen = live_gen;
    std::vector<at::Tensor> inputs{x};
    const auto params = layer_params(*w);
    for (const auto& p : params) {
      if (p.requires_grad()) inputs.push_back(p);
    }
    auto grads = torch::autograd::grad({y}, inputs, grad_out, false, false, true);
    torch::autograd::variable_list out{grads[0]};
    size_t gi = 1;
    for (const auto& p : params) out.push_back(p.requires_grad() ? grads[gi++] : at::Tensor());
    out.push_back(at::Tensor());  // ctx_ptr
    return out;
  }
  static std::vector<at::Tensor> layer_params(const LayerW& w) {
    std::vector<at::Tensor> p;
    for (const auto& t : {w.ln1, w.ln2, w.q_norm, w.k_norm}) {
      if (t.defined()) p.push_back(t);
    }
    for (const Lin* l : {&w.q, &w.k, &w.v, &w.o, &w.gate, &w.up, &w.down}) {
      for (const auto& t : {l->w, l->b, l->lora_a, l->lora_b}) {
        if (t.defined()) p.push_back(t);
      }
    }
    return p;
  }
};

at::Tensor lm_head(const Weights& w) { return w.lm_head; }

// EmbeddingLookup is at::embedding whose backward adds each token's
// gradient row into the weight's .grad in place (index_add_) and hands
// autograd no gradient for the weight. at::embedding's backward instead
// returns a zero-filled dense [V, H] matrix, which AccumulateGrad (or, in a
// tied model, the sum with the LM head's gradient) then adds: two or three
// passes over V x H per micro-batch, which at V = 151,936 cost as much as a
// decoder layer. The sum is the same; only the order of the additions into
// .grad differs.
struct EmbeddingLookup : public torch::autograd::Function<EmbeddingLookup> {
  static at::Tensor forward(torch::autograd::AutogradContext* ctx, const at::Tensor& weight, const at::Tensor& ids) {
    ctx->save_for_backward({ids});
    ctx->saved_data["weight"] = weight;  // the leaf itself (not a copy), whose .grad backward adds to
    return at::embedding(weight, ids);
  }
  static torch::autograd::variable_list backward(torch::autograd::AutogradContext* ctx,
                                                 torch::autograd::variable_list grad_out) {
    auto weight = ctx->saved_data["weight"].toTensor();
    const auto ids = ctx->get_saved_variables()[0].reshape({-1});
    auto rows = grad_out[0].reshape({-1, weight.size(1)});
    auto& acc = weight.mutable_grad();
    if (!acc.defined()) acc = at::zeros_like(weight, at::MemoryFormat::Contiguous);
    acc.index_add_(0, ids, rows.to(acc.scalar_type()));
    return {at::Tensor(), at::Tensor()};
  }
};

at::Tensor embed_tokens(const at::Tensor& weight, const at::Tensor& ids) {
  if (!at::GradMode::is_enabled() || !weight.requires_grad() || !weight.is_leaf()) return at::embedding(weight, ids);
  return EmbeddingLookup::apply(weight, ids);
}

LayerCtx layer_ctx(Model& m, const at::Tensor& pos, const at::Tensor& seg, KVCache* cache) {
  const int64_t B = pos.size(0), L = pos.size(1), hd = m.arch.head_dim;
  // Positions are below the keys' length: the cache's span, else the
  // sequence's (0..L-1). Known from shapes, so no read of pos (a device sync
  // on a GPU); a position past it fails in index_select.
  const int64_t Lk = cache != nullptr ? cache->k[0].size(2) : pos.size(1);
  rope_tables(m, std::max<int64_t>(Lk, 1));
  auto rows = pos.reshape({-1});
  LayerCtx c{&m, nullptr, false, m.rope_cos.index_select(0, rows).view({B, 1, L, hd}),
             m.rope_sin_rot.index_select(0, rows).view({B, 1, L, hd}), pos, seg, cache, 0, {}, {}};
  if (cache == nullptr || !cache->all_keys) {
    attention_masks(c, cache != nullptr ? at::arange(Lk, pos.options()).view({1, -1}).expand({pos.size(0), Lk}) : pos,
                    acc_dtype(m));
  }
  return c;
}

at::Tensor forward(Model& m, const Weights& w, bool lora_on, const at::Tensor& ids, const at::Tensor& pos, const at::Tensor& seg,
                   KVCache* cache, const volatile int32_t* cancel) {
  auto x = embed_tokens(w.embed, ids);
  auto c = layer_ctx(m, pos, seg, cache);
  c.lora_on = lora_on;
  const bool ckpt = m.opts.grad_checkpointing && cache == nullptr && at::GradMode::is_enabled();
  for (size_t i = 0; i < w.layers.size(); i++) {
    check_cancel(cancel);
    c.w = &w.layers[i];
    c.layer = static_cast<int>(i);
    if (ckpt) {
      auto params = LayerCheckpoint::layer_params(*c.w);
      x = LayerCheckpoint::apply(x, at::TensorList(params), reinterpret_cast<int64_t>(&c))[0];
    } else {
      x = layer_forward(c, x);
    }
  }
  return rms_norm(x, w.norm, m.arch.rms_eps);
}

}  // namespace ort
