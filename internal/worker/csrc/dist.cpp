// dist.cpp: data-parallel training on c10d, the way PyTorch DDP does it but
// without its Python module (libtorch has no C++ DDP): a TCPStore
// rendezvous, one process group (Gloo on CPU, NCCL on CUDA), a broadcast of
// the trainable tensors from one rank, and a bucketed all-reduce of their
// gradients after the last micro-batch of each optimizer step. Sharded
// optimizer state and gradients (ZeRO stages 1 and 2) build on the same
// primitives in shard.cpp (collective.h).
//
// Every collective is started asynchronously and polled, so each one has a
// deadline (the group's timeout) and honours the caller's cancel flag; a
// dead peer surfaces as the backend's error (Gloo: connection closed). Any
// failure marks the group broken: the ranks no longer agree on which
// collective comes next, so a later call fails at once instead of pairing
// with the wrong peer operation.
//
// One clock owns each deadline: ours (await, join_group's check_wait). The
// backend and the store get the group's timeout plus a margin
// (backend_timeout), so theirs cannot win a race of two equal timers. When
// theirs fires anyway (a poll delayed past both on a busy machine, a
// blocking call such as the Gloo mesh connect), is_timeout classifies it,
// so every timeout leaves as ort::TimeoutError whichever clock ran out.
//
// libtorch 1.13 and 2.x differ here in two ways we touch: from 2.0 the
// backends (ProcessGroupGloo, ProcessGroupNCCL) derive from c10d::Backend
// rather than c10d::ProcessGroup (their constructors, Options::create and
// the collective calls used below are the same in both), and from 2.4 the
// TCPStore serves with libuv by default, which Debian's libtorch lacks
// (join_group then serves the classic store).
#include <algorithm>
#include <cctype>
#include <chrono>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

#include "collective.h"  // first: model.h defines ORT_TORCH_AT_LEAST

