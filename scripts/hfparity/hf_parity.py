#!/usr/bin/env python3
"""hf_parity.py: ortrain against the real Hugging Face stack (issue 24 item 2).

Run by scripts/check-hf-parity inside the forky root (transformers,
tokenizers, torch, safetensors, jinja2 from Debian). Subcommands:

  reference --out DIR [--parts ...]   build models, run the checks that call
        ortrain as a subprocess (log-probs, checkpoints) and write the
        references the Go tests compare with (tokenizers, templates):
          DIR/manifest.json              what was written (the Go tests fail
                                         on a part named here but missing)
          DIR/tokenizers/corpus.json     the mixed-text corpus (a list of
                                         documents) and DIR/tokenizers/<name>.json
                                         the ids transformers and tokenizers give
          DIR/templates/cases.json       conversations and apply_chat_template's
                                         output (or error)
          DIR/py-results.json            the rows of the summary table
  summary --out DIR [--xfail REGEX]   print DIR/py-results.json and
        DIR/go-results.json (written by internal/chat/hfparity_test.go) as
        one table; exit 1 when a row failed (but for --xfail's cases) or a
        part is missing.

Parts:
  logprobs     per-token log-probs of every supported architecture, from
               models written by `ortrain init-model` and by transformers
               (weights randomised so that biases and norms matter): the
               worker (benchworker --logprobs) against transformers (eager
               attention) in float32, and in float64 through
               scripts/hfparity/wlogprobs, which also reads each log-prob to
               float64 precision through the loss (the worker's Logprobs
               returns float32). The float64 reference is transformers with
               its float32 islands (RMSNorm variance, RoPE tables, softmax)
               made float64 (TrueFloat64). Cases of features ortrain may
               leave unsupported (sliding windows, yarn/dynamic RoPE, float64
               checkpoints) pass when ortrain refuses the model, and fail
               when it loads it and computes something else; cases of
               features under test first check that the feature changes
               transformers' log-probs on the rows used.
  checkpoints  `ortrain run` (2 steps of a quickstart-like run of the tiny
               preset), full and LoRA with modules_to_save: transformers
               loads the full checkpoint with no missing or unexpected keys,
               the adapter has PEFT's layout and, merged by hand (python3-peft
               is not packaged in Debian), gives the worker's log-probs.
  tokenizers   ids of every tokenizer fixture and of init-model's tokenizer
               on a deterministic mixed-script corpus (reference only: the
               comparison is internal/chat/hfparity_test.go).
  templates    chat templates rendered by apply_chat_template on multi-turn
               tool-calling conversations (reference only, likewise).
"""
import argparse
import datetime
import gzip
import json
import math
import os
import random
import re
import shutil
import subprocess
import sys
import time
import unicodedata

import numpy as np
import torch
import transformers

ALL_PARTS = ["logprobs", "checkpoints", "tokenizers", "templates"]
F32_TOL = 1e-4
F64_TOL = 1e-10

transformers.logging.set_verbosity_error()
try:  # progress bars of save_pretrained / from_pretrained
    transformers.utils.logging.disable_progress_bar()
except AttributeError:
    pass


class Ctx:
    def __init__(self, args):
        self.out = os.path.abspath(args.out)
        self.repo = os.path.abspath(args.repo)
        self.ortrain = os.path.abspath(args.ortrain)
        self.benchworker = os.path.abspath(args.benchworker)
        self.wlogprobs = os.path.abspath(args.wlogprobs)
        self.threads = args.threads
        self.big_threads = args.big_threads
        self.args = args
        self.results = []
        self.timings = {}  # per part
        self.case_timings = {}

    def result(self, part, case, metric, value, threshold, ok, note=""):
        """One row of the summary table. value/threshold: numbers or text."""
        self.results.append(dict(part=part, case=case, metric=metric, value=value, threshold=threshold,
                                 ok=bool(ok), note=note))
        v = fmt_num(value)
        print(f"  {'ok  ' if ok else 'FAIL'} {case:<34} {metric:<26} {v:>12}  (<= {fmt_num(threshold)}) {note}",
              flush=True)

    def run(self, cmd, check=True, **kw):
        p = subprocess.run(cmd, capture_output=True, text=True, **kw)
        if check and p.returncode != 0:
            raise RuntimeError(f"{' '.join(cmd)}: exit {p.returncode}\n{p.stderr[-3000:]}")
        return p


def fmt_num(v):
    if isinstance(v, float):
        return f"{v:.3g}"
    return str(v)


def first_line(s):
    s = s.strip().splitlines()
    return s[-1] if s else ""


# ---------------------------------------------------------------- models

def init_model(ctx, preset, out):
    """`ortrain init-model`, once per directory."""
    if not os.path.exists(os.path.join(out, "config.json")):
        ctx.run([ctx.ortrain, "init-model", "--preset", preset, "--out", out, "--seed", "3"])
    return out


def list_presets(ctx):
    """Presets from `ortrain init-model --help`: [(name, params)]."""
    help_text = ctx.run([ctx.ortrain, "init-model", "--help"]).stdout
    out = []
    section = help_text.split("Presets", 1)[1].split("\n\n", 1)[0] if "Presets" in help_text else ""
    for line in section.splitlines()[1:]:
        m = re.match(r"\s+(\S+)\s+.*?~([\d.]+)([MB])\s+parameters", line)
        if m:
            n = float(m.group(2)) * (1e6 if m.group(3) == "M" else 1e9)
            out.append((m.group(1), n))
    return out


def randomize(model, seed):
    """Weights that make every part of the model matter: transformers'
    init leaves biases at 0 and norms at 1 (a wrong bias or norm would go
    unseen) and its std 0.02 makes every log-prob about -log(V)."""
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if name.endswith("norm.weight"):
                p.copy_(1 + 0.3 * torch.randn(p.shape, generator=g))
            elif name.endswith(".bias"):
                p.copy_(0.3 * torch.randn(p.shape, generator=g))
            elif "embed_tokens" in name:
                p.copy_(torch.randn(p.shape, generator=g))
            else:
                p.copy_(torch.randn(p.shape, generator=g) / math.sqrt(p.shape[1]))


def tiny(**kw):
    base = dict(vocab_size=256, hidden_size=64, intermediate_size=96, num_hidden_layers=2, num_attention_heads=4,
                num_key_value_heads=2, max_position_embeddings=256, rms_norm_eps=1e-6, bos_token_id=1, eos_token_id=2)
    base.update(kw)
    return base


