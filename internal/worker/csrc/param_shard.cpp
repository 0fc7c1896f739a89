// param_shard.cpp: ZeRO stage 3 (ORT_SHARD_PARAMETERS), parameters sharded
// over the ranks as FSDP does, and the passes over them (param_layout.cpp
// cuts the model into units and slices them). Each rank keeps 1/P of every
// unit's flattened trainable tensors (a ShardBucket: its slice of the
// parameters, their averaged gradient and AdamW moments) and of its frozen
// ones (LoRA base weights, the reference copy). A pass
// all-gathers a unit just before it runs, prefetching the next one, and
// drops it right after. Each layer's backward gathers it again, recomputes
// it (activation recomputation is part of stage 3) and reduce-scatters its
// gradient at once. The embedding's and LM head's gradients, which the
// lookup and the fused log-prob path produce outside autograd, are
// reduce-scattered when they are whole: the LM head's after the loss, the
// embedding's (plus a tied LM head's) after the backward.
#include <torch/csrc/autograd/autograd.h>
#include <torch/csrc/autograd/custom_function.h>

#include <algorithm>
#include <deque>
#include <stdexcept>
#include <string>
#include <vector>

#include "collective.h"  // first: model.h defines ORT_TORCH_AT_LEAST

namespace ort {

namespace {

const std::string kPeft = kPeftPrefix;

// unit_of_layer is the index of layer i's unit (the embedding is unit 0).
size_t unit_of_layer(int i) { return static_cast<size_t>(i) + 1; }
size_t norm_unit(const Model& m) { return unit_of_layer(m.arch.num_layers); }
size_t head_unit(const Model& m) { return m.arch.tie_embeddings ? 0 : norm_unit(m) + 1; }

// UnitGather is one unit's all-gathers, in flight or done: the trainable
// bucket's and the frozen slice's (base or reference) full flats.
struct UnitGather {
  size_t unit = 0;
  bool reference = false, with_ref = false;
  at::Tensor train, frozen, ref;  // [size * chunk] in the wire dtype, then [numel] in the model's
  std::vector<c10::intrusive_ptr<c10d::Work>> works;
  int64_t bytes = 0;  // counted in Shard::gathered_bytes
};

}  // namespace

// ShardedPass is one forward (and backward) over a stage-3 model.
struct ShardedPass {
  Model& m;
  Group& g;
  bool reference;
  const volatile int32_t* cancel;
  LayerCtx ctx{};
  std::deque<UnitGather> gathers;  // started, in the order they will be taken
  struct Reduce {
    size_t bucket;
    at::Tensor flat, out;
    c10::intrusive_ptr<c10d::Work> work;
    std::string name;
  };
  std::deque<Reduce> reduces;
  at::Tensor x0;            // the embedding's output, a leaf (training)
  at::Tensor ids;           // the tokens it looked up
  at::Tensor norm_w;        // the final norm's weight, a leaf when trainable
  UnitGather head;          // the gathered LM head
  at::Tensor head_w;        // its weight, a leaf when trainable
  bool clean = false;       // every collective started was awaited

  ShardedPass(Model& mm, Group& gg, bool ref, const volatile int32_t* c) : m(mm), g(gg), reference(ref), cancel(c) {}
  ~ShardedPass();

  Shard& sh() { return m.shard; }
  const ParamUnit& unit(size_t u) { return sh().units.at(u); }
  bool uses_ref(size_t u) { return reference && m.opts.lora_rank <= 0; }

  // timed runs f, adding its time to what the passes waited on collectives.
  template <typename F>
  void timed(F&& f) {
    const auto t0 = Clock::now();
    f();
    sh().sync_wait_seconds += std::chrono::duration<double>(Clock::now() - t0).count();
  }

  void count(int64_t delta) {
    sh().gathered_bytes += delta;
    sh().peak_gathered_bytes = std::max(sh().peak_gathered_bytes, sh().gathered_bytes);
  }

  void start_part(UnitGather& ug, at::Tensor* full, const at::Tensor& data, int64_t chunk, const std::string& what) {
    auto mine = padded(data.to(wire_dtype(g, m.dtype)), chunk);
    sh().sync_gather_bytes += mine.nbytes();
    *full = at::empty({chunk * g.size}, mine.options());
    ug.bytes += full->nbytes();
    ug.works.push_back(start_allgather(g, mine, *full, "all-gather " + unit(ug.unit).what + " (" + what + ")"));
  }

