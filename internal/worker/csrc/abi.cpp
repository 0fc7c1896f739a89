// abi.cpp: the C entry points. Each one runs its body inside guard(), which
// turns every C++ exception (c10::Error from TORCH_CHECK included) into an
// error string, so nothing ever unwinds into Go.
#include <ATen/CPUGeneratorImpl.h>
#include <ATen/Parallel.h>
#include <ATen/detail/CUDAHooksInterface.h>

#include <cstring>
#include <memory>
#include <sstream>
#include <stdexcept>

#include "model.h"

struct ort_model {
  ort::Model m;
};

namespace {

void write_err(char* err, size_t n, const char* msg) {
  if (err == nullptr || n == 0) return;
  std::strncpy(err, msg, n - 1);
  err[n - 1] = '\0';
}

template <class F>
int guard(char* err, size_t n, F&& f) {
  try {
    f();
    return 0;
  } catch (const c10::Error& e) {
    write_err(err, n, e.what_without_backtrace());
  } catch (const std::exception& e) {
    write_err(err, n, e.what());
  } catch (...) {
    write_err(err, n, "unknown C++ exception");
  }
  return 1;
}

at::ScalarType scalar_type(int32_t d) {
  switch (d) {
    case ORT_F32: return at::kFloat;
    case ORT_BF16: return at::kBFloat16;
    case ORT_F16: return at::kHalf;
    case ORT_F64: return at::kDouble;
    case ORT_I64: return at::kLong;
  }
  throw std::runtime_error("unknown dtype code " + std::to_string(d));
}

int32_t dtype_code(at::ScalarType t) {
  switch (t) {
    case at::kFloat: return ORT_F32;
    case at::kBFloat16: return ORT_BF16;
    case at::kHalf: return ORT_F16;
    case at::kDouble: return ORT_F64;
    case at::kLong: return ORT_I64;
    default: break;
  }
  throw std::runtime_error("tensor has unsupported dtype");
}

std::string shape_str(at::IntArrayRef s) {
  std::ostringstream o;
  o << "[";
  for (size_t i = 0; i < s.size(); i++) o << (i ? ", " : "") << s[i];
  o << "]";
  return o.str();
}

ort::Model& model(ort_model* h) {
  if (h == nullptr) throw std::runtime_error("nil model handle");
  return h->m;
}

void need_finalized(const ort::Model& m) {
  if (!m.finalized) throw std::runtime_error("model not finalized: call ort_model_finalize after loading weights");
}

bool ends_with(const std::string& s, const std::string& suf) {
  return s.size() >= suf.size() && s.compare(s.size() - suf.size(), suf.size(), suf) == 0;
}

// named lists every tensor of a kind, in a stable order.
std::vector<std::pair<std::string, at::Tensor>> named(ort::Model& m, int32_t kind) {
  std::vector<std::pair<std::string, at::Tensor>> out;
  switch (kind) {
    case ORT_KIND_WEIGHT:
      for (const auto& n : m.names) out.push_back({n, m.weights.at(n)});
      return out;
    case ORT_KIND_LORA:
      if (m.opts.lora_rank > 0) out = ort::trainable(m);
      return out;
    case ORT_KIND_OPTIM: {
      auto step = at::full({1}, m.step, at::TensorOptions().dtype(at::kLong));
      out.push_back({"step", step});
      for (auto& p : ort::trainable(m)) {
        auto a = m.exp_avg.find(p.first);
        auto b = m.exp_avg_sq.find(p.first);
        if (a != m.exp_avg.end()) out.push_back({"exp_avg." + p.first, a->second});
        if (b != m.exp_avg_sq.end()) out.push_back({"exp_avg_sq." + p.first, b->second});
      }
      return out;
    }
    case ORT_KIND_GRAD:  // the parameters themselves: same names and shapes; get reads .grad()
      return ort::trainable(m);
  }
  throw std::runtime_error("unknown tensor kind " + std::to_string(kind));
}

// merged returns a weight with its LoRA adapter folded in, for HF export.
at::Tensor merged(ort::Model& m, const std::string& name, const at::Tensor& w) {
  if (!ends_with(name, ".weight")) return w;
  auto it = m.lora.find(name.substr(0, name.size() - 7));
  if (it == m.lora.end()) return w;
  return w + at::matmul(it->second.b, it->second.a) * m.lora_scale;
}

void set_weight(ort::Model& m, const std::string& name, const at::Tensor& src) {
  const auto expected = ort::expected_weights(m.arch);
  for (const auto& e : expected) {
    if (e.first != name) continue;
    if (src.sizes() != at::IntArrayRef(e.second)) {
      throw std::runtime_error("tensor " + name + " has shape " + shape_str(src.sizes()) + ", config.json implies " +
                               shape_str(e.second));
    }
    at::NoGradGuard ng;
    auto it = m.weights.find(name);
    if (it != m.weights.end()) {
      it->second.detach().copy_(src);  // in place: keeps views and optimizer state valid
    } else {
      m.weights[name] = src.to(m.device, m.dtype).clone();
    }
    return;
  }
  if (ends_with(name, "rotary_emb.inv_freq")) return;          // recomputed from config
  if (name == "lm_head.weight" && m.arch.tie_embeddings) return;  // tied to the embedding
  throw std::runtime_error("unexpected tensor " + name + " (not part of a Llama/Qwen-family model with this config.json)");
}

void set_named(ort::Model& m, int32_t kind, const std::string& name, const at::Tensor& src) {
  if (kind == ORT_KIND_WEIGHT) return set_weight(m, name, src);
  need_finalized(m);
  at::NoGradGuard ng;
  if (kind == ORT_KIND_OPTIM && name == "step") {
    m.step = src.to(at::kLong).item<int64_t>();
    return;
  }
  for (auto& p : ort::trainable(m)) {
    std::string stem = name;
    std::map<std::string, at::Tensor>* state = nullptr;
    if (kind == ORT_KIND_OPTIM) {
      if (name.rfind("exp_avg_sq.", 0) == 0) {
        stem = name.substr(11);
        state = &m.exp_avg_sq;
      } else if (name.rfind("exp_avg.", 0) == 0) {
        stem = name.substr(8);
        state = &m.exp_avg;
      }
    } else if (kind != ORT_KIND_LORA) {
      break;
    }
    if (stem != p.first) continue;
    if (src.sizes() != p.second.sizes()) {
      throw std::runtime_error("tensor " + name + " has shape " + shape_str(src.sizes()) + ", expected " +
                               shape_str(p.second.sizes()));
    }
    if (state != nullptr) {
      (*state)[stem] = src.to(p.second.device(), p.second.scalar_type()).clone();
    } else {
      p.second.detach().copy_(src);
    }
    return;
  }
  throw std::runtime_error("unexpected tensor " + name + " for tensor kind " + std::to_string(kind));
}

}  // namespace

