/* worker_abi.h: the C ABI of ortrain's libtorch worker.
 *
 * Rules: opaque handle, plain structs, no C++ types. Every function that can
 * fail returns ORT_OK (0) on success and a nonzero ORT_ERR_* code on failure,
 * writing a NUL-terminated message into the caller's err buffer; no C++
 * exception or TORCH_CHECK ever crosses this boundary. Every buffer the
 * library writes into comes with its capacity, and a call whose output does
 * not fit fails with a message instead of writing past it. The codes below are the one definition of each numeric
 * vocabulary; the Go side checks its constants against them at compile time.
 * Bump ORT_ABI_VERSION on any change to this file; the Go loader refuses a
 * library whose ort_abi_version() differs.
 */
#ifndef ORTRAIN_WORKER_ABI_H
#define ORTRAIN_WORKER_ABI_H

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

#define ORT_ABI_VERSION 11

/* Return codes. ORT_ERR_TIMEOUT: a process-group rendezvous or collective
 * ran past the group's timeout (ortrain's own deadline, or a backend or
 * store timeout that fired first); callers may wait longer or give up. */
enum { ORT_OK = 0, ORT_ERR = 1, ORT_ERR_TIMEOUT = 2 };

/* Element types; values cross the ABI. */
enum { ORT_F32 = 0, ORT_BF16 = 1, ORT_F16 = 2, ORT_F64 = 3, ORT_I64 = 4 };

/* Tensor families addressed by name. */
enum {
  ORT_KIND_WEIGHT = 0, /* HF names; get returns LoRA-merged weights */
  ORT_KIND_LORA = 1,   /* PEFT names (base_model.model.<module>.lora_A.weight;
                          base_model.model.<HF name> for modules_to_save) */
  ORT_KIND_OPTIM = 2,  /* "exp_avg.<name>", "exp_avg_sq.<name>", "step"; sharded: pieces "<...>@<offset>", and at
                          stage 3 "param.<name>@<offset>", the rank's slice of the parameter itself */
  ORT_KIND_GRAD = 3    /* gradient of a trainable tensor, by its weight/LoRA name (get only) */
};

/* Loss types (grpo.LossType, TRL's loss_type). */
enum {
  ORT_LOSS_DAPO = 0,
  ORT_LOSS_GRPO = 1,
  ORT_LOSS_BNPO = 2,
  ORT_LOSS_DR_GRPO = 3,
  ORT_LOSS_CISPO = 4,
  ORT_LOSS_SAPO = 5,
  ORT_LOSS_LUSPO = 6,
  ORT_LOSS_VESPO = 7,
  ORT_LOSS_SFT = 8 /* supervised fine-tuning: -log p(label), no ratio/clip/KL, advantages ignored */
};

/* Importance-sampling level (grpo.ISLevel, TRL's importance_sampling_level). */
enum { ORT_IS_LEVEL_TOKEN = 0, ORT_IS_LEVEL_SEQUENCE = 1 };

/* Importance-sampling correction between sampler and trainer log-probs
 * (grpo.ISCorrection, TRL's vllm_importance_sampling_mode). */
enum {
  ORT_IS_OFF = 0,
  ORT_IS_TOKEN_TRUNCATE = 1,
  ORT_IS_TOKEN_MASK = 2,
  ORT_IS_SEQUENCE_TRUNCATE = 3,
  ORT_IS_SEQUENCE_MASK = 4
};

/* How ort_forward_backward differentiates the vocabulary projection
 * (ort_loss_config.logprob_path). FUSED computes each chunk's log-probs and
 * the loss gradient w.r.t. the hidden states and the LM head in one pass, so
 * the logits are never recomputed; it applies where the loss is separable
 * per token (sft always; every other config except vespo and sequence-level
 * importance sampling, and sequence-level correction with a row that has
 * sampler but no old log-probs). RECOMPUTE keeps the logits out of memory and
 * recomputes each chunk in backward. AUTO = FUSED where it applies, else
 * RECOMPUTE; FUSED on a config it does not apply to is an error. */
enum { ORT_LOGPROB_AUTO = 0, ORT_LOGPROB_RECOMPUTE = 1, ORT_LOGPROB_FUSED = 2 };

/* RoPE scaling (config.json rope_scaling type). */
enum { ORT_ROPE_DEFAULT = 0, ORT_ROPE_LINEAR = 1, ORT_ROPE_LLAMA3 = 2 };