# name, config class, kwargs, expect, sensitivity (kwargs that remove the
# feature under test: its log-probs must then differ, so the case is not
# vacuous). expect "match": ortrain must load the model and agree;
# "refuse-or-match": a feature ortrain may leave unsupported, but only by
# refusing the model, never by computing something else.
def hf_cases():
    L, Q2, Q3, M = transformers.LlamaConfig, transformers.Qwen2Config, transformers.Qwen3Config, transformers.MistralConfig
    llama3 = {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
              "original_max_position_embeddings": 32, "rope_theta": 500000.0}
    return [
        ("llama-tied", L, tiny(tie_word_embeddings=True), "match", None),
        ("llama-untied", L, tiny(tie_word_embeddings=False), "match", None),
        ("llama-mha-untied", L, tiny(num_key_value_heads=4, hidden_size=32, tie_word_embeddings=False), "match", None),
        ("llama-attention-bias", L, tiny(attention_bias=True, tie_word_embeddings=False), "match", None),
        # mlp_bias is not implemented: config validation refuses it by name.
        ("llama-mlp-bias", L, tiny(mlp_bias=True, tie_word_embeddings=True), "refuse-or-match", None),
        ("llama-attention+mlp-bias", L, tiny(attention_bias=True, mlp_bias=True), "refuse-or-match", None),
        ("llama-rope-llama3", L, tiny(rope_parameters=llama3), "match",
         {"rope_parameters": {"rope_type": "default", "rope_theta": 500000.0}}),
        ("llama-rope-linear", L, tiny(rope_parameters={"rope_type": "linear", "factor": 4.0, "rope_theta": 10000.0}),
         "match", {"rope_parameters": {"rope_type": "default", "rope_theta": 10000.0}}),
        ("llama-head-dim-16-hidden-40", L, tiny(hidden_size=40, head_dim=16, tie_word_embeddings=False), "match", None),
        ("qwen2-qkv-bias-tied", Q2, tiny(tie_word_embeddings=True), "match", None),
        ("qwen2-qkv-bias-untied-mqa", Q2, tiny(num_key_value_heads=1, tie_word_embeddings=False), "match", None),
        ("qwen3-qk-norm", Q3, tiny(head_dim=16, tie_word_embeddings=True), "match", None),
        ("qwen3-head-dim-32-hidden-48", Q3, tiny(hidden_size=48, head_dim=32, tie_word_embeddings=False), "match", None),
        ("mistral", M, tiny(head_dim=16, tie_word_embeddings=False), "match", None),
        ("mistral-head-dim-24-hidden-32", M, tiny(hidden_size=32, head_dim=24), "match", None),
        # Features ortrain may refuse, but must not get wrong silently.
        ("mistral-sliding-window-16", M, tiny(head_dim=16, sliding_window=16), "refuse-or-match",
         {"sliding_window": None}),
        ("qwen2-sliding-window-16", Q2, tiny(use_sliding_window=True, sliding_window=16, max_window_layers=1),
         "refuse-or-match", {"use_sliding_window": False}),
        ("llama-rope-yarn", L, tiny(rope_parameters={"rope_type": "yarn", "factor": 4.0, "rope_theta": 10000.0,
                                                     "original_max_position_embeddings": 32}),
         "refuse-or-match", {"rope_parameters": {"rope_type": "default", "rope_theta": 10000.0}}),
        ("llama-rope-dynamic", L, tiny(max_position_embeddings=32,
                                       rope_parameters={"rope_type": "dynamic", "factor": 2.0, "rope_theta": 10000.0}),
         "refuse-or-match", {"rope_parameters": {"rope_type": "default", "rope_theta": 10000.0}}),
    ]


def make_rows(vocab, seed, lengths=(24, 56, 90), prompts=(1, 8, 33)):
    rng = np.random.RandomState(seed)
    return [{"tokens": rng.randint(0, vocab, size=n).tolist(), "prompt_len": p} for n, p in zip(lengths, prompts)]


def hf_logprobs(model, rows, dtype):
    out = []
    with torch.no_grad():
        for r in rows:
            ids = torch.tensor([r["tokens"]])
            logits = model(ids).logits[0].to(dtype)
            p = r["prompt_len"]
            lp = torch.log_softmax(logits[p - 1:-1], -1).gather(1, ids[0, p:, None])[:, 0]
            out.append(lp.double().numpy())
    return out


class TrueFloat64:
    """While active, float32 means float64 to torch. transformers computes
    RMSNorm's variance (hidden_states.to(torch.float32)), the RoPE tables
    (inv_freq and its llama3/linear scaling, .float()) and eager attention's
    softmax (dtype=torch.float32) in float32 even in a float64 model, which
    leaves its "float64" log-probs about 1e-7 (relative) from float64 ones.
    Loading and running the model inside this makes the reference float64
    throughout."""

    def __enter__(self):
        self.saved = torch.Tensor.to, torch.Tensor.float, torch.nn.functional.softmax, torch.get_default_dtype()
        orig_to, _, orig_softmax, _ = self.saved

        def to(t, *a, **k):
            a = tuple(torch.float64 if x is torch.float32 else x for x in a)
            if k.get("dtype") is torch.float32:
                k["dtype"] = torch.float64
            return orig_to(t, *a, **k)

        def softmax(x, *a, **k):
            if k.get("dtype") is torch.float32:
                k["dtype"] = torch.float64
            return orig_softmax(x, *a, **k)

        torch.Tensor.to = to
        torch.Tensor.float = lambda t, *a, **k: orig_to(t, torch.float64)
        torch.nn.functional.softmax = softmax
        torch.set_default_dtype(torch.float64)
        return self

    def __exit__(self, *exc):
        torch.Tensor.to, torch.Tensor.float, torch.nn.functional.softmax, default = self.saved
        torch.set_default_dtype(default)


def load_hf(path, dtype, check_info=None):
    """AutoModelForCausalLM in dtype, eager attention; with check_info a
    list that gets the loading problems (missing, unexpected, mismatched)."""
    model, info = transformers.AutoModelForCausalLM.from_pretrained(path, dtype=dtype, attn_implementation="eager",
                                                                     output_loading_info=True)
    model.eval()
    if check_info is not None:
        for k in ("missing_keys", "unexpected_keys", "mismatched_keys", "error_msgs"):
            if info.get(k):
                check_info.append(f"{k}: {sorted(map(str, info[k]))[:6]}")
    return model


def max_diff(a, b):
    return max(float(np.max(np.abs(np.asarray(x, dtype=np.float64) - np.asarray(y, dtype=np.float64))))
               for x, y in zip(a, b))


def ulp32(x):
    x = np.abs(np.asarray(x, dtype=np.float32))
    return np.spacing(x).astype(np.float64)


def as_f32(rows):
    """The worker's float32 log-probs, as the float32 values they are (the
    JSON holds their shortest decimal form, which as a float64 is up to half
    a float32 ulp off)."""
    return [np.asarray(r, dtype=np.float32).astype(np.float64) for r in rows]


def worker_logprobs(ctx, model_dir, rows_path, dtype, exact=False, adapter=None, threads=None):
    """(float32 log-probs, exact float64 or None, error text or None)."""
    threads = threads or ctx.threads
    if adapter is None and not exact:
        cmd = [ctx.benchworker, "--model", model_dir, "--dtype", dtype, "--threads", str(threads),
               "--logprobs", rows_path]
        p = ctx.run(cmd, check=False)
        if p.returncode != 0:
            return None, None, first_line(p.stderr)
        return as_f32(json.loads(p.stdout)), None, None
    cmd = [ctx.wlogprobs, "--dtype", dtype, "--threads", str(threads), "--rows", rows_path]
    if model_dir:
        cmd += ["--model", model_dir]
    if adapter:
        cmd += ["--adapter", adapter]
    if exact:
        cmd.append("--exact")
    p = ctx.run(cmd, check=False)
    if p.returncode != 0:
        return None, None, first_line(p.stderr)
    out = json.loads(p.stdout)
    return as_f32(out["logprobs"]), out.get("exact"), None


def compare_model(ctx, case, model_dir, rows, expect="match", plain_config=None, exact=True, threads=None):
    """Worker against transformers on model_dir in float32 and float64."""
    t0 = time.time()
    torch.set_num_threads(threads or ctx.threads)
    try:
        _compare_model(ctx, case, model_dir, rows, expect, plain_config, exact, threads or ctx.threads)
    finally:
        torch.set_num_threads(ctx.threads)
        ctx.case_timings[case] = time.time() - t0
        print(f"       {case}: {time.time() - t0:.1f} s", flush=True)