extern "C" {

int ort_abi_version(void) { return ORT_ABI_VERSION; }

int ort_info(char* json, size_t json_len, char* err, size_t err_len) {
  return guard(err, err_len, [&] {
    std::ostringstream o;
    o << "{\"libtorch\":\"" << TORCH_VERSION_MAJOR << "." << TORCH_VERSION_MINOR << "." << TORCH_VERSION_PATCH
      << "\",\"cuda_devices\":" << at::detail::getCUDAHooks().getNumGPUs() << ",\"threads\":" << at::get_num_threads()
      << ",\"cxx11_abi\":" << _GLIBCXX_USE_CXX11_ABI << "}";
    const auto s = o.str();
    if (s.size() + 1 > json_len) throw std::runtime_error("info buffer too small");
    std::memcpy(json, s.c_str(), s.size() + 1);
  });
}

int ort_model_new(const ort_arch* arch, const ort_model_options* opts, ort_model** out, char* err, size_t err_len) {
  return guard(err, err_len, [&] {
    const auto& a = *arch;
    if (a.vocab_size <= 0 || a.hidden_size <= 0 || a.intermediate_size <= 0 || a.num_layers <= 0 || a.head_dim <= 0 ||
        a.head_dim % 2 != 0 || a.num_heads <= 0 || a.num_kv_heads <= 0 || a.num_heads % a.num_kv_heads != 0) {
      throw std::runtime_error("invalid architecture: sizes must be positive, head_dim even, num_attention_heads a multiple of num_key_value_heads");
    }
    auto h = std::make_unique<ort_model>();
    auto& m = h->m;
    m.arch = a;
    m.opts = *opts;
    m.device_str = opts->device ? opts->device : "cpu";
    m.lora_targets = opts->lora_targets ? opts->lora_targets : "";
    m.opts.device = nullptr;
    m.opts.lora_targets = nullptr;
    m.device = at::Device(m.device_str);
    if (m.device.is_cuda() && m.device.index() >= at::detail::getCUDAHooks().getNumGPUs()) {
      throw std::runtime_error("device " + m.device_str + " is not available (CUDA devices: " +
                               std::to_string(at::detail::getCUDAHooks().getNumGPUs()) + ")");
    }
    if (m.device.is_cuda() && opts->lora_dropout > 0 && opts->grad_checkpointing) {
      throw std::runtime_error("lora_dropout > 0 with gradient checkpointing is supported on CPU only (recomputation must replay the dropout masks)");
    }
    m.dtype = scalar_type(opts->dtype);
    if (m.dtype == at::kLong) throw std::runtime_error("dtype int64 is not a model dtype");
#if !ORT_TORCH_AT_LEAST(2, 1)
    if (m.dtype == at::kHalf && !m.device.is_cuda()) {
      throw std::runtime_error("dtype float16 on CPU needs libtorch >= 2.1 (this is " + std::to_string(TORCH_VERSION_MAJOR) + "." +
                               std::to_string(TORCH_VERSION_MINOR) + "); use float32 or bfloat16");
    }
#endif
    if (opts->threads > 0) at::set_num_threads(opts->threads);
    m.gen = at::detail::createCPUGenerator(static_cast<uint64_t>(opts->seed));
    for (const auto& e : ort::expected_weights(a)) m.names.push_back(e.first);
    *out = h.release();
  });
}

void ort_model_free(ort_model* m) {
  try {
    delete m;
  } catch (...) {
  }
}

int ort_model_set_tensor(ort_model* h, int32_t kind, const char* name, int32_t dtype, const int64_t* shape,
                         int32_t ndim, const void* data, char* err, size_t err_len) {
  return guard(err, err_len, [&] {
    auto& m = model(h);
    std::vector<int64_t> dims(shape, shape + ndim);
    auto src = at::from_blob(const_cast<void*>(data), dims, at::TensorOptions().dtype(scalar_type(dtype)));
    set_named(m, kind, name, src);
  });
}

int ort_model_finalize(ort_model* h, char* err, size_t err_len) {
  return guard(err, err_len, [&] { ort::finalize(model(h)); });
}

int ort_model_tensor_count(ort_model* h, int32_t kind, int32_t* count, char* err, size_t err_len) {
  return guard(err, err_len, [&] { *count = static_cast<int32_t>(named(model(h), kind).size()); });
}

int ort_model_tensor_info(ort_model* h, int32_t kind, int32_t index, char* name, size_t name_len, int32_t* dtype,
                          int64_t* shape, int32_t* ndim, char* err, size_t err_len) {
  return guard(err, err_len, [&] {
    auto list = named(model(h), kind);
    if (index < 0 || static_cast<size_t>(index) >= list.size()) throw std::runtime_error("tensor index out of range");
    const auto& e = list[index];
    if (e.first.size() + 1 > name_len) throw std::runtime_error("name buffer too small for " + e.first);
    std::memcpy(name, e.first.c_str(), e.first.size() + 1);
    if (e.second.dim() > 8) throw std::runtime_error("tensor " + e.first + " has more than 8 dims");
    *dtype = dtype_code(e.second.scalar_type());
    *ndim = static_cast<int32_t>(e.second.dim());
    for (int64_t i = 0; i < e.second.dim(); i++) shape[i] = e.second.size(i);
  });
}

int ort_model_get_tensor(ort_model* h, int32_t kind, const char* name, void* out, size_t nbytes, char* err,
                         size_t err_len) {
  return guard(err, err_len, [&] {
    auto& m = model(h);
    at::NoGradGuard ng;
    for (auto& e : named(m, kind)) {
      if (e.first != name) continue;
      auto t = e.second;
      if (kind == ORT_KIND_WEIGHT) t = merged(m, e.first, e.second);
      if (kind == ORT_KIND_GRAD) t = e.second.grad().defined() ? e.second.grad() : at::zeros_like(e.second);
      t = t.detach().to(at::kCPU).contiguous();
      if (static_cast<size_t>(t.nbytes()) != nbytes) {
        throw std::runtime_error("tensor " + e.first + " needs " + std::to_string(t.nbytes()) + " bytes, buffer has " +
                                 std::to_string(nbytes));
      }
      std::memcpy(out, t.data_ptr(), nbytes);
      return;
    }
    throw std::runtime_error(std::string("no tensor named ") + name);
  });
}

int ort_logprobs(ort_model* h, const ort_batch* b, double temperature, int32_t reference, float* logps,
                 float* entropies, const volatile int32_t* cancel, char* err, size_t err_len) {
  return guard(err, err_len, [&] {
    auto& m = model(h);
    need_finalized(m);
    at::NoGradGuard ng;
    auto bt = ort::decode_batch(m, b);
    auto r = ort::token_logprobs(m, bt, temperature, reference != 0, cancel);
    auto lp = r[0].to(at::kCPU, at::kFloat).contiguous();
    auto en = r[1].to(at::kCPU, at::kFloat).contiguous();
    std::memcpy(logps, lp.data_ptr<float>(), lp.numel() * sizeof(float));
    std::memcpy(entropies, en.data_ptr<float>(), en.numel() * sizeof(float));
  });
}

int ort_forward_backward(ort_model* h, const ort_batch* b, const ort_loss_config* cfg, int32_t backward,
                         ort_loss_stats* stats, const volatile int32_t* cancel, char* err, size_t err_len) {
  return guard(err, err_len, [&] {
    auto& m = model(h);
    need_finalized(m);
    *stats = ort_loss_stats{};
    ort::forward_backward(m, b, *cfg, backward != 0, stats, cancel);
  });
}

int ort_optimizer_step(ort_model* h, double lr, double* grad_norm, char* err, size_t err_len) {
  return guard(err, err_len, [&] {
    auto& m = model(h);
    need_finalized(m);
    *grad_norm = ort::optimizer_step(m, lr);
  });
}

int ort_zero_grad(ort_model* h, char* err, size_t err_len) {
  return guard(err, err_len, [&] { ort::zero_grad(model(h)); });
}

int ort_sample(ort_model* h, const ort_sample_request* reqs, int32_t n, ort_sample_result* out,
               const volatile int32_t* cancel, char* err, size_t err_len) {
  return guard(err, err_len, [&] {
    auto& m = model(h);
    need_finalized(m);
    ort::sample(m, reqs, n, out, cancel);
  });
}

}  // extern "C"
