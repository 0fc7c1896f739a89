// onednn.cpp: matmul_nt, the decode matmuls handed to oneDNN's sgemm or to
// at::mm as the model's DecodeKernels say (under a DecodeGemmScope), and
// where oneDNN's sgemm was found (onednn_status, reported by ort_info).
// ORTRAIN_WORKER_ONEDNN=off hides it, as if libtorch carried no oneDNN.
#include <ATen/Parallel.h>  // at::set_num_threads, whose address names libtorch_cpu
#include <dlfcn.h>
#include <link.h>

#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include "model.h"

namespace ort {

namespace {

// dnnl_sgemm's signature (oneDNN's C API, row-major); the status is 0 on success.
using SgemmFn = int (*)(char transa, char transb, int64_t M, int64_t N, int64_t K, float alpha, const float* A,
                        int64_t lda, const float* B, int64_t ldb, float beta, float* C, int64_t ldc);

// sgemm_in resolves dnnl_sgemm through the already loaded object at path
// (RTLD_NOLOAD never loads one; a handle's lookup also searches the
// object's dependencies). Dropping the handle leaves it loaded: libtorch
// holds it.
SgemmFn sgemm_in(const char* path) {
  void* h = dlopen(path, RTLD_NOW | RTLD_NOLOAD);
  if (h == nullptr) return nullptr;
  void* f = dlsym(h, "dnnl_sgemm");
  dlclose(h);
  return reinterpret_cast<SgemmFn>(f);
}

// loaded_dnnl collects the loaded objects named libdnnl.so*: whichever
// soname libtorch links (libdnnl.so.2 on 1.13, libdnnl.so.3.6 on 2.14).
int loaded_dnnl(dl_phdr_info* info, size_t, void* out) {
  const char* name = info->dlpi_name;
  if (name == nullptr || *name == '\0') return 0;
  const char* slash = std::strrchr(name, '/');
  const char* base = slash != nullptr ? slash + 1 : name;
  if (std::strncmp(base, "libdnnl.so", 10) == 0) static_cast<std::vector<std::string>*>(out)->push_back(name);
  return 0;
}

struct Sgemm {
  SgemmFn fn = nullptr;
  OneDnnStatus status;
};

// find_sgemm looks for dnnl_sgemm in the oneDNN this process already has: a
// libdnnl that libtorch links (Debian), else libtorch_cpu itself when it
// carries oneDNN with the symbol visible.
Sgemm find_sgemm() {
  Sgemm s;
  if (const char* v = std::getenv("ORTRAIN_WORKER_ONEDNN"); v != nullptr && std::strcmp(v, "off") == 0) {
    s.status.why = "turned off by ORTRAIN_WORKER_ONEDNN=off";
    return s;
  }
  std::vector<std::string> dnnl;
  dl_iterate_phdr(loaded_dnnl, &dnnl);
  for (const auto& path : dnnl) {
    if ((s.fn = sgemm_in(path.c_str())) != nullptr) break;
  }
  std::string torch_cpu = "libtorch_cpu";
  Dl_info info{};
  if (s.fn == nullptr && dladdr(reinterpret_cast<void*>(&at::set_num_threads), &info) != 0 && info.dli_fname != nullptr) {
    torch_cpu = info.dli_fname;
    s.fn = sgemm_in(info.dli_fname);
  }
  if (s.fn == nullptr) {
    s.status.why = (dnnl.empty() ? "no libdnnl.so* is loaded" : "the loaded " + dnnl.front() + " has no dnnl_sgemm") +
                   std::string(" and ") + torch_cpu + " does not export dnnl_sgemm";
    return s;
  }
  s.status.active = true;
  s.status.library = dladdr(reinterpret_cast<void*>(s.fn), &info) != 0 && info.dli_fname != nullptr ? info.dli_fname : "?";
  return s;
}

const Sgemm& sgemm() {
  static const Sgemm s = find_sgemm();
  return s;
}

}  // namespace

const OneDnnStatus& onednn_status() { return sgemm().status; }

int rows_class(int64_t rows) {
  // The class whose measured rows are nearest on a log scale: 1 | 4 | 16 | 45 | 128.
  return rows <= 4 ? 0 : rows <= 45 ? 1 : 2;
}

bool sgemm_available() { return sgemm().fn != nullptr; }

bool sgemm_nt(const at::Tensor& x, const at::Tensor& w, const at::Tensor& b, at::Tensor& y) {
  SgemmFn gemm = sgemm().fn;
  if (gemm == nullptr) return false;
  const int64_t M = x.size(0), N = w.size(0), K = x.size(1);
  // With a bias, C starts as the bias in every row and beta = 1 adds the product.
  y = b.defined() ? b.reshape({1, N}).expand({M, N}).contiguous() : at::empty({M, N}, x.options());
  return gemm('N', 'T', M, N, K, 1.0f, x.data_ptr<float>(), K, w.data_ptr<float>(), K, b.defined() ? 1.0f : 0.0f,
              y.data_ptr<float>(), N) == 0;
}

at::Tensor matmul_nt(const Model& m, const at::Tensor& x, const at::Tensor& w, const at::Tensor& b) {
  const bool applies = m.decode_gemm && x.is_cpu() && x.scalar_type() == at::kFloat && w.scalar_type() == at::kFloat &&
                       x.dim() == 2 && w.dim() == 2 && x.is_contiguous() && w.is_contiguous() && x.size(1) == w.size(1) &&
                       (!b.defined() || (b.scalar_type() == at::kFloat && b.numel() == w.size(0))) &&
                       !at::GradMode::is_enabled() && x.numel() > 0 && w.numel() > 0;
  if (applies) {
    const auto& k = m.kernels;
    auto it = k.gemm.find({w.size(1), w.size(0)});
    const Gemm choice = it == k.gemm.end() ? k.fallback : it->second[rows_class(x.size(0))];
    at::Tensor y;
    if (choice == Gemm::ONEDNN && sgemm_nt(x, w, b, y)) return y;
  }
  return b.defined() ? at::addmm(b, x, w.t()) : at::mm(x, w.t());
}

}  // namespace ort