/* Why sampling stopped (ort_sample_result.stop_reason). */
enum { ORT_STOP_TOKEN = 1, ORT_STOP_LENGTH = 2 };

typedef struct ort_model ort_model;
typedef struct ort_group ort_group; /* a joined c10d process group (data-parallel training) */

/* Architecture, parsed from config.json by the Go side. */
typedef struct {
  int32_t vocab_size, hidden_size, intermediate_size, num_layers;
  int32_t num_heads, num_kv_heads, head_dim;
  double rms_eps, rope_theta;
  int32_t rope_scaling; /* ORT_ROPE_* */
  double rope_factor, rope_low_freq_factor, rope_high_freq_factor;
  int32_t rope_original_max_pos;
  int32_t tie_embeddings, attention_bias, qk_norm; /* attention_bias: q/k/v biases */
  int32_t o_bias;                                 /* o_proj bias (Llama attention_bias) */
} ort_arch;

typedef struct {
  const char *device; /* "cpu", "cuda", "cuda:N" */
  int32_t dtype;      /* ORT_F32, ORT_BF16, ORT_F16, ORT_F64 */
  int32_t threads;    /* intra-op threads; <= 0 keeps libtorch's choice */
  int64_t seed;
  int32_t lora_rank; /* 0 = full fine-tuning */
  double lora_alpha, lora_dropout;
  const char *lora_targets; /* comma-separated module names, e.g. "q_proj,v_proj" */
  int32_t reference;        /* keep a reference policy for KL */
  int32_t grad_checkpointing;
  double beta1, beta2, adam_eps, weight_decay, max_grad_norm;
  int64_t logprob_chunk_rows; /* token rows per vocab-projection chunk; 0 = auto */
  /* With LoRA: comma-separated modules trained in full, as PEFT's
   * modules_to_save (embed_tokens, lm_head, norm, input_layernorm,
   * post_attention_layernorm, q_norm, k_norm). Each gets a trainable copy;
   * the loaded weights stay frozen as the base/reference. NULL or "" = none. */
  const char *lora_modules_to_save;
} ort_model_options;

/* A micro-batch. Row i has tokens[token_off[i] .. token_off[i+1]) and
 * T_i = its length - prompt_len[i] completion positions stored at
 * comp[comp_off[i] .. comp_off[i+1]) in every completion-aligned array.
 * Optional arrays may be NULL; has_* flags (NULL = none) say per row whether
 * that row carries the array. */
typedef struct {
  int32_t n_rows;
  const int32_t *tokens;
  const int64_t *token_off;
  const int32_t *prompt_len;
  const int64_t *comp_off;
  const uint8_t *loss_mask;
  const float *sampler_logps;
  const uint8_t *has_sampler;
  const float *old_logps;
  const uint8_t *has_old;
  const float *ref_logps;
  const uint8_t *has_ref;
  const float *advantages;
  double round_tokens;
  int32_t grad_accum;
  /* Padding-free packing: per row, the packed sequence it is placed in
   * (0-based; a sequence's rows in row order, each attending only to
   * itself, positions restarting at 0). NULL = each row its own sequence,
   * right-padded to the longest. */
  const int32_t *pack_seq;
} ort_batch;

/* Mirrors grpo.LossConfig. */
typedef struct {
  int32_t loss_type;     /* ORT_LOSS_* */
  int32_t is_level;      /* ORT_IS_LEVEL_* */
  int32_t is_correction; /* ORT_IS_* */
  double epsilon, epsilon_high, delta, beta, temperature;
  int32_t max_completion_length;
  double sapo_temp_pos, sapo_temp_neg;
  double vespo_k_pos, vespo_lambda_pos, vespo_k_neg, vespo_lambda_neg;
  double is_clip_min, is_clip_max, entropy_coef;
  int32_t logprob_path; /* ORT_LOGPROB_* */
} ort_loss_config;

/* Sums and counts, so micro-batches reduce exactly. The Go side reads this
 * struct in place (worker.LossStats, layout checked at compile time). */
typedef struct {
  double loss;             /* the micro-batch loss that was back-propagated */
  double active_tokens;    /* sum of the loss mask */
  double rows;             /* rows in the micro-batch */
  double rows_with_tokens; /* rows with at least one active token */
  double clip_low, clip_high, clip_region, clip_denom; /* counts; denom = tokens or rows */
  double clip_low_min, clip_high_max;                  /* per-row fraction extremes */
  double cispo_clip;
  double kl_sum, entropy_sum;
  double vespo_phi_sum;
  double correct_tokens; /* active tokens whose argmax logit is the label (ABI 7) */
} ort_loss_stats;

