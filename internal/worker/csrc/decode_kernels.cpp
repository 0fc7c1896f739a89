// decode_kernels.cpp: the measurements behind each model's DecodeKernels
// (ort_decode_shapes, ort_bench_gemm, ort_bench_attention) and the spec that
// sets them (ort_model_set_decode_kernels). Each candidate runs on the same
// random operands, alternating with the other so both see the same machine,
// and keeps its fastest run: on a shared machine the minimum is the time the
// kernel needs, the rest is its neighbours.
#include <ATen/CPUGeneratorImpl.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <map>
#include <set>
#include <sstream>
#include <stdexcept>
#include <string>

#include "model.h"

namespace ort {

namespace {

using Clock = std::chrono::steady_clock;

double seconds_since(Clock::time_point t0) { return std::chrono::duration<double>(Clock::now() - t0).count(); }

// Timing rules: a warm-up run of each candidate, then alternating runs
// until each has at least kMinRuns and kMinSeconds of runs, or kMaxRuns.
constexpr int kMinRuns = 3, kMaxRuns = 40;
constexpr double kMinSeconds = 0.004;
// N beyond this is timed on its first kTimedRows weight rows: the LM head of
// a large vocabulary would otherwise take most of the budget, and the two
// kernels' relative speed does not change with more output columns.
constexpr int64_t kTimedRows = 4096;
// Each product is timed on weights streamed from memory, as a decode step
// meets them (each layer's weights once): copies of w, kStreamBytes in all,
// taken in turn, so no run finds its weights in a cache the previous run
// warmed.
constexpr int64_t kStreamBytes = int64_t{64} << 20;
constexpr int64_t kMaxCopies = 32;

// race times a and b (b may be null: unavailable) and returns their fastest
// runs in seconds; hurried (the budget is spent), one run each after the
// warm-up.
template <class A, class B>
std::pair<double, double> race(A&& a, B* b, bool hurried) {
  a();
  if (b != nullptr) (*b)();
  double best_a = 1e30, best_b = 1e30, sum_a = 0, sum_b = 0;
  for (int i = 0; i < kMaxRuns; i++) {
    auto t0 = Clock::now();
    a();
    double s = seconds_since(t0);
    best_a = std::min(best_a, s);
    sum_a += s;
    if (b != nullptr) {
      t0 = Clock::now();
      (*b)();
      s = seconds_since(t0);
      best_b = std::min(best_b, s);
      sum_b += s;
    }
    if (hurried || (i + 1 >= kMinRuns && sum_a >= kMinSeconds && (b == nullptr || sum_b >= kMinSeconds))) break;
  }
  return {best_a, b != nullptr ? best_b : -1.0};
}

Gemm parse_gemm(const std::string& s) {
  if (s == "onednn") return Gemm::ONEDNN;
  if (s == "aten") return Gemm::ATEN;
  throw std::invalid_argument("decode kernels: backend \"" + s + "\" is unknown (onednn, aten)");
}

}  // namespace

std::pair<std::vector<ort_gemm_timing>, std::vector<ort_attention_timing>> decode_shapes(const ort_arch& a) {
  const int64_t H = a.hidden_size, I = a.intermediate_size, V = a.vocab_size;
  const int64_t q = int64_t{a.num_heads} * a.head_dim, kv = int64_t{a.num_kv_heads} * a.head_dim;
  // (k, n) of every product matmul_nt runs: q, k/v, o, gate/up, down, LM head.
  std::set<std::pair<int64_t, int64_t>> kn{{H, q}, {H, kv}, {q, H}, {H, I}, {I, H}, {H, V}};
  std::vector<ort_gemm_timing> gemm;
  for (int c = 0; c < kRowClasses; c++) {
    for (const auto& [k, n] : kn) {
      ort_gemm_timing t{};
      t.rows = kClassRows[c], t.k = k, t.n = n, t.serial = serial_decode_arch(a, kClassRows[c]) ? 1 : 0;
      gemm.push_back(t);
    }
  }
  std::vector<ort_attention_timing> attn;
  for (int64_t rows : {int64_t{1}, int64_t{16}}) {
    ort_attention_timing t{};
    t.rows = rows, t.heads = a.num_heads, t.kv_heads = a.num_kv_heads, t.head_dim = a.head_dim, t.keys = 128;
    t.serial = serial_decode_arch(a, rows) ? 1 : 0;
    attn.push_back(t);
  }
  return {gemm, attn};
}

void bench_gemm(ort_gemm_timing* ts, int32_t n, double budget_s) {
  at::NoGradGuard ng;
  const auto t0 = Clock::now();
  auto gen = at::make_generator<at::CPUGeneratorImpl>(1234);
  const auto f32 = at::TensorOptions().dtype(at::kFloat);
  // Entries of one (k, n) share their weights: made once, in entry order.
  std::map<std::pair<int64_t, int64_t>, std::vector<int32_t>> by_shape;
  std::vector<std::pair<int64_t, int64_t>> order;
  for (int32_t i = 0; i < n; i++) {
    auto& t = ts[i];
    t.onednn_s = t.aten_s = 0;
    if (t.rows <= 0 || t.k <= 0 || t.n <= 0) throw std::invalid_argument("ort_bench_gemm: entry with a size <= 0");
    auto& idx = by_shape[{t.k, t.n}];
    if (idx.empty()) order.push_back({t.k, t.n});
    idx.push_back(i);
  }
  for (const auto& kn : order) {
    const int64_t k = kn.first, rows_n = std::min(kn.second, kTimedRows);
    const int64_t copies = std::clamp<int64_t>(kStreamBytes / (rows_n * k * 4), 1, kMaxCopies);
    auto first = at::randn({rows_n, k}, gen, f32);
    std::vector<at::Tensor> ws{first};
    for (int64_t c = 1; c < copies; c++) ws.push_back(first.clone());
    for (int32_t i : by_shape[kn]) {
      auto& t = ts[i];
      const bool hurried = seconds_since(t0) >= budget_s;
      SerialScope serial(t.serial != 0);
      auto x = at::randn({t.rows, k}, gen, f32);
      size_t next_a = 0, next_o = 0;
      at::Tensor y, none;
      auto aten = [&] { y = at::mm(x, ws[next_a++ % ws.size()].t()); };
      auto onednn = [&] {
        if (!sgemm_nt(x, ws[next_o++ % ws.size()], none, y)) {
          throw std::runtime_error("dnnl_sgemm failed on " + std::to_string(t.rows) + "x" + std::to_string(t.k) + "x" +
                                   std::to_string(t.n));
        }
      };
      auto [a, o] = sgemm_available() ? race(aten, &onednn, hurried)
                                      : race(aten, static_cast<decltype(onednn)*>(nullptr), hurried);
      t.aten_s = a, t.onednn_s = o;
    }
  }
}

void bench_attention(ort_attention_timing* ts, int32_t n, double budget_s) {
  at::NoGradGuard ng;
  const auto t0 = Clock::now();
  auto gen = at::make_generator<at::CPUGeneratorImpl>(4321);
  for (int32_t i = 0; i < n; i++) {
    auto& t = ts[i];
    t.fused_s = t.aten_s = 0;
    if (t.rows <= 0 || t.heads <= 0 || t.kv_heads <= 0 || t.head_dim <= 0 || t.keys <= 0 || t.heads % t.kv_heads != 0) {
      throw std::invalid_argument("ort_bench_attention: entry with a size <= 0 or heads not a multiple of kv_heads");
    }
    const bool hurried = seconds_since(t0) >= budget_s;
    SerialScope serial(t.serial != 0);
    const auto f32 = at::TensorOptions().dtype(at::kFloat);
    auto q = at::randn({t.rows, t.heads, 1, t.head_dim}, gen, f32);
    auto k = at::randn({t.rows, t.kv_heads, t.keys, t.head_dim}, gen, f32);
    auto v = at::randn({t.rows, t.kv_heads, t.keys, t.head_dim}, gen, f32);
    // As a decode step over a padded cache sees them: every key allowed.
    auto allowed = at::ones({t.rows, 1, 1, t.keys}, f32.dtype(at::kBool));
    auto bias = at::zeros({t.rows, 1, 1, 1, t.keys}, f32);
    const double scale = 1.0 / std::sqrt(static_cast<double>(t.head_dim));
    at::Tensor out;
    auto fused = [&] { out = decode_attention(q, k, v, bias, scale); };
    auto aten = [&] { out = aten_attention(q, k, v, allowed, bias, true, false, at::kFloat); };
    auto [a, f] = race(aten, &fused, hurried);
    t.aten_s = a, t.fused_s = f;
  }
}

void set_decode_kernels(Model& m, const std::string& spec) {
  DecodeKernels k;
  std::istringstream in(spec);
  std::string field;
  bool onednn = false;
  while (in >> field) {
    const auto eq = field.find('=');
    if (eq == std::string::npos) throw std::invalid_argument("decode kernels: field \"" + field + "\" has no '='");
    const std::string key = field.substr(0, eq), val = field.substr(eq + 1);
    if (key == "fallback") {
      k.fallback = parse_gemm(val);
      onednn |= k.fallback == Gemm::ONEDNN;
    } else if (key == "attention") {
      if (val != "fused" && val != "aten") throw std::invalid_argument("decode kernels: attention=" + val + " (fused, aten)");
      k.fused_attention = val == "fused";
    } else if (key.rfind("gemm:", 0) == 0) {
      long long kk = 0, nn = 0;
      char tail = 0;
      if (std::sscanf(key.c_str() + 5, "%lldx%lld%c", &kk, &nn, &tail) != 2 || kk <= 0 || nn <= 0) {
        throw std::invalid_argument("decode kernels: \"" + key + "\" is not gemm:KxN");
      }
      std::vector<std::string> names;
      std::istringstream vs(val);
      for (std::string b; std::getline(vs, b, ',');) names.push_back(b);
      if (names.size() != kRowClasses) {
        throw std::invalid_argument("decode kernels: " + field + " needs " + std::to_string(kRowClasses) + " backends");
      }
      std::array<Gemm, kRowClasses> per{};
      for (int c = 0; c < kRowClasses; c++) {
        per[c] = parse_gemm(names[c]);
        onednn |= per[c] == Gemm::ONEDNN;
      }
      k.gemm[{kk, nn}] = per;
    } else {
      throw std::invalid_argument("decode kernels: field \"" + key + "\" is unknown (fallback, attention, gemm:KxN)");
    }
  }
  if (onednn && !sgemm_available()) {
    throw std::invalid_argument("decode kernels: onednn is named but oneDNN's sgemm is unavailable (" +
                                onednn_status().why + ")");
  }
  m.kernels = std::move(k);
}

}  // namespace ort
