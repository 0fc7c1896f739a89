// param_layout.cpp: ZeRO stage 3's layout (param_shard.cpp runs the
// passes over it). A model is cut into units in forward order (the
// embedding, each decoder layer, the final norm, the LM head); each rank
// keeps 1/P of every unit's flattened trainable tensors (a ShardBucket) and
// of its frozen ones (LoRA base weights, the reference copy). The full
// tensors are sliced away at the first pass, their handles left holding
// one-element placeholders of the same shape.
#include <algorithm>
#include <stdexcept>
#include <string>
#include <vector>

#include "collective.h"  // first: model.h defines ORT_TORCH_AT_LEAST

namespace ort {

namespace {

const std::string kPeft = kPeftPrefix;

void cut(int64_t numel, int rank, int size, int64_t* chunk, int64_t* lo, int64_t* hi) {
  *chunk = std::max<int64_t>(1, (numel + size - 1) / size);
  *lo = std::min(numel, rank * *chunk);
  *hi = std::min(numel, (rank + 1) * *chunk);
}

FrozenSlice frozen_slice(const Model& m, const std::vector<std::string>& names, int rank, int size) {
  FrozenSlice f;
  f.names = names;
  for (const auto& n : names) {
    const auto& shape = m.expected_shapes.at(n);
    int64_t k = 1;
    for (auto d : shape) k *= d;
    f.numel += k;
  }
  cut(f.numel, rank, size, &f.chunk, &f.lo, &f.hi);
  return f;
}

// trainable_in returns the trainable tensors of a unit covering names, in
// flattening order: the weights themselves (full fine-tuning), else each
// projection's LoRA pair and the modules_to_save copies.
std::vector<size_t> trainable_in(const Model& m, const std::vector<std::string>& names) {
  std::vector<size_t> out;
  auto add = [&](const std::string& name) {
    auto it = m.param_index.find(name);
    if (it != m.param_index.end()) out.push_back(it->second);
  };
  for (const auto& n : names) {
    if (m.opts.lora_rank <= 0) {
      add(n);
      continue;
    }
    const std::string suffix = ".weight";
    if (n.size() > suffix.size() && n.compare(n.size() - suffix.size(), suffix.size(), suffix) == 0) {
      const auto module = n.substr(0, n.size() - suffix.size());
      if (m.lora.count(module) != 0) {
        add(kPeft + module + ".lora_A.weight");
        add(kPeft + module + ".lora_B.weight");
      }
    }
    if (m.saved.count(n) != 0) add(kPeft + n);
  }
  return out;
}

ShardBucket bucket_of(Model& m, const std::vector<size_t>& params, int rank, int size) {
  ShardBucket sb;
  sb.params = params;
  for (auto i : params) sb.numel += m.params[i].second.numel();
  cut(sb.numel, rank, size, &sb.chunk, &sb.lo, &sb.hi);
  int64_t off = 0;
  for (auto i : params) {
    const int64_t n = m.params[i].second.numel();
    const int64_t a = std::max(off, sb.lo), z = std::min(off + n, sb.hi);
    if (a < z) sb.pieces.push_back({i, a - off, z - a, a - sb.lo});
    off += n;
  }
  return sb;
}

// placeholder keeps a tensor's dtype and shape in one element, so listings
// and autograd metadata stay as they were while the data lives in slices.
at::Tensor placeholder(const at::Tensor& t) {
  return at::zeros({1}, t.options().requires_grad(false)).expand(t.sizes());
}

at::Tensor flat_of(const std::vector<at::Tensor>& ts) {
  std::vector<at::Tensor> parts;
  for (const auto& t : ts) parts.push_back(t.detach().reshape({-1}));
  return at::cat(parts);
}

}  // namespace

// slice_params cuts every unit's slices out of the full tensors, then drops
// the full tensors (their handles keep placeholders).
void slice_params(Model& m) {
  at::NoGradGuard ng;
  auto& sh = m.shard;
  for (auto& u : sh.units) {
    if (u.bucket != SIZE_MAX) {
      auto& b = sh.buckets[u.bucket];
      std::vector<at::Tensor> ts;
      for (auto i : b.params) ts.push_back(m.params[i].second);
      b.data = flat_of(ts).narrow(0, b.lo, b.hi - b.lo).clone();
    }
    for (auto* f : {&u.base, &u.ref}) {
      if (f->names.empty()) continue;
      auto& src = f == &u.ref ? m.ref_weights : m.weights;
      std::vector<at::Tensor> ts;
      for (const auto& n : f->names) ts.push_back(src.at(n));
      f->data = flat_of(ts).narrow(0, f->lo, f->hi - f->lo).clone();
    }
  }
  for (auto* w : {&m.weights, &m.ref_weights, &m.saved}) {
    for (auto& kv : *w) kv.second.set_data(placeholder(kv.second));
  }
  for (auto& kv : m.lora) {
    kv.second.a.set_data(placeholder(kv.second.a));
    kv.second.b.set_data(placeholder(kv.second.b));
  }
  for (auto& p : m.params) p.second.mutable_grad() = at::Tensor();
  sh.sliced = true;
  m.weights_version++;
  forget_listings(m);
}


Shard build_param_shard(Model& m, int rank, int size) {
  Shard sh;
  sh.stage = ORT_SHARD_PARAMETERS;
  sh.rank = rank;
  sh.size = size;
  sh.has_state.assign(m.params.size(), 0);
  sh.has_grad.assign(m.params.size(), 0);
  const auto expected = expected_weights(m.arch);
  auto unit = [&](const std::string& what, int layer, std::vector<std::string> names) {
    ParamUnit u;
    u.what = what;
    u.layer = layer;
    u.names = std::move(names);
    const auto params = trainable_in(m, u.names);
    if (!params.empty()) {
      u.bucket = sh.buckets.size();
      sh.buckets.push_back(bucket_of(m, params, rank, size));
    }
    if (m.opts.lora_rank > 0) u.base = frozen_slice(m, u.names, rank, size);
    if (m.opts.lora_rank <= 0 && m.opts.reference) u.ref = frozen_slice(m, u.names, rank, size);
    sh.units.push_back(std::move(u));
  };
  unit("embedding", -1, {"model.embed_tokens.weight"});
  for (int i = 0; i < m.arch.num_layers; i++) {
    const auto prefix = layer_prefix(i);
    std::vector<std::string> names;
    for (const auto& e : expected) {
      if (e.first.rfind(prefix, 0) == 0) names.push_back(e.first);
    }
    unit("layer " + std::to_string(i), i, names);
  }
  unit("norm", -1, {"model.norm.weight"});
  if (!m.arch.tie_embeddings) unit("lm_head", -1, {"lm_head.weight"});
  std::vector<uint8_t> covered(m.params.size(), 0);
  for (const auto& b : sh.buckets) {
    for (auto i : b.params) covered[i]++;
  }
  for (size_t i = 0; i < covered.size(); i++) {
    if (covered[i] != 1) throw std::runtime_error("stage 3 layout: trainable tensor " + m.params[i].first + " is in " +
                                                  std::to_string(covered[i]) + " units (want 1)");
  }
  return sh;
}

void bind_param_group(Group& g, Model& m) {
  if (g.param_model != nullptr && g.param_model != &m) {
    throw std::runtime_error("this group already shards another model's parameters");
  }
  g.param_model = &m;
  m.shard.group = &g;
}

void unbind_param_group(Group& g) {
  if (g.param_model != nullptr) g.param_model->shard.group = nullptr;
  g.param_model = nullptr;
}

void unbind_param_model(Model& m) {
  if (m.shard.group != nullptr) m.shard.group->param_model = nullptr;
  m.shard.group = nullptr;
}

void need_full_weights(const Model& m, const std::string& what) {
  if (m.shard.sliced) {
    throw std::runtime_error(what + ": the model's parameters are sharded over its process group (worker.shard: "
                                    "parameters), so no rank holds them whole; sample from a copy synced from it");
  }
}

at::Tensor shard_param_piece(Model& m, const ShardBucket& b, const ShardPiece& p) {
  if (m.shard.sliced) return b.data.narrow(0, p.slice_off, p.len);
  return m.params[p.param].second.detach().reshape({-1}).narrow(0, p.param_off, p.len);
}

ort_shard_memory shard_memory(Model& m, bool reset_peak) {
  ort_shard_memory out{};
  auto& sh = m.shard;
  auto bytes = [](const at::Tensor& t) { return t.defined() ? static_cast<int64_t>(t.nbytes()) : int64_t{0}; };
  if (sh.sliced) {
    for (const auto& b : sh.buckets) out.param_bytes += bytes(b.data);
    for (const auto& u : sh.units) out.param_bytes += bytes(u.base.data) + bytes(u.ref.data);
  } else {
    for (const auto* w : {&m.weights, &m.ref_weights, &m.saved}) {
      for (const auto& kv : *w) out.param_bytes += bytes(kv.second);
    }
    for (const auto& kv : m.lora) out.param_bytes += bytes(kv.second.a) + bytes(kv.second.b);
  }
  for (const auto& p : m.params) out.grad_bytes += bytes(p.second.grad());
  for (const auto& b : sh.buckets) {
    out.grad_bytes += bytes(b.grad);
    out.optim_bytes += bytes(b.exp_avg) + bytes(b.exp_avg_sq);
  }
  for (const auto* s : {&m.exp_avg, &m.exp_avg_sq}) {
    for (const auto& kv : *s) out.optim_bytes += bytes(kv.second);
  }
  out.gathered_bytes = sh.gathered_bytes;
  out.peak_gathered_bytes = sh.peak_gathered_bytes;
  if (reset_peak) sh.peak_gathered_bytes = sh.gathered_bytes;
  return out;
}

}  // namespace ort