typedef struct {
  const int32_t *prompt;
  int32_t prompt_len, max_new_tokens;
  double temperature, top_p;
  int32_t top_k;
  double min_p;
  const int32_t *stop_ids;
  int32_t n_stop;
  int64_t seed;
} ort_sample_request;

/* The caller allocates ids and logps with room for cap tokens each; cap must
 * be at least the request's max_new_tokens. */
typedef struct {
  int32_t *ids;
  float *logps;
  int32_t cap;
  int32_t n;
  int32_t stop_reason; /* ORT_STOP_* */
} ort_sample_result;

int ort_abi_version(void);
/* JSON {"libtorch":"x.y.z","cuda_devices":N,"threads":N,"cxx11_abi":0|1,"c10d":["gloo","nccl"],
 *       "onednn":{"active":true|false,"library":"...","detail":"..."},
 *       "tcpstore":{"libuv_default":true|false,"libuv":true|false,"detail":"..."}}
 * (c10d: the process-group backends compiled in; onednn: whether CPU decode
 * matmuls reach oneDNN's sgemm, and from which library; tcpstore: whether
 * the rendezvous store can serve with libuv). onednn and tcpstore were added
 * without a version bump: readers treat them as optional. */
int ort_info(char *json, size_t json_len, char *err, size_t err_len);

int ort_model_new(const ort_arch *arch, const ort_model_options *opts, ort_model **out, char *err, size_t err_len);
void ort_model_free(ort_model *m);
int ort_model_set_tensor(ort_model *m, int32_t kind, const char *name, int32_t dtype, const int64_t *shape,
                         int32_t ndim, const void *data, char *err, size_t err_len);
/* Checks every weight was set, then builds LoRA adapters and the reference. */
int ort_model_finalize(ort_model *m, char *err, size_t err_len);
/* Lists the tensors of a kind, in a stable order, and keeps that list for
 * ort_model_tensor_info, which reads entry index of it (so listing n tensors
 * costs O(n)). Writing a tensor or stepping the optimizer drops the list. */
int ort_model_tensor_count(ort_model *m, int32_t kind, int32_t *count, char *err, size_t err_len);
/* name has room for name_len bytes (NUL included), shape for shape_len dims. */
int ort_model_tensor_info(ort_model *m, int32_t kind, int32_t index, char *name, size_t name_len, int32_t *dtype,
                          int64_t *shape, size_t shape_len, int32_t *ndim, char *err, size_t err_len);
/* out has room for nbytes, which must be the tensor's exact size. */
int ort_model_get_tensor(ort_model *m, int32_t kind, const char *name, void *out, size_t nbytes, char *err,
                         size_t err_len);

/* Per-token log-probs and entropies of completion tokens (completion-aligned);
 * logps and entropies have room for logps_len and entropies_len floats, each
 * at least the batch's completion token count. */
int ort_logprobs(ort_model *m, const ort_batch *b, double temperature, int32_t reference, float *logps,
                 size_t logps_len, float *entropies, size_t entropies_len, const volatile int32_t *cancel, char *err,
                 size_t err_len);
/* Loss of one micro-batch; with backward != 0, accumulates gradients. */
int ort_forward_backward(ort_model *m, const ort_batch *b, const ort_loss_config *cfg, int32_t backward,
                         ort_loss_stats *stats, const volatile int32_t *cancel, char *err, size_t err_len);
/* Clips by global norm, applies AdamW at lr, zeroes gradients. */
int ort_optimizer_step(ort_model *m, double lr, double *grad_norm, char *err, size_t err_len);
int ort_zero_grad(ort_model *m, char *err, size_t err_len);

/* The device allocator's bytes for m's device (CUDA, libtorch >= 2.10):
 * allocated now and the peak since the last reset; available 0 where the
 * allocator cannot tell (CPU: use the process's RSS). reset_peak != 0 starts
 * a new peak after reading. */
typedef struct {
  int32_t available;
  int64_t allocated, peak_allocated;
} ort_device_memory_stats;
int ort_device_memory(ort_model *m, int32_t reset_peak, ort_device_memory_stats *out, char *err, size_t err_len);
int ort_sample(ort_model *m, const ort_sample_request *reqs, int32_t n, ort_sample_result *out,
               const volatile int32_t *cancel, char *err, size_t err_len);

