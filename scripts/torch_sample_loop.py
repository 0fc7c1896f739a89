#!/usr/bin/python3
"""torch_sample_loop.py: the PyTorch-eager baseline of scripts/bench-sample,
a batched KV-cache sampling loop written to be fair to PyTorch: all rows in
one batch, a preallocated KV cache that each step writes one position of and
attends over only up to the live length, GQA without copying keys/values,
sampling of all rows with tensor ops (temperature, softmax, one
torch.multinomial call), no per-row host round trips (the ids are read back
once at the end), under torch.inference_mode. Model code is
torch_reference.py's (same semantics as transformers).

  torch_sample_loop.py MODEL_DIR --rows R --prompt P --new-tokens N --threads T [--repeats K]
prints {"sample_tokens_per_s": ..., "sample_s": ...} (the median of K timed
runs, as benchworker --repeats); prompts are random ids
(seeded), temperature 1, no stop ids: every row makes N tokens, as in
benchworker.
"""
import argparse
import json
import math
import os
import statistics
import sys
import time

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from torch_reference import inv_freq, load, rms, rot  # noqa: E402


class Decoder:
    def __init__(self, cfg, w, rows, max_len):
        self.cfg, self.w = cfg, w
        H, nh = cfg["hidden_size"], cfg["num_attention_heads"]
        self.nh = nh
        self.nkv = cfg.get("num_key_value_heads") or nh
        self.hd = cfg.get("head_dim") or H // nh
        self.eps = cfg.get("rms_norm_eps", 1e-6)
        self.dt = w["model.embed_tokens.weight"].dtype
        self.acc = torch.float64 if self.dt == torch.float64 else torch.float32
        self.qwen3 = cfg["model_type"] == "qwen3"
        L = cfg["num_hidden_layers"]
        self.k = [torch.zeros(rows, self.nkv, max_len, self.hd, dtype=self.dt) for _ in range(L)]
        self.v = [torch.zeros(rows, self.nkv, max_len, self.hd, dtype=self.dt) for _ in range(L)]
        freqs = torch.arange(max_len, dtype=self.acc)[:, None] * inv_freq(cfg, self.hd, self.acc)[None, :]
        emb = torch.cat([freqs, freqs], -1)
        self.cos, self.sin = emb.cos().to(self.dt), emb.sin().to(self.dt)
        self.head = w["model.embed_tokens.weight"] if cfg.get("tie_word_embeddings") else w["lm_head.weight"]

    def forward(self, ids, pos0):
        """ids [B, L] at positions pos0.. (the same for every row); returns
        the last position's logits [B, V]."""
        w, B, L = self.w, ids.shape[0], ids.shape[1]
        nh, nkv, hd, g = self.nh, self.nkv, self.hd, self.nh // self.nkv
        end = pos0 + L
        cos, sin = self.cos[pos0:end], self.sin[pos0:end]
        mask = None
        if L > 1:
            mask = torch.full((L, end), float("-inf"), dtype=self.acc).triu(pos0 + 1)
        x = w["model.embed_tokens.weight"][ids]

        def lin(name, t):
            return torch.nn.functional.linear(t, w[name + ".weight"], w.get(name + ".bias"))

        for i in range(self.cfg["num_hidden_layers"]):
            p = f"model.layers.{i}."
            h = rms(x, w[p + "input_layernorm.weight"], self.eps)
            q = lin(p + "self_attn.q_proj", h).view(B, L, nh, hd)
            k = lin(p + "self_attn.k_proj", h).view(B, L, nkv, hd)
            v = lin(p + "self_attn.v_proj", h).view(B, L, nkv, hd).transpose(1, 2)
            if self.qwen3:
                q = rms(q, w[p + "self_attn.q_norm.weight"], self.eps)
                k = rms(k, w[p + "self_attn.k_norm.weight"], self.eps)
            q, k = q.transpose(1, 2), k.transpose(1, 2)
            q, k = q * cos + rot(q) * sin, k * cos + rot(k) * sin
            self.k[i][:, :, pos0:end] = k
            self.v[i][:, :, pos0:end] = v
            K, V = self.k[i][:, :, :end], self.v[i][:, :, :end]
            # GQA without copying K/V: the g query heads of a kv head are rows.
            q4 = (q / math.sqrt(hd)).reshape(B, nkv, g * L, hd)
            s = (q4 @ K.transpose(-1, -2)).view(B, nkv, g, L, end).to(self.acc)
            if mask is not None:
                s = s + mask
            a = torch.softmax(s, -1).to(self.dt).view(B, nkv, g * L, end) @ V
            a = a.view(B, nh, L, hd).transpose(1, 2).reshape(B, L, nh * hd)
            x = x + lin(p + "self_attn.o_proj", a)
            h = rms(x, w[p + "post_attention_layernorm.weight"], self.eps)
            x = x + lin(p + "mlp.down_proj", torch.nn.functional.silu(lin(p + "mlp.gate_proj", h)) * lin(p + "mlp.up_proj", h))
        x = rms(x[:, -1], w["model.norm.weight"], self.eps)
        return (x @ self.head.t()).to(self.acc)


def sample(cfg, w, prompts, new_tokens, gen):
    rows, P = prompts.shape
    d = Decoder(cfg, w, rows, P + new_tokens)
    out = torch.empty(rows, new_tokens, dtype=torch.long)
    logps = torch.empty(rows, new_tokens, dtype=d.acc)
    logits = d.forward(prompts, 0)
    for t in range(new_tokens):
        lp = torch.log_softmax(logits / 1.0, -1)
        tok = torch.multinomial(lp.exp(), 1, generator=gen)
        out[:, t : t + 1] = tok
        logps[:, t : t + 1] = lp.gather(1, tok)
        if t + 1 < new_tokens:
            logits = d.forward(tok, P + t)
    return out.tolist(), logps.tolist()


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("model")
    ap.add_argument("--rows", type=int, default=16)
    ap.add_argument("--prompt", type=int, default=32)
    ap.add_argument("--new-tokens", type=int, default=64)
    ap.add_argument("--threads", type=int, default=os.cpu_count())
    ap.add_argument("--repeats", type=int, default=1, help="time sampling this many times, report the median")
    a = ap.parse_args()
    torch.set_num_threads(a.threads)
    cfg, w = load(a.model)
    g = torch.Generator().manual_seed(1)
    prompts = torch.randint(0, cfg["vocab_size"], (a.rows, a.prompt), generator=g)
    with torch.inference_mode():
        sample(cfg, w, prompts[:1], a.new_tokens, g)  # warm-up, as benchworker's
        rates, times = [], []
        for _ in range(max(a.repeats, 1)):
            t0 = time.perf_counter()
            ids, _ = sample(cfg, w, prompts, a.new_tokens, g)
            dt = time.perf_counter() - t0
            times.append(dt)
            rates.append(sum(len(r) for r in ids) / dt)
    print(json.dumps({"sample_tokens_per_s": statistics.median(rates), "sample_s": statistics.median(times)}))


if __name__ == "__main__":
    main()