def _compare_model(ctx, case, model_dir, rows, expect, plain_config, exact, threads):
    part = "logprobs"
    rows_path = os.path.join(model_dir, "parity-rows.json")
    with open(rows_path, "w") as f:
        json.dump(rows, f)
    problems = []
    hf32 = hf_logprobs(load_hf(model_dir, torch.float32, problems), rows, torch.float32)
    if problems:
        ctx.result(part, case, "transformers load", "; ".join(problems), "none", False)
    with TrueFloat64():
        hf64_model = load_hf(model_dir, torch.float64)
        inv = [b for n, b in hf64_model.named_buffers() if n.endswith("inv_freq")]
        assert inv and all(b.dtype == torch.float64 for b in inv), "RoPE inv_freq is not float64"
        hf64 = hf_logprobs(hf64_model, rows, torch.float64)
        if plain_config is not None:
            plain_config._attn_implementation = "eager"
            plain = type(hf64_model)(plain_config).to(torch.float64).eval()
            plain.load_state_dict(hf64_model.state_dict())
            effect = max_diff(hf_logprobs(plain, rows, torch.float64), hf64)
    if plain_config is not None:
        ok = effect > 1e-3
        ctx.result(part, case, "feature changes HF lp", effect, "> 1e-3", ok,
                   "" if ok else "the rows do not exercise the feature: the case proves nothing")
    w32, _, err = worker_logprobs(ctx, model_dir, rows_path, "float32", threads=threads)
    if err is not None:
        ok = expect == "refuse-or-match"
        ctx.result(part, case, "f32 max|worker-HF|", "refused", F32_TOL, ok, err[:160])
        return
    d32 = max_diff(w32, hf32)
    ok32 = d32 <= F32_TOL
    if expect == "refuse-or-match" and not ok32:
        note = "ortrain loads the model and computes something else (should refuse or implement)"
    else:
        note = ""
    if not exact:
        note = (note + "; " if note else "") + "float64 not run on presets this large"
    ctx.result(part, case, "f32 max|worker-HF|", d32, F32_TOL, ok32, note)
    if not exact or not ok32 and expect == "refuse-or-match":
        return
    w64, x64, err = worker_logprobs(ctx, model_dir, rows_path, "float64", exact=True, threads=threads)
    if err is not None:
        ctx.result(part, case, "f64 max|worker-HF|", "refused", F64_TOL, False, err[:160])
        return
    # Logprobs() hands back float32 even for a float64 model: the best it
    # can do is the float64 value rounded to nearest, half a float32 ulp
    # away (plus the float64 error, far below).
    ulps = max(float(np.max(np.abs(w - h) / ulp32(h))) for w, h in zip(w64, hf64))
    ctx.result(part, case, "f64 Logprobs() in f32 ulps", ulps, 0.5, ulps <= 0.5 + 1e-6,
               f"max|diff| {max_diff(w64, hf64):.3g} (float32 output)")
    d64 = max_diff(x64, hf64)
    ctx.result(part, case, "f64 max|worker-HF| exact", d64, F64_TOL, d64 <= F64_TOL, "read through the loss")


def part_logprobs(ctx):
    root = os.path.join(ctx.out, "logprobs")
    os.makedirs(root, exist_ok=True)
    # Presets of `ortrain init-model`, as written.
    for name, params in list_presets(ctx):
        case = f"init-model:{name}"
        if not re.search(ctx.args.cases, case):
            continue
        if params > ctx.args.max_preset_params:
            limit = f"<= {ctx.args.max_preset_params / 1e6:.0f}M"
            ctx.result("logprobs", case, "skipped", f"{params / 1e6:.0f}M params", limit, True, "--max-preset-params")
            continue
        d = init_model(ctx, name, os.path.join(root, f"init-{name}"))
        vocab = json.load(open(os.path.join(d, "config.json")))["vocab_size"]
        big = params > 5e6
        rows = make_rows(vocab, 11, lengths=(40,), prompts=(8,)) if big else make_rows(vocab, 11)
        compare_model(ctx, case, d, rows, exact=not big, threads=ctx.big_threads if big else None)
    # Models written by transformers itself.
    for i, (name, cls, kw, expect, sens) in enumerate(hf_cases()):
        if not re.search(ctx.args.cases, name):
            continue
        d = os.path.join(root, name)
        cfg = cls(**kw)
        torch.manual_seed(i)
        model = transformers.AutoModelForCausalLM.from_config(cfg, dtype=torch.float32)
        randomize(model, 100 + i)
        model.save_pretrained(d)
        plain = cls(**{**kw, **sens}) if sens is not None else None
        compare_model(ctx, name, d, make_rows(cfg.vocab_size, 200 + i), expect, plain)
    # Checkpoints in other dtypes: bf16 (computed in float32 by both) and
    # float64 (config dtype float64, which ortrain may refuse).
    for name, dtype, expect in (("qwen3-bf16-weights", torch.bfloat16, "match"),
                                ("llama-float64-weights", torch.float64, "refuse-or-match")):
        if not re.search(ctx.args.cases, name):
            continue
        cls = transformers.Qwen3Config if name.startswith("qwen3") else transformers.LlamaConfig
        cfg = cls(**tiny(head_dim=16))
        model = transformers.AutoModelForCausalLM.from_config(cfg, dtype=torch.float32)
        randomize(model, 98 if dtype == torch.float64 else 99)
        d = os.path.join(root, name)
        model.to(dtype).save_pretrained(d)
        compare_model(ctx, name, d, make_rows(256, 299), expect)


# ---------------------------------------------------------------- checkpoints

RUN_YAML = """\
model: {model}
init_model_preset: tiny
output_dir: {out}
seed: 7
envs:
  - target: builtin:letters
    split: train
chat:
  system_prompt: "Answer the user."
  final_answer_tool: submit
  render_tools: false
grpo:
  num_generations: 8
  per_device_train_batch_size: 16
  gradient_accumulation_steps: 1
  max_completion_length: 12
  max_tool_calling_iterations: 0
  temperature: 1.0
  loss_type: dapo
  beta: 0.0
  learning_rate: 0.05
  lr_scheduler_type: constant
  max_grad_norm: 1.0
  max_steps: 2
  logging_steps: 1
  save_steps: 2
{lora}
rollout:
  max_concurrency: 16
  episode_timeout: 2m
  call_timeout: 30s
worker:
  device: cpu
  dtype: float32
logging:
  log_completions: false
  tensorboard: false
"""

LORA_R, LORA_ALPHA = 4, 8
LORA_YAML = f"""  lora:
    enabled: true
    r: {LORA_R}
    alpha: {LORA_ALPHA}
    dropout: 0.0
    modules_to_save: [embed_tokens, lm_head]"""

# LoraConfig's and PeftConfig's fields (peft 0.17-0.18, src/peft/tuners/lora/
# config.py and src/peft/config.py): a key outside these makes older PEFT
# versions refuse adapter_config.json and newer ones warn.
PEFT_LORA_FIELDS = {
    "base_model_name_or_path", "revision", "peft_type", "task_type", "inference_mode", "auto_mapping", "peft_version",
    "r", "target_modules", "exclude_modules", "lora_alpha", "lora_dropout", "fan_in_fan_out", "bias", "use_rslora",
    "modules_to_save", "init_lora_weights", "layers_to_transform", "layers_pattern", "rank_pattern", "alpha_pattern",
    "megatron_config", "megatron_core", "trainable_token_indices", "loftq_config", "eva_config", "corda_config",
    "use_dora", "use_qalora", "qalora_group_size", "layer_replication", "runtime_config", "lora_bias",
    "target_parameters", "alora_invocation_tokens", "arrow_config", "ensure_weight_tying",
}