/* Continuous batching (ABI 4). A decoder keeps a running batch of sequences
 * over one model: ort_decoder_add prefills new sequences (a prompt identical
 * to a live sequence's is prefilled once and its keys/values copied; a cache
 * key whose parked entry is a prefix of the prompt prefills only the rest),
 * ort_decoder_step samples one token for every live sequence and advances
 * them, a finished sequence leaves the batch at once (parked under its cache
 * key when it has one). Tokens are sampled as ort_sample does, so the same
 * request and seed give the same tokens on either path. Free decoders
 * before their model. A failed add or step drops every live sequence. */
typedef struct ort_decoder ort_decoder;

typedef struct {
  int64_t kv_cache_budget; /* bytes of parked keys/values kept between turns (LRU); 0 = keep none */
} ort_decoder_options;

typedef struct {
  int64_t seq;         /* from ort_decoder_add */
  int32_t token;       /* the sampled id */
  float logp;          /* its processed log-prob */
  int32_t stop_reason; /* 0 while the sequence goes on, else ORT_STOP_* (the sequence has left) */
} ort_decode_event;

typedef struct {
  int64_t live;            /* sequences in the running batch */
  int64_t cached_entries;  /* parked cache keys */
  int64_t cached_bytes;    /* their keys/values */
  int64_t slot_bytes;      /* keys/values allocated for the running batch */
  int64_t prefill_tokens;  /* prompt tokens run through the model */
  int64_t reused_tokens;   /* prompt tokens taken from a parked entry */
  int64_t shared_tokens;   /* prompt tokens copied from an identical live prompt */
  int64_t evictions;       /* parked entries dropped for the budget */
} ort_decoder_stats;

int ort_decoder_new(ort_model *m, const ort_decoder_options *opts, ort_decoder **out, char *err, size_t err_len);
void ort_decoder_free(ort_decoder *d);
/* keys may be NULL, and keys[i] NULL or "" for no cache key; ids has room for n. */
int ort_decoder_add(ort_decoder *d, const ort_sample_request *reqs, const char *const *keys, int32_t n, int64_t *ids,
                    const volatile int32_t *cancel, char *err, size_t err_len);
/* events has room for cap events; cap must be at least the live count. It
 * runs decode steps while the events of one more step fit in cap, and returns
 * after a step in which a sequence finished: cap = the live count runs exactly
 * one step. */
int ort_decoder_step(ort_decoder *d, ort_decode_event *events, int32_t cap, int32_t *n,
                     const volatile int32_t *cancel, char *err, size_t err_len);
/* Drops a live sequence (a caller gave up); unknown ids are ignored. */
int ort_decoder_release(ort_decoder *d, int64_t seq, char *err, size_t err_len);
/* Drops the parked entry of a cache key, if any. */
int ort_decoder_forget(ort_decoder *d, const char *key, char *err, size_t err_len);
int ort_decoder_get_stats(ort_decoder *d, ort_decoder_stats *stats, char *err, size_t err_len);

/* Data-parallel training on c10d. Every rank calls the same collectives in
 * the same order. A collective that fails, times out or is cancelled leaves
 * the group broken: later calls fail at once; free it and join anew. A join
 * or collective that runs past timeout_ms returns ORT_ERR_TIMEOUT. */
typedef struct {
  const char *master_addr; /* rank 0 serves the TCPStore rendezvous here */
  int32_t master_port;
  int32_t rank, world_size;
  int64_t timeout_ms;   /* rendezvous, and each collective; > 0 */
  int64_t bucket_bytes; /* gradient bucket size; <= 0 = 25 MiB */
  int32_t shard;        /* ORT_SHARD_*: how the model's optimizer is spread over the ranks */
} ort_group_options;