  // start begins gathering unit u: for the policy its trainable bucket and
  // LoRA base, for the reference its frozen copy (or the base), and with
  // everything the lot (ort_group_gather_unit).
  UnitGather start(size_t u, bool everything = false) {
    check_cancel(cancel);
    UnitGather ug;
    ug.unit = u;
    ug.reference = reference;
    const auto& pu = unit(u);
    const bool ref = uses_ref(u);
    if ((!ref || everything) && pu.bucket != SIZE_MAX) {
      const auto& b = sh().buckets[pu.bucket];
      start_part(ug, &ug.train, b.data, b.chunk, "trainable");
    }
    if (!pu.base.names.empty()) start_part(ug, &ug.frozen, pu.base.data, pu.base.chunk, "base");
    if ((ref || everything) && !pu.ref.names.empty()) {
      start_part(ug, &ug.ref, pu.ref.data, pu.ref.chunk, "reference");
      ug.with_ref = true;
    }
    count(ug.bytes);
    return ug;
  }

  void finish(UnitGather& ug) {
    const auto& pu = unit(ug.unit);
    timed([&] {
      for (const auto& w : ug.works) await(g, w, "all-gather " + pu.what, cancel);
    });
    ug.works.clear();
    int64_t bytes = 0;
    auto narrow = [&](at::Tensor& t, int64_t numel) {
      if (!t.defined()) return;
      t = cast(t.narrow(0, 0, numel), m.dtype);
      bytes += t.nbytes();
    };
    if (pu.bucket != SIZE_MAX) narrow(ug.train, sh().buckets[pu.bucket].numel);
    narrow(ug.frozen, pu.base.numel);
    narrow(ug.ref, pu.ref.numel);
    count(bytes - ug.bytes);
    ug.bytes = bytes;
  }

  void prefetch(size_t u) {
    if (u < sh().units.size()) gathers.push_back(start(u));
  }

  // take returns unit u gathered, prefetching next (SIZE_MAX: none).
  UnitGather take(size_t u, size_t next) {
    UnitGather ug;
    while (!gathers.empty() && gathers.front().unit != u) {  // a prefetch not used: finish it and let it go
      finish(gathers.front());
      release(gathers.front());
      gathers.pop_front();
    }
    if (!gathers.empty()) {
      ug = std::move(gathers.front());
      gathers.pop_front();
    } else {
      ug = start(u);
    }
    if (next != SIZE_MAX) prefetch(next);
    finish(ug);
    return ug;
  }

  void release(UnitGather& ug) {
    count(-ug.bytes);
    ug = UnitGather{};
  }

  // weights maps the HF names of a gathered unit to the tensors this pass
  // runs (views into the flats), and fills lora with its adapters.
  std::map<std::string, at::Tensor> weights(const UnitGather& ug, const at::Tensor& train,
                                            std::map<std::string, LoraPair>* lora) {
    const auto& pu = unit(ug.unit);
    std::map<std::string, at::Tensor> w;
    auto view_into = [&](const at::Tensor& flat, const std::vector<std::string>& names) {
      int64_t off = 0;
      for (const auto& n : names) {
        const auto& shape = m.expected_shapes.at(n);
        int64_t k = 1;
        for (auto d : shape) k *= d;
        w[n] = flat.narrow(0, off, k).view(shape);
        off += k;
      }
    };
    if (uses_ref(ug.unit)) {
      view_into(ug.ref, pu.ref.names);
      return w;
    }
    if (ug.frozen.defined()) view_into(ug.frozen, pu.base.names);
    if (reference || pu.bucket == SIZE_MAX) return w;  // LoRA's reference: the base alone
    int64_t off = 0;
    for (auto i : sh().buckets[pu.bucket].params) {
      const auto& p = m.params[i];
      auto t = train.narrow(0, off, p.second.numel()).view(p.second.sizes());
      off += p.second.numel();
      if (m.opts.lora_rank <= 0) {
        w[p.first] = t;
        continue;
      }
      const auto stem = p.first.substr(kPeft.size());
      const std::string a = ".lora_A.weight", b = ".lora_B.weight";
      if (stem.size() > a.size() && stem.compare(stem.size() - a.size(), a.size(), a) == 0) {
        (*lora)[stem.substr(0, stem.size() - a.size())].a = t;
      } else if (stem.size() > b.size() && stem.compare(stem.size() - b.size(), b.size(), b) == 0) {
        (*lora)[stem.substr(0, stem.size() - b.size())].b = t;
      } else {
        w[stem] = t;  // a modules_to_save copy replaces its original
      }
    }
    return w;
  }

