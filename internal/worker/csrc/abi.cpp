// abi.cpp: the C entry points. Each one checks its arguments and caller
// buffers and runs its body inside guard(), which turns every C++ exception
// (c10::Error from TORCH_CHECK included) into an error string and a return
// code (ORT_ERR_TIMEOUT for ort::TimeoutError), so nothing ever unwinds into
// Go. The model's state lives in state.cpp.
#include <ATen/CPUGeneratorImpl.h>
#include <ATen/Parallel.h>
#include <ATen/detail/CUDAHooksInterface.h>

#include <algorithm>
#include <cstdio>
#include <cstring>
#include <memory>
#include <sstream>
#include <stdexcept>
#include <string>

#include "dist.h"
#include "model.h"

struct ort_model {
  ort::Model m;
};

struct ort_group {
  ort::Group* g;
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
    return ORT_OK;
  } catch (const ort::TimeoutError& e) {
    write_err(err, n, e.what());
    return ORT_ERR_TIMEOUT;
  } catch (const c10::Error& e) {
    write_err(err, n, e.what_without_backtrace());
  } catch (const std::exception& e) {
    write_err(err, n, e.what());
  } catch (...) {
    write_err(err, n, "unknown C++ exception");
  }
  return ORT_ERR;
}

// json_str quotes s as a JSON string, cut to 400 bytes (ort_info's reader
// has a fixed buffer; a store's error can be long).
std::string json_str(std::string s) {
  if (s.size() > 400) s = s.substr(0, 400) + "...";
  std::string out = "\"";
  for (unsigned char c : s) {
    if (c == '"' || c == '\\') {
      out += '\\';
      out += static_cast<char>(c);
    } else if (c < 0x20) {
      char buf[8];
      std::snprintf(buf, sizeof buf, "\\u%04x", c);
      out += buf;
    } else {
      out += static_cast<char>(c);
    }
  }
  return out + "\"";
}

const char* json_bool(bool b) { return b ? "true" : "false"; }

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

ort::Model& model(ort_model* h) {
  if (h == nullptr) throw std::runtime_error("nil model handle");
  return h->m;
}

ort::Group& group(ort_group* h) {
  if (h == nullptr || h->g == nullptr) throw std::runtime_error("nil process group handle");
  return *h->g;
}

// copy_floats copies t (CPU, contiguous, float) into a buffer the caller
// has already been checked to have room for it.
void copy_floats(const at::Tensor& t, float* out) {
  if (t.numel() > 0) std::memcpy(out, t.data_ptr<float>(), t.numel() * sizeof(float));
}

}  // namespace