def ortrain_run(ctx, name, lora):
    d = os.path.join(ctx.out, "checkpoints")
    os.makedirs(d, exist_ok=True)
    out = os.path.join(d, name)
    cfg = os.path.join(d, name + ".yaml")
    with open(cfg, "w") as f:
        f.write(RUN_YAML.format(model=os.path.join(d, "base-tiny"), out=out, lora=LORA_YAML if lora else ""))
    t0 = time.time()
    # ortrain refuses ORTRAIN_* variables it does not know (this check's own
    # ORTRAIN_HF_* ones among them).
    env = {k: v for k, v in os.environ.items() if not k.startswith("ORTRAIN_HF_")}
    p = ctx.run([ctx.ortrain, "run", "--config", cfg, "--max-steps", "2", "--overwrite"], check=False, env=env)
    ctx.case_timings[f"ortrain run ({name})"] = time.time() - t0
    if p.returncode != 0:
        raise RuntimeError(f"ortrain run {name}: exit {p.returncode}\n{(p.stdout + p.stderr)[-3000:]}")
    ck = os.path.join(out, "checkpoints")
    steps = sorted(s for s in os.listdir(ck) if re.fullmatch(r"step-0*2", s)) if os.path.isdir(ck) else []
    if not steps:
        raise RuntimeError(f"ortrain run {name}: no step-2 checkpoint in {ck}")
    return os.path.join(ck, steps[0]), os.path.join(d, "base-tiny")


def read_safetensors(path):
    from safetensors import safe_open
    with safe_open(path, "pt") as f:
        return {k: f.get_tensor(k) for k in f.keys()}


def part_checkpoints(ctx):
    for name, check in (("full", checkpoint_full), ("lora", checkpoint_lora)):
        try:
            check(ctx)
        except Exception as e:  # noqa: BLE001 - a failed row; the other run still goes
            import traceback
            traceback.print_exc()
            ctx.result("checkpoints", f"{name}: run and check", "ran", "crashed", "runs", False,
                       str(e).splitlines()[0][:200])


def checkpoint_full(ctx):
    """Full fine-tuning: checkpoints/step-2/model/."""
    part = "checkpoints"
    step, base = ortrain_run(ctx, "full", lora=False)
    mdir = os.path.join(step, "model")
    problems = []
    model = load_hf(mdir, torch.float32, problems)
    ctx.result(part, "full: transformers load", "missing/unexpected keys", len(problems), 0, not problems,
               "; ".join(problems))
    try:
        tok = transformers.AutoTokenizer.from_pretrained(mdir)
        ctx.result(part, "full: AutoTokenizer load", "loads", type(tok).__name__, "loads", True)
    except Exception as e:  # noqa: BLE001 - reported
        ctx.result(part, "full: AutoTokenizer load", "loads", "error", "loads", False, str(e)[:160])
    base_w = read_safetensors(os.path.join(base, "model.safetensors"))
    new_w = read_safetensors(os.path.join(mdir, "model.safetensors"))
    moved = max(float((new_w[k] - base_w[k]).abs().max()) for k in base_w if k in new_w)
    ctx.result(part, "full: weights trained", "max|w - base|", moved, "> 0", moved > 0,
               "" if moved > 0 else "2 steps changed nothing: the log-prob check below cannot see a bad save")
    vocab = model.config.vocab_size
    rows = make_rows(vocab, 31)
    rows_path = os.path.join(ctx.out, "checkpoints", "full-rows.json")
    json.dump(rows, open(rows_path, "w"))
    hf = hf_logprobs(model, rows, torch.float32)
    w, _, err = worker_logprobs(ctx, mdir, rows_path, "float32")
    if err:
        ctx.result(part, "full: log-probs", "f32 max|worker-HF|", "refused", F32_TOL, False, err[:160])
    else:
        d = max_diff(w, hf)
        ctx.result(part, "full: log-probs", "f32 max|worker-HF|", d, F32_TOL, d <= F32_TOL)



def checkpoint_lora(ctx):
    """LoRA with modules_to_save: checkpoints/step-2/adapter/."""
    part = "checkpoints"
    step, base = ortrain_run(ctx, "lora", lora=True)
    adir = os.path.join(step, "adapter")
    if os.path.isdir(os.path.join(step, "model")):
        print(f"  note: the LoRA checkpoint also has {step}/model")
    cfg = json.load(open(os.path.join(adir, "adapter_config.json")))
    base_model = load_hf(base, torch.float32)
    tied = bool(base_model.config.tie_word_embeddings)
    targets = ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]
    want = {"peft_type": "LORA", "task_type": "CAUSAL_LM", "r": LORA_R, "lora_alpha": LORA_ALPHA, "bias": "none",
            "use_rslora": False, "use_dora": False, "fan_in_fan_out": False}
    bad = [f"{k}={cfg.get(k)!r} (want {v!r})" for k, v in want.items() if cfg.get(k) != v]
    if sorted(cfg.get("target_modules") or []) != sorted(targets):
        bad.append(f"target_modules={cfg.get('target_modules')}")
    mts = sorted(cfg.get("modules_to_save") or [])
    want_mts = ["embed_tokens", "lm_head"]
    if mts != want_mts:
        bad.append(f"modules_to_save={cfg.get('modules_to_save')} (want {want_mts})")
    unknown = sorted(set(cfg) - PEFT_LORA_FIELDS)
    if unknown:
        bad.append(f"keys PEFT's LoraConfig does not have: {unknown}")
    bm = cfg.get("base_model_name_or_path", "")
    if not os.path.isfile(os.path.join(bm, "config.json")):
        bad.append(f"base_model_name_or_path {bm!r} is not a model directory")
    ctx.result(part, "lora: adapter_config.json", "fields unlike PEFT's", len(bad), 0, not bad, "; ".join(bad))

    # Tensor names and shapes, as PEFT's get_peft_model_state_dict names them.
    tensors = read_safetensors(os.path.join(adir, "adapter_model.safetensors"))
    expected = {}
    for mname, mod in base_model.named_modules():
        leaf = mname.rsplit(".", 1)[-1]
        if isinstance(mod, torch.nn.Linear) and leaf in targets:
            expected[f"base_model.model.{mname}.lora_A.weight"] = (LORA_R, mod.in_features)
            expected[f"base_model.model.{mname}.lora_B.weight"] = (mod.out_features, LORA_R)
    expected["base_model.model.model.embed_tokens.weight"] = tuple(base_model.model.embed_tokens.weight.shape)
    expected["base_model.model.lm_head.weight"] = tuple(base_model.lm_head.weight.shape)
    got = {k: tuple(v.shape) for k, v in tensors.items()}
    missing = sorted(set(expected) - set(got))
    extra = sorted(set(got) - set(expected))
    wrong = sorted(k for k in set(expected) & set(got) if expected[k] != got[k])
    nonf32 = sorted(k for k, v in tensors.items() if v.dtype != torch.float32)
    msgs = []
    if missing:
        msgs.append(f"missing {missing[:4]}")
    if extra:
        msgs.append(f"unexpected {extra[:4]}")
    if wrong:
        msgs.append("shapes " + ", ".join(f"{k} {got[k]} want {expected[k]}" for k in wrong[:4]))
    if nonf32:
        msgs.append(f"not F32: {nonf32[:4]}")
    n_bad = len(missing) + len(extra) + len(wrong) + len(nonf32)
    ctx.result(part, "lora: adapter tensors", "names/shapes unlike PEFT", n_bad, 0, not msgs,
               f"{len(got)} tensors; " + "; ".join(msgs))
    lora_b = max((float(v.abs().max()) for k, v in tensors.items() if ".lora_B." in k), default=0.0)
    emb_key = "base_model.model.model.embed_tokens.weight"
    emb_moved = float((tensors[emb_key] - base_model.model.embed_tokens.weight.detach()).abs().max()) \
        if emb_key in tensors else 0.0
    ctx.result(part, "lora: adapter trained", "max|lora_B|", lora_b, "> 0", lora_b > 0,
               f"modules_to_save moved by {emb_moved:.3g}")
    if tied and "base_model.model.lm_head.weight" in tensors and "base_model.model.model.embed_tokens.weight" in tensors:
        same = torch.equal(tensors["base_model.model.lm_head.weight"], tensors["base_model.model.model.embed_tokens.weight"])
        ctx.result(part, "lora: tied lm_head == embed_tokens", "equal", same, True, same)

    # Merge by hand, as PEFT's merge_and_unload: W += (alpha / r) B A, and
    # modules_to_save replace their modules (each its own copy, untied).
    merged = load_hf(base, torch.float32)
    scale = cfg["lora_alpha"] / cfg["r"]
    mods = dict(merged.named_modules())
    with torch.no_grad():
        for k, a in tensors.items():
            if ".lora_A.weight" not in k:
                continue
            mname = k[len("base_model.model."):-len(".lora_A.weight")]
            b = tensors[k.replace(".lora_A.", ".lora_B.")]
            mods[mname].weight += scale * (b @ a)
        if emb_key in tensors:
            merged.model.embed_tokens.weight = torch.nn.Parameter(tensors[emb_key].clone())
        if "base_model.model.lm_head.weight" in tensors:
            merged.lm_head.weight = torch.nn.Parameter(tensors["base_model.model.lm_head.weight"].clone())
    rows = make_rows(merged.config.vocab_size, 41)
    rows_path = os.path.join(ctx.out, "checkpoints", "lora-rows.json")
    json.dump(rows, open(rows_path, "w"))
    hf = hf_logprobs(merged, rows, torch.float32)
    hf_base = hf_logprobs(base_model, rows, torch.float32)
    w, _, err = worker_logprobs(ctx, None, rows_path, "float32", adapter=adir)
    if err:
        ctx.result(part, "lora: log-probs (merged)", "f32 max|worker-HF|", "refused", F32_TOL, False, err[:160])
    else:
        d = max_diff(w, hf)
        ctx.result(part, "lora: log-probs (merged)", "f32 max|worker-HF|", d, F32_TOL, d <= F32_TOL,
                   f"adapter moves HF lp by {max_diff(hf, hf_base):.3g}")