/* ZeRO stages of ort_group_options.shard. NONE: every rank keeps all
 * gradients and AdamW state (all-reduce). OPTIMIZER (stage 1): each rank
 * keeps the AdamW state of its 1/P slice of every bucket of flattened
 * trainable tensors, receives its slice of the averaged gradients by
 * reduce-scatter after the last micro-batch, steps it and all-gathers the
 * parameters. GRADIENTS (stage 2): as OPTIMIZER, but the gradients are
 * reduce-scattered after every micro-batch, so only the slice is kept
 * between micro-batches. PARAMETERS (stage 3, ABI 11): as GRADIENTS, and
 * each rank keeps only its slice of the parameters too, cut by unit (the
 * embedding, each decoder layer, the final norm, the LM head), frozen ones
 * (LoRA base weights, the reference copy) included. A unit's full tensors
 * are all-gathered just before it runs and dropped right after; each
 * layer's backward gathers it again, recomputes it and reduce-scatters its
 * gradients as soon as it ends. Every rank must run the same forward,
 * backward and log-prob calls in the same order (they are collectives).
 * The full tensors are sliced away at the group's first training or
 * log-prob call, so ort_group_broadcast_trainable still sees them; weights
 * are then read a unit at a time with ort_group_gather_unit, and sampling
 * from the model itself is refused. */
enum { ORT_SHARD_NONE = 0, ORT_SHARD_OPTIMIZER = 1, ORT_SHARD_GRADIENTS = 2, ORT_SHARD_PARAMETERS = 3 };

/* What one ort_group_reduce_grads sent. */
typedef struct {
  int64_t bytes;    /* bytes each rank contributed, as sent (Gloo sends 16-bit floats as float32) */
  int32_t buckets;  /* collectives, one per bucket */
  int32_t emulated; /* 1: reduce-scatter built from an all-reduce (Gloo) */
  /* Stage 3 (ABI 11): what the passes since the last call did besides the
   * reduce-scatters above: the parameter bytes this rank sent to the
   * layers' all-gathers, and the seconds they waited on all-gathers and
   * reduce-scatters (the rest overlapped computation). */
  int64_t gather_bytes;
  double wait_seconds;
} ort_grad_sync;

/* What one sharded optimizer step did besides the update. */
typedef struct {
  double grad_norm;     /* global L2 norm before clipping */
  double comm_seconds;  /* waiting on the norm's all-reduce and the parameters' all-gather */
  int64_t gather_bytes; /* parameter bytes each rank sent */
} ort_shard_step_stats;

/* Joins the group with m's device's backend (Gloo on CPU, NCCL on CUDA). */
int ort_group_join(ort_model *m, const ort_group_options *o, ort_group **out, const volatile int32_t *cancel,
                   char *err, size_t err_len);
void ort_group_free(ort_group *g);
/* Writes the backend name ("gloo", "nccl") into name (room for name_len bytes). */
int ort_group_backend(ort_group *g, char *name, size_t name_len, char *err, size_t err_len);
/* Overwrites every rank's trainable tensors (full weights, or LoRA adapters
 * and modules_to_save) with root's. */
int ort_group_broadcast_trainable(ort_group *g, ort_model *m, int32_t root, const volatile int32_t *cancel, char *err,
                                  size_t err_len);
/* Averages the trainable tensors' gradients over the group (one collective
 * per bucket). Unsharded and OPTIMIZER: call once after the last
 * micro-batch of an optimizer step; GRADIENTS: after every micro-batch. With
 * a shard, each rank keeps only its slice of the average (added to what
 * earlier micro-batches left there) and the full gradients are dropped. */
int ort_group_reduce_grads(ort_group *g, ort_model *m, ort_grad_sync *out, const volatile int32_t *cancel, char *err,
                           size_t err_len);
/* The optimizer step of a sharded model (shard != NONE): global-norm
 * clipping over every rank's slice, AdamW on this rank's slice, then (stages
 * 1 and 2) an all-gather of the parameters, so every rank holds the whole
 * updated model; at stage 3 the slices are the parameters, and the next
 * pass gathers them.
 * Runs to the end once started (no cancel): a half-gathered model would be
 * worse than a late one; the group's timeout still bounds it. */
int ort_group_optimizer_step(ort_group *g, ort_model *m, double lr, ort_shard_step_stats *out, char *err,
                             size_t err_len);
/* Stage 3: gathers unit (0 .. units-1, in forward order) of m's full
 * tensors on every rank, so that ort_model_get_tensor reads its weights
 * (ORT_KIND_WEIGHT, LoRA folded in) and trainable tensors (ORT_KIND_LORA)
 * until the next call; unit -1 only drops what is staged. Writes the number
 * of units into units (may be null). A collective: every rank calls it with
 * the same unit. */
int ort_group_gather_unit(ort_group *g, ort_model *m, int32_t unit, int32_t *units, const volatile int32_t *cancel,
                          char *err, size_t err_len);

