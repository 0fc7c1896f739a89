/* dlapi.h: the worker library's entry points, resolved with dlsym into one
 * struct per opened library, and trampolines (cgo cannot call C function
 * pointers directly). Included by every cgo file of package worker. */
#ifndef ORTRAIN_DLAPI_H
#define ORTRAIN_DLAPI_H

#include <dlfcn.h>
#include <stdio.h>
#include <stdlib.h>
#include "csrc/worker_abi.h"

// ort_api holds the resolved entry points of one opened library.
typedef struct {
  void *handle;
  int (*abi_version)(void);
  int (*info)(char *, size_t, char *, size_t);
  int (*model_new)(const ort_arch *, const ort_model_options *, ort_model **, char *, size_t);
  void (*model_free)(ort_model *);
  int (*set_tensor)(ort_model *, int32_t, const char *, int32_t, const int64_t *, int32_t, const void *, char *, size_t);
  int (*finalize)(ort_model *, char *, size_t);
  int (*tensor_count)(ort_model *, int32_t, int32_t *, char *, size_t);
  int (*tensor_info)(ort_model *, int32_t, int32_t, char *, size_t, int32_t *, int64_t *, size_t, int32_t *, char *, size_t);
  int (*get_tensor)(ort_model *, int32_t, const char *, void *, size_t, char *, size_t);
  int (*logprobs)(ort_model *, const ort_batch *, double, int32_t, float *, size_t, float *, size_t, const volatile int32_t *, char *, size_t);
  int (*forward_backward)(ort_model *, const ort_batch *, const ort_loss_config *, int32_t, ort_loss_stats *, const volatile int32_t *, char *, size_t);
  int (*optimizer_step)(ort_model *, double, double *, char *, size_t);
  int (*zero_grad)(ort_model *, char *, size_t);
  int (*sample)(ort_model *, const ort_sample_request *, int32_t, ort_sample_result *, const volatile int32_t *, char *, size_t);
  int (*decoder_new)(ort_model *, const ort_decoder_options *, ort_decoder **, char *, size_t);
  void (*decoder_free)(ort_decoder *);
  int (*decoder_add)(ort_decoder *, const ort_sample_request *, const char *const *, int32_t, int64_t *, const volatile int32_t *, char *, size_t);
  int (*decoder_step)(ort_decoder *, ort_decode_event *, int32_t, int32_t *, const volatile int32_t *, char *, size_t);
  int (*decoder_release)(ort_decoder *, int64_t, char *, size_t);
  int (*decoder_forget)(ort_decoder *, const char *, char *, size_t);
  int (*decoder_stats)(ort_decoder *, ort_decoder_stats *, char *, size_t);
  int (*device_memory)(ort_model *, int32_t, ort_device_memory_stats *, char *, size_t);
  int (*group_join)(ort_model *, const ort_group_options *, ort_group **, const volatile int32_t *, char *, size_t);
  void (*group_free)(ort_group *);
  int (*group_backend)(ort_group *, char *, size_t, char *, size_t);
  int (*group_broadcast_trainable)(ort_group *, ort_model *, int32_t, const volatile int32_t *, char *, size_t);
  int (*group_reduce_grads)(ort_group *, ort_model *, ort_grad_sync *, const volatile int32_t *, char *, size_t);
  int (*group_optimizer_step)(ort_group *, ort_model *, double, ort_shard_step_stats *, char *, size_t);
  int (*group_allreduce_f64)(ort_group *, int32_t, double *, size_t, const volatile int32_t *, char *, size_t);
  int (*group_allgather)(ort_group *, const void *, size_t, size_t, void *, size_t, const volatile int32_t *, char *, size_t);
  int (*group_gather_unit)(ort_group *, ort_model *, int32_t, int32_t *, const volatile int32_t *, char *, size_t);
  int (*model_shard_memory)(ort_model *, int32_t, ort_shard_memory *, char *, size_t);
  int (*decode_shapes)(const ort_arch *, ort_gemm_timing *, int32_t, int32_t *, ort_attention_timing *, int32_t, int32_t *, char *, size_t);
  int (*bench_gemm)(ort_gemm_timing *, int32_t, int32_t, double, char *, size_t);
  int (*bench_attention)(ort_attention_timing *, int32_t, int32_t, double, char *, size_t);
  int (*set_decode_kernels)(ort_model *, const char *, char *, size_t);
} ort_api;