extern "C" {

int ort_abi_version(void) { return ORT_ABI_VERSION; }

int ort_info(char* json, size_t json_len, char* err, size_t err_len) {
  return guard(err, err_len, [&] {
    std::ostringstream o;
    o << "{\"libtorch\":\"" << TORCH_VERSION_MAJOR << "." << TORCH_VERSION_MINOR << "." << TORCH_VERSION_PATCH
      << "\",\"cuda_devices\":" << at::detail::getCUDAHooks().getNumGPUs() << ",\"threads\":" << at::get_num_threads()
      << ",\"cxx11_abi\":" << _GLIBCXX_USE_CXX11_ABI << ",\"c10d\":[";
    const auto backends = ort::compiled_backends();
    for (size_t i = 0; i < backends.size(); i++) o << (i ? "," : "") << json_str(backends[i]);
    const auto& dnnl = ort::onednn_status();
    o << "],\"onednn\":{\"active\":" << json_bool(dnnl.active) << ",\"library\":" << json_str(dnnl.library)
      << ",\"detail\":" << json_str(dnnl.why) << "}";
    const auto& store = ort::store_status();
    o << ",\"tcpstore\":{\"libuv_default\":" << json_bool(store.libuv_default) << ",\"libuv\":" << json_bool(store.libuv)
      << ",\"detail\":" << json_str(store.detail) << "}}";
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
    m.lora_save = opts->lora_modules_to_save ? opts->lora_modules_to_save : "";
    m.opts.device = nullptr;
    m.opts.lora_targets = nullptr;
    m.opts.lora_modules_to_save = nullptr;
    if (!m.lora_save.empty() && opts->lora_rank <= 0) {
      throw std::runtime_error("lora_modules_to_save needs LoRA (full fine-tuning trains every module)");
    }
    m.device = at::Device(m.device_str);
    if (m.device.is_cpu()) ort::keep_freed_cpu_memory();
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
    ort::index_weights(m);
    *out = h.release();
  });
}

void ort_model_free(ort_model* m) {
  try {
    if (m != nullptr) ort::unbind_param_model(m->m);
    delete m;
  } catch (...) {
  }
}

int ort_model_set_tensor(ort_model* h, int32_t kind, const char* name, int32_t dtype, const int64_t* shape,
                         int32_t ndim, const void* data, char* err, size_t err_len) {
  return guard(err, err_len, [&] {
    auto& m = model(h);
    if (ndim < 0 || (ndim > 0 && shape == nullptr)) throw std::runtime_error("tensor shape: bad dimension count " + std::to_string(ndim));
    std::vector<int64_t> dims(shape, shape + ndim);
    auto src = at::from_blob(const_cast<void*>(data), dims, at::TensorOptions().dtype(scalar_type(dtype)));
    ort::write_tensor(m, kind, name, src);
  });
}

int ort_model_finalize(ort_model* h, char* err, size_t err_len) {
  return guard(err, err_len, [&] { ort::finalize(model(h)); });
}

int ort_model_tensor_count(ort_model* h, int32_t kind, int32_t* count, char* err, size_t err_len) {
  return guard(err, err_len, [&] { *count = static_cast<int32_t>(ort::list_tensors(model(h), kind, true).size()); });
}

int ort_model_tensor_info(ort_model* h, int32_t kind, int32_t index, char* name, size_t name_len, int32_t* dtype,
                          int64_t* shape, size_t shape_len, int32_t* ndim, char* err, size_t err_len) {
  return guard(err, err_len, [&] {
    const auto& list = ort::list_tensors(model(h), kind, false);
    if (index < 0 || static_cast<size_t>(index) >= list.size()) throw std::runtime_error("tensor index out of range");
    const auto& e = list[index];
    if (e.name.size() + 1 > name_len) {
      throw std::runtime_error("name buffer has room for " + std::to_string(name_len) + " bytes, tensor name " + e.name +
                               " needs " + std::to_string(e.name.size() + 1));
    }
    if (e.shape.size() > shape_len) {
      throw std::runtime_error("tensor " + e.name + " has " + std::to_string(e.shape.size()) +
                               " dims, shape buffer has room for " + std::to_string(shape_len));
    }
    *dtype = dtype_code(e.dtype);
    std::memcpy(name, e.name.c_str(), e.name.size() + 1);
    std::copy(e.shape.begin(), e.shape.end(), shape);
    *ndim = static_cast<int32_t>(e.shape.size());
  });
}

int ort_model_get_tensor(ort_model* h, int32_t kind, const char* name, void* out, size_t nbytes, char* err,
                         size_t err_len) {
  return guard(err, err_len, [&] {
    auto t = ort::read_tensor(model(h), kind, name);
    if (static_cast<size_t>(t.nbytes()) != nbytes) {
      throw std::runtime_error(std::string("tensor ") + name + " needs " + std::to_string(t.nbytes()) +
                               " bytes, buffer has " + std::to_string(nbytes));
    }
    if (nbytes > 0) std::memcpy(out, t.data_ptr(), nbytes);
  });
}

int ort_logprobs(ort_model* h, const ort_batch* b, double temperature, int32_t reference, float* logps,
                 size_t logps_len, float* entropies, size_t entropies_len, const volatile int32_t* cancel, char* err,
                 size_t err_len) {
  return guard(err, err_len, [&] {
    auto& m = model(h);
    ort::need_finalized(m);
    at::NoGradGuard ng;
    auto bt = ort::decode_batch(m, b);
    const auto n = static_cast<size_t>(bt.targets.size(0));
    if (n > logps_len || n > entropies_len) {  // before the forward pass, which is the expensive part
      throw std::runtime_error("output buffers have room for " + std::to_string(std::min(logps_len, entropies_len)) +
                               " floats, the batch has " + std::to_string(n) + " completion tokens");
    }
    auto r = ort::token_logprobs(m, bt, temperature, reference != 0, cancel);
    auto lp = r[0].to(at::kCPU, at::kFloat).contiguous();
    auto en = r[1].to(at::kCPU, at::kFloat).contiguous();
    copy_floats(lp, logps);
    copy_floats(en, entropies);
  });
}

int ort_forward_backward(ort_model* h, const ort_batch* b, const ort_loss_config* cfg, int32_t backward,
                         ort_loss_stats* stats, const volatile int32_t* cancel, char* err, size_t err_len) {
  return guard(err, err_len, [&] {
    auto& m = model(h);
    ort::need_finalized(m);
    *stats = ort_loss_stats{};
    ort::forward_backward(m, b, *cfg, backward != 0, stats, cancel);
  });
}

int ort_optimizer_step(ort_model* h, double lr, double* grad_norm, char* err, size_t err_len) {
  return guard(err, err_len, [&] {
    auto& m = model(h);
    ort::need_finalized(m);
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
    ort::need_finalized(m);
    ort::sample(m, reqs, n, out, cancel);
  });
}

struct ort_decoder {
  ort::Decoder* d;
};

namespace {
ort::Decoder& decoder(ort_decoder* h) {
  if (h == nullptr || h->d == nullptr) throw std::runtime_error("nil decoder handle");
  return *h->d;
}
}  // namespace

int ort_decoder_new(ort_model* h, const ort_decoder_options* opts, ort_decoder** out, char* err, size_t err_len) {
  return guard(err, err_len, [&] {
    if (opts == nullptr || out == nullptr) throw std::runtime_error("decoder: nil options or output");
    auto& m = model(h);
    ort::need_finalized(m);
    auto* d = new ort_decoder{nullptr};
    try {
      d->d = ort::new_decoder(m, *opts);
    } catch (...) {
      delete d;
      throw;
    }
    *out = d;
  });
}

void ort_decoder_free(ort_decoder* d) {
  if (d == nullptr) return;
  ort::free_decoder(d->d);
  delete d;
}

int ort_decoder_add(ort_decoder* d, const ort_sample_request* reqs, const char* const* keys, int32_t n, int64_t* ids,
                    const volatile int32_t* cancel, char* err, size_t err_len) {
  return guard(err, err_len, [&] {
    if (n > 0 && (reqs == nullptr || ids == nullptr)) throw std::runtime_error("decoder add: nil requests or ids");
    ort::decoder_add(decoder(d), reqs, keys, n, ids, cancel);
  });
}

int ort_decoder_step(ort_decoder* d, ort_decode_event* events, int32_t cap, int32_t* n, const volatile int32_t* cancel,
                     char* err, size_t err_len) {
  return guard(err, err_len, [&] {
    if (n == nullptr || (cap > 0 && events == nullptr)) throw std::runtime_error("decoder step: nil events or count");
    *n = 0;
    *n = ort::decoder_step(decoder(d), events, cap, cancel);
  });
}

int ort_decoder_release(ort_decoder* d, int64_t seq, char* err, size_t err_len) {
  return guard(err, err_len, [&] { ort::decoder_release(decoder(d), seq); });
}

int ort_decoder_forget(ort_decoder* d, const char* key, char* err, size_t err_len) {
  return guard(err, err_len, [&] {
    if (key == nullptr) throw std::runtime_error("decoder forget: nil key");
    ort::decoder_forget(decoder(d), key);
  });
}

int ort_decoder_get_stats(ort_decoder* d, ort_decoder_stats* stats, char* err, size_t err_len) {
  return guard(err, err_len, [&] {
    if (stats == nullptr) throw std::runtime_error("decoder stats: nil output");
    *stats = ort::decoder_stats(decoder(d));
  });
}

int ort_device_memory(ort_model* h, int32_t reset_peak, ort_device_memory_stats* out, char* err, size_t err_len) {
  return guard(err, err_len, [&] {
    if (out == nullptr) throw std::runtime_error("device memory: nil output");
    *out = ort::device_memory(model(h), reset_peak != 0);
  });
}

int ort_decode_shapes(const ort_arch* arch, ort_gemm_timing* gemm, int32_t gemm_cap, int32_t* n_gemm,
                      ort_attention_timing* attn, int32_t attn_cap, int32_t* n_attn, char* err, size_t err_len) {
  return guard(err, err_len, [&] {
    if (arch == nullptr || n_gemm == nullptr || n_attn == nullptr) throw std::runtime_error("decode shapes: nil argument");
    auto [g, a] = ort::decode_shapes(*arch);
    *n_gemm = static_cast<int32_t>(g.size());
    *n_attn = static_cast<int32_t>(a.size());
    if (gemm != nullptr) std::copy_n(g.begin(), std::min<size_t>(g.size(), std::max(gemm_cap, 0)), gemm);
    if (attn != nullptr) std::copy_n(a.begin(), std::min<size_t>(a.size(), std::max(attn_cap, 0)), attn);
  });
}

int ort_bench_gemm(ort_gemm_timing* t, int32_t n, int32_t threads, double budget_s, char* err, size_t err_len) {
  return guard(err, err_len, [&] {
    if (n < 0 || (n > 0 && t == nullptr)) throw std::runtime_error("bench gemm: bad entries");
    if (threads > 0) at::set_num_threads(threads);
    ort::bench_gemm(t, n, budget_s);
  });
}

int ort_bench_attention(ort_attention_timing* t, int32_t n, int32_t threads, double budget_s, char* err,
                        size_t err_len) {
  return guard(err, err_len, [&] {
    if (n < 0 || (n > 0 && t == nullptr)) throw std::runtime_error("bench attention: bad entries");
    if (threads > 0) at::set_num_threads(threads);
    ort::bench_attention(t, n, budget_s);
  });
}

int ort_model_set_decode_kernels(ort_model* h, const char* spec, char* err, size_t err_len) {
  return guard(err, err_len, [&] { ort::set_decode_kernels(model(h), spec != nullptr ? spec : ""); });
}

int ort_group_join(ort_model* h, const ort_group_options* o, ort_group** out, const volatile int32_t* cancel,
                   char* err, size_t err_len) {
  return guard(err, err_len, [&] {
    auto& m = model(h);
    ort::need_finalized(m);
    auto g = std::make_unique<ort_group>();
    g->g = ort::join_group(m.device, *o, cancel);
    try {
      ort::attach_shard(*g->g, m);
    } catch (...) {
      ort::free_group(g->g);
      throw;
    }
    *out = g.release();
  });
}

void ort_group_free(ort_group* g) {
  try {
    if (g != nullptr) ort::free_group(g->g);
    delete g;
  } catch (...) {
  }
}

int ort_group_backend(ort_group* h, char* name, size_t name_len, char* err, size_t err_len) {
  return guard(err, err_len, [&] {
    const auto b = ort::group_backend(group(h));
    if (b.size() + 1 > name_len) throw std::runtime_error("backend name buffer too small");
    std::memcpy(name, b.c_str(), b.size() + 1);
  });
}

int ort_group_broadcast_trainable(ort_group* g, ort_model* h, int32_t root, const volatile int32_t* cancel, char* err,
                                  size_t err_len) {
  return guard(err, err_len, [&] { ort::broadcast_trainable(group(g), model(h), root, cancel); });
}

int ort_group_reduce_grads(ort_group* g, ort_model* h, ort_grad_sync* out, const volatile int32_t* cancel, char* err,
                           size_t err_len) {
  return guard(err, err_len, [&] {
    if (out == nullptr) throw std::runtime_error("reduce gradients: nil output");
    *out = ort::reduce_grads(group(g), model(h), cancel);
  });
}

int ort_group_optimizer_step(ort_group* g, ort_model* h, double lr, ort_shard_step_stats* out, char* err,
                             size_t err_len) {
  return guard(err, err_len, [&] {
    if (out == nullptr) throw std::runtime_error("sharded optimizer step: nil output");
    *out = ort::sharded_optimizer_step(group(g), model(h), lr);
  });
}

int ort_group_gather_unit(ort_group* g, ort_model* h, int32_t unit, int32_t* units, const volatile int32_t* cancel,
                          char* err, size_t err_len) {
  return guard(err, err_len, [&] { ort::gather_unit(group(g), model(h), unit, units, cancel); });
}

int ort_model_shard_memory(ort_model* h, int32_t reset_peak, ort_shard_memory* out, char* err, size_t err_len) {
  return guard(err, err_len, [&] {
    if (out == nullptr) throw std::runtime_error("shard memory: nil output");
    *out = ort::shard_memory(model(h), reset_peak != 0);
  });
}

int ort_group_allreduce_f64(ort_group* g, int32_t op, double* values, size_t n, const volatile int32_t* cancel,
                            char* err, size_t err_len) {
  return guard(err, err_len, [&] { ort::allreduce_f64(group(g), op, values, n, cancel); });
}

int ort_group_allgather(ort_group* g, const void* data, size_t n, size_t max_n, void* out, size_t out_cap,
                        const volatile int32_t* cancel, char* err, size_t err_len) {
  return guard(err, err_len, [&] {
    if (data == nullptr && n > 0) throw std::runtime_error("all-gather: nil input");
    ort::allgather_bytes(group(g), data, n, max_n, out, out_cap, cancel);
  });
}

}  // extern "C"