/* What a rank holds of a sharded model (any stage), in bytes. */
typedef struct {
  int64_t param_bytes;          /* parameters this rank keeps (stage 3: its slices, frozen ones included) */
  int64_t grad_bytes;           /* gradients kept between micro-batches (stages 2-3: the slices) */
  int64_t optim_bytes;          /* AdamW moments */
  int64_t gathered_bytes;       /* stage 3: full tensors gathered right now */
  int64_t peak_gathered_bytes;  /* stage 3: the most gathered at once since the last reset */
} ort_shard_memory;

/* Reports what m holds; reset_peak restarts peak_gathered_bytes. */
int ort_model_shard_memory(ort_model *m, int32_t reset_peak, ort_shard_memory *out, char *err, size_t err_len);

/* Reductions of ort_group_allreduce_f64. */
enum { ORT_REDUCE_SUM = 0, ORT_REDUCE_MIN = 1, ORT_REDUCE_MAX = 2 };
/* Reduces n doubles element-wise over the group (ORT_REDUCE_*), in place. */
int ort_group_allreduce_f64(ort_group *g, int32_t op, double *values, size_t n, const volatile int32_t *cancel,
                            char *err, size_t err_len);
/* Gathers n bytes from every rank into out: rank r's at r*max_n, zero-padded
 * to max_n, which every rank passes the same (all-reduce the sizes first);
 * out has room for out_cap >= world_size*max_n bytes. */
int ort_group_allgather(ort_group *g, const void *data, size_t n, size_t max_n, void *out, size_t out_cap,
                        const volatile int32_t *cancel, char *err, size_t err_len);

/* Decode kernels (ABI 10). CPU float32 sampling and decoding can run each
 * product [rows, k] x [n, k]^T on oneDNN's sgemm or on at::mm, and attend
 * one query per row with the worker's fused loop or with ATen's ops. Which
 * is faster depends on the CPU and its BLAS, so the caller measures both on
 * the model's own shapes and sets the choice per shape.
 *
 * ort_decode_shapes lists what to measure for a model of arch: one
 * ort_gemm_timing per distinct (k, n) of its projections and LM head at 1,
 * 16 and 128 rows (a product of M rows takes the choice of the nearest of
 * these), and one ort_attention_timing at 1 and 16 rows; serial says the
 * decode step of those rows runs on one thread (it does, for a model that
 * small), and the timing does the same. It writes at most gemm_cap and
 * attn_cap entries and the counts it needed into n_gemm and n_attn. */
typedef struct {
  int64_t rows, k, n; /* x [rows, k] times w [n, k]^T */
  int32_t serial;     /* time it on one thread */
  /* Outputs of ort_bench_gemm: seconds per product, the fastest of several
   * runs (of one, once the budget is spent); onednn_s < 0: oneDNN's sgemm
   * is unavailable. n above 4096 is timed on its first 4096 rows. */
  double onednn_s, aten_s;
} ort_gemm_timing;

typedef struct {
  int64_t rows, heads, kv_heads, head_dim, keys;
  int32_t serial;
  double fused_s, aten_s; /* outputs of ort_bench_attention, as ort_gemm_timing's */
} ort_attention_timing;

int ort_decode_shapes(const ort_arch *arch, ort_gemm_timing *gemm, int32_t gemm_cap, int32_t *n_gemm,
                      ort_attention_timing *attn, int32_t attn_cap, int32_t *n_attn, char *err, size_t err_len);
/* Time every entry on random data, in order: several runs each until
 * budget_s seconds are spent, then one run each (a choice needs every
 * number, and the same numbers every time it is made). threads > 0 sets
 * libtorch's intra-op threads first (process-wide, as ort_model_new does). */
int ort_bench_gemm(ort_gemm_timing *t, int32_t n, int32_t threads, double budget_s, char *err, size_t err_len);
int ort_bench_attention(ort_attention_timing *t, int32_t n, int32_t threads, double budget_s, char *err,
                        size_t err_len);
/* Sets m's decode kernels from spec, space-separated fields:
 *   fallback=onednn|aten   shapes not listed (the default before any call: onednn)
 *   attention=fused|aten
 *   gemm:KxN=B1,B16,B128   the backend at 1, 16 and 128 rows, each onednn|aten
 * Fails, changing nothing, on a malformed spec or one that names onednn
 * where oneDNN's sgemm is unavailable. */
int ort_model_set_decode_kernels(ort_model *m, const char *spec, char *err, size_t err_len);

#ifdef __cplusplus
}
#endif
#endif
