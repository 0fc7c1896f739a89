// shard.cpp: ZeRO stages 1 and 2 on c10d (ort_group_options.shard), the
// way DeepSpeed ZeRO and PyTorch's ZeroRedundancyOptimizer spread the
// optimizer, on the collectives the data-parallel path already uses.
//
// The trainable tensors are flattened into the all-reduce's buckets; rank r
// owns elements [r*chunk, (r+1)*chunk) of each bucket. After the last
// micro-batch (stage 1) or after every micro-batch (stage 2) the gradients
// are reduce-scattered: each rank receives the average of its slice only
// and the full gradients are dropped. The step clips by the global norm
// (one all-reduce of the ranks' squared partial norms), runs AdamW on the
// slice against slice-sized moments, and all-gathers the parameters.
//
// On Gloo the reduce-scatter is built from an all-reduce of the padded
// bucket, of which each rank keeps its slice (start_reduce_scatter says
// why): the same result for about twice a ring reduce-scatter's traffic;
// NCCL runs its own.
#include <algorithm>
#include <cmath>
#include <deque>
#include <stdexcept>
#include <string>
#include <vector>

#include "collective.h"  // first: model.h defines ORT_TORCH_AT_LEAST

namespace ort {

namespace {

constexpr const char* kStageNames[] = {"none", "optimizer", "gradients", "parameters"};

// build_shard lays out m's trainable tensors for rank of size ranks.
Shard build_shard(Model& m, int32_t stage, int rank, int size, int64_t bucket_bytes) {
  Shard sh;
  sh.stage = stage;
  sh.rank = rank;
  sh.size = size;
  auto& params = trainable(m);
  sh.has_state.assign(params.size(), 0);
  sh.has_grad.assign(params.size(), 0);
  std::vector<at::Tensor> ts;
  for (const auto& p : params) ts.push_back(p.second);
  size_t next = 0;
  for (const auto& b : make_buckets(ts, bucket_bytes)) {
    ShardBucket sb;
    for (size_t i = 0; i < b.parts.size(); i++) sb.params.push_back(next++);
    for (auto i : sb.params) sb.numel += params[i].second.numel();
    sb.chunk = std::max<int64_t>(1, (sb.numel + size - 1) / size);
    sb.lo = std::min(sb.numel, rank * sb.chunk);
    sb.hi = std::min(sb.numel, (rank + 1) * sb.chunk);
    int64_t off = 0;
    for (auto i : sb.params) {
      const int64_t n = params[i].second.numel();
      const int64_t a = std::max(off, sb.lo), z = std::min(off + n, sb.hi);
      if (a < z) sb.pieces.push_back({i, a - off, z - a, a - sb.lo});
      off += n;
    }
    sh.buckets.push_back(std::move(sb));
  }
  return sh;
}

// ready_shard returns m's shard for g, laying it out on first use.
Shard& ready_shard(Group& g, Model& m) {
  auto& sh = m.shard;
  if (sh.stage == ORT_SHARD_NONE) {
    sh = g.shard == ORT_SHARD_PARAMETERS ? build_param_shard(m, g.rank, g.size)
                                         : build_shard(m, g.shard, g.rank, g.size, g.bucket_bytes);
  } else if (sh.stage != g.shard || sh.rank != g.rank || sh.size != g.size) {
    throw std::runtime_error("the model's optimizer is sharded as rank " + std::to_string(sh.rank) + " of " +
                             std::to_string(sh.size) + " (" + kStageNames[sh.stage] + "); this group has rank " +
                             std::to_string(g.rank) + " of " + std::to_string(g.size) + " (" + kStageNames[g.shard] +
                             "): load the model anew to change the layout");
  }
  return sh;
}

// flat_param is the flattened view of a trainable tensor: updates through
// it change the tensor.
at::Tensor flat_param(Model& m, size_t i) {
  auto& p = trainable(m)[i];
  if (!p.second.is_contiguous()) throw std::runtime_error("trainable tensor " + p.first + " is not contiguous");
  return p.second.detach().view({-1});
}

// bucket_grads is bucket b's gradients flattened in the wire dtype and
// padded to size*chunk (zeros for a tensor without a gradient on this rank).
at::Tensor bucket_grads(const Group& g, Model& m, const ShardBucket& b) {
  auto& params = trainable(m);
  std::vector<at::Tensor> parts;
  for (auto i : b.params) {
    const auto& p = params[i].second;
    parts.push_back(p.grad().defined() ? p.grad().reshape({-1}) : at::zeros({p.numel()}, p.options()));
  }
  auto flat = at::cat(parts).to(wire_dtype(g, params[b.params.front()].second.scalar_type()));
  return padded(flat, b.chunk * g.size);
}

bool any_grad(const Shard& sh, const ShardBucket& b) {
  return std::any_of(b.params.begin(), b.params.end(), [&](size_t i) { return sh.has_grad[i] != 0; });
}

}  // namespace

// padded is flat extended with zeros to n elements.
at::Tensor padded(const at::Tensor& flat, int64_t n) {
  if (flat.numel() == n) return flat;
  return at::cat({flat, at::zeros({n - flat.numel()}, flat.options())});
}

// native_reduce_scatter says whether g's backend reduce-scatters itself:
// NCCL does. Gloo has no reduce-scatter in libtorch 1.13, and the one
// libtorch 2.14's Gloo accepts never completed between two local ranks
// (reduce_scatter and _reduce_scatter_base alike, one bucket or many), so
// on Gloo it is built from an all-reduce.
bool native_reduce_scatter(const Group& g) { return g.backend == "nccl"; }

// start_reduce_scatter starts the sum of every rank's flat into out, this
// rank's chunk of it; without a native one, by an all-reduce of flat itself
// (finish_reduce_scatter then takes the chunk).
c10::intrusive_ptr<c10d::Work> start_reduce_scatter(Group& g, at::Tensor& flat, at::Tensor& out, const std::string& op) {
  if (!native_reduce_scatter(g)) return start_allreduce(g, flat, op);
  c10d::ReduceScatterOptions o;
  o.reduceOp = c10d::ReduceOp::SUM;
  o.timeout = backend_timeout(g.timeout);
  try {
    return g.pg->_reduce_scatter_base(out, flat, o);
  } catch (const std::exception& e) {
    fail_backend(g, op, e);
  }
}

c10::intrusive_ptr<c10d::Work> start_allgather(Group& g, at::Tensor& mine, at::Tensor& full, const std::string& op) {
  const int64_t chunk = mine.numel();
  // The backend keeps its own handles on these views until the work ends.
  std::vector<std::vector<at::Tensor>> outs(1);
  for (int r = 0; r < g.size; r++) outs[0].push_back(full.narrow(0, r * chunk, chunk));
  std::vector<at::Tensor> in{mine};
  c10d::AllgatherOptions o;
  o.timeout = backend_timeout(g.timeout);
  try {
    return g.pg->allgather(outs, in, o);
  } catch (const std::exception& e) {
    fail_backend(g, op, e);
  }
}

at::Tensor finish_reduce_scatter(const Group& g, const at::Tensor& flat, const at::Tensor& out, int64_t chunk) {
  if (native_reduce_scatter(g)) return out;
  return flat.narrow(0, g.rank * chunk, chunk);
}

void attach_shard(Group& g, Model& m) {
  if (g.shard < ORT_SHARD_NONE || g.shard > ORT_SHARD_PARAMETERS) {
    throw std::runtime_error("unknown shard stage " + std::to_string(g.shard) +
                             " (want 0 none, 1 optimizer, 2 gradients, 3 parameters)");
  }
  if (g.shard == ORT_SHARD_NONE) {
    if (m.shard.stage != ORT_SHARD_NONE) {
      throw std::runtime_error("the model's optimizer is sharded; an unsharded group cannot step it");
    }
    return;
  }
  need_finalized(m);
  ready_shard(g, m);
  if (g.shard == ORT_SHARD_PARAMETERS) bind_param_group(g, m);
  forget_listings(m);
}

std::string shard_piece_name(const Model& m, const ShardPiece& p) {
  return m.params[p.param].first + "@" + std::to_string(p.param_off);
}

bool find_shard_piece(const Model& m, const std::string& name, const ShardBucket** bucket, const ShardPiece** piece) {
  const auto at = name.rfind('@');
  if (at == std::string::npos || m.shard.stage == ORT_SHARD_NONE) return false;
  auto it = m.param_index.find(name.substr(0, at));
  if (it == m.param_index.end()) return false;
  int64_t off = -1;
  try {
    size_t used = 0;
    off = std::stoll(name.substr(at + 1), &used);
    if (used != name.size() - at - 1) return false;
  } catch (const std::exception&) {
    return false;
  }
  for (const auto& b : m.shard.buckets) {
    for (const auto& p : b.pieces) {
      if (p.param == it->second && p.param_off == off) {
        *bucket = &b;
        *piece = &p;
        return true;
      }
    }
  }
  return false;
}

void shard_absorb_state(Model& m) {
  auto& sh = m.shard;
  if (sh.stage == ORT_SHARD_NONE || (m.exp_avg.empty() && m.exp_avg_sq.empty())) return;
  at::NoGradGuard ng;
  auto& params = trainable(m);
  for (size_t i = 0; i < params.size(); i++) {
    if (m.exp_avg.count(params[i].first) != 0 && m.exp_avg_sq.count(params[i].first) != 0) sh.has_state[i] = 1;
  }
  for (auto& b : sh.buckets) {
    for (const auto& p : b.pieces) {
      const auto& name = params[p.param].first;
      auto a = m.exp_avg.find(name), v = m.exp_avg_sq.find(name);
      if (a == m.exp_avg.end() || v == m.exp_avg_sq.end()) continue;
      if (!b.exp_avg.defined()) {
        const auto opts = params[p.param].second.options().requires_grad(false);
        b.exp_avg = at::zeros({b.hi - b.lo}, opts);
        b.exp_avg_sq = at::zeros({b.hi - b.lo}, opts);
      }
      b.exp_avg.narrow(0, p.slice_off, p.len).copy_(a->second.reshape({-1}).narrow(0, p.param_off, p.len));
      b.exp_avg_sq.narrow(0, p.slice_off, p.len).copy_(v->second.reshape({-1}).narrow(0, p.param_off, p.len));
    }
  }
  m.exp_avg.clear();
  m.exp_avg_sq.clear();
  forget_listings(m);
}

ort_grad_sync reduce_grads(Group& g, Model& m, const volatile int32_t* cancel) {
  ort_grad_sync out{};
  if (g.shard == ORT_SHARD_NONE) {
    allreduce_grads(g, m, &out.bytes, &out.buckets, cancel);
    return out;
  }
  check_usable(g);
  check_model(g, m);
  auto& sh = ready_shard(g, m);
  if (sh.stage == ORT_SHARD_PARAMETERS) {  // the backward passes reduce-scattered as they went
    out.bytes = sh.sync_bytes;
    out.buckets = sh.sync_buckets;
    out.emulated = native_reduce_scatter(g) ? 0 : 1;
    out.gather_bytes = sh.sync_gather_bytes;
    out.wait_seconds = sh.sync_wait_seconds;
    sh.sync_bytes = sh.sync_gather_bytes = 0;
    sh.sync_buckets = 0;
    sh.sync_wait_seconds = 0;
    return out;
  }
  at::NoGradGuard ng;
  auto& params = trainable(m);
  const auto any = grads_on_any_rank(g, m, cancel);
  for (size_t i = 0; i < params.size(); i++) sh.has_grad[i] |= any[i];
  struct Pending {
    ShardBucket* b;
    at::Tensor flat, out;
    c10::intrusive_ptr<c10d::Work> work;
    std::string name;
  };
  // A bounded number of buckets in flight: each one's gradients are dropped
  // as soon as they are flattened, so the memory they free holds the next
  // bucket's copy and no moment holds every gradient twice.
  std::deque<Pending> pending;
  auto finish = [&] {
    auto& p = pending.front();
    await(g, p.work, p.name, cancel);
    auto mine = finish_reduce_scatter(g, p.flat, p.out, p.b->chunk).narrow(0, 0, p.b->hi - p.b->lo);
    // The slice keeps the tensors' dtype, as autograd's accumulated
    // gradients do: a 16-bit model's slice is rounded once, as the unsharded
    // path rounds its average back into the gradients.
    const auto dtype = params[p.b->params.front()].second.scalar_type();
    if (!p.b->grad.defined()) p.b->grad = at::zeros({p.b->hi - p.b->lo}, mine.options().dtype(dtype));
    p.b->grad.add_(cast(mine.div(g.size), dtype));
    pending.pop_front();
  };
  for (size_t k = 0; k < sh.buckets.size(); k++) {
    auto& b = sh.buckets[k];
    if (!std::any_of(b.params.begin(), b.params.end(), [&](size_t i) { return any[i] != 0; })) continue;
    if (pending.size() >= kBucketsInFlight) finish();
    Pending p{&b, bucket_grads(g, m, b), {}, {}, "reduce-scatter bucket " + std::to_string(k + 1) + " of " +
                                                    std::to_string(sh.buckets.size())};
    for (auto i : b.params) params[i].second.mutable_grad() = at::Tensor();
    if (native_reduce_scatter(g)) p.out = at::empty({b.chunk}, p.flat.options());
    p.work = start_reduce_scatter(g, p.flat, p.out, p.name);
    out.bytes += p.flat.nbytes();
    out.buckets++;
    pending.push_back(std::move(p));
  }
  while (!pending.empty()) finish();
  out.emulated = native_reduce_scatter(g) ? 0 : 1;
  for (auto& p : params) p.second.mutable_grad() = at::Tensor();  // a bucket no rank had a gradient for
  forget_listings(m);
  return out;
}

ort_shard_step_stats sharded_optimizer_step(Group& g, Model& m, double lr) {
  check_usable(g);
  check_model(g, m);
  if (g.shard == ORT_SHARD_NONE) throw std::runtime_error("sharded optimizer step: the group does not shard the optimizer");
  auto& sh = ready_shard(g, m);
  for (const auto& p : trainable(m)) {
    if (p.second.grad().defined()) {
      throw std::runtime_error("sharded optimizer step: " + p.first +
                               " holds a gradient not yet reduce-scattered (call ort_group_reduce_grads first)");
    }
  }
  shard_absorb_state(m);
  at::NoGradGuard ng;
  ort_shard_step_stats st{};
  m.weights_version++;
  forget_listings(m);
  auto timed_await = [&](const c10::intrusive_ptr<c10d::Work>& w, const std::string& op) {
    const auto t0 = Clock::now();
    await(g, w, op, nullptr);
    st.comm_seconds += std::chrono::duration<double>(Clock::now() - t0).count();
  };

  // Global norm: the slices are disjoint and their padding is zero.
  double local = 0;
  for (const auto& b : sh.buckets) {
    if (!b.grad.defined()) continue;
    const double n = at::linalg_vector_norm(b.grad, 2, c10::nullopt, false, acc_dtype(m)).item<double>();
    local += n * n;
  }
  auto sq = at::full({1}, local, at::TensorOptions().dtype(at::kDouble)).to(g.device);
  timed_await(start_allreduce(g, sq, "gradient norm"), "gradient norm");
  st.grad_norm = std::sqrt(sq.to(at::kCPU).item<double>());

  auto& params = trainable(m);
  std::vector<at::Tensor> ws, gs, m1s, vs;
  for (auto& b : sh.buckets) {
    for (const auto& p : b.pieces) {
      if (!sh.has_grad[p.param]) continue;  // no gradient on any rank: no update
      const auto& w = params[p.param].second;
      if (!b.exp_avg.defined()) {
        b.exp_avg = at::zeros({b.hi - b.lo}, w.options().requires_grad(false));
        b.exp_avg_sq = at::zeros({b.hi - b.lo}, w.options().requires_grad(false));
      }
      ws.push_back(sh.stage == ORT_SHARD_PARAMETERS ? b.data.narrow(0, p.slice_off, p.len)
                                                    : flat_param(m, p.param).narrow(0, p.param_off, p.len));
      gs.push_back(cast(b.grad.narrow(0, p.slice_off, p.len), w.scalar_type()));
      m1s.push_back(b.exp_avg.narrow(0, p.slice_off, p.len));
      vs.push_back(b.exp_avg_sq.narrow(0, p.slice_off, p.len));
    }
  }
  m.step++;
  adamw_update(m, ws, gs, m1s, vs, clip_factor(m, st.grad_norm), lr);
  for (size_t i = 0; i < params.size(); i++) {
    if (sh.has_grad[i]) sh.has_state[i] = 1;
  }
  if (sh.stage == ORT_SHARD_PARAMETERS) {  // the slices are the parameters: the next pass gathers them
    for (auto& b : sh.buckets) {
      if (b.grad.defined()) b.grad.zero_();
    }
    std::fill(sh.has_grad.begin(), sh.has_grad.end(), 0);
    return st;
  }

  // Every rank's updated slices, to every rank, a bounded number of
  // buckets in flight. Buckets no rank had a gradient for did not change.
  struct Pending {
    ShardBucket* b;
    at::Tensor mine, full;  // full: [size * chunk], rank r's slice at r * chunk
    c10::intrusive_ptr<c10d::Work> work;
    std::string name;
  };
  std::deque<Pending> pending;
  auto finish = [&] {
    auto& pd = pending.front();
    timed_await(pd.work, pd.name);
    std::vector<at::Tensor> parts;
    for (auto i : pd.b->params) parts.push_back(params[i].second.detach());
    unflatten(pd.full.narrow(0, 0, pd.b->numel), parts);
    pending.pop_front();
  };
  for (size_t k = 0; k < sh.buckets.size(); k++) {
    auto& b = sh.buckets[k];
    if (!any_grad(sh, b)) continue;
    if (pending.size() >= kBucketsInFlight) finish();
    const auto dtype = params[b.params.front()].second.scalar_type();
    std::vector<at::Tensor> parts;
    for (const auto& p : b.pieces) parts.push_back(flat_param(m, p.param).narrow(0, p.param_off, p.len));
    auto mine = parts.empty() ? at::zeros({0}, params[b.params.front()].second.options().requires_grad(false))
                              : at::cat(parts);
    Pending pd{&b, padded(mine.to(wire_dtype(g, dtype)), b.chunk), {}, {},
               "all-gather bucket " + std::to_string(k + 1) + " of " + std::to_string(sh.buckets.size())};
    pd.full = at::empty({b.chunk * g.size}, pd.mine.options());
    pd.work = start_allgather(g, pd.mine, pd.full, pd.name);
    st.gather_bytes += pd.mine.nbytes();
    pending.push_back(std::move(pd));
  }
  while (!pending.empty()) finish();
  for (auto& b : sh.buckets) {
    if (b.grad.defined()) b.grad.zero_();
  }
  std::fill(sh.has_grad.begin(), sh.has_grad.end(), 0);
  return st;
}

}  // namespace ort