# ---------------------------------------------------------------- tokenizers

SENTENCES = [
    "The quick brown fox jumps over the lazy dog. It's 3:45pm; we'll re-run the tests — don't panic!",
    "Où est la bibliothèque ? Ça coûte 12,50 € — déjà vu, naïve façade, cœur, Æsop.",
    "Größere Straßen führen über Brücken; Äpfel, Öl und Übermut. ẞ",
    "¿Dónde está el niño? ¡Mañana comeremos jalapeños en Peñíscola!",
    "Tiếng Việt có nhiều dấu: người, được, những, Hà Nội, Đà Nẵng.",
    "Zażółć gęślą jaźń. Příliš žluťoučký kůň úpěl ďábelské ódy. Þórður.",
    "Съешь же ещё этих мягких французских булок, да выпей чаю. Ёлка, йод.",
    "Ξεσκεπάζω την ψυχοφθόρα βδελυγμία. Άλφα, Ώρα, ΐ, ς.",
    "نص حكيم له سر قاطع وذو شأن عظيم مكتوب على ثوب أخضر ومغلف بجلد أزرق. ١٢٣٤٥",
    "דג סקרן שט בים מאוכזב ולפתע מצא חברה. שָׁלוֹם",
    "ऋषियों को सताने वाले दुष्ट राक्षसों के राजा रावण का सर्वनाश करने वाले। १२३",
    "আমি বাংলায় গান গাই। தமிழ் மொழி. తెలుగు భాష.",
    "เป็นมนุษย์สุดประเสริฐเลิศคุณค่า กว่าบรรดาฝูงสัตว์เดรัจฉาน ๑๒๓",
    "我能吞下玻璃而不伤身体。中华人民共和国成立于1949年。「引号」，标点！",
    "いろはにほへと ちりぬるを。カタカナとひらがな、漢字を混ぜる。ｶﾀｶﾅ半角　全角スペース",
    "다람쥐 헌 쳇바퀴에 타고파. 한국어 문장입니다, 괜찮아요?",
    "ქართული ენა. Հայերեն լեզու։ ሰላም ለዓለም. ᠮᠣᠩᠭᠣᠯ",
    "∀x∈ℝ: x² ≥ 0; ∑ᵢ aᵢ ≤ ∞; ½ ⅓ ¼; ①②③; ℌ𝔢𝔩𝔩𝔬 𝐁𝐨𝐥𝐝; ﬁ ﬂ; Ⅻ; ㎏ ㎞",
]
EMOJI = ["👍🏽", "👨‍👩‍👧‍👦", "🇫🇷🇯🇵", "❤️‍🔥", "🧑🏿‍💻", "☕️", "🫠", "😀😃😄", "🏳️‍🌈", "✅", "🔥🔥🔥", "🤖", "🇺🇳"]
CODE = [
    "def fib(n):\n    if n < 2:\n        return n\n    return fib(n - 1) + fib(n - 2)\n\nprint([fib(i) for i in range(10)])\n",
    "func main() {\n\tctx := context.Background()\n\tif err := run(ctx); err != nil {\n\t\tlog.Fatal(err)\n\t}\n}\n",
    '{"name": "ortrain", "version": "0.1.0", "deps": {"torch": ">=2.1"}, "n": [1, 2.5e-3, -7], "ok": true}',
    "<html>\n  <body class=\"main\">\n    <p>Hello&nbsp;&amp; goodbye</p>\n  </body>\n</html>\n",
    "#!/usr/bin/env bash\nset -euo pipefail\nfor f in *.txt; do wc -l \"$f\" | awk '{print $1}'; done\r\n",
    "SELECT id, COUNT(*) AS n FROM users WHERE created_at >= '2024-01-01' GROUP BY id HAVING n > 10;",
    "#include <stdio.h>\nint main(void) {\n\tprintf(\"%d\\n\", 42);\t// answer\n\treturn 0;\n}\n",
    "fn main() { let v: Vec<u8> = (0..=255).collect(); println!(\"{:?}\", &v[..4]); }",
    "    x = [i**2 for i in range(100)]  # squares\n        \n\t\tmixed\t indent\n",
]
SPECIALS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>", "<tool_call>", "</tool_call>", "<think>", "</think>",
            "<s>", "</s>", "<unk>", "<|user|>", "<|assistant|>", "<|end|>", "<pad>", "<mask>"]
SPACES = [" ", "  ", "   ", "\t", "\n", "\n\n", "\n\n\n", "\r\n", " \n", "\n ", "\u00a0", "\u2003", "\u3000", "\u200b",
          "\u2028", "\u202f", "\ufeff", " \t \n", "        ", "\u0085", "\x0b", "\x0c"]
# Non-NFC text: decomposed accents, singletons NFC maps elsewhere (Angstrom
# sign, Ohm sign, CJK compatibility ideographs), combining marks out of
# canonical order, decomposed Hangul.
NON_NFC = ["cafe\u0301", "A\u030angstro\u0308m", "\u212b", "\u2126", "\uf900\uf901", "q\u0307\u0323", "a\u0301\u0300",
           "\u1100\u1161\u11a8", "\u1112\u1161\u11ab\u1100\u1173\u11af", "e\u0304\u0301", "\u0041\u0308\u0304",
           "\u00e9\u0301", "\u1e9b\u0323", "\u0958", "\u2000", "\u0344", "\u0f73"]
BLOCKS = [(0x00A1, 0x00FF), (0x0100, 0x017F), (0x0180, 0x024F), (0x0370, 0x03FF), (0x0400, 0x04FF),
          (0x0590, 0x05FF), (0x0600, 0x06FF), (0x0900, 0x097F), (0x0E00, 0x0E7F), (0x3040, 0x30FF),
          (0x4E00, 0x9FA5), (0xAC00, 0xD7A3), (0x1F300, 0x1F5FF), (0x2000, 0x206F), (0x2100, 0x214F),
          (0x0300, 0x036F), (0xFF00, 0xFFEF), (0x1D400, 0x1D4FF)]