static inline int ort_api_open(const char *path, ort_api *a, char *err, size_t n) {
  a->handle = dlopen(path, RTLD_NOW | RTLD_LOCAL);
  if (!a->handle) {
    snprintf(err, n, "%s", dlerror());
    return 1;
  }
#define ORT_SYM(field, name)                                               \
  *(void **)(&a->field) = dlsym(a->handle, name);                          \
  if (!a->field) {                                                         \
    snprintf(err, n, "symbol %s missing (library too old?)", name);        \
    dlclose(a->handle);                                                    \
    a->handle = NULL;                                                      \
    return 1;                                                              \
  }
  ORT_SYM(abi_version, "ort_abi_version")
  ORT_SYM(info, "ort_info")
  ORT_SYM(model_new, "ort_model_new")
  ORT_SYM(model_free, "ort_model_free")
  ORT_SYM(set_tensor, "ort_model_set_tensor")
  ORT_SYM(finalize, "ort_model_finalize")
  ORT_SYM(tensor_count, "ort_model_tensor_count")
  ORT_SYM(tensor_info, "ort_model_tensor_info")
  ORT_SYM(get_tensor, "ort_model_get_tensor")
  ORT_SYM(logprobs, "ort_logprobs")
  ORT_SYM(forward_backward, "ort_forward_backward")
  ORT_SYM(optimizer_step, "ort_optimizer_step")
  ORT_SYM(zero_grad, "ort_zero_grad")
  ORT_SYM(sample, "ort_sample")
  ORT_SYM(decoder_new, "ort_decoder_new")
  ORT_SYM(decoder_free, "ort_decoder_free")
  ORT_SYM(decoder_add, "ort_decoder_add")
  ORT_SYM(decoder_step, "ort_decoder_step")
  ORT_SYM(decoder_release, "ort_decoder_release")
  ORT_SYM(decoder_forget, "ort_decoder_forget")
  ORT_SYM(decoder_stats, "ort_decoder_get_stats")
  ORT_SYM(device_memory, "ort_device_memory")
  ORT_SYM(group_join, "ort_group_join")
  ORT_SYM(group_free, "ort_group_free")
  ORT_SYM(group_backend, "ort_group_backend")
  ORT_SYM(group_broadcast_trainable, "ort_group_broadcast_trainable")
  ORT_SYM(group_reduce_grads, "ort_group_reduce_grads")
  ORT_SYM(group_optimizer_step, "ort_group_optimizer_step")
  ORT_SYM(group_allreduce_f64, "ort_group_allreduce_f64")
  ORT_SYM(group_allgather, "ort_group_allgather")
  ORT_SYM(group_gather_unit, "ort_group_gather_unit")
  ORT_SYM(model_shard_memory, "ort_model_shard_memory")
  ORT_SYM(decode_shapes, "ort_decode_shapes")
  ORT_SYM(bench_gemm, "ort_bench_gemm")
  ORT_SYM(bench_attention, "ort_bench_attention")
  ORT_SYM(set_decode_kernels, "ort_model_set_decode_kernels")
#undef ORT_SYM
  return 0;
}

