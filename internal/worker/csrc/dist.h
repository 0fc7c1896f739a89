// dist.h: data-parallel training on c10d (dist.cpp). Never seen by Go; the
// entry points in abi.cpp wrap these.
#pragma once

#include <stdexcept>
#include <string>
#include <vector>

#include "model.h"

namespace ort {

struct Group;  // a joined process group (dist.cpp)

// TimeoutError is a join or collective that ran past the group's timeout;
// guard() (abi.cpp) returns it as ORT_ERR_TIMEOUT.
struct TimeoutError : std::runtime_error {
  using std::runtime_error::runtime_error;
};

// compiled_backends names the c10d backends this build can join ("gloo", "nccl").
std::vector<std::string> compiled_backends();

// StoreStatus says whether this libtorch's TCPStore serves with libuv:
// libuv_default when its options ask for libuv by default (2.4+), libuv when
// such a server starts (probed once on 127.0.0.1, port 0), detail why not.
// join_group falls back to the classic server when libuv is missing.
struct StoreStatus {
  bool libuv_default = false, libuv = false;
  std::string detail;
};
const StoreStatus& store_status();

// join_group rendezvouses through a TCPStore on o.master_addr:o.master_port
// (rank 0 serves it) and builds the process group for device: Gloo on CPU,
// NCCL on CUDA. Polls cancel while waiting for peers.
Group* join_group(const at::Device& device, const ort_group_options& o, const volatile int32_t* cancel);
void free_group(Group* g);
std::string group_backend(const Group& g);
// broadcast_trainable copies root's trainable tensors into every rank's.
void broadcast_trainable(Group& g, Model& m, int32_t root, const volatile int32_t* cancel);
// allreduce_grads averages the trainable tensors' gradients over the group
// in flat buckets; bytes and buckets report what was sent.
void allreduce_grads(Group& g, Model& m, int64_t* bytes, int32_t* buckets, const volatile int32_t* cancel);
// attach_shard lays out m's optimizer over g as g.shard says (shard.cpp);
// ort_group_join calls it once the group stands.
void attach_shard(Group& g, Model& m);
// reduce_grads is ort_group_reduce_grads: allreduce_grads without a shard,
// else a reduce-scatter into this rank's slice (shard.cpp).
ort_grad_sync reduce_grads(Group& g, Model& m, const volatile int32_t* cancel);
// sharded_optimizer_step is ort_group_optimizer_step (shard.cpp).
ort_shard_step_stats sharded_optimizer_step(Group& g, Model& m, double lr);
// gather_unit is ort_group_gather_unit (param_shard.cpp); unbind_param_group
// makes a group being freed forget its stage-3 model.
void gather_unit(Group& g, Model& m, int32_t unit, int32_t* units, const volatile int32_t* cancel);
void unbind_param_group(Group& g);
// allreduce_f64 reduces values element-wise over the group with op
// (ORT_REDUCE_*), in place.
void allreduce_f64(Group& g, int32_t op, double* values, size_t n, const volatile int32_t* cancel);
// allgather_bytes gathers every rank's n bytes (n <= max_n, max_n the same on
// every rank) into out, rank r's at r*max_n, zero-padded to max_n.
void allgather_bytes(Group& g, const void* data, size_t n, size_t max_n, void* out, size_t out_cap,
                     const volatile int32_t* cancel);

}  // namespace ort