def make_corpus(n_bytes, seed=2024):
    """Deterministic mixed text: several scripts, code, emoji, odd whitespace,
    digits, special-token strings and non-NFC forms."""
    rng = random.Random(seed)

    def rand_run():
        lo, hi = rng.choice(BLOCKS)
        out = []
        while len(out) < rng.randint(1, 24):
            c = chr(rng.randint(lo, hi))
            if unicodedata.category(c) not in ("Cn", "Cs", "Co"):
                out.append(c)
        return "".join(out)

    def number():
        k = rng.randint(0, 6)
        if k == 0:
            return str(rng.randint(0, 10 ** rng.randint(1, 25)))
        if k == 1:
            return f"{rng.uniform(-1e6, 1e6):.{rng.randint(0, 8)}f}"
        if k == 2:
            return f"{rng.randint(0, 10 ** 9):,}"
        if k == 3:
            return f"0x{rng.getrandbits(48):x}"
        if k == 4:
            return f"{rng.randint(1900, 2100)}-{rng.randint(1, 12):02d}-{rng.randint(1, 28):02d}T12:{rng.randint(0, 59):02d}Z"
        if k == 5:
            return "+1 (555) " + str(rng.randint(100, 999)) + "-" + str(rng.randint(1000, 9999))
        return "".join(rng.choice("0123456789") for _ in range(rng.randint(1, 60)))

    def piece():
        k = rng.random()
        if k < 0.30:
            s = rng.choice(SENTENCES)
            t = rng.random()
            if t < 0.25:
                s = unicodedata.normalize("NFD", s)
            elif t < 0.32:
                s = unicodedata.normalize("NFKD", s)
            elif t < 0.40:
                s = s.upper()
            elif t < 0.50:
                words = s.split(" ")
                s = " ".join(rng.sample(words, len(words)))
            return s
        if k < 0.42:
            return rng.choice(CODE)
        if k < 0.52:
            return number()
        if k < 0.62:
            return "".join(rng.choice(EMOJI) for _ in range(rng.randint(1, 4)))
        if k < 0.72:
            return rand_run()
        if k < 0.82:
            return rng.choice(NON_NFC) + rng.choice(["", " ", "s", "\u0301"])
        if k < 0.86:
            return rng.choice(SPECIALS)
        if k < 0.92:
            return rng.choice(SPACES) * rng.randint(1, 5)
        t = rng.randint(0, 3)  # stress runs
        if t == 0:
            return "a" * rng.randint(50, 400)
        if t == 1:
            return " " * rng.randint(10, 200) + "x"
        if t == 2:
            return "1234567890" * rng.randint(3, 30)
        return "=-" * rng.randint(10, 100)

    docs, total = [], 0
    while total < n_bytes:
        parts = []
        for _ in range(rng.randint(3, 60)):
            parts.append(piece())
            parts.append(rng.choice(["", " ", " ", "\n", "", ". "]))
        doc = "".join(parts)
        if len(docs) % 2 == 0:  # half the documents in NFC, so a difference on non-NFC text stands out
            doc = unicodedata.normalize("NFC", doc)
        docs.append(doc)
        total += len(doc.encode("utf-8"))
    return docs


# The upstream tokenizer_config.json of openai-community/gpt2 (the fixture
# has only vocab.json and merges.txt, which name no tokenizer class).
GPT2_TOKENIZER_CONFIG = {
    "add_prefix_space": False,
    "added_tokens_decoder": {"50256": {"content": "<|endoftext|>", "lstrip": False, "normalized": True, "rstrip": False,
                                       "single_word": False, "special": True}},
    "bos_token": "<|endoftext|>", "clean_up_tokenization_spaces": False, "eos_token": "<|endoftext|>",
    "model_max_length": 1024, "tokenizer_class": "GPT2Tokenizer", "unk_token": "<|endoftext|>",
}


def tokenizer_dirs(ctx):
    """(name, directory both sides load, note). Fixture directories are
    copied (qwen3's tokenizer.json.gz decompressed, gpt2 given its upstream
    tokenizer_config.json) so that Go and transformers read the same files."""
    src = os.path.join(ctx.repo, "testdata", "tokenizers")
    dst = os.path.join(ctx.out, "tokenizers", "models")
    out = []
    for name in sorted(os.listdir(src)):
        s = os.path.join(src, name)
        files = set(os.listdir(s)) if os.path.isdir(s) else set()
        if not (files & {"tokenizer.json", "tokenizer.json.gz", "vocab.json"}):
            continue
        d = os.path.join(dst, name)
        shutil.rmtree(d, ignore_errors=True)
        os.makedirs(d)
        note = ""
        for f in files:
            if f == "tokenizer.json.gz":
                with gzip.open(os.path.join(s, f)) as g, open(os.path.join(d, "tokenizer.json"), "wb") as o:
                    o.write(g.read())
                note = "tokenizer.json.gz decompressed"
            else:
                shutil.copy(os.path.join(s, f), d)
        if name == "gpt2" and "tokenizer_config.json" not in files:
            json.dump(GPT2_TOKENIZER_CONFIG, open(os.path.join(d, "tokenizer_config.json"), "w"), indent=2)
            note = "upstream tokenizer_config.json added"
        out.append((name, d, note))
    d = init_model(ctx, "tiny", os.path.join(dst, "init-model-tiny"))
    out.append(("init-model-tiny", d, "written by ortrain init-model"))
    return out


def part_tokenizers(ctx):
    import tokenizers
    root = os.path.join(ctx.out, "tokenizers")
    os.makedirs(root, exist_ok=True)
    docs = make_corpus(int(ctx.args.corpus_mb * 1e6))
    nbytes = sum(len(d.encode()) for d in docs)
    nfc = sum(1 for d in docs if unicodedata.normalize("NFC", d) != d)
    print(f"  corpus: {len(docs)} documents, {nbytes / 1e6:.2f} MB, {nfc} not in NFC")
    json.dump(docs, open(os.path.join(root, "corpus.json"), "w"), ensure_ascii=False)
    entries = []
    for name, d, note in tokenizer_dirs(ctx):
        t0 = time.time()
        at = transformers.AutoTokenizer.from_pretrained(d)
        hf = at(docs, add_special_tokens=False)["input_ids"]
        if os.path.exists(os.path.join(d, "tokenizer.json")):
            tk = tokenizers.Tokenizer.from_file(os.path.join(d, "tokenizer.json"))
            tk_src = "tokenizers.Tokenizer.from_file(tokenizer.json)"
        else:
            tk = at.backend_tokenizer
            tk_src = "transformers' backend_tokenizer (no tokenizer.json)"
        tk.no_truncation()
        tk.no_padding()
        tkids = [e.ids for e in tk.encode_batch(docs, add_special_tokens=False)]
        diff = {str(i): ids for i, ids in enumerate(tkids) if ids != hf[i]}
        ref = {"name": name, "dir": d, "note": note, "transformers_class": type(at).__name__,
               "tokenizers_source": tk_src, "transformers": hf, "tokenizers_differs": diff}
        path = os.path.join(root, name + ".json")
        json.dump(ref, open(path, "w"))
        ntok = sum(map(len, hf))
        print(f"  {name}: {type(at).__name__}, {ntok} tokens; tokenizers != transformers on {len(diff)} documents "
              f"({time.time() - t0:.1f} s)")
        entries.append({"name": name, "file": os.path.relpath(path, ctx.out), "dir": d,
                        "tokenizers_vs_transformers_docs": len(diff), "tokens": ntok})
        ctx.result("tokenizers", name, "tokenizers!=transformers", len(diff), "info", True,
                   "documents where the two Hugging Face libraries disagree (not ortrain)")
    return {"corpus": "tokenizers/corpus.json", "documents": len(docs), "bytes": nbytes, "non_nfc": nfc,
            "fixtures": entries}


# ---------------------------------------------------------------- templates

FROZEN_NOW = datetime.datetime(2025, 7, 26, 12, 0, 0)