namespace ort {

// Shared with shard.cpp (declared in collective.h).

std::string error_text(const std::exception& e) {
  if (const auto* ce = dynamic_cast<const c10::Error*>(&e)) return ce->what_without_backtrace();
  return e.what();
}

bool cancelled(const volatile int32_t* cancel) { return cancel != nullptr && *cancel != 0; }

milliseconds backend_timeout(milliseconds t) {
  return t + std::clamp(t / 2, milliseconds(2000), milliseconds(60000));
}

// is_timeout says whether a backend's or store's message reports a timeout.
// By text, as the types differ across libtorch versions and Gloo's
// IoException covers closed connections too. Seen: Gloo "Timed out waiting
// Nms for recv operation to complete", "Connect timeout"; c10d store
// "Socket Timeout", "Wait timeout", "wait timeout after Nms", "The client
// socket has timed out"; NCCL's watchdog "... before timing out".
bool is_timeout(const std::string& msg) {
  std::string m(msg);
  std::transform(m.begin(), m.end(), m.begin(), [](unsigned char c) { return std::tolower(c); });
  for (const char* w : {"timed out", "timeout", "timing out", "deadline exceeded"}) {
    if (m.find(w) != std::string::npos) return true;
  }
  return false;
}

[[noreturn]] void fail(Group& g, const std::string& op, const std::string& msg, bool timeout) {
  g.broken = op.empty() ? msg : op + ": " + msg;
  if (timeout) throw TimeoutError(g.broken);
  throw std::runtime_error(g.broken);
}

// fail_backend breaks the group with the backend's error e.
[[noreturn]] void fail_backend(Group& g, const std::string& op, const std::exception& e) {
  const auto msg = error_text(e);
  fail(g, op, msg, is_timeout(msg));
}

void check_usable(const Group& g) {
  if (!g.broken.empty()) {
    throw std::runtime_error("process group is broken by an earlier failure (" + g.broken +
                             "); leave it and join a new one");
  }
}

void await(Group& g, const c10::intrusive_ptr<c10d::Work>& w, const std::string& op,
           const volatile int32_t* cancel) {
  const auto deadline = Clock::now() + g.timeout;
  auto pause = std::chrono::microseconds(20);
  while (!w->isCompleted()) {
    if (cancelled(cancel)) fail(g, op, "cancelled");
    if (Clock::now() >= deadline) {
      fail(g, op, "timed out after " + std::to_string(g.timeout.count()) + " ms (a peer is stalled or gone)", true);
    }
    std::this_thread::sleep_for(pause);
    pause = std::min(pause * 2, std::chrono::microseconds(1000));
  }
  try {
    w->wait();
  } catch (const std::exception& e) {
    fail_backend(g, op, e);
  }
}

c10::intrusive_ptr<c10d::Work> start_allreduce(Group& g, at::Tensor& t, const std::string& op,
                                               c10d::ReduceOp::RedOpType red) {
  std::vector<at::Tensor> v{t};
  c10d::AllreduceOptions o;
  o.reduceOp = red;
  o.timeout = backend_timeout(g.timeout);
  try {
    return g.pg->allreduce(v, o);
  } catch (const std::exception& e) {
    fail_backend(g, op, e);
  }
}

std::vector<Bucket> make_buckets(const std::vector<at::Tensor>& ts, int64_t cap) {
  std::vector<Bucket> out;
  int64_t bytes = 0;
  for (const auto& t : ts) {
    const auto n = static_cast<int64_t>(t.nbytes());
    if (out.empty() || out.back().parts.front().scalar_type() != t.scalar_type() || bytes + n > cap) {
      out.emplace_back();
      out.back().index = out.size() - 1;
      bytes = 0;
    }
    out.back().parts.push_back(t);
    bytes += n;
  }
  return out;
}

std::string bucket_name(const Bucket& b, size_t n) {
  return "bucket " + std::to_string(b.index + 1) + " of " + std::to_string(n);
}

at::ScalarType wire_dtype(const Group& g, at::ScalarType t) {
  if (g.backend == "gloo" && (t == at::kBFloat16 || t == at::kHalf)) return at::kFloat;
  return t;
}

at::Tensor flatten(const Group& g, const std::vector<at::Tensor>& parts) {
  std::vector<at::Tensor> flat;
  flat.reserve(parts.size());
  for (const auto& p : parts) flat.push_back(p.reshape({-1}));
  return at::cat(flat).to(wire_dtype(g, parts.front().scalar_type()));
}

void unflatten(const at::Tensor& flat, std::vector<at::Tensor>& parts) {
  int64_t off = 0;
  for (auto& p : parts) {
    p.copy_(flat.narrow(0, off, p.numel()).view(p.sizes()));
    off += p.numel();
  }
}

std::vector<uint8_t> grads_on_any_rank(Group& g, Model& m, const volatile int32_t* cancel) {
  auto& params = trainable(m);
  std::vector<float> has(params.size());
  for (size_t i = 0; i < params.size(); i++) has[i] = params[i].second.grad().defined() ? 1.f : 0.f;
  auto any = at::from_blob(has.data(), {static_cast<int64_t>(has.size())}, at::kFloat).clone().to(g.device);
  auto w = start_allreduce(g, any, "which gradients exist");
  await(g, w, "which gradients exist", cancel);
  auto any_cpu = any.to(at::kCPU).contiguous();
  std::vector<uint8_t> out(params.size());
  for (size_t i = 0; i < params.size(); i++) out[i] = any_cpu.data_ptr<float>()[i] != 0 ? 1 : 0;
  return out;
}

void check_model(const Group& g, const Model& m) {
  need_finalized(m);
  if (m.device != g.device) {
    throw std::runtime_error("model is on " + m.device.str() + ", the process group on " + g.device.str());
  }
}

namespace {

// From 2.4 TCPStoreOptions::useLibUV defaults to true, and a libtorch built
// without libuv (Debian's) refuses to serve; pip wheels have it. Before 2.4
// the classic server is the default (and 1.13 has no choice).
#if ORT_TORCH_AT_LEAST(2, 4)
bool wants_libuv(const c10d::TCPStoreOptions& o) { return o.useLibUV; }
void use_classic_store(c10d::TCPStoreOptions& o) { o.useLibUV = false; }
bool serves_libuv(c10d::TCPStore& s) { return s.isLibUvBackend(); }
#else
bool wants_libuv(const c10d::TCPStoreOptions&) { return false; }
void use_classic_store(c10d::TCPStoreOptions&) {}
bool serves_libuv(c10d::TCPStore&) { return false; }
#endif

// no_libuv says whether a store's error is the missing libuv ("use_libuv was
// requested but PyTorch was built without libuv support").
bool no_libuv(const std::string& msg) {
  std::string m(msg);
  std::transform(m.begin(), m.end(), m.begin(), [](unsigned char c) { return std::tolower(c); });
  return m.find("libuv") != std::string::npos;
}

// rethrow turns a backend's or store's exception into ours, prefixed by
// where, keeping whether it was a timeout.
[[noreturn]] void rethrow(const std::string& where, const std::exception& e) {
  const auto msg = where + ": " + error_text(e);
  if (is_timeout(msg)) throw TimeoutError(msg);
  throw std::runtime_error(msg);
}


#ifdef USE_C10D_GLOO
// gloo_device picks the interface Gloo binds: GLOO_SOCKET_IFNAME as in
// torch.distributed, loopback when the master is local, else the address
// this host's name resolves to.
std::shared_ptr<::gloo::transport::Device> gloo_device(const std::string& addr) {
  const char* ifname = std::getenv("GLOO_SOCKET_IFNAME");
  if (ifname != nullptr && *ifname != '\0') return c10d::ProcessGroupGloo::createDeviceForInterface(ifname);
  if (addr == "localhost" || addr.rfind("127.", 0) == 0) {
    return c10d::ProcessGroupGloo::createDeviceForHostname("127.0.0.1");
  }
  return c10d::ProcessGroupGloo::createDefaultDevice();
}
#endif

// check_backend fails before the rendezvous when this build lacks the
// device's backend.
void check_backend(const at::Device& device) {
#ifndef USE_C10D_NCCL
  if (device.is_cuda()) {
    throw std::runtime_error("join process group: this worker was built without NCCL (needs a CUDA libtorch with "
                             "ProcessGroupNCCL; rebuild with scripts/build-worker.sh against one)");
  }
#endif
#ifndef USE_C10D_GLOO
  if (!device.is_cuda()) {
    throw std::runtime_error("join process group: this worker was built without Gloo (c10d ProcessGroupGloo, and "
                             "gloo headers: libgloo-dev on Debian); rebuild with scripts/build-worker.sh");
  }
#endif
}

// make_backend builds g's process group over its store (check_backend
// has passed).
void make_backend(Group& g, const std::string& addr, const ort_group_options& o) {
  if (g.device.is_cuda()) {
#ifdef USE_C10D_NCCL
    auto opts = c10d::ProcessGroupNCCL::Options::create();
    opts->timeout = backend_timeout(g.timeout);
    g.pg = c10::make_intrusive<c10d::ProcessGroupNCCL>(g.store, o.rank, o.world_size, opts);
    g.backend = "nccl";
#endif
  } else {
#ifdef USE_C10D_GLOO
    auto opts = c10d::ProcessGroupGloo::Options::create(backend_timeout(g.timeout));
    opts->devices.push_back(gloo_device(addr));
    g.pg = c10::make_intrusive<c10d::ProcessGroupGloo>(g.store, o.rank, o.world_size, opts);
    g.backend = "gloo";
#endif
  }
  if (!g.pg) throw std::runtime_error("no c10d backend for " + g.device.str());
}

}  // namespace

const StoreStatus& store_status() {
  static const StoreStatus st = [] {
    StoreStatus r;
    c10d::TCPStoreOptions so;
    r.libuv_default = wants_libuv(so);
    if (!r.libuv_default) {
      r.detail = "libtorch " + std::to_string(TORCH_VERSION_MAJOR) + "." + std::to_string(TORCH_VERSION_MINOR) +
                 " serves the classic store by default";
      return r;
    }
    so.port = 0;
    so.isServer = true;
    so.waitWorkers = false;
    so.timeout = milliseconds(5000);
    try {
      auto s = c10::make_intrusive<c10d::TCPStore>("127.0.0.1", so);
      r.libuv = serves_libuv(*s);
      if (!r.libuv) r.detail = "a store asked for libuv started the classic server";
    } catch (const std::exception& e) {
      // libtorch's text suggests USE_LIBUV=0, which only its Python reads.
      r.detail = no_libuv(error_text(e)) ? "libtorch was built without libuv" : error_text(e);
    }
    return r;
  }();
  return st;
}

std::vector<std::string> compiled_backends() {
  std::vector<std::string> out;
#ifdef USE_C10D_GLOO
  out.push_back("gloo");
#endif
#ifdef USE_C10D_NCCL
  out.push_back("nccl");
#endif
  return out;
}

Group* join_group(const at::Device& device, const ort_group_options& o, const volatile int32_t* cancel) {
  const std::string addr = o.master_addr != nullptr ? o.master_addr : "";
  if (addr.empty()) throw std::runtime_error("join process group: master address is empty");
  if (o.master_port <= 0 || o.master_port > 65535) {
    throw std::runtime_error("join process group: master port " + std::to_string(o.master_port) + " is not in 1..65535");
  }
  if (o.world_size < 1 || o.rank < 0 || o.rank >= o.world_size) {
    throw std::runtime_error("join process group: rank " + std::to_string(o.rank) + " is not in [0, world size " +
                             std::to_string(o.world_size) + ")");
  }
  if (o.timeout_ms <= 0) throw std::runtime_error("join process group: timeout must be > 0");
  if (o.shard < ORT_SHARD_NONE || o.shard > ORT_SHARD_PARAMETERS) {
    throw std::runtime_error("join process group: unknown shard stage " + std::to_string(o.shard) +
                             " (want 0 none, 1 optimizer, 2 gradients, 3 parameters)");
  }
  check_backend(device);
  auto g = std::make_unique<Group>();
  g->device = device;
  g->rank = o.rank;
  g->size = o.world_size;
  g->timeout = milliseconds(o.timeout_ms);
  if (o.bucket_bytes > 0) g->bucket_bytes = o.bucket_bytes;
  g->shard = o.shard;
  const std::string where = addr + ":" + std::to_string(o.master_port);
  const auto deadline = Clock::now() + g->timeout;
  auto check_wait = [&](const std::string& state) {
    if (cancelled(cancel)) throw std::runtime_error("join process group at " + where + ": cancelled (" + state + ")");
    if (Clock::now() >= deadline) {
      throw TimeoutError("join process group at " + where + ": timed out after " + std::to_string(g->timeout.count()) +
                         " ms (" + state + ")");
    }
  };

  // Rendezvous: rank 0 serves the store. The others connect in one-second
  // attempts, so cancel is seen while the master is not up yet (c10d's
  // socket timeouts count whole seconds: less than one fails at once). An
  // attempt under way when the deadline passes runs to its end (libtorch 2.x
  // retries inside one for a few seconds), so a join can overrun by that.
  c10d::TCPStoreOptions so;
  so.port = static_cast<uint16_t>(o.master_port);
  so.isServer = o.rank == 0;
  so.numWorkers = static_cast<size_t>(o.world_size);
  so.waitWorkers = false;  // the barrier below waits, polling cancel
  std::string last = "connecting";
  while (!g->store) {
    check_wait(last);
    so.timeout = milliseconds(1000);
    try {
      g->store = c10::make_intrusive<c10d::TCPStore>(addr, so);
    } catch (const std::exception& e) {
      if (wants_libuv(so) && no_libuv(error_text(e))) {  // libtorch's default, built without it
        use_classic_store(so);
        continue;
      }
      if (so.isServer) throw std::runtime_error("serve rendezvous at " + where + ": " + error_text(e));
      last = "connecting: " + error_text(e);
      std::this_thread::sleep_for(milliseconds(250));
    }
  }
  const std::string key = "ortrain/joined";
  int64_t n = 0;
  try {
    g->store->setTimeout(backend_timeout(g->timeout));
    n = g->store->add(key, 1);
  } catch (const std::exception& e) {
    rethrow("join process group at " + where + ": rendezvous", e);
  }
  while (n < o.world_size) {
    check_wait(std::to_string(n) + " of " + std::to_string(o.world_size) + " ranks joined");
    std::this_thread::sleep_for(milliseconds(10));
    try {
      n = g->store->add(key, 0);
    } catch (const std::exception& e) {
      rethrow("join process group at " + where + ": rendezvous (" + std::to_string(n) + " of " +
                  std::to_string(o.world_size) + " ranks joined)",
              e);
    }
  }

  // The backend connects every pair of ranks through the store; that call
  // blocks (no cancel) for at most backend_timeout.
  try {
    make_backend(*g, addr, o);
  } catch (const std::exception& e) {
    rethrow("join process group at " + where + ": connect the " + (device.is_cuda() ? "nccl" : "gloo") + " backend", e);
  }
  return g.release();
}

void free_group(Group* g) {
  if (g != nullptr) unbind_param_group(*g);
  delete g;
}

std::string group_backend(const Group& g) { return g.backend; }

void broadcast_trainable(Group& g, Model& m, int32_t root, const volatile int32_t* cancel) {
  check_usable(g);
  check_model(g, m);
  if (root < 0 || root >= g.size) throw std::runtime_error("broadcast: root " + std::to_string(root) + " is not a rank");
  need_full_weights(m, "broadcast trainable tensors (before the first pass)");
  at::NoGradGuard ng;
  std::vector<at::Tensor> ts;
  for (auto& p : trainable(m)) ts.push_back(p.second.detach());
  auto buckets = make_buckets(ts, g.bucket_bytes);
  for (auto& b : buckets) {
    b.flat = flatten(g, b.parts);
    std::vector<at::Tensor> v{b.flat};
    c10d::BroadcastOptions o;
    o.rootRank = root;
    o.timeout = backend_timeout(g.timeout);
    try {
      b.work = g.pg->broadcast(v, o);
    } catch (const std::exception& e) {
      fail_backend(g, bucket_name(b, buckets.size()), e);
    }
  }
  for (auto& b : buckets) {
    await(g, b.work, bucket_name(b, buckets.size()), cancel);
    if (g.rank != root) unflatten(b.flat, b.parts);
  }
}

void allreduce_grads(Group& g, Model& m, int64_t* bytes, int32_t* nbuckets, const volatile int32_t* cancel) {
  check_usable(g);
  check_model(g, m);
  at::NoGradGuard ng;
  auto& params = trainable(m);
  *bytes = 0;
  *nbuckets = 0;
  if (params.empty()) return;
  // A tensor without a gradient on this rank (unused by its micro-batches)
  // still takes part when another rank has one, as zeros; one that no rank
  // touched keeps no gradient, so AdamW skips it as in a single process.
  const auto any = grads_on_any_rank(g, m, cancel);
  std::vector<at::Tensor> grads;
  for (size_t i = 0; i < params.size(); i++) {
    if (!any[i]) continue;
    auto& p = params[i].second;
    if (!p.grad().defined()) p.mutable_grad() = at::zeros_like(p.detach());
    grads.push_back(p.grad());
  }
  auto buckets = make_buckets(grads, g.bucket_bytes);
  *nbuckets = static_cast<int32_t>(buckets.size());
  // Two buckets in flight keep the backend busy (it runs them in order)
  // while at most two flat copies exist besides the gradients.
  constexpr size_t kInFlight = 2;
  size_t done = 0;
  auto finish = [&] {
    auto& b = buckets[done++];
    await(g, b.work, bucket_name(b, buckets.size()), cancel);
    b.flat.div_(g.size);
    unflatten(b.flat, b.parts);
    b.flat = at::Tensor();
  };
  for (size_t k = 0; k < buckets.size(); k++) {
    if (k - done >= kInFlight) finish();
    auto& b = buckets[k];
    b.flat = flatten(g, b.parts);
    *bytes += b.flat.nbytes();
    b.work = start_allreduce(g, b.flat, bucket_name(b, buckets.size()));
  }
  while (done < buckets.size()) finish();
}

void allreduce_f64(Group& g, int32_t op, double* values, size_t n, const volatile int32_t* cancel) {
  check_usable(g);
  c10d::ReduceOp::RedOpType red;
  switch (op) {
    case ORT_REDUCE_SUM: red = c10d::ReduceOp::SUM; break;
    case ORT_REDUCE_MIN: red = c10d::ReduceOp::MIN; break;
    case ORT_REDUCE_MAX: red = c10d::ReduceOp::MAX; break;
    default: throw std::runtime_error("unknown reduction " + std::to_string(op));
  }
  if (n == 0) return;
  auto t = at::from_blob(values, {static_cast<int64_t>(n)}, at::kDouble).clone().to(g.device);
  auto w = start_allreduce(g, t, "", red);
  await(g, w, "", cancel);
  auto out = t.to(at::kCPU).contiguous();
  std::memcpy(values, out.data_ptr<double>(), n * sizeof(double));
}

void allgather_bytes(Group& g, const void* data, size_t n, size_t max_n, void* out, size_t out_cap,
                     const volatile int32_t* cancel) {
  check_usable(g);
  if (n > max_n) throw std::runtime_error("all-gather: " + std::to_string(n) + " bytes exceed the agreed maximum " + std::to_string(max_n));
  const size_t need = max_n * static_cast<size_t>(g.size);
  if (out == nullptr || out_cap < need) {
    throw std::runtime_error("all-gather: the output has room for " + std::to_string(out_cap) + " bytes, " + std::to_string(need) + " needed");
  }
  if (max_n == 0) return;
  const auto bytes = at::TensorOptions().dtype(at::kByte);
  auto mine = at::zeros({static_cast<int64_t>(max_n)}, bytes);
  if (n > 0) std::memcpy(mine.data_ptr(), data, n);
  std::vector<at::Tensor> in{mine.to(g.device)};
  std::vector<std::vector<at::Tensor>> outs(1);
  for (int r = 0; r < g.size; r++) outs[0].push_back(at::empty({static_cast<int64_t>(max_n)}, bytes.device(g.device)));
  c10d::AllgatherOptions o;
  o.timeout = backend_timeout(g.timeout);
  c10::intrusive_ptr<c10d::Work> w;
  try {
    w = g.pg->allgather(outs, in, o);
  } catch (const std::exception& e) {
    fail_backend(g, "all-gather", e);
  }
  await(g, w, "all-gather", cancel);
  for (int r = 0; r < g.size; r++) {
    auto t = outs[0][r].to(at::kCPU).contiguous();
    std::memcpy(static_cast<char*>(out) + static_cast<size_t>(r) * max_n, t.data_ptr(), max_n);
  }
}

}  // namespace ort
