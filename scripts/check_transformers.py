#!/usr/bin/env python3
"""check_transformers.py: run by scripts/check-transformers. Builds a random
Qwen3 model with transformers, then compares the worker (build/benchworker)
with transformers on CUDA in bfloat16:
  1. per-token log-probs of random rows agree to bf16 tolerance;
  2. the worker's forward + backward processes at least as many tokens/s
     as transformers' (same rows, loss on the completion tokens).
Exit status 1 when either fails."""
import argparse
import json
import os
import subprocess
import sys
import time

import torch
import transformers


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--device", default="cuda:0")
    ap.add_argument("--benchworker", required=True)
    ap.add_argument("--out", required=True)
    ap.add_argument("--rows", type=int, default=8)
    ap.add_argument("--prompt", type=int, default=64)
    ap.add_argument("--completion", type=int, default=448)
    args = ap.parse_args()
    torch.manual_seed(0)
    cfg = transformers.Qwen3Config(vocab_size=32000, hidden_size=1024, intermediate_size=3072, num_hidden_layers=8,
                                   num_attention_heads=16, num_key_value_heads=8, head_dim=64, tie_word_embeddings=True,
                                   max_position_embeddings=4096)
    model_dir = os.path.join(args.out, "qwen3-random")
    model = transformers.Qwen3ForCausalLM(cfg).to(torch.bfloat16)
    model.save_pretrained(model_dir, safe_serialization=True)
    # transformers 5 writes rope_theta inside rope_parameters; surface it at
    # the top level too, and say so, in case internal/model does not read it.
    cfg_path = os.path.join(model_dir, "config.json")
    saved = json.load(open(cfg_path))
    rp = saved.get("rope_parameters") or {}
    if "rope_theta" not in saved and "rope_theta" in rp:
        print(f"note: config.json has rope_parameters (transformers 5); copying rope_theta={rp['rope_theta']} to the top level")
        saved["rope_theta"] = rp["rope_theta"]
        json.dump(saved, open(cfg_path, "w"), indent=2)
    model = model.to(args.device)

    # 1. log-probs
    g = torch.Generator().manual_seed(1)
    seq = args.prompt + args.completion
    ids = torch.randint(0, cfg.vocab_size, (args.rows, seq), generator=g)
    rows = [{"tokens": r.tolist(), "prompt_len": args.prompt} for r in ids]
    rows_path = os.path.join(args.out, "rows.json")
    json.dump(rows, open(rows_path, "w"))
    with torch.no_grad():
        logits = model(ids.to(args.device)).logits[:, args.prompt - 1:-1].float()
        ref = torch.log_softmax(logits, -1).gather(2, ids[:, args.prompt:, None].to(args.device))[..., 0].cpu()
    out = subprocess.run([args.benchworker, "--model", model_dir, "--device", args.device, "--dtype", "bfloat16",
                          "--logprobs", rows_path], check=True, capture_output=True, text=True).stdout
    got = torch.tensor(json.loads(out))
    diff = (got - ref).abs()
    print(f"log-probs: max |worker - transformers| = {diff.max():.4f}, mean = {diff.mean():.5f} (bf16)")
    ok = diff.mean().item() < 2e-2 and diff.max().item() < 0.5

    # 2. forward + backward throughput of transformers (loss on completion tokens)
    model.train()
    x = ids.to(args.device)
    times = []
    for step in range(4):
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        logits = model(x).logits[:, args.prompt - 1:-1].float()
        lp = torch.log_softmax(logits, -1).gather(2, x[:, args.prompt:, None])[..., 0]
        (-lp.mean()).backward()
        torch.cuda.synchronize()
        if step > 0:
            times.append(time.perf_counter() - t0)
        model.zero_grad(set_to_none=True)
    hf_tps = args.rows * seq * len(times) / sum(times)
    del model
    torch.cuda.empty_cache()
    out = subprocess.run([args.benchworker, "--model", model_dir, "--device", args.device, "--dtype", "bfloat16",
                          "--rows", str(args.rows), "--prompt", str(args.prompt), "--completion", str(args.completion),
                          "--steps", "3", "--new-tokens", "32"], check=True, capture_output=True, text=True).stdout
    w = json.loads(out)
    print(f"forward+backward tokens/s: worker {w['fwd_bwd_tokens_per_s']:.0f}, transformers {hf_tps:.0f} "
          f"(ratio {w['fwd_bwd_tokens_per_s'] / hf_tps:.2f}x); worker with AdamW {w['train_tokens_per_s']:.0f}; "
          f"worker sampling {w['sample_tokens_per_s']:.0f} tokens/s")
    ok = ok and w["fwd_bwd_tokens_per_s"] >= hf_tps
    print("check-transformers:", "PASS" if ok else "FAIL")
    sys.exit(0 if ok else 1)


if __name__ == "__main__":
    main()