WEATHER = {"name": "get_weather", "description": "Current weather for a city <fast> & \"free\"",
           "parameters": {"type": "object", "properties": {
               "city": {"type": "string", "description": "City name, e.g. Zürich"},
               "days": {"type": "integer", "minimum": 1, "maximum": 7},
               "units": {"type": "string", "enum": ["metric", "imperial"]}},
               "required": ["city"]}}
TIME = {"name": "get_time", "description": "Local time in a time zone",
        "parameters": {"type": "object", "properties": {
            "tz": {"type": "string"},
            "format": {"type": "object", "properties": {"seconds": {"type": "boolean"}}},
            "fields": {"type": "array", "items": {"type": "string"}}},
            "required": ["tz"]}}
TOOLS = [WEATHER, TIME]


def call(cid, name, args):
    return {"id": cid, "name": name, "arguments": args}


# Conversations in ortrain's terms (chat.Message): content null is
# NullContent; arguments are JSON values (a JSON string stays a string).
CONVERSATIONS = {
    "tool_roundtrip": [
        {"role": "system", "content": "You are a careful assistant. Use tools when needed."},
        {"role": "user", "content": "What's the weather in Paris for 2 days?"},
        {"role": "assistant", "content": "", "tool_calls": [call("call00001", "get_weather", {"city": "Paris", "days": 2})]},
        {"role": "tool", "name": "get_weather", "tool_call_id": "call00001", "content": "{\"temp_c\": 21, \"sky\": \"clear\"}"},
        {"role": "assistant", "content": "It is 21 °C and clear in Paris."},
        {"role": "user", "content": "And tomorrow in Zürich? 明天呢？"},
    ],
    "parallel_null_content": [
        {"role": "system", "content": "Be terse."},
        {"role": "user", "content": "Weather and time in Rome?"},
        {"role": "assistant", "content": None, "tool_calls": [
            call("call00001", "get_weather", {"city": "Rome", "units": "metric"}),
            call("call00002", "get_time", {"tz": "Europe/Rome", "format": {"seconds": True}, "fields": ["h", "m"]})]},
        {"role": "tool", "name": "get_weather", "tool_call_id": "call00001", "content": "25 C, sunny"},
        {"role": "tool", "name": "get_time", "tool_call_id": "call00002", "content": "14:03:07"},
        {"role": "assistant", "content": "Sunny, 25 °C; it is 14:03."},
    ],
    "two_tool_turns_no_system": [
        {"role": "user", "content": "Check Oslo, then Bergen."},
        {"role": "assistant", "content": "Let me check Oslo first.", "tool_calls": [call("call00001", "get_weather", {"city": "Oslo"})]},
        {"role": "tool", "name": "get_weather", "tool_call_id": "call00001", "content": "cold"},
        {"role": "assistant", "content": "Now Bergen.", "tool_calls": [call("call00002", "get_weather", {"city": "Bergen", "days": 1})]},
        {"role": "tool", "name": "get_weather", "tool_call_id": "call00002", "content": "rain\n  and wind\t"},
        {"role": "assistant", "content": "Oslo is cold; Bergen has rain and wind."},
    ],
    "string_arguments": [
        {"role": "system", "content": "Tools return JSON."},
        {"role": "user", "content": "Time in Tokyo?"},
        {"role": "assistant", "content": "", "tool_calls": [call("call00001", "get_time", "{\"tz\": \"Asia/Tokyo\"}")]},
        {"role": "tool", "name": "get_time", "tool_call_id": "call00001", "content": "{\"time\": \"09:00\"}"},
        {"role": "assistant", "content": "It is 09:00 in Tokyo."},
        {"role": "user", "content": "Thanks!"},
    ],
    "plain_multi_turn": [
        {"role": "user", "content": "Hi! ¿Qué tal?"},
        {"role": "assistant", "content": "Bien, ¿y tú?"},
        {"role": "user", "content": "Fine.\n\n  Thanks\t"},
    ],
    "content_blocks": [
        {"role": "user", "content": [{"type": "text", "text": "Describe"}, {"type": "text", "text": " this."}]},
        {"role": "assistant", "content": "It is a test."},
        {"role": "user", "content": "And again?"},
    ],
    "reasoning": [
        {"role": "system", "content": "Think step by step."},
        {"role": "user", "content": "Is it warm in Lisbon?"},
        {"role": "assistant", "content": "", "reasoning_content": "I should call the weather tool.\n",
         "tool_calls": [call("call00001", "get_weather", {"city": "Lisbon"})]},
        {"role": "tool", "name": "get_weather", "tool_call_id": "call00001", "content": "24 C"},
        {"role": "assistant", "content": "Yes, 24 °C.", "reasoning_content": "24 C is warm."},
    ],
}

# Special-token strings each template is rendered with (as its model's
# tokenizer would pass them); default bos <s>, eos </s>.
SPECIAL_BY_TEMPLATE = {
    "qwen": {"eos_token": "<|im_end|>", "pad_token": "<|endoftext|>"},
    "Llama-3": {"bos_token": "<|begin_of_text|>", "eos_token": "<|eot_id|>"},
    "Hermes-3": {"bos_token": "<|begin_of_text|>", "eos_token": "<|im_end|>"},
    "DeepSeek": {"bos_token": "<｜begin▁of▁sentence｜>", "eos_token": "<｜end▁of▁sentence｜>"},
    "gemma": {"bos_token": "<bos>", "eos_token": "<eos>", "pad_token": "<pad>"},
    "Phi-3.5": {"bos_token": "<s>", "eos_token": "<|endoftext|>", "unk_token": "<unk>"},
    "glm": {"eos_token": "<|endoftext|>"},
    "MiniMax": {"bos_token": "]~!b[", "eos_token": "[e~["},
}


def hf_message(m):
    """The dict chat.Template.Render builds from a chat.Message."""
    d = {"role": m["role"], "content": m.get("content")}
    if m.get("reasoning_content"):
        d["reasoning_content"] = m["reasoning_content"]
    if m.get("tool_calls"):
        d["tool_calls"] = [dict(**({"id": c["id"]} if c.get("id") else {}), type="function",
                                function={"name": c["name"], "arguments": c["arguments"]}) for c in m["tool_calls"]]
    if m.get("name"):
        d["name"] = m["name"]
    if m.get("tool_call_id"):
        d["tool_call_id"] = m["tool_call_id"]
    return d


def hf_tool(t):
    return {"type": "function", "function": {"name": t["name"], "description": t["description"],
                                             "parameters": t["parameters"]}}


class _FrozenDatetime(datetime.datetime):
    @classmethod
    def now(cls, tz=None):
        return FROZEN_NOW


def template_tokenizer(special):
    import tokenizers
    from tokenizers import models
    tk = tokenizers.Tokenizer(models.WordLevel({"[UNK]": 0}, unk_token="[UNK]"))
    return transformers.PreTrainedTokenizerFast(tokenizer_object=tk, **special)


