#!/usr/bin/python3
"""torch_reference.py: an independent PyTorch-eager implementation of the
Llama / Qwen2 / Qwen3 decoder (same semantics as transformers' modeling code)
used to check and benchmark ortrain's libtorch worker without transformers.

  torch_reference.py logprobs MODEL_DIR ROWS_JSON     # rows: [{"tokens":[...],"prompt_len":P}], prints logprobs JSON
  torch_reference.py bench MODEL_DIR --rows R --prompt P --completion C --steps S --threads N  # forward+backward tokens/s
  torch_reference.py write-fixture OUT_DIR --arch qwen3|llama                # a micro checkpoint + expected log-probs
  torch_reference.py train-golden MODEL_DIR                                   # NLL over 5 AdamW steps -> expected_train.json

Reads safetensors without the safetensors package (header JSON + raw bytes).
"""
import argparse
import json
import math
import os
import struct
import sys
import time

import torch

DTYPES = {"F32": torch.float32, "F64": torch.float64, "BF16": torch.bfloat16, "F16": torch.float16}
NAMES = {v: k for k, v in DTYPES.items()}


def read_safetensors(path):
    with open(path, "rb") as f:
        n = struct.unpack("<Q", f.read(8))[0]
        header = json.loads(f.read(n))
        data = f.read()
    out = {}
    for name, t in header.items():
        if name == "__metadata__":
            continue
        b, e = t["data_offsets"]
        buf = bytearray(data[b:e])
        out[name] = torch.frombuffer(buf, dtype=DTYPES[t["dtype"]]).reshape(t["shape"]).clone() if e > b else torch.zeros(t["shape"], dtype=DTYPES[t["dtype"]])
    return out


def write_safetensors(path, tensors):
    header, blobs, off = {"__metadata__": {"format": "pt"}}, [], 0
    for name in sorted(tensors):
        t = tensors[name].contiguous()
        raw = t.view(torch.uint8).numpy().tobytes() if t.dtype in (torch.bfloat16,) else t.numpy().tobytes()
        header[name] = {"dtype": NAMES[t.dtype], "shape": list(t.shape), "data_offsets": [off, off + len(raw)]}
        blobs.append(raw)
        off += len(raw)
    h = json.dumps(header, separators=(",", ":")).encode()
    h += b" " * ((8 - len(h) % 8) % 8)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(h)) + h + b"".join(blobs))


def load(model_dir, dtype=torch.float32):
    cfg = json.load(open(os.path.join(model_dir, "config.json")))
    w = {k: v.to(dtype) for k, v in read_safetensors(os.path.join(model_dir, "model.safetensors")).items()}
    return cfg, w


def rms(x, w, eps):
    xf = x.float() if x.dtype != torch.float64 else x
    xf = xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + eps)
    return w * xf.to(x.dtype)


def inv_freq(cfg, hd, acc):
    inv = 1.0 / (cfg.get("rope_theta", 10000.0) ** (torch.arange(0, hd, 2, dtype=torch.int64).to(acc) / hd))
    rs = cfg.get("rope_scaling") or {}
    kind = rs.get("rope_type", rs.get("type", "default"))
    if kind == "linear":
        inv = inv / rs["factor"]
    elif kind == "llama3":
        f, lo, hi, old = rs["factor"], rs["low_freq_factor"], rs["high_freq_factor"], rs["original_max_position_embeddings"]
        wl = 2 * math.pi / inv
        llama = torch.where(wl > old / lo, inv / f, inv)
        smooth = (old / wl - lo) / (hi - lo)
        smoothed = (1 - smooth) * llama / f + smooth * llama
        medium = ~(wl < old / hi) & ~(wl > old / lo)
        inv = torch.where(medium, smoothed, llama)
    return inv


def rot(x):
    h = x.shape[-1] // 2
    return torch.cat([-x[..., h:], x[..., :h]], -1)


