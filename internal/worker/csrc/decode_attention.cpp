// decode_attention.cpp: attention of one float32 query per row against its
// cached keys, on CPU, as plain loops. The ATen form of it (broadcast
// products and sums, or one small bmm per row and kv head on libtorch 1.13)
// is a dozen ops over [rows, heads, keys, head_dim] temporaries per layer:
// 7 of the 48 ms of a 16-row small100m decode step. Here each (row, query
// head) is one pass over its keys and values, in registers.
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>
#include <vector>

#include "model.h"

#if defined(__x86_64__)
#include <immintrin.h>
#endif

namespace ort {
namespace {

struct Heads {
  const float* q;  // [B, nh, hd] contiguous
  const float* k;  // [B, nkv, Lk, hd] with strides below, last dim contiguous
  const float* v;
  const float* bias;  // [B, Lk] additive mask (0 / -inf) with strides, or null
  float* out;         // [B, nh, hd] contiguous
  int64_t B, nh, nkv, Lk, hd;
  int64_t ks0, ks1, ks2, vs0, vs1, vs2, bs0, bs1;
  float scale;
};

// dot and axpy over head_dim floats: AVX2 where the CPU has it.
#if defined(__x86_64__)
__attribute__((target("avx2,fma"))) float dot_avx2(const float* a, const float* b, int64_t n) {
  __m256 s0 = _mm256_setzero_ps(), s1 = _mm256_setzero_ps();
  int64_t i = 0;
  for (; i + 16 <= n; i += 16) {
    s0 = _mm256_fmadd_ps(_mm256_loadu_ps(a + i), _mm256_loadu_ps(b + i), s0);
    s1 = _mm256_fmadd_ps(_mm256_loadu_ps(a + i + 8), _mm256_loadu_ps(b + i + 8), s1);
  }
  for (; i + 8 <= n; i += 8) s0 = _mm256_fmadd_ps(_mm256_loadu_ps(a + i), _mm256_loadu_ps(b + i), s0);
  s0 = _mm256_add_ps(s0, s1);
  __m128 s = _mm_add_ps(_mm256_castps256_ps128(s0), _mm256_extractf128_ps(s0, 1));
  s = _mm_add_ps(s, _mm_movehl_ps(s, s));
  s = _mm_add_ss(s, _mm_movehdup_ps(s));
  float r = _mm_cvtss_f32(s);
  for (; i < n; i++) r += a[i] * b[i];
  return r;
}

__attribute__((target("avx2,fma"))) void axpy_avx2(float alpha, const float* x, float* y, int64_t n) {
  const __m256 a = _mm256_set1_ps(alpha);
  int64_t i = 0;
  for (; i + 8 <= n; i += 8) _mm256_storeu_ps(y + i, _mm256_fmadd_ps(a, _mm256_loadu_ps(x + i), _mm256_loadu_ps(y + i)));
  for (; i < n; i++) y[i] += alpha * x[i];
}

bool have_avx2() {
  static const bool ok = __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma");
  return ok;
}
#endif

float dot(const float* a, const float* b, int64_t n) {
#if defined(__x86_64__)
  if (have_avx2()) return dot_avx2(a, b, n);
#endif
  float r = 0;
  for (int64_t i = 0; i < n; i++) r += a[i] * b[i];
  return r;
}

void axpy(float alpha, const float* x, float* y, int64_t n) {
#if defined(__x86_64__)
  if (have_avx2()) return axpy_avx2(alpha, x, y, n);
#endif
  for (int64_t i = 0; i < n; i++) y[i] += alpha * x[i];
}

// head computes the output of query head h of row b: a softmax over the
// scaled scores (plus the mask), then the probability-weighted values.
void head(const Heads& p, int64_t b, int64_t h, std::vector<float>& scores) {
  const int64_t kv = h / (p.nh / p.nkv), hd = p.hd;
  const float* q = p.q + (b * p.nh + h) * hd;
  const float* kb = p.k + b * p.ks0 + kv * p.ks1;
  const float* vb = p.v + b * p.vs0 + kv * p.vs1;
  float top = -std::numeric_limits<float>::infinity();
  for (int64_t t = 0; t < p.Lk; t++) {
    float s = dot(q, kb + t * p.ks2, hd) * p.scale;
    if (p.bias != nullptr) s += p.bias[b * p.bs0 + t * p.bs1];
    scores[t] = s;
    top = std::max(top, s);
  }
  float* out = p.out + (b * p.nh + h) * hd;
  std::fill(out, out + hd, 0.0f);
  float sum = 0;
  for (int64_t t = 0; t < p.Lk; t++) {
    if (scores[t] == -std::numeric_limits<float>::infinity()) continue;  // a masked key
    const float e = std::exp(scores[t] - top);
    sum += e;
    axpy(e, vb + t * p.vs2, out, hd);
  }
  const float inv = 1.0f / sum;
  for (int64_t d = 0; d < hd; d++) out[d] *= inv;
}

void heads_range(const Heads& p, int64_t from, int64_t to) {
  std::vector<float> scores(p.Lk);
  for (int64_t i = from; i < to; i++) head(p, i / p.nh, i % p.nh, scores);
}

void run_share(void* arg) {
  const auto& p = *static_cast<const Heads*>(arg);
  const int64_t t = omp_get_thread_num(), nt = omp_get_num_threads(), n = p.B * p.nh;
  heads_range(p, n * t / nt, n * (t + 1) / nt);
}

}  // namespace

bool decode_attention_applies(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v, const at::Tensor& bias) {
  auto last_contiguous = [](const at::Tensor& t) { return t.stride(-1) == 1; };
  return q.device().is_cpu() && q.scalar_type() == at::kFloat && k.scalar_type() == at::kFloat &&
         v.scalar_type() == at::kFloat && last_contiguous(k) && last_contiguous(v) && q.size(2) == 1 &&
         (!bias.defined() || bias.scalar_type() == at::kFloat) && !at::GradMode::is_enabled();
}

at::Tensor decode_attention(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v, const at::Tensor& bias,
                            double scale) {
  const int64_t B = q.size(0), nh = q.size(1), hd = q.size(3), nkv = k.size(1), Lk = k.size(2);
  auto qc = q.contiguous();
  auto out = at::empty({B, 1, nh * hd}, q.options());
  at::Tensor bias2;
  if (bias.defined()) bias2 = bias.reshape({B, Lk});  // [B, 1, 1, 1, Lk]: one row of mask per sequence
  Heads p{qc.data_ptr<float>(), k.data_ptr<float>(), v.data_ptr<float>(),
          bias2.defined() ? bias2.data_ptr<float>() : nullptr, out.data_ptr<float>(), B, nh, nkv, Lk, hd,
          k.stride(0), k.stride(1), k.stride(2), v.stride(0), v.stride(1), v.stride(2),
          bias2.defined() ? bias2.stride(0) : 0, bias2.defined() ? bias2.stride(1) : 0, static_cast<float>(scale)};
  const int threads = omp_get_max_threads != nullptr ? omp_get_max_threads() : 1;
  // Split across threads only when the work (B * nh * Lk * hd multiply-adds,
  // twice) outweighs waking them.
  if (GOMP_parallel != nullptr && omp_get_thread_num != nullptr && omp_get_num_threads != nullptr && threads > 1 &&
      B * nh * Lk * hd >= (int64_t{1} << 16)) {
    GOMP_parallel(&run_share, &p, static_cast<unsigned>(std::min<int64_t>(threads, B * nh)), 0);
  } else {
    heads_range(p, 0, B * nh);
  }
  return out;
}

}  // namespace ort
