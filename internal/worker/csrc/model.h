// model.h: the worker's C++ internals (never seen by Go). Shapes: B rows,
// L sequence length, H hidden, V vocab, nh/nkv heads, hd head dim.
#pragma once

#include <ATen/ATen.h>
#include <ATen/core/grad_mode.h>  // NoGradGuard, GradMode: ATen.h stopped including it in 2.x
#include <torch/version.h>

#include <array>
#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <unordered_map>
#include <utility>
#include <vector>

#include "worker_abi.h"

// compat: libtorch 1.13 (Debian) and 2.x (pip) differ in a few APIs.
#define ORT_TORCH_AT_LEAST(maj, min) \
  (TORCH_VERSION_MAJOR > (maj) || (TORCH_VERSION_MAJOR == (maj) && TORCH_VERSION_MINOR >= (min)))

namespace ort {

// Lin is one projection; lora_a/lora_b are undefined without an adapter.
struct Lin {
  at::Tensor w, b, lora_a, lora_b;
};

struct LayerW {
  at::Tensor ln1, ln2, q_norm, k_norm;
  Lin q, k, v, o, gate, up, down;
};

// Weights is a view over a name->tensor map, resolved once.
struct Weights {
  at::Tensor embed, norm, lm_head;
  std::vector<LayerW> layers;
};

struct LoraPair {
  at::Tensor a, b;  // a [r, in], b [out, r]
};

// TensorMeta describes one entry of a tensor listing.
struct TensorMeta {
  std::string name;
  at::ScalarType dtype;
  std::vector<int64_t> shape;
};

using NamedTensors = std::vector<std::pair<std::string, at::Tensor>>;

// kPeftPrefix starts PEFT's names of trainable tensors.
constexpr const char* kPeftPrefix = "base_model.model.";

// KVCache holds keys/values per layer, [B, nkv, Lmax, hd].
struct KVCache {
  std::vector<at::Tensor> k, v;
  // all_keys: every query attends to every cached key (a decode step whose
  // rows all sit at the last position), so no mask is built.
  bool all_keys = false;
};

// ShardPiece is where a trainable tensor meets this rank's slice of a
// bucket: its flattened elements [param_off, param_off + len) sit at
// slice_off in the slice.
struct ShardPiece {
  size_t param;  // index into Model::params
  int64_t param_off, len, slice_off;
};

// ShardBucket is one bucket of the flattened trainable tensors (cut as the
// gradient all-reduce cuts them) and this rank's slice of it: rank r owns
// elements [r*chunk, (r+1)*chunk) clipped to numel, chunk = ceil(numel/P).
struct ShardBucket {
  std::vector<size_t> params;  // indices into Model::params, in order
  int64_t numel = 0, chunk = 0, lo = 0, hi = 0;
  std::vector<ShardPiece> pieces;
  // Stage 3 only: this rank's slice of the parameters themselves ([hi - lo],
  // the tensors' dtype); the tensors in Model::params then hold placeholders.
  at::Tensor data;
  at::Tensor grad;                 // [hi - lo] in the tensors' dtype: the slice of the averaged gradient
  at::Tensor exp_avg, exp_avg_sq;  // [hi - lo] in the tensors' dtype, allocated at the first update
};

// FrozenSlice is a run of frozen tensors (LoRA's base weights, the frozen
// reference copy) flattened and sliced as a ShardBucket is (stage 3).
struct FrozenSlice {
  std::vector<std::string> names;  // HF weight names, in flattening order
  int64_t numel = 0, chunk = 0, lo = 0, hi = 0;
  at::Tensor data;  // [hi - lo]
};

// ParamUnit is what stage 3 gathers at once: the embedding, one decoder
// layer, the final norm or the LM head. Its trainable tensors are a bucket
// (npos when it has none), its frozen ones (LoRA base weights) and the
// reference copy's (full fine-tuning with a reference) FrozenSlices.
struct ParamUnit {
  std::string what;  // "embedding", "layer 3", "norm", "lm_head"
  int layer = -1;
  std::vector<std::string> names;  // the HF weights it covers
  size_t bucket = SIZE_MAX;
  FrozenSlice base, ref;
};

// Shard is a model's optimizer spread over a process group (ZeRO stages 1
// and 2, shard.cpp) and, at stage 3, its parameters too (param_shard.cpp).
// stage NONE: every rank holds everything.
struct Group;
struct Shard {
  int32_t stage = ORT_SHARD_NONE;
  int rank = 0, size = 1;
  std::vector<ShardBucket> buckets;
  // Stage 3: the units in forward order, whether the full tensors have been
  // sliced and dropped yet (at the first use after the join, so the join's
  // broadcast still sees them), the group the gathers run on (cleared when
  // it is freed), and what the gradient reduce-scatters of the backward
  // passes since the last ort_group_reduce_grads sent.
  std::vector<ParamUnit> units;
  bool sliced = false;
  Group* group = nullptr;
  int64_t sync_bytes = 0, sync_gather_bytes = 0;
  int32_t sync_buckets = 0;
  double sync_wait_seconds = 0;
  int64_t gathered_bytes = 0, peak_gathered_bytes = 0;  // full tensors gathered now, and at most since the last reset
  // The unit ort_group_gather_unit gathered last, for reads by name.
  int staged_unit = -1;
  std::map<std::string, at::Tensor> staged;  // HF names (base or full weights), PEFT names (trainable)
  // By trainable tensor, the same on every rank: its AdamW state exists
  // (created by its first gradient, as torch.optim does), and some rank had
  // a gradient for it since the last step.
  std::vector<uint8_t> has_state, has_grad;
};

// DecodeKernels say which kernel each CPU float32 product of sampling and
// decoding runs on. No kernel is fastest on every CPU (oneDNN 2.7's sgemm
// ran the 16-row decode shapes at half of OpenBLAS's speed on an AMD EPYC
// and at twice it on an Intel Xeon), so the Go side measures both on the
// model's own shapes at load (ort_bench_gemm, ort_bench_attention) and sets
// the choice here. Until it does, a model keeps the old default: oneDNN
// where it is available, and the fused decode attention.
enum class Gemm : uint8_t { ATEN = 0, ONEDNN = 1 };
// Products are told apart by rows class: 1, 16 and 128 rows are measured,
// and a product of M rows takes the choice of the nearest (rows_class).
constexpr int kRowClasses = 3;
constexpr int64_t kClassRows[kRowClasses] = {1, 16, 128};
int rows_class(int64_t rows);
struct DecodeKernels {
  Gemm fallback = Gemm::ONEDNN;                                               // shapes not in gemm
  std::map<std::pair<int64_t, int64_t>, std::array<Gemm, kRowClasses>> gemm;  // by (K, N)
  bool fused_attention = true;                                                // decode_attention, else ATen's
};

struct Model {
  // rope_cos / rope_sin_rot [positions, head_dim] are the rotary tables of
  // positions 0.. (model.cpp's rope_tables), grown on demand.
  at::Tensor rope_cos, rope_sin_rot;
  ort_arch arch{};
  ort_model_options opts{};
  std::string device_str, lora_targets, lora_save;
  at::Device device{at::kCPU};
  at::ScalarType dtype{at::kFloat};
  std::vector<std::string> names;  // expected HF weight names, in save order
  std::unordered_map<std::string, std::vector<int64_t>> expected_shapes;  // by HF weight name
  std::map<std::string, at::Tensor> weights;
  std::map<std::string, at::Tensor> ref_weights;  // frozen copy (full fine-tuning + reference)
  std::map<std::string, LoraPair> lora;           // keyed by module path
  // modules_to_save (LoRA only): trainable copies keyed by HF weight name;
  // weights keeps the frozen originals. A tied lm_head is the embedding, so
  // saving either trains the one copy of model.embed_tokens.weight.
  std::map<std::string, at::Tensor> saved;
  // PEFT names that address a saved copy besides its own (tied lm_head).
  std::map<std::string, std::string> saved_alias;  // PEFT name -> PEFT name of the param
  double lora_scale = 0;
  Weights view, ref_view;  // ref_view: the frozen base (no adapters, no saved copies)
  bool finalized = false;
  NamedTensors params;                                  // what the optimizer updates, built by finalize
  std::unordered_map<std::string, size_t> param_index;  // position in params, by name
  std::map<int32_t, std::vector<TensorMeta>> listings;  // by tensor kind, kept for ort_model_tensor_info
  // AdamW state (PyTorch AdamW semantics), keyed by trainable tensor name.
  // Sharded (shard.stage != NONE): the slices in shard hold it, and these
  // maps only hold a loaded checkpoint until shard_absorb_state slices it.
  std::map<std::string, at::Tensor> exp_avg, exp_avg_sq;
  int64_t step = 0;
  Shard shard;
  at::Generator gen;  // LoRA init and dropout
  bool training = false;  // LoRA dropout on (set during forward_backward)
  bool decode_gemm = false;  // matmul_nt may use oneDNN's sgemm (set by DecodeGemmScope)
  DecodeKernels kernels;     // which kernel each decode product runs on (ort_model_set_decode_kernels)
  // weights_version changes whenever a weight the forward pass reads may
  // have changed (optimizer step, tensor write), so a decoder knows its
  // cached keys/values are stale.
  int64_t weights_version = 0;
};

// model.cpp
std::vector<std::pair<std::string, std::vector<int64_t>>> expected_weights(const ort_arch& a);
std::string layer_prefix(int i);  // "model.layers.<i>."
Weights make_view(Model& m, std::map<std::string, at::Tensor>& w, bool with_lora);
// make_layer is layer i's view over w (HF names), with the adapters in lora
// (by module path) when lora is not null.
LayerW make_layer(const Model& m, std::map<std::string, at::Tensor>& w, const std::map<std::string, LoraPair>* lora,
                  int i);

// LayerCtx is what a decoder layer reads besides its weights.
struct LayerCtx {
  const Model* m;
  const LayerW* w;
  bool lora_on;
  at::Tensor cos, sin_rot, pos;  // [B, 1, L, hd] (rope_tables)
  // seg [B, L] (packed training batches only): the row each position
  // belongs to; a query sees only keys of its own row.
  at::Tensor seg;
  KVCache* cache;
  int layer;
  // allowed [B, 1, L, Lk] says which keys each query sees: causal by
  // position; right padding means real tokens never see padding. bias is
  // the same as an additive 0/-inf mask [B, 1, 1, L, Lk], built once per
  // forward rather than per layer.
  at::Tensor allowed, bias;
};
// layer_ctx builds the rotary rows and masks of positions pos (w and
// lora_on left for the caller); layer_forward runs one block.
LayerCtx layer_ctx(Model& m, const at::Tensor& pos, const at::Tensor& seg, KVCache* cache);
at::Tensor layer_forward(const LayerCtx& c, const at::Tensor& x);
at::Tensor rms_norm(const at::Tensor& x, const at::Tensor& w, double eps);
void finalize(Model& m);
// forward runs the decoder over ids [B, L] at positions [B, L]; with a cache
// it writes keys/values at those positions and attends over the cache.
// Positions are below the cache's length (without one: 0..L-1).
// Returns the final-normed hidden states [B, L, H].
at::Tensor forward(Model& m, const Weights& w, bool lora_on, const at::Tensor& ids, const at::Tensor& pos, const at::Tensor& seg,
                   KVCache* cache, const volatile int32_t* cancel);
at::Tensor lm_head(const Weights& w);
at::ScalarType acc_dtype(const Model& m);  // fp64 for fp64 models, else fp32
// cast is t.to(dtype) without the dispatcher call when t has it already.
inline at::Tensor cast(const at::Tensor& t, at::ScalarType dtype) { return t.scalar_type() == dtype ? t : t.to(dtype); }

// keep_freed_cpu_memory keeps freed CPU tensor memory for reuse
// (process-wide, once; cpu_allocator.cpp): libtorch's CPU allocator becomes
// a cache of blocks, and glibc's malloc keeps its heap. A training step frees
// and reallocates gigabytes of tensors, and memory handed back to the kernel
// comes back as fresh pages it must fault in and zero (measured: 8.4 -> 5.6
// CPU s per small100m step with the malloc settings alone, 7.6 -> 6.3 with
// the cache on top). Memory stays near the step's peak instead of shrinking
// after it.
void keep_freed_cpu_memory();
void check_cancel(const volatile int32_t* cancel);

// libgomp's entry points, bound weakly: present when libtorch's OpenMP
// runtime is loaded (Debian's and pip's libtorch_cpu need it), null with a
// non-OpenMP libtorch, where SerialScope does nothing and decode_attention
// runs on the calling thread. at::parallel_for cannot serve here: with
// libtorch's OpenMP backend it is a header-inline `#pragma omp parallel`,
// serial in code built without -fopenmp.
extern "C" {
void omp_set_num_threads(int) __attribute__((weak));
int omp_get_max_threads(void) __attribute__((weak));
int omp_get_thread_num(void) __attribute__((weak));
int omp_get_num_threads(void) __attribute__((weak));
void GOMP_parallel(void (*fn)(void*), void* data, unsigned num_threads, unsigned flags) __attribute__((weak));
}

// SerialScope runs libtorch's CPU ops on the calling thread alone for its
// lifetime when on (and libtorch uses OpenMP), then restores the team size.
// A decode step of a small model is hundreds of ops on a few thousand
// elements each, where waking the other OpenMP threads costs more than the
// op: a softmax over [16, 2, 2, 1, 96] took 16 us on one thread and 6 ms on
// two while another process kept the second core busy, and the tiny
// preset's decoder made 2.3-2.8k tokens/s on two threads against 10-15k on
// one beside a busy loop on a 2-core machine (an env server is such a
// neighbour). Real models never qualify (serial_decode).
class SerialScope {
 public:
  explicit SerialScope(bool on);
  ~SerialScope();
  SerialScope(const SerialScope&) = delete;
  SerialScope& operator=(const SerialScope&) = delete;