def forward(cfg, w, ids):
    """ids [B, L] (right-padded); returns logits [B, L, V]."""
    B, L = ids.shape
    H, nh = cfg["hidden_size"], cfg["num_attention_heads"]
    nkv = cfg.get("num_key_value_heads") or nh
    hd = cfg.get("head_dim") or H // nh
    eps = cfg.get("rms_norm_eps", 1e-6)
    dt = w["model.embed_tokens.weight"].dtype
    acc = torch.float64 if dt == torch.float64 else torch.float32
    qwen3, qwen2 = cfg["model_type"] == "qwen3", cfg["model_type"] == "qwen2"
    freqs = torch.arange(L, dtype=acc)[:, None] * inv_freq(cfg, hd, acc)[None, :]
    emb = torch.cat([freqs, freqs], -1)
    cos, sin = emb.cos().to(dt), emb.sin().to(dt)
    mask = torch.full((L, L), float("-inf"), dtype=acc).triu(1)
    x = w["model.embed_tokens.weight"][ids]

    def lin(name, t):
        return torch.nn.functional.linear(t, w[name + ".weight"], w.get(name + ".bias"))

    for i in range(cfg["num_hidden_layers"]):
        p = f"model.layers.{i}."
        h = rms(x, w[p + "input_layernorm.weight"], eps)
        q = lin(p + "self_attn.q_proj", h).view(B, L, nh, hd)
        k = lin(p + "self_attn.k_proj", h).view(B, L, nkv, hd)
        v = lin(p + "self_attn.v_proj", h).view(B, L, nkv, hd).transpose(1, 2)
        if qwen3:
            q = rms(q, w[p + "self_attn.q_norm.weight"], eps)
            k = rms(k, w[p + "self_attn.k_norm.weight"], eps)
        q, k = q.transpose(1, 2), k.transpose(1, 2)
        q, k = q * cos + rot(q) * sin, k * cos + rot(k) * sin
        k = k.repeat_interleave(nh // nkv, 1)
        v = v.repeat_interleave(nh // nkv, 1)
        s = (q @ k.transpose(-1, -2)) / math.sqrt(hd)
        a = torch.softmax(s.to(acc) + mask, -1).to(dt) @ v
        x = x + lin(p + "self_attn.o_proj", a.transpose(1, 2).reshape(B, L, nh * hd))
        h = rms(x, w[p + "post_attention_layernorm.weight"], eps)
        x = x + lin(p + "mlp.down_proj", torch.nn.functional.silu(lin(p + "mlp.gate_proj", h)) * lin(p + "mlp.up_proj", h))
    x = rms(x, w["model.norm.weight"], eps)
    head = w["model.embed_tokens.weight"] if cfg.get("tie_word_embeddings") else w["lm_head.weight"]
    return x @ head.t()


def row_logprobs(cfg, w, rows, temperature=1.0):
    out = []
    for r in rows:
        ids = torch.tensor([r["tokens"]])
        z = forward(cfg, w, ids)[0].to(torch.float64) / temperature
        P = r["prompt_len"]
        lp = torch.log_softmax(z[P - 1:-1], -1).gather(1, ids[0, P:, None])[:, 0]
        out.append(lp.tolist())
    return out


def bench(args):
    torch.set_num_threads(args.threads)
    cfg, w = load(args.model)
    for t in w.values():
        t.requires_grad_(True)
    opt = torch.optim.AdamW(list(w.values()), lr=1e-5)
    V = cfg["vocab_size"]
    g = torch.Generator().manual_seed(0)
    seq = args.prompt + args.completion
    ids = torch.randint(0, V, (args.rows, seq), generator=g)
    P = args.prompt
    import resource
    times, cpu, fwd_bwd, fwd_bwd_cpu, sys_s, faults = [], [], [], [], [], []
    for step in range(args.steps + 1):
        t0, c0 = time.perf_counter(), time.process_time()
        ru0 = resource.getrusage(resource.RUSAGE_SELF)
        z = forward(cfg, w, ids)[:, P - 1:-1].float()
        lp = torch.log_softmax(z, -1).gather(2, ids[:, P:, None])[..., 0]
        loss = -(lp * torch.randn(args.rows, 1, generator=g)).mean()
        loss.backward()
        t1, c1 = time.perf_counter(), time.process_time()
        opt.step()
        opt.zero_grad()
        if step > 0:  # the first step warms up
            times.append(time.perf_counter() - t0)
            cpu.append(time.process_time() - c0)
            fwd_bwd.append(t1 - t0)
            fwd_bwd_cpu.append(c1 - c0)
            ru1 = resource.getrusage(resource.RUSAGE_SELF)
            sys_s.append(ru1.ru_stime - ru0.ru_stime)
            faults.append(ru1.ru_minflt - ru0.ru_minflt)
    tok = args.rows * seq * args.steps
    rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    print(json.dumps({"train_tokens_per_s": tok / sum(times), "train_step_s": sum(times) / len(times), "train_step_cpu_s": sum(cpu) / len(cpu),
                      "fwd_bwd_tokens_per_s": tok / sum(fwd_bwd), "fwd_bwd_cpu_s": sum(fwd_bwd_cpu) / len(fwd_bwd_cpu), "peak_rss_mib": rss,
                      "train_step_sys_s": sum(sys_s) / len(sys_s), "train_step_minflt": sum(faults) / len(faults)}))


def write_fixture(args):
    """A micro checkpoint (covers GQA, tied/untied, biases, q/k norm, llama3
    rope scaling) plus expected log-probs from this reference."""
    g = torch.Generator().manual_seed(7)
    qwen3 = args.arch == "qwen3"
    cfg = {
        "architectures": ["Qwen3ForCausalLM" if qwen3 else "LlamaForCausalLM"], "model_type": "qwen3" if qwen3 else "llama",
        "vocab_size": 61, "hidden_size": 32, "intermediate_size": 48, "num_hidden_layers": 2,
        "num_attention_heads": 4, "num_key_value_heads": 2, "head_dim": 8, "hidden_act": "silu",
        "rms_norm_eps": 1e-6, "rope_theta": 10000.0 if qwen3 else 500000.0, "max_position_embeddings": 256,
        "tie_word_embeddings": qwen3, "torch_dtype": "float32", "attention_bias": not qwen3,
        "rope_scaling": None if qwen3 else {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0,
                                              "high_freq_factor": 4.0, "original_max_position_embeddings": 16},
    }
    H, I, V, hd, nh, nkv = 32, 48, 61, 8, 4, 2
    w = {"model.embed_tokens.weight": torch.randn(V, H, generator=g) * 0.3, "model.norm.weight": 1 + 0.1 * torch.randn(H, generator=g)}
    if not qwen3:
        w["lm_head.weight"] = torch.randn(V, H, generator=g) * 0.3
    for i in range(2):
        p = f"model.layers.{i}."
        shapes = {"input_layernorm.weight": (H,), "post_attention_layernorm.weight": (H,),
                  "self_attn.q_proj.weight": (nh * hd, H), "self_attn.k_proj.weight": (nkv * hd, H),
                  "self_attn.v_proj.weight": (nkv * hd, H), "self_attn.o_proj.weight": (H, nh * hd),
                  "mlp.gate_proj.weight": (I, H), "mlp.up_proj.weight": (I, H), "mlp.down_proj.weight": (H, I)}
        if qwen3:
            shapes.update({"self_attn.q_norm.weight": (hd,), "self_attn.k_norm.weight": (hd,)})
        else:
            shapes.update({"self_attn.q_proj.bias": (nh * hd,), "self_attn.k_proj.bias": (nkv * hd,),
                           "self_attn.v_proj.bias": (nkv * hd,), "self_attn.o_proj.bias": (H,)})
        for n, s in shapes.items():
            scale = 0.1 if len(s) == 1 else 0.3
            w[p + n] = (1 if "norm" in n else 0) + scale * torch.randn(*s, generator=g)
    os.makedirs(args.out, exist_ok=True)
    json.dump(cfg, open(os.path.join(args.out, "config.json"), "w"), indent=2)
    write_safetensors(os.path.join(args.out, "model.safetensors"), w)
    rows = []
    for n in (5, 9, 24):
        toks = torch.randint(0, V, (n,), generator=g).tolist()
        rows.append({"tokens": toks, "prompt_len": 2 + n // 4})
    w64 = {k: v.double() for k, v in w.items()}
    expected = {"temperature": 0.7, "rows": rows, "logprobs": row_logprobs(cfg, w64, rows, 0.7)}
    json.dump(expected, open(os.path.join(args.out, "expected_logprobs.json"), "w"))


def train_golden(args):
    """Five float64 AdamW steps on one fixed sequence, minimising its mean
    NLL (the gradient of on-policy dapo with advantage 1); records the NLL
    before each step."""
    cfg, w = load(args.model, torch.float64)
    params = [w[k].requires_grad_(True) for k in sorted(w)]
    lr, wd = 1e-2, 0.01
    opt = torch.optim.AdamW(params, lr=lr, betas=(0.9, 0.999), eps=1e-8, weight_decay=wd)
    tokens = [1, 7, 30, 12, 12, 40, 5, 22, 9, 13, 57, 3]
    P = 3
    ids = torch.tensor([tokens])
    nlls = []
    for _ in range(5):
        z = forward(cfg, w, ids)[0, P - 1:-1]
        loss = -torch.log_softmax(z, -1).gather(1, ids[0, P:, None]).mean()
        nlls.append(loss.item())
        loss.backward()
        opt.step()
        opt.zero_grad()
    out = {"tokens": tokens, "prompt_len": P, "lr": lr, "weight_decay": wd, "nll": nlls}
    json.dump(out, open(os.path.join(args.model, "expected_train.json"), "w"))


def main():
    ap = argparse.ArgumentParser()
    sub = ap.add_subparsers(dest="cmd", required=True)
    a = sub.add_parser("logprobs")
    a.add_argument("model")
    a.add_argument("rows")
    b = sub.add_parser("bench")
    b.add_argument("model")
    b.add_argument("--rows", type=int, default=4)
    b.add_argument("--prompt", type=int, default=32)
    b.add_argument("--completion", type=int, default=96)
    b.add_argument("--steps", type=int, default=3)
    b.add_argument("--threads", type=int, default=os.cpu_count())
    c = sub.add_parser("write-fixture")
    c.add_argument("out")
    c.add_argument("--arch", default="qwen3")
    d = sub.add_parser("train-golden")
    d.add_argument("model")
    args = ap.parse_args()
    if args.cmd == "train-golden":
        train_golden(args)
    elif args.cmd == "logprobs":
        cfg, w = load(args.model, torch.float64)
        print(json.dumps(row_logprobs(cfg, w, json.load(open(args.rows)))))
    elif args.cmd == "bench":
        bench(args)
    else:
        write_fixture(args)


if __name__ == "__main__":
    main()