def part_templates(ctx):
    from transformers.utils import chat_template_utils
    chat_template_utils.datetime = _FrozenDatetime  # strftime_now
    root = os.path.join(ctx.out, "templates")
    os.makedirs(root, exist_ok=True)
    tdir = os.path.join(ctx.repo, "testdata", "chat-templates")
    sources = []
    for dirpath, _, files in sorted(os.walk(tdir)):
        for f in sorted(files):
            if f.endswith(".jinja"):
                sources.append(os.path.join(dirpath, f))
    init_dir = init_model(ctx, "tiny", os.path.join(ctx.out, "tokenizers", "models", "init-model-tiny"))
    variants = []
    for conv in CONVERSATIONS:
        for agp in (True, False):
            kw = {"enable_thinking": False} if conv == "reasoning" else {}
            variants.append((conv, agp, conv not in ("plain_multi_turn", "content_blocks"), kw))
    variants.append(("tool_roundtrip", True, False, {}))
    variants.append(("reasoning", True, True, {"enable_thinking": True}))
    cases = []
    n_err = 0
    for src in sources + [init_dir]:
        if src == init_dir:
            tok = transformers.AutoTokenizer.from_pretrained(init_dir)
            label, template = "init-model-tiny", None
            special = {k: v for k, v in tok.special_tokens_map.items() if isinstance(v, str)}
        else:
            label = os.path.relpath(src, tdir)
            special = {"bos_token": "<s>", "eos_token": "</s>"}
            for key, sp in SPECIAL_BY_TEMPLATE.items():
                if key.lower() in label.lower():
                    special = sp
                    break
            tok = template_tokenizer(special)
            template = open(src, encoding="utf-8").read()
        for conv, agp, with_tools, kw in variants:
            msgs = CONVERSATIONS[conv]
            case = {"id": f"{label}/{conv}/agp={str(agp).lower()}/tools={str(with_tools).lower()}"
                          + ("".join(f"/{k}={v}" for k, v in kw.items())),
                    "template_file": src if template is not None else None,
                    "model_dir": init_dir if template is None else None,
                    "special": {k: v for k, v in special.items() if k in ("bos_token", "eos_token", "pad_token", "unk_token")},
                    "now": FROZEN_NOW.isoformat() + "Z", "messages": msgs, "tools": TOOLS if with_tools else [],
                    "add_generation_prompt": agp, "kwargs": kw}
            try:
                case["expected"] = tok.apply_chat_template(
                    [hf_message(m) for m in msgs], tools=[hf_tool(t) for t in TOOLS] if with_tools else None,
                    add_generation_prompt=agp, tokenize=False, chat_template=template, **kw)
            except Exception as e:  # noqa: BLE001 - the template raised: ortrain must too
                case["error"] = f"{type(e).__name__}: {e}"
                n_err += 1
            cases.append(case)
    json.dump({"transformers": transformers.__version__, "cases": cases}, open(os.path.join(root, "cases.json"), "w"),
              ensure_ascii=False, indent=1)
    print(f"  {len(cases)} renderings of {len(sources) + 1} templates ({n_err} raise in transformers)")
    return {"cases": "templates/cases.json", "count": len(cases), "errors": n_err}


# ---------------------------------------------------------------- main

def cmd_reference(args):
    ctx = Ctx(args)
    os.makedirs(ctx.out, exist_ok=True)
    parts = [p for p in args.parts.split(",") if p]
    manifest_path = os.path.join(ctx.out, "manifest.json")
    manifest = {"transformers": transformers.__version__, "torch": torch.__version__, "parts": {}}
    try:
        import tokenizers
        manifest["tokenizers"] = tokenizers.__version__
    except ImportError:
        pass
    failed_parts = []
    for part in parts:
        print(f"== {part}", flush=True)
        t0 = time.time()
        try:
            info = {"logprobs": part_logprobs, "checkpoints": part_checkpoints, "tokenizers": part_tokenizers,
                    "templates": part_templates}[part](ctx)
            if part in ("tokenizers", "templates"):
                manifest["parts"][part] = info
        except Exception as e:  # noqa: BLE001 - reported as a failed row
            import traceback
            traceback.print_exc()
            ctx.result(part, f"{part} (whole part)", "ran", "crashed", "runs", False, str(e).splitlines()[0][:200])
            failed_parts.append(part)
        ctx.timings[part] = time.time() - t0
        print(f"   {part}: {ctx.timings[part]:.1f} s", flush=True)
    json.dump(manifest, open(manifest_path, "w"), indent=1)
    json.dump({"results": ctx.results, "timings": ctx.timings, "case_timings": ctx.case_timings},
              open(os.path.join(ctx.out, "py-results.json"), "w"), indent=1)
    return 1 if failed_parts else 0


def cmd_summary(args):
    out = os.path.abspath(args.out)
    rows, timings = [], {}
    missing = []
    go_rows = 0
    for name in ("py-results.json", "go-results.json"):
        p = os.path.join(out, name)
        if not os.path.exists(p):
            missing.append(name)
            continue
        d = json.load(open(p))
        rows += d.get("results", [])
        if name == "go-results.json":
            go_rows = sum(1 for r in d.get("results", []) if not r["ok"])
        timings.update(d.get("timings", {}))
    xfail = re.compile(args.xfail) if args.xfail else None
    print()
    print("== summary: ortrain vs Hugging Face (transformers %s)" % transformers.__version__)
    w = max([len(r["case"]) for r in rows] + [10])
    m = max([len(r["metric"]) for r in rows] + [10])
    print(f"{'part':<12} {'case':<{w}} {'metric':<{m}} {'value':>12} {'threshold':>10}  result  note")
    fails = xfails = xpasses = 0
    for r in rows:
        note = r.get("note") or ""
        known = xfail is not None and xfail.search(r["case"])
        if r["ok"]:
            result = "pass"
        elif known:
            result, xfails = "xfail", xfails + 1
        else:
            result, fails = "FAIL", fails + 1
        print(f"{r['part']:<12} {r['case']:<{w}} {r['metric']:<{m}} {fmt_num(r['value']):>12} "
              f"{fmt_num(r['threshold']):>10}  {result:<6}  {note[:200]}")
    if xfail is not None:  # a known failure that passes now: take it off the list
        cases = {r["case"] for r in rows if xfail.search(r["case"])}
        for c in sorted(cases):
            if all(r["ok"] for r in rows if r["case"] == c):
                print(f"XPASS: {c} passes now; drop it from --xfail")
                xpasses += 1
    if timings:
        print("times: " + ", ".join(f"{k} {v:.0f} s" for k, v in timings.items()))
    for name in missing:
        print(f"FAIL: {name} is missing (a step crashed)")
    crashed = args.go_exit != 0 and go_rows == 0 and "go-results.json" not in missing
    if crashed:
        print(f"FAIL: the Go tests exited {args.go_exit} with no failed row (see go-test.log)")
    passed = sum(1 for r in rows if r["ok"])
    nfail = fails + len(missing) + xpasses + int(crashed)
    print(f"{passed} passed, {nfail} failed" + (f", {xfails} skipped" if xfails else ""))
    return 1 if nfail else 0


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = ap.add_subparsers(dest="cmd", required=True)
    r = sub.add_parser("reference")
    r.add_argument("--out", required=True)
    r.add_argument("--repo", default=os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", ".."))
    r.add_argument("--ortrain", required=True)
    r.add_argument("--benchworker", required=True)
    r.add_argument("--wlogprobs", required=True)
    r.add_argument("--parts", default=",".join(ALL_PARTS))
    r.add_argument("--threads", type=int, default=1,
                   help="torch and worker threads for the tiny models (more only contend on tensors this small)")
    r.add_argument("--big-threads", type=int, default=os.cpu_count() or 1,
                   help="threads for the larger init-model presets")
    r.add_argument("--corpus-mb", type=float, default=2.0)
    r.add_argument("--cases", default="", help="logprobs: only the cases whose name this regex finds")
    r.add_argument("--max-preset-params", type=float, default=150e6,
                   help="init-model presets larger than this are skipped")
    s = sub.add_parser("summary")
    s.add_argument("--out", required=True)
    s.add_argument("--xfail", default="", help="known failures: rows of the cases this regex finds do not fail the "
                                               "check (shown as xfail); such a case that passes fails it (XPASS)")
    s.add_argument("--go-exit", type=int, default=0, help="the Go tests' exit status")
    args = ap.parse_args()
    torch.set_num_threads(getattr(args, "threads", None) or os.cpu_count() or 1)
    sys.exit(cmd_reference(args) if args.cmd == "reference" else cmd_summary(args))


if __name__ == "__main__":
    main()