  // leaf makes a unit's trainable flat a leaf whose .grad collects its
  // gradient, when this pass trains it.
  at::Tensor trainable_flat(const UnitGather& ug, bool grad) {
    if (!ug.train.defined() || !grad) return ug.train;
    return ug.train.detach().requires_grad_(true);
  }

  // reduce starts the reduce-scatter of a unit's flat gradient into its
  // bucket's slice, a bounded number in flight.
  void reduce(size_t u, const at::Tensor& flat) {
    const auto& pu = unit(u);
    auto& b = sh().buckets.at(pu.bucket);
    if (reduces.size() >= kBucketsInFlight) finish_reduce();
    Reduce r{pu.bucket, padded(flat.detach().reshape({-1}).to(wire_dtype(g, m.dtype)), b.chunk * g.size), {}, {},
             "reduce-scatter " + pu.what};
    if (native_reduce_scatter(g)) r.out = at::empty({b.chunk}, r.flat.options());
    r.work = start_reduce_scatter(g, r.flat, r.out, r.name);
    count(r.flat.nbytes());  // a full gradient until its reduce-scatter ends
    sh().sync_bytes += r.flat.nbytes();
    sh().sync_buckets++;
    for (auto i : b.params) sh().has_grad[i] = 1;
    reduces.push_back(std::move(r));
  }

  void finish_reduce() {
    auto& r = reduces.front();
    timed([&] { await(g, r.work, r.name, cancel); });
    auto& b = sh().buckets[r.bucket];
    auto mine = finish_reduce_scatter(g, r.flat, r.out, b.chunk).narrow(0, 0, b.hi - b.lo);
    if (!b.grad.defined()) b.grad = at::zeros({b.hi - b.lo}, mine.options().dtype(m.dtype));
    b.grad.add_(cast(mine.div(g.size), m.dtype));  // as stage 2: the slice keeps the tensors' dtype
    count(-r.flat.nbytes());
    reduces.pop_front();
  }

