#!/usr/bin/env python3
"""LibTorch old/new, side by side: the same benchmarks from two build trees
(e.g. Debian's LibTorch 1.13 build of an older commit and the torch 2.11
wheel build of this one), run alternately in the same script, reported as
new/old ratios (median over rounds, with the range).

    tests/bench/libtorch_compare.py --old OLD_BIN_DIR --new NEW_BIN_DIR \
        [--rounds 3] [--threads 1]

Workloads (all on the built-in tiny model, one LibTorch thread by default):
  - model_bench: prefill and decode tok/s, fp32 and bf16, batch 1 and 8;
  - engine_bench: continuous batching with inflight updates, tokens/s of its
    four modes;
  - tandem-sft: optimizer steps per second of the supervised warm start
    (packed forward, backward, AdamW: the trainer's step on this model).
Each round runs old then new, or new then old (alternating), so drifting
load hits both alike. Higher is better for every figure.
"""

import argparse
import os
import re
import statistics
import subprocess
import sys
import tempfile


def run(command):
    r = subprocess.run(command, capture_output=True, text=True, timeout=1800)
    if r.returncode != 0:
        sys.exit(f"{' '.join(command)} failed ({r.returncode}):\n"
                 f"{r.stdout[-2000:]}{r.stderr[-2000:]}")
    return r.stdout + r.stderr


def model_bench(bin_dir, threads):
    out = run([os.path.join(bin_dir, "model_bench"), "--model", "tiny",
               "--dtype", "all", "--batches", "1,8", "--prompt", "64",
               "--steps", "32", "--threads", str(threads), "--repeat", "3"])
    figures = {}
    pattern = (r"^tiny\s+(\w+) batch\s+(\d+) .*prefill\s+([\d.]+) tok/s"
               r" \| decode\s+([\d.]+) tok/s")
    for m in re.finditer(pattern, out, re.M):
        dtype, batch = m.group(1), int(m.group(2))
        figures[f"model_bench {dtype} b{batch} prefill tok/s"] = \
            float(m.group(3))
        figures[f"model_bench {dtype} b{batch} decode tok/s"] = \
            float(m.group(4))
    if not figures:
        sys.exit(f"model_bench printed no figures:\n{out}")
    return figures


def engine_bench(bin_dir, threads):
    out = run([os.path.join(bin_dir, "engine_bench"), "--threads",
               str(threads), "--repeat", "1"])
    figures = {}
    for m in re.finditer(r"^(\([a-d]\) [^\d]+?)\s+([\d.]+)\s+\d+\s", out,
                         re.M):
        figures[f"engine_bench {m.group(1).strip()} tok/s"] = \
            float(m.group(2))
    if len(figures) != 4:
        sys.exit(f"engine_bench printed {len(figures)} of 4 modes:\n{out}")
    return figures


def sft_steps(bin_dir, threads, steps=60):
    with tempfile.TemporaryDirectory(prefix="tandem-libtorch-cmp-") as tmp:
        run([os.path.join(bin_dir, "tandem-sft"), "--output", tmp,
             "--steps", str(steps), "--eval-every", str(10 * steps),
             "--eval-problems", "8", "--threads", str(threads),
             "--target-accuracy", "1", "--max-accuracy", "1"])
        with open(os.path.join(tmp, "sft_curve.csv")) as f:
            rows = [line.split(",") for line in f.read().split()[1:]]
    first, last = rows[0], rows[-1]
    seconds = float(last[3]) - float(first[3])
    return {"tandem-sft steps/s": (int(last[0]) - int(first[0])) / seconds}


def measure(bin_dir, threads):
    figures = {}
    figures.update(model_bench(bin_dir, threads))
    figures.update(engine_bench(bin_dir, threads))
    figures.update(sft_steps(bin_dir, threads))
    return figures


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--old", required=True, help="old build's bin/")
    parser.add_argument("--new", required=True, help="new build's bin/")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--threads", type=int, default=1)
    args = parser.parse_args()
    for d in (args.old, args.new):
        for b in ("model_bench", "engine_bench", "tandem-sft"):
            if not os.access(os.path.join(d, b), os.X_OK):
                sys.exit(f"{d}/{b} is missing: build it in that tree first")
    ratios = {}
    values = {"old": {}, "new": {}}
    for r in range(args.rounds):
        order = ["old", "new"] if r % 2 == 0 else ["new", "old"]
        got = {}
        for which in order:
            got[which] = measure(getattr(args, which), args.threads)
            for k, v in got[which].items():
                values[which].setdefault(k, []).append(v)
        for k in got["old"]:
            if k in got["new"] and got["old"][k] > 0:
                ratios.setdefault(k, []).append(got["new"][k] / got["old"][k])
        print(f"round {r + 1}/{args.rounds} done ({' then '.join(order)})",
              file=sys.stderr, flush=True)
    print(f"| figure (higher is better; {args.rounds} rounds, "
          f"{args.threads} thread) | old (median) | new (median) | "
          "new/old median [min, max] |")
    print("| --- | --- | --- | --- |")
    for k, v in ratios.items():
        print(f"| {k} | {statistics.median(values['old'][k]):.1f} | "
              f"{statistics.median(values['new'][k]):.1f} | "
              f"{statistics.median(v):.2f} [{min(v):.2f}, {max(v):.2f}] |")


if __name__ == "__main__":
    main()
