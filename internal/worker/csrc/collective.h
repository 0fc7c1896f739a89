// collective.h: the joined process group and the collective primitives that
// dist.cpp (rendezvous, broadcast, all-reduce) and shard.cpp (ZeRO stages 1
// and 2) share. Never seen by Go.
#pragma once

#include <chrono>
#include <string>
#include <vector>

#include "dist.h"  // first: model.h defines ORT_TORCH_AT_LEAST

#include <torch/csrc/distributed/c10d/TCPStore.hpp>
#include <torch/csrc/distributed/c10d/Types.hpp>
#include <torch/csrc/distributed/c10d/Work.hpp>
#ifdef USE_C10D_GLOO
#include <torch/csrc/distributed/c10d/ProcessGroupGloo.hpp>
#endif
#ifdef USE_C10D_NCCL
#include <torch/csrc/distributed/c10d/ProcessGroupNCCL.hpp>
#endif
#if ORT_TORCH_AT_LEAST(2, 0)
#include <torch/csrc/distributed/c10d/Backend.hpp>
#else
#include <torch/csrc/distributed/c10d/ProcessGroup.hpp>
#endif

namespace ort {

#if ORT_TORCH_AT_LEAST(2, 0)
using Collectives = c10d::Backend;
#else
using Collectives = c10d::ProcessGroup;
#endif

using Clock = std::chrono::steady_clock;
using std::chrono::milliseconds;

constexpr int64_t kDefaultBucketBytes = int64_t{25} << 20;  // DDP's bucket_cap_mb default

struct Group {
  // Declared before pg, so destroyed after it: the backend may still use the
  // store while it shuts down.
  c10::intrusive_ptr<c10d::Store> store;
  c10::intrusive_ptr<Collectives> pg;
  std::string backend;
  at::Device device{at::kCPU};
  int rank = 0, size = 1;
  milliseconds timeout{0};
  int64_t bucket_bytes = kDefaultBucketBytes;
  int32_t shard = ORT_SHARD_NONE;  // ZeRO stage of the model's optimizer (ORT_SHARD_*)
  Model* param_model = nullptr;    // stage 3: the model whose parameters this group gathers
  std::string broken;  // why the group is unusable, after a failed collective
};

// Bucket is a run of same-dtype tensors sent as one flat tensor.
struct Bucket {
  size_t index = 0;
  std::vector<at::Tensor> parts;
  at::Tensor flat;
  c10::intrusive_ptr<c10d::Work> work;
};

std::string error_text(const std::exception& e);  // c10::Error without its backtrace
bool cancelled(const volatile int32_t* cancel);
// backend_timeout is what Gloo, NCCL and the store are told for a group
// timeout t: t plus a margin wide enough for a descheduled poll to wake.
milliseconds backend_timeout(milliseconds t);
bool is_timeout(const std::string& msg);
// fail breaks the group; op names the step ("" when the call does one).
[[noreturn]] void fail(Group& g, const std::string& op, const std::string& msg, bool timeout = false);
[[noreturn]] void fail_backend(Group& g, const std::string& op, const std::exception& e);
void check_usable(const Group& g);
void check_model(const Group& g, const Model& m);
// grads_on_any_rank says, by trainable tensor, whether some rank holds a
// gradient for it (one all-reduce): one no rank has is neither sent nor
// stepped, as torch.optim skips a tensor without a gradient.
std::vector<uint8_t> grads_on_any_rank(Group& g, Model& m, const volatile int32_t* cancel);
// await polls w until it completes, the group's timeout passes or cancel is
// set, then rethrows the backend's error, if any.
void await(Group& g, const c10::intrusive_ptr<c10d::Work>& w, const std::string& op, const volatile int32_t* cancel);
c10::intrusive_ptr<c10d::Work> start_allreduce(Group& g, at::Tensor& t, const std::string& op,
                                               c10d::ReduceOp::RedOpType red = c10d::ReduceOp::SUM);
// make_buckets cuts ts, in order, into runs of one dtype and at most cap
// bytes (a tensor larger than cap is a bucket of its own).
std::vector<Bucket> make_buckets(const std::vector<at::Tensor>& ts, int64_t cap);
std::string bucket_name(const Bucket& b, size_t n);
// wire_dtype is what a bucket travels as: Gloo reduces 16-bit floats in
// fp32 (1.13's Gloo has no bfloat16 kernels, and the average is exacter).
at::ScalarType wire_dtype(const Group& g, at::ScalarType t);
at::Tensor flatten(const Group& g, const std::vector<at::Tensor>& parts);

// kBucketsInFlight bounds the buckets a reduce-scatter or all-gather has
// started and not finished: two keep the backend busy (it runs them in
// order) while a step holds at most two buckets' copies at once.
constexpr size_t kBucketsInFlight = 2;
// padded is flat extended with zeros to n elements.
at::Tensor padded(const at::Tensor& flat, int64_t n);
bool native_reduce_scatter(const Group& g);
// start_reduce_scatter starts the sum of every rank's flat [size * chunk]
// into out [chunk] (native) or into flat itself (an all-reduce, Gloo);
// finish_reduce_scatter returns this rank's chunk of the sum.
c10::intrusive_ptr<c10d::Work> start_reduce_scatter(Group& g, at::Tensor& flat, at::Tensor& out, const std::string& op);
at::Tensor finish_reduce_scatter(const Group& g, const at::Tensor& flat, const at::Tensor& out, int64_t chunk);
// start_allgather starts gathering every rank's mine [chunk] into full
// [size * chunk], rank r's at r * chunk.
c10::intrusive_ptr<c10d::Work> start_allgather(Group& g, at::Tensor& mine, at::Tensor& full, const std::string& op);

// param_layout.cpp: stage 3's layout, and the binding of a model to the
// group its gathers run on (cleared by free_group and ort_model_free).
Shard build_param_shard(Model& m, int rank, int size);
// slice_params cuts every unit's slices out of the full tensors and drops
// them (param_layout.cpp; the first pass or gather does it).
void slice_params(Model& m);
void bind_param_group(Group& g, Model& m);
void unflatten(const at::Tensor& flat, std::vector<at::Tensor>& parts);

}  // namespace ort