  // run_layer is layer i's forward on gathered weights (train: the flat is a
  // leaf, for the backward's recomputation); the gather is dropped after.
  at::Tensor run_layer(int i, const at::Tensor& x, bool prefetch_next, at::Tensor* flat_grad) {
    const bool backward = flat_grad != nullptr;
    const size_t u = unit_of_layer(i);
    const size_t next = !prefetch_next ? SIZE_MAX : backward ? (i > 0 ? unit_of_layer(i - 1) : SIZE_MAX) : u + 1;
    auto ug = take(u, next);
    // A custom function's backward runs with autograd off: the views of the
    // trainable flat must be recorded for its gradient to reach it.
    at::AutoGradMode record(backward);
    auto train = trainable_flat(ug, backward);
    std::map<std::string, LoraPair> lora;
    auto w = weights(ug, train, &lora);
    const auto lw = make_layer(m, w, m.opts.lora_rank > 0 && !reference ? &lora : nullptr, i);
    ctx.w = &lw;
    ctx.layer = i;
    if (!backward) {
      auto y = layer_forward(ctx, x);
      release(ug);
      return y;
    }
    auto xl = x.detach().requires_grad_(true);
    auto y = layer_forward(ctx, xl);
    *flat_grad = train;  // the caller differentiates y by xl and train
    ctx.w = nullptr;
    held = std::move(ug);
    held_x = xl;
    return y;
  }
  UnitGather held;  // the layer a backward recomputed, until its gradients are taken
  at::Tensor held_x;
};

namespace {

// ShardedLayer runs a decoder layer of a stage-3 model: forward on weights
// gathered for it alone; backward gathers them again, recomputes the layer
// and reduce-scatters its trainable gradient before returning the input's.
struct ShardedLayer : public torch::autograd::Function<ShardedLayer> {
  static torch::autograd::variable_list forward(torch::autograd::AutogradContext* actx, const at::Tensor& x,
                                                int64_t pass, int64_t layer) {
    auto* p = reinterpret_cast<ShardedPass*>(pass);
    actx->saved_data["pass"] = pass;
    actx->saved_data["layer"] = layer;
    actx->saved_data["gen"] = p->m.gen.clone();  // LoRA dropout replays its masks
    actx->save_for_backward({x});
    at::NoGradGuard ng;
    return {p->run_layer(static_cast<int>(layer), x, true, nullptr)};
  }
  static torch::autograd::variable_list backward(torch::autograd::AutogradContext* actx,
                                                 torch::autograd::variable_list grad_out) {
    auto* p = reinterpret_cast<ShardedPass*>(actx->saved_data["pass"].toInt());
    const int layer = static_cast<int>(actx->saved_data["layer"].toInt());
    auto x = actx->get_saved_variables()[0];
    auto live_gen = p->m.gen;
    p->m.gen = actx->saved_data["gen"].toGenerator();
    at::Tensor train;
    at::Tensor y;
    try {
      y = p->run_layer(layer, x, true, &train);
    } catch (...) {
      p->m.gen = live_gen;
      throw;
    }
    p->m.gen = live_gen;
    std::vector<at::Tensor> inputs{p->held_x};
    if (train.defined()) inputs.push_back(train);
    auto grads = torch::autograd::grad({y}, inputs, grad_out, false, false, true);
    p->release(p->held);
    p->held_x = at::Tensor();
    if (train.defined()) {
      auto gw = grads[1].defined() ? grads[1] : at::zeros_like(train);
      p->reduce(unit_of_layer(layer), gw);
    }
    return {grads[0], at::Tensor(), at::Tensor()};
  }
};

}  // namespace

ShardedPass::~ShardedPass() {
  if (clean) return;
  // An exception left collectives in flight: wait for them (the backend
  // still writes into their tensors), then break the group, since this
  // rank left the pass where the others did not.
  for (auto& ug : gathers) {
    for (const auto& w : ug.works) {
      try {
        w->wait();
      } catch (...) {
      }
    }
  }
  for (auto& r : reduces) {
    try {
      r.work->wait();
    } catch (...) {
    }
  }
  sh().gathered_bytes = 0;
  if (g.broken.empty()) g.broken = "a stage-3 pass stopped midway on this rank, so the ranks are out of step";
}

void ShardedPassDeleter::operator()(ShardedPass* p) const { delete p; }

ShardedPassPtr begin_sharded_pass(Model& m, bool reference, const volatile int32_t* cancel) {
  if (m.shard.stage != ORT_SHARD_PARAMETERS) throw std::runtime_error("the model's parameters are not sharded");
  if (m.shard.group == nullptr) {
    throw std::runtime_error("the model's parameters are sharded over a process group that was closed: load it anew");
  }
  auto& g = *m.shard.group;
  check_usable(g);
  if (!m.shard.sliced) slice_params(m);
  return ShardedPassPtr(new ShardedPass(m, g, reference, cancel));
}

at::Tensor sharded_hidden(ShardedPass& p, const Batch& bt, bool grad) {
  auto& m = p.m;
  auto e = p.take(0, unit_of_layer(0));
  std::map<std::string, LoraPair> unused;
  {
    at::NoGradGuard ng;
    auto w = p.weights(e, e.train, &unused);
    p.x0 = at::embedding(w.at("model.embed_tokens.weight"), bt.ids);
  }
  p.release(e);
  p.ids = bt.ids;
  if (grad) p.x0.requires_grad_(true);
  p.ctx = layer_ctx(m, bt.pos, bt.seg, nullptr);
  p.ctx.lora_on = m.opts.lora_rank > 0 && !p.reference;
  auto x = p.x0;
  for (int i = 0; i < m.arch.num_layers; i++) {
    check_cancel(p.cancel);
    x = grad ? ShardedLayer::apply(x, reinterpret_cast<int64_t>(&p), i)[0] : p.run_layer(i, x, true, nullptr);
  }
  auto n = p.take(norm_unit(m), head_unit(m));
  auto train = p.trainable_flat(n, grad);
  p.norm_w = train;
  auto w = p.weights(n, train, &unused).at("model.norm.weight");
  auto h = rms_norm(x, w, m.arch.rms_eps);
  p.release(n);  // a trainable weight lives on in p.norm_w, as small as the norm
  auto hs = h.reshape({-1, h.size(-1)}).index_select(0, bt.gather_idx);
  check_cancel(p.cancel);
  return hs;
}

at::Tensor sharded_lm_head(ShardedPass& p, bool grad) {
  const size_t u = head_unit(p.m);
  p.head = p.take(u, SIZE_MAX);
  std::map<std::string, LoraPair> unused;
  auto w = p.weights(p.head, p.head.train, &unused).at(p.m.arch.tie_embeddings ? "model.embed_tokens.weight" : "lm_head.weight");
  // The head unit's trainable bucket, when it has one, is this one tensor:
  // a leaf of it collects the gradient the loss writes outside autograd.
  if (grad && p.head.train.defined()) {
    w = w.detach().requires_grad_(true);
    p.head_w = w;
  }
  return w;
}

void sharded_head_done(ShardedPass& p) {
  // A tied head's gradient goes to the embedding's slice now, and the
  // lookup's joins it after the backward: two reduce-scatters into one
  // slice rather than a vocabulary-sized gradient held through the layers.
  if (p.head_w.defined() && p.head_w.requires_grad()) {
    p.reduce(head_unit(p.m), p.head_w.grad().defined() ? p.head_w.grad().detach() : at::zeros_like(p.head_w));
  }
  p.head_w = at::Tensor();
  p.release(p.head);
}

void finish_sharded_pass(ShardedPass& p, bool trained) {
  auto& m = p.m;
  if (trained) {
    at::NoGradGuard ng;
    if (p.norm_w.defined() && p.norm_w.requires_grad()) {
      p.reduce(norm_unit(m), p.norm_w.grad().defined() ? p.norm_w.grad() : at::zeros_like(p.norm_w));
    }
    const auto& e = m.shard.units[0];
    if (e.bucket != SIZE_MAX) {  // the embedding trains: its flat is the one weight
      auto dense = at::zeros({m.arch.vocab_size, m.arch.hidden_size}, at::TensorOptions().dtype(m.dtype).device(m.device));
      if (p.x0.grad().defined()) {
        dense.index_add_(0, p.ids.reshape({-1}), p.x0.grad().reshape({-1, m.arch.hidden_size}).to(dense.scalar_type()));
      }
      p.count(dense.nbytes());
      p.reduce(0, dense);
      p.count(-dense.nbytes());
    }
  }
  while (!p.reduces.empty()) p.finish_reduce();
  while (!p.gathers.empty()) {
    p.finish(p.gathers.front());
    p.release(p.gathers.front());
    p.gathers.pop_front();
  }
  p.x0 = at::Tensor();
  p.norm_w = at::Tensor();
  p.clean = true;
}

void gather_unit(Group& g, Model& m, int32_t u, int32_t* units, const volatile int32_t* cancel) {
  if (m.shard.stage != ORT_SHARD_PARAMETERS || m.shard.group != &g) {
    throw std::runtime_error("gather unit: the model's parameters are not sharded over this group (worker.shard: parameters)");
  }
  if (units != nullptr) *units = static_cast<int32_t>(m.shard.units.size());
  m.shard.staged.clear();
  m.shard.staged_unit = -1;
  forget_listings(m);
  if (u < 0) return;
  if (static_cast<size_t>(u) >= m.shard.units.size()) {
    throw std::runtime_error("gather unit: unit " + std::to_string(u) + " is not in [0, " +
                             std::to_string(m.shard.units.size()) + ")");
  }
  check_usable(g);
  if (!m.shard.sliced) slice_params(m);
  at::NoGradGuard ng;
  ShardedPass p(m, g, false, cancel);
  auto ug = p.start(static_cast<size_t>(u), true);
  p.finish(ug);
  std::map<std::string, LoraPair> lora;
  auto w = p.weights(ug, ug.train, &lora);
  auto& staged = m.shard.staged;
  for (auto& kv : w) staged[kv.first] = kv.second.to(at::kCPU);
  if (m.opts.lora_rank > 0 && ug.train.defined()) {  // the trainable tensors by their PEFT names as well
    int64_t off = 0;
    for (auto i : m.shard.buckets[m.shard.units[u].bucket].params) {
      const auto& t = m.params[i];
      staged[t.first] = ug.train.narrow(0, off, t.second.numel()).view(t.second.sizes()).to(at::kCPU);
      off += t.second.numel();
    }
  }
  m.shard.staged_unit = u;
  p.release(ug);
  p.clean = true;
}

}  // namespace ort