// Trampolines: cgo cannot call C function pointers directly.
static inline int ort_call_abi_version(ort_api *a) { return a->abi_version(); }
static inline int ort_call_info(ort_api *a, char *j, size_t jn, char *e, size_t en) { return a->info(j, jn, e, en); }
static inline int ort_call_model_new(ort_api *a, const ort_arch *ar, const ort_model_options *o, ort_model **m, char *e, size_t en) { return a->model_new(ar, o, m, e, en); }
static inline void ort_call_model_free(ort_api *a, ort_model *m) { a->model_free(m); }
static inline int ort_call_set_tensor(ort_api *a, ort_model *m, int32_t k, const char *nm, int32_t dt, const int64_t *sh, int32_t nd, const void *d, char *e, size_t en) { return a->set_tensor(m, k, nm, dt, sh, nd, d, e, en); }
static inline int ort_call_finalize(ort_api *a, ort_model *m, char *e, size_t en) { return a->finalize(m, e, en); }
static inline int ort_call_tensor_count(ort_api *a, ort_model *m, int32_t k, int32_t *c, char *e, size_t en) { return a->tensor_count(m, k, c, e, en); }
static inline int ort_call_tensor_info(ort_api *a, ort_model *m, int32_t k, int32_t i, char *nm, size_t nn, int32_t *dt, int64_t *sh, size_t shn, int32_t *nd, char *e, size_t en) { return a->tensor_info(m, k, i, nm, nn, dt, sh, shn, nd, e, en); }
static inline int ort_call_get_tensor(ort_api *a, ort_model *m, int32_t k, const char *nm, void *o, size_t nb, char *e, size_t en) { return a->get_tensor(m, k, nm, o, nb, e, en); }
static inline int ort_call_logprobs(ort_api *a, ort_model *m, const ort_batch *b, double t, int32_t r, float *lp, size_t lpn, float *ent, size_t entn, const volatile int32_t *c, char *e, size_t en) { return a->logprobs(m, b, t, r, lp, lpn, ent, entn, c, e, en); }
static inline int ort_call_forward_backward(ort_api *a, ort_model *m, const ort_batch *b, const ort_loss_config *cfg, int32_t bw, ort_loss_stats *st, const volatile int32_t *c, char *e, size_t en) { return a->forward_backward(m, b, cfg, bw, st, c, e, en); }
static inline int ort_call_optimizer_step(ort_api *a, ort_model *m, double lr, double *gn, char *e, size_t en) { return a->optimizer_step(m, lr, gn, e, en); }
static inline int ort_call_zero_grad(ort_api *a, ort_model *m, char *e, size_t en) { return a->zero_grad(m, e, en); }
static inline int ort_call_sample(ort_api *a, ort_model *m, const ort_sample_request *r, int32_t n, ort_sample_result *o, const volatile int32_t *c, char *e, size_t en) { return a->sample(m, r, n, o, c, e, en); }
static inline int ort_call_decoder_new(ort_api *a, ort_model *m, const ort_decoder_options *o, ort_decoder **d, char *e, size_t en) { return a->decoder_new(m, o, d, e, en); }
static inline void ort_call_decoder_free(ort_api *a, ort_decoder *d) { a->decoder_free(d); }
static inline int ort_call_decoder_add(ort_api *a, ort_decoder *d, const ort_sample_request *r, const char *const *k, int32_t n, int64_t *ids, const volatile int32_t *c, char *e, size_t en) { return a->decoder_add(d, r, k, n, ids, c, e, en); }
static inline int ort_call_decoder_step(ort_api *a, ort_decoder *d, ort_decode_event *ev, int32_t cap, int32_t *n, const volatile int32_t *c, char *e, size_t en) { return a->decoder_step(d, ev, cap, n, c, e, en); }
static inline int ort_call_decoder_release(ort_api *a, ort_decoder *d, int64_t s, char *e, size_t en) { return a->decoder_release(d, s, e, en); }
static inline int ort_call_decoder_forget(ort_api *a, ort_decoder *d, const char *k, char *e, size_t en) { return a->decoder_forget(d, k, e, en); }
static inline int ort_call_decoder_stats(ort_api *a, ort_decoder *d, ort_decoder_stats *s, char *e, size_t en) { return a->decoder_stats(d, s, e, en); }
static inline int ort_call_device_memory(ort_api *a, ort_model *m, int32_t r, ort_device_memory_stats *o, char *e, size_t en) { return a->device_memory(m, r, o, e, en); }
static inline int ort_call_group_join(ort_api *a, ort_model *m, const ort_group_options *o, ort_group **g, const volatile int32_t *c, char *e, size_t en) { return a->group_join(m, o, g, c, e, en); }
static inline void ort_call_group_free(ort_api *a, ort_group *g) { a->group_free(g); }
static inline int ort_call_group_backend(ort_api *a, ort_group *g, char *nm, size_t nn, char *e, size_t en) { return a->group_backend(g, nm, nn, e, en); }
static inline int ort_call_group_broadcast_trainable(ort_api *a, ort_group *g, ort_model *m, int32_t root, const volatile int32_t *c, char *e, size_t en) { return a->group_broadcast_trainable(g, m, root, c, e, en); }
static inline int ort_call_group_reduce_grads(ort_api *a, ort_group *g, ort_model *m, ort_grad_sync *o, const volatile int32_t *c, char *e, size_t en) { return a->group_reduce_grads(g, m, o, c, e, en); }
static inline int ort_call_group_optimizer_step(ort_api *a, ort_group *g, ort_model *m, double lr, ort_shard_step_stats *o, char *e, size_t en) { return a->group_optimizer_step(g, m, lr, o, e, en); }
static inline int ort_call_group_gather_unit(ort_api *a, ort_group *g, ort_model *m, int32_t u, int32_t *n, const volatile int32_t *c, char *e, size_t en) { return a->group_gather_unit(g, m, u, n, c, e, en); }
static inline int ort_call_model_shard_memory(ort_api *a, ort_model *m, int32_t r, ort_shard_memory *o, char *e, size_t en) { return a->model_shard_memory(m, r, o, e, en); }
static inline int ort_call_group_allgather(ort_api *a, ort_group *g, const void *d, size_t n, size_t mx, void *o, size_t oc, const volatile int32_t *c, char *e, size_t en) { return a->group_allgather(g, d, n, mx, o, oc, c, e, en); }
static inline int ort_call_decode_shapes(ort_api *a, const ort_arch *ar, ort_gemm_timing *g, int32_t gc, int32_t *ng, ort_attention_timing *t, int32_t tc, int32_t *nt, char *e, size_t en) { return a->decode_shapes(ar, g, gc, ng, t, tc, nt, e, en); }
static inline int ort_call_bench_gemm(ort_api *a, ort_gemm_timing *t, int32_t n, int32_t th, double b, char *e, size_t en) { return a->bench_gemm(t, n, th, b, e, en); }
static inline int ort_call_bench_attention(ort_api *a, ort_attention_timing *t, int32_t n, int32_t th, double b, char *e, size_t en) { return a->bench_attention(t, n, th, b, e, en); }
static inline int ort_call_set_decode_kernels(ort_api *a, ort_model *m, const char *s, char *e, size_t en) { return a->set_decode_kernels(m, s, e, en); }
static inline int ort_call_group_allreduce_f64(ort_api *a, ort_group *g, int32_t op, double *v, size_t n, const volatile int32_t *c, char *e, size_t en) { return a->group_allreduce_f64(g, op, v, n, c, e, en); }
#endif
