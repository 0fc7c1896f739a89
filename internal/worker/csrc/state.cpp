// state.cpp: the model's named tensors, by kind (ORT_KIND_*). Weights are
// addressed by HF name, LoRA adapters by PEFT name, AdamW state as
// "exp_avg.<name>" / "exp_avg_sq.<name>" / "step", gradients by the name of
// their trainable tensor. Reads and writes by name are map lookups; listings
// are built once and kept until the set of tensors may have changed.
#include <sstream>
#include <stdexcept>

#include "model.h"

namespace ort {

namespace {

std::string shape_str(at::IntArrayRef s) {
  std::ostringstream o;
  o << "[";
  for (size_t i = 0; i < s.size(); i++) o << (i ? ", " : "") << s[i];
  o << "]";
  return o.str();
}

bool ends_with(const std::string& s, const std::string& suf) {
  return s.size() >= suf.size() && s.compare(s.size() - suf.size(), suf.size(), suf) == 0;
}

bool starts_with(const std::string& s, const std::string& pre) { return s.rfind(pre, 0) == 0; }

void check_kind(int32_t kind) {
  if (kind < ORT_KIND_WEIGHT || kind > ORT_KIND_GRAD) throw std::runtime_error("unknown tensor kind " + std::to_string(kind));
}

void check_shape(const std::string& name, const at::Tensor& src, at::IntArrayRef want, const char* source) {
  if (src.sizes() != want) {
    throw std::runtime_error("tensor " + name + " has shape " + shape_str(src.sizes()) + ", " + source + " " +
                             shape_str(want));
  }
}

// find_param returns the trainable tensor called name (or a PEFT alias of
// it), or nullptr.
at::Tensor* find_param(Model& m, const std::string& name) {
  auto it = m.param_index.find(name);
  if (it == m.param_index.end()) {
    auto alias = m.saved_alias.find(name);
    if (alias != m.saved_alias.end()) it = m.param_index.find(alias->second);
  }
  return it == m.param_index.end() ? nullptr : &m.params[it->second].second;
}

// optim_state splits "exp_avg.<name>" / "exp_avg_sq.<name>" into its state
// map and the trainable name; nullptr when name has neither prefix.
std::map<std::string, at::Tensor>* optim_state(Model& m, const std::string& name, std::string* stem) {
  static const std::string avg = "exp_avg.", avg_sq = "exp_avg_sq.";
  if (starts_with(name, avg_sq)) {
    *stem = name.substr(avg_sq.size());
    return &m.exp_avg_sq;
  }
  if (starts_with(name, avg)) {
    *stem = name.substr(avg.size());
    return &m.exp_avg;
  }
  return nullptr;
}

at::Tensor step_tensor(const Model& m) { return at::full({1}, m.step, at::TensorOptions().dtype(at::kLong)); }

// merged returns a weight with its LoRA adapter folded in, for HF export.
at::Tensor merged(Model& m, const std::string& name, const at::Tensor& w) {
  if (!ends_with(name, ".weight")) return w;
  auto it = m.lora.find(name.substr(0, name.size() - 7));
  if (it == m.lora.end()) return w;
  return w + at::matmul(it->second.b, it->second.a) * m.lora_scale;
}

// staged_tensor is a read of a weight or trainable tensor of a stage-3
// model: from the unit ort_group_gather_unit gathered last.
at::Tensor staged_tensor(Model& m, int32_t kind, const std::string& name) {
  const auto& st = m.shard.staged;
  auto find = [&](const std::string& n) -> const at::Tensor* {
    auto it = st.find(n);
    return it == st.end() ? nullptr : &it->second;
  };
  const at::Tensor* t = nullptr;
  if (kind == ORT_KIND_WEIGHT) {
    if (m.opts.lora_rank <= 0) {
      t = find(name);
    } else if ((t = find("base_model.model." + name)) == nullptr && (t = find(name)) != nullptr &&
               ends_with(name, ".weight")) {
      const auto module = "base_model.model." + name.substr(0, name.size() - 7);
      const auto *a = find(module + ".lora_A.weight"), *b = find(module + ".lora_B.weight");
      if (a != nullptr && b != nullptr) return *t + at::matmul(*b, *a) * m.lora_scale;
    }
  } else if (kind == ORT_KIND_LORA && m.opts.lora_rank > 0) {
    auto alias = m.saved_alias.find(name);
    t = find(alias != m.saved_alias.end() ? alias->second : name);
  }
  if (t != nullptr) return *t;
  const bool known = kind == ORT_KIND_WEIGHT ? m.expected_shapes.count(name) != 0
                                             : m.param_index.count(name) != 0 || m.saved_alias.count(name) != 0;
  if (!known) throw std::runtime_error("no tensor named " + name);
  throw std::runtime_error("tensor " + name + " is sharded over the process group's ranks (worker.shard: parameters)" +
                           (m.shard.staged_unit < 0 ? std::string() : " and not in the unit gathered last") +
                           ": gather its unit first (ort_group_gather_unit)");
}

// find_tensor returns the stored tensor a read of (kind, name) starts from.
at::Tensor find_tensor(Model& m, int32_t kind, const std::string& name) {
  if (m.shard.sliced && (kind == ORT_KIND_WEIGHT || kind == ORT_KIND_LORA)) return staged_tensor(m, kind, name);
  switch (kind) {
    case ORT_KIND_WEIGHT: {
      if (auto sv = m.saved.find(name); sv != m.saved.end()) return sv->second;  // trained in full
      auto it = m.weights.find(name);
      if (it != m.weights.end()) return merged(m, name, it->second);
      break;
    }
    case ORT_KIND_LORA:
      if (m.opts.lora_rank <= 0) break;
      if (auto* p = find_param(m, name)) return *p;
      break;
    case ORT_KIND_OPTIM: {
      if (name == "step") return step_tensor(m);
      std::string stem;
      auto* state = optim_state(m, name, &stem);
      const ShardBucket* b = nullptr;
      const ShardPiece* p = nullptr;
      if (state != nullptr && find_shard_piece(m, stem, &b, &p) && m.shard.has_state[p->param] && b->exp_avg.defined()) {
        return (state == &m.exp_avg ? b->exp_avg : b->exp_avg_sq).narrow(0, p->slice_off, p->len);
      }
      if (state == nullptr && name.rfind("param.", 0) == 0 && params_sharded(m) &&
          find_shard_piece(m, name.substr(6), &b, &p)) {  // stage 3: this rank's slice of the parameter itself
        return shard_param_piece(m, *b, *p);
      }
      if (state == nullptr || m.param_index.count(stem) == 0) break;
      auto it = state->find(stem);
      if (it != state->end()) return it->second;
      break;
    }
    case ORT_KIND_GRAD: {  // by the trainable tensor's name, or its piece's (stage 2)
      const ShardBucket* b = nullptr;
      const ShardPiece* p = nullptr;
      if (m.shard.stage >= ORT_SHARD_GRADIENTS && find_shard_piece(m, name, &b, &p)) {
        if (b->grad.defined()) return b->grad.narrow(0, p->slice_off, p->len);
        return at::zeros({p->len}, m.params[p->param].second.options());
      }
      if (m.param_index.count(name) == 0) break;
      if (auto* p = find_param(m, name)) return p->grad().defined() ? p->grad() : at::zeros_like(*p);
      break;
    }
  }
  throw std::runtime_error("no tensor named " + name);
}

void write_weight(Model& m, const std::string& name, const at::Tensor& src) {
  auto e = m.expected_shapes.find(name);
  if (e == m.expected_shapes.end()) {
    if (ends_with(name, "rotary_emb.inv_freq")) return;          // recomputed from config
    if (name == "lm_head.weight" && m.arch.tie_embeddings) return;  // tied to the embedding
    throw std::runtime_error("unexpected tensor " + name +
                             " (not part of a Llama/Qwen-family model with this config.json)");
  }
  check_shape(name, src, e->second, "config.json implies");
  at::NoGradGuard ng;
  auto it = m.weights.find(name);
  if (it != m.weights.end()) {
    it->second.detach().copy_(src);  // in place: keeps views and optimizer state valid
  } else {
    m.weights[name] = src.to(m.device, m.dtype).clone();
  }
}

std::vector<TensorMeta> build_listing(Model& m, int32_t kind) {
  std::vector<TensorMeta> out;
  auto add = [&](const std::string& name, const at::Tensor& t) {
    out.push_back({name, t.scalar_type(), t.sizes().vec()});
  };
  switch (kind) {
    case ORT_KIND_WEIGHT:
      for (const auto& n : m.names) {
        auto it = m.weights.find(n);
        if (it == m.weights.end()) throw std::runtime_error("tensor " + n + " is not loaded yet");
        add(n, it->second);
      }
      break;
    case ORT_KIND_LORA:
      if (m.opts.lora_rank > 0) {
        for (const auto& p : m.params) add(p.first, p.second);
        for (const auto& a : m.saved_alias) add(a.first, m.params[m.param_index.at(a.second)].second);
      }
      break;
    case ORT_KIND_OPTIM:
      add("step", step_tensor(m));
      if (m.shard.stage != ORT_SHARD_NONE) {  // this rank's slices, by piece
        shard_absorb_state(m);
        for (const auto& b : m.shard.buckets) {
          if (!b.exp_avg.defined()) continue;
          for (const auto& p : b.pieces) {
            if (!m.shard.has_state[p.param]) continue;
            add("exp_avg." + shard_piece_name(m, p), b.exp_avg.narrow(0, p.slice_off, p.len));
            add("exp_avg_sq." + shard_piece_name(m, p), b.exp_avg_sq.narrow(0, p.slice_off, p.len));
          }
        }
        if (params_sharded(m)) {  // stage 3: the parameters' slices too, so a checkpoint needs no collective
          for (const auto& b : m.shard.buckets) {
            for (const auto& p : b.pieces) add("param." + shard_piece_name(m, p), shard_param_piece(m, b, p));
          }
        }
        break;
      }
      for (const auto& p : m.params) {
        auto a = m.exp_avg.find(p.first);
        auto b = m.exp_avg_sq.find(p.first);
        if (a != m.exp_avg.end()) add("exp_avg." + p.first, a->second);
        if (b != m.exp_avg_sq.end()) add("exp_avg_sq." + p.first, b->second);
      }
      break;
    case ORT_KIND_GRAD:  // the parameters themselves: same names and shapes
      if (m.shard.stage >= ORT_SHARD_GRADIENTS) {  // stages 2 and 3 keep this rank's slices only
        for (const auto& b : m.shard.buckets) {
          for (const auto& p : b.pieces) {
            const auto& t = b.grad.defined() ? b.grad : m.params[p.param].second;
            out.push_back({shard_piece_name(m, p), t.scalar_type(), {p.len}});
          }
        }
        break;
      }
      for (const auto& p : m.params) add(p.first, p.second);
      break;
  }
  return out;
}

}  // namespace

void need_finalized(const Model& m) {
  if (!m.finalized) throw std::runtime_error("model not finalized: call ort_model_finalize after loading weights");
}

void index_weights(Model& m) {
  m.names.clear();
  m.expected_shapes.clear();
  for (auto& e : expected_weights(m.arch)) {
    m.names.push_back(e.first);
    m.expected_shapes.emplace(e.first, std::move(e.second));
  }
}

void index_trainable(Model& m) {
  m.params.clear();
  m.param_index.clear();
  if (m.opts.lora_rank <= 0) {
    for (const auto& n : m.names) m.params.push_back({n, m.weights.at(n)});
  } else {
    for (auto& kv : m.lora) {
      m.params.push_back({"base_model.model." + kv.first + ".lora_A.weight", kv.second.a});
      m.params.push_back({"base_model.model." + kv.first + ".lora_B.weight", kv.second.b});
    }
    // modules_to_save under PEFT's saved key: get_peft_model_state_dict
    // drops "modules_to_save.<adapter>." from the wrapper's parameter name,
    // leaving base_model.model.<HF name>.
    for (auto& kv : m.saved) m.params.push_back({"base_model.model." + kv.first, kv.second});
  }
  for (size_t i = 0; i < m.params.size(); i++) m.param_index.emplace(m.params[i].first, i);
  forget_listings(m);
}

NamedTensors& trainable(Model& m) { return m.params; }

const std::vector<TensorMeta>& list_tensors(Model& m, int32_t kind, bool refresh) {
  check_kind(kind);
  auto it = m.listings.find(kind);
  if (it == m.listings.end() || refresh) {
    auto list = build_listing(m, kind);
    it = m.listings.insert_or_assign(kind, std::move(list)).first;
  }
  return it->second;
}

void forget_listings(Model& m) { m.listings.clear(); }

at::Tensor read_tensor(Model& m, int32_t kind, const std::string& name) {
  check_kind(kind);
  at::NoGradGuard ng;
  return find_tensor(m, kind, name).detach().to(at::kCPU).contiguous();
}

void write_tensor(Model& m, int32_t kind, const std::string& name, const at::Tensor& src) {
  check_kind(kind);
  if (kind != ORT_KIND_OPTIM) need_full_weights(m, "write tensor " + name);
  forget_listings(m);
  m.weights_version++;
  if (kind == ORT_KIND_WEIGHT) return write_weight(m, name, src);
  need_finalized(m);
  at::NoGradGuard ng;
  if (kind == ORT_KIND_OPTIM) {
    if (name == "step") {
      m.step = src.to(at::kLong).item<int64_t>();
      return;
    }
    std::string stem;
    auto* state = optim_state(m, name, &stem);
    const at::Tensor* p = state != nullptr && m.param_index.count(stem) != 0 ? find_param(m, stem) : nullptr;
    if (p != nullptr) {
      check_shape(name, src, p->sizes(), "expected");
      (*state)[stem] = src.to(p->device(), p->scalar_type()).clone();
      return;
    }
  } else if (kind == ORT_KIND_LORA && m.opts.lora_rank > 0) {
    if (auto* p = find_param(m, name)) {
      check_shape(name, src, p->sizes(), "expected");
      p->detach().copy_(src);
      return;
    }
  }
  throw std::runtime_error("unexpected tensor " + name + " for tensor kind " + std::to_string(kind));
}

}  // namespace ort