 private:
  int saved_ = 0;
};

// DecodeGemmScope lets matmul_nt hand the model's CPU float32 matmuls to
// oneDNN's sgemm, when this process's libtorch carries it (Debian's links
// libdnnl), for its lifetime: the sampler's and the decoder's prefill and
// decode steps. OpenBLAS, libtorch's mm on such builds, runs the [rows, H] x
// [H, N]^T products of a decode step slowly: 16 rows of small100m's MLP at
// 1.06-1.58x oneDNN's time, a single row at 3.5-6.7x (scripts/bench-sample).
// Training never uses it: its forward and the log-probs it is compared with
// keep one GEMM, so on-policy ratios stay exactly 1. The sampler's log-probs
// differ from the training forward's by fp32 rounding (TestSamplerLogprobs
// MatchTraining bounds it).
class DecodeGemmScope {
 public:
  explicit DecodeGemmScope(Model& m) : m_(m), saved_(m.decode_gemm) { m.decode_gemm = true; }
  ~DecodeGemmScope() { m_.decode_gemm = saved_; }
  DecodeGemmScope(const DecodeGemmScope&) = delete;
  DecodeGemmScope& operator=(const DecodeGemmScope&) = delete;

 private:
  Model& m_;
  bool saved_;
};

// matmul_nt is x [M, K] times w [N, K] transposed, plus b [N] when defined:
// by oneDNN under a DecodeGemmScope where it applies (CPU, float32,
// contiguous, no autograd), else by at::mm / at::addmm.
at::Tensor matmul_nt(const Model& m, const at::Tensor& x, const at::Tensor& w, const at::Tensor& b = {});

// OneDnnStatus says whether matmul_nt's oneDNN path is available: library is
// the object dnnl_sgemm was found in, why the reason when it was not.
struct OneDnnStatus {
  bool active = false;
  std::string library, why;
};
const OneDnnStatus& onednn_status();

// decode_attention (decode_attention.cpp) attends one float32 query per row
// on CPU: q [B, nh, 1, hd] against a KV cache k, v [B, nkv, Lk, hd] (GQA:
// query head h reads kv head h / (nh / nkv)), with an optional additive mask
// bias [B, 1, 1, 1, Lk]; returns [B, 1, nh * hd]. decode_attention_applies
// says whether it takes these tensors (CPU, float32, no autograd, one
// query); CUDA, float64 (tests) and 16-bit models take attention()'s general
// path.
bool decode_attention_applies(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v, const at::Tensor& bias);
at::Tensor decode_attention(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v, const at::Tensor& bias,
                            double scale);

// serial_decode says whether a decode step of rows rows is small enough for
// SerialScope: its largest matmul (the vocab projection or the MLP) is under
// a few million multiply-adds, so no op in it gains from a second thread.
bool serial_decode(const Model& m, int64_t rows);
bool serial_decode_arch(const ort_arch& a, int64_t rows);  // the same rule, for a CPU model of arch a

// aten_attention is attention's general path (ATen ops; fused SDPA on
// libtorch 2.x): q [B, nh, L, hd], k, v [B, nkv, Lk, hd]; allowed/bias as
// LayerCtx's (either may be undefined); cached: keys come from a KV cache;
// packed: allowed separates packed rows. Returns [B, L, nh * hd].
at::Tensor aten_attention(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v, const at::Tensor& allowed,
                          const at::Tensor& bias, bool cached, bool packed, at::ScalarType acc);

// sgemm_available says whether oneDNN's dnnl_sgemm was found (onednn.cpp);
// sgemm_nt runs y [M, N] = x [M, K] w [N, K]^T (+ b) with it, false when it
// cannot (not found, or it returned an error).
bool sgemm_available();
bool sgemm_nt(const at::Tensor& x, const at::Tensor& w, const at::Tensor& b, at::Tensor& y);

// decode_kernels.cpp: the C entry points' bodies (worker_abi.h, ABI 10).
std::pair<std::vector<ort_gemm_timing>, std::vector<ort_attention_timing>> decode_shapes(const ort_arch& a);
void bench_gemm(ort_gemm_timing* t, int32_t n, double budget_s);
void bench_attention(ort_attention_timing* t, int32_t n, double budget_s);
void set_decode_kernels(Model& m, const std::string& spec);

// loss.cpp: token log-probs and entropies of targets given hidden rows,
// chunked over rows so [N, V] logits never exist at once.
// chunk = rows per chunk, 0 = auto.
std::vector<at::Tensor> chunked_logprobs(const at::Tensor& h, const at::Tensor& w, const at::Tensor& targets,
                                         double temperature, int64_t chunk);

// Batch is a decoded ort_batch on the model's device.
struct Batch {
  int64_t B = 0, L = 0, T = 0;
  at::Tensor ids, pos;        // [S, L] long, right-padded (S = B unless packed)
  at::Tensor seg;             // [S, L] long when packed: the row of each position, -1 for padding
  at::Tensor gather_idx;      // [N] flat index into B*L of the hidden predicting each completion token
  at::Tensor targets;         // [N] completion token ids
  at::Tensor row_idx, col_idx;  // [N] position of each completion token in [B, T]
  std::vector<int64_t> comp_len;
};
Batch decode_batch(const Model& m, const ort_batch* b);
// token_logprobs returns {logp [N], entropy [N]} for the batch's completion tokens.
std::vector<at::Tensor> token_logprobs(Model& m, const Batch& bt, double temperature, bool reference,
                                       const volatile int32_t* cancel);
void forward_backward(Model& m, const ort_batch* b, const ort_loss_config& c, bool backward, ort_loss_stats* st,
                      const volatile int32_t* cancel);

// state.cpp: the model's named tensors by kind (ORT_KIND_*): listing,
// reading and writing them by name with map lookups.
void need_finalized(const Model& m);
// index_weights records the HF weight names and shapes config.json implies.
void index_weights(Model& m);
// index_trainable records what the optimizer updates; finalize calls it.
void index_trainable(Model& m);
// trainable returns (name, tensor) for every tensor the optimizer updates,
// in a stable order (HF names for full fine-tuning, PEFT names for LoRA).
NamedTensors& trainable(Model& m);
// list_tensors lists a kind's tensors, keeping the list until
// forget_listings; refresh rebuilds it.
const std::vector<TensorMeta>& list_tensors(Model& m, int32_t kind, bool refresh);
void forget_listings(Model& m);
// read_tensor returns a tensor by kind and name as a contiguous CPU tensor
// (weights with their LoRA adapter folded in; gradients zero when absent).
at::Tensor read_tensor(Model& m, int32_t kind, const std::string& name);
// write_tensor overwrites or loads one tensor, checking its shape.
void write_tensor(Model& m, int32_t kind, const std::string& name, const at::Tensor& src);

// device_memory.cpp
ort_device_memory_stats device_memory(const Model& m, bool reset_peak);

// train.cpp
double optimizer_step(Model& m, double lr);
void zero_grad(Model& m);
// clip_factor scales gradients of global norm norm to max_grad_norm
// (torch.nn.utils.clip_grad_norm_); 1 when they are within it.
double clip_factor(const Model& m, double norm);
// adamw_update applies one AdamW step at m.step (already advanced) to ws in
// place, from gradients gs scaled by clip and moments m1s, vs (updated).
void adamw_update(Model& m, const std::vector<at::Tensor>& ws, const std::vector<at::Tensor>& gs,
                  const std::vector<at::Tensor>& m1s, const std::vector<at::Tensor>& vs, double clip, double lr);

// shard.cpp, the parts without collectives.
// shard_absorb_state moves full-size AdamW state (a loaded checkpoint, any
// world size) into this rank's slices and drops the rest.
void shard_absorb_state(Model& m);
// shard_piece_name is "<param>@<param_off>"; find_shard_piece parses one
// and returns its bucket and piece, or false.
std::string shard_piece_name(const Model& m, const ShardPiece& p);
bool find_shard_piece(const Model& m, const std::string& name, const ShardBucket** bucket, const ShardPiece** piece);

// param_shard.cpp: ZeRO stage 3. A pass is one forward (and backward) over
// the units of a model whose parameters are sharded: begin it, take the
// completion rows' hidden states and the LM head, compute the loss and its
// backward (the layers reduce-scatter their gradients as it runs), tell it
// the head's gradient is whole, then finish it (the norm's and embedding's
// gradients; every collective awaited). A pass destroyed unfinished breaks
// the group, as its peers are left in a collective this rank skipped.
struct ShardedPass;
struct ShardedPassDeleter {
  void operator()(ShardedPass* p) const;
};
using ShardedPassPtr = std::unique_ptr<ShardedPass, ShardedPassDeleter>;
inline bool params_sharded(const Model& m) { return m.shard.stage == ORT_SHARD_PARAMETERS; }
ShardedPassPtr begin_sharded_pass(Model& m, bool reference, const volatile int32_t* cancel);
at::Tensor sharded_hidden(ShardedPass& p, const Batch& bt, bool grad);  // [N, H], as completion_hidden
at::Tensor sharded_lm_head(ShardedPass& p, bool grad);
void sharded_head_done(ShardedPass& p);
void finish_sharded_pass(ShardedPass& p, bool trained);
// need_full_weights refuses what needs the whole model on one rank (what
// names it) once stage 3 has sliced it.
void need_full_weights(const Model& m, const std::string& what);
ort_shard_memory shard_memory(Model& m, bool reset_peak);
// shard_param_piece is this rank's piece p of bucket b's parameters (its
// slice once sliced, else the tensor itself).
at::Tensor shard_param_piece(Model& m, const ShardBucket& b, const ShardPiece& p);
void unbind_param_model(Model& m);  // ort_model_free: the group forgets it

// sample.cpp
void sample(Model& m, const ort_sample_request* reqs, int32_t n, ort_sample_result* out,
            const volatile int32_t* cancel);

// sampling.cpp: the one token picker of the static and the continuous path.
struct RowSampling {
  double temperature = 0, top_p = 1, min_p = 0;  // temperature 0 = greedy
  int32_t top_k = 0;                            // 0 = off
};
void validate_sampling(const Model& m, const ort_sample_request& r, const std::string& where);
// row_uniform draws the next uniform of a row's stream: u = (x >> 11) / 2^53
// with x the next 64-bit output of the row's own mt19937 CPU generator
// (seeded with the request's seed), so u is in [0, 1) and a row's draws never
// depend on the other rows of the batch.
double row_uniform(at::Generator& gen);
// sample_rows picks one token per row of logits [n, V] with tensor ops and
// one host copy: temperature, top-k, top-p, min-p (in that order), then the
// smallest token id whose cumulative processed probability (in token-id
// order) exceeds u[i] times the row's total; greedy rows take the argmax.
// Returns the token ids and their processed log-probs.
void sample_rows(const at::Tensor& logits, const std::vector<RowSampling>& rows, const std::vector<double>& u,
                 std::vector<int64_t>* tokens, std::vector<double>* logps);

// decoder.cpp: continuous batching (ort_decoder_*). A failed add or step
// drops every live sequence (they may be half-advanced).
struct Decoder;
Decoder* new_decoder(Model& m, const ort_decoder_options& o);
void free_decoder(Decoder* d);
void decoder_add(Decoder& d, const ort_sample_request* reqs, const char* const* keys, int32_t n, int64_t* ids,
                 const volatile int32_t* cancel);
// decoder_step writes one event per live sequence and returns their count.
int32_t decoder_step(Decoder& d, ort_decode_event* events, int32_t cap, const volatile int32_t* cancel);
void decoder_release(Decoder& d, int64_t seq);
void decoder_forget(Decoder& d, const std::string& key);
ort_decoder_stats decoder_stats(Decoder& d);

}  // namespace ort
