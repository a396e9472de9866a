#!/usr/bin/python3
"""Staged vs in-place weight updates, side by side in one cluster
(docs/benchmarks.md, "In-place weight updates").

Starts a coordinator, a verifier, a trainer and TWO rollout workers on the
same model (a widened built-in model, tests/bench/wide_model.py), one with
`engine.update_mode: staged`, one with `inplace`, both receiving every
version the trainer publishes (same weight_sync mode). While versions flow
it samples each worker's resident memory (/proc/PID/status VmRSS, and the
peak VmHWM), then reports per worker: RSS, the weight bytes the mode holds,
versions made live, and tandem_rollout_weight_update_pause_seconds (mean, bucket
quantiles, share of the run) and generated tokens from its /metrics.

    tests/bench/inplace_memory_bench.py --bin build/bin --seconds 120
"""

import argparse
import os
import re
import shutil
import sys
import tempfile
import time

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)),
                                "..", "integration"))
import harness  # noqa: E402
from harness import metric_sum, scrape_metrics  # noqa: E402


def proc_kib(pid, field):
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith(field + ":"):
                return int(line.split()[1])
    return 0


def histogram_quantile(text, name, q):
    """Upper bound of the bucket of histogram `name` holding quantile q."""
    buckets = []
    for line in text.splitlines():
        m = re.match(rf'^{name}_bucket\{{.*le="([^"]+)".*\}} (\S+)$', line)
        if m:
            buckets.append((float(m.group(1)), float(m.group(2))))
    buckets.sort()
    total = buckets[-1][1] if buckets else 0
    for le, count in buckets:
        if total > 0 and count >= q * total:
            return le
    return float("nan")


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--bin", default="build/bin")
    parser.add_argument("--model", default="",
                        help="model directory (default: write a wide one)")
    parser.add_argument("--seconds", type=float, default=120)
    parser.add_argument("--weight-sync", default="broadcast",
                        choices=["broadcast", "pull"])
    args = parser.parse_args()
    os.environ["TANDEM_BIN_DIR"] = os.path.abspath(args.bin)
    harness.BIN_DIR = os.path.abspath(args.bin)

    tmp = tempfile.mkdtemp(prefix="tandem-inplace-bench-")
    model = args.model
    if not model:
        model = os.path.join(tmp, "model")
        import subprocess
        subprocess.run([sys.executable, os.path.join(
            os.path.dirname(os.path.abspath(__file__)), "wide_model.py"),
            "--bin", args.bin, "--out", model], check=True)
    daemons = []
    try:
        coordinator = harness.Daemon(
            "coordinator", tmp,
            ["--set", "weight_sync.broadcast=true",
             "--set", "heartbeat_interval_ms=200"])
        daemons.append(coordinator)
        address = coordinator.wait_ready()["grpc_address"]
        member = ["--set", f"coordinator_address={address}"]
        verifier = harness.Daemon("verifier", tmp, member)
        daemons.append(verifier)
        verifier.wait_ready()
        trainer = harness.Daemon(
            "trainer", tmp,
            [*member, "--set", f"model.path={model}",
             "--set", f"checkpoint_dir={tmp}/checkpoints",
             "--set", "checkpoint_on_stop=false",
             # Small batches: a version every few seconds on a CPU.
             "--set", "training.batch_max_groups=2",
             "--set", "training.batch_max_tokens=512",
             "--set", "weight_sync.broadcast=true"])
        daemons.append(trainer)
        trainer.wait_ready(timeout=120)
        workers = {}
        for mode in ("staged", "inplace"):
            w = harness.Daemon(
                "rollout", tmp,
                [*member, "--set", f"model.path={model}",
                 "--set", f"engine.update_mode={mode}",
                 "--set", f"weight_sync.mode={args.weight_sync}",
                 "--set", "engine.max_num_seqs=16"],
                name=f"rollout-{mode}")
            daemons.append(w)
            workers[mode] = w
        infos = {mode: w.wait_ready(timeout=120)
                 for mode, w in workers.items()}
        rss = {mode: [] for mode in workers}
        start = time.monotonic()
        while time.monotonic() - start < args.seconds:
            for mode, w in workers.items():
                rss[mode].append(proc_kib(w.process.pid, "VmRSS"))
            time.sleep(0.5)
        print(f"model {model}; {args.seconds:.0f} s; weight_sync "
              f"{args.weight_sync}")
        print("| mode | weight copies held | RSS median (MiB) | RSS peak "
              "VmHWM (MiB) | versions live | pause mean (ms) | pause p50 / "
              "p99 / max (bucket bound, s) | time paused | tokens |")
        print("|---|---|---|---|---|---|---|---|---|")
        for mode, w in workers.items():
            text = scrape_metrics(infos[mode]["metrics_address"])
            count = metric_sum(
                text, "tandem_rollout_weight_update_pause_seconds_count")
            total = metric_sum(
                text, "tandem_rollout_weight_update_pause_seconds_sum")
            tokens = metric_sum(text, "tandem_rollout_generated_tokens_total")
            samples = sorted(rss[mode])
            median = samples[len(samples) // 2] / 1024 if samples else 0
            peak = proc_kib(w.process.pid, "VmHWM") / 1024
            copies = "1" if mode == "inplace" else "3-4"
            print(f"| {mode} | {copies} | {median:.0f} | {peak:.0f} | "
                  f"{int(count)} | {1000 * total / max(count, 1):.2f} | "
                  + " / ".join(str(histogram_quantile(
                      text, "tandem_rollout_weight_update_pause_seconds", q))
                      for q in (0.5, 0.99, 1.0)) +
                  f" | {100 * total / args.seconds:.1f}% | {int(tokens)} |")
        if not any(metric_sum(scrape_metrics(i["metrics_address"]),
                              "tandem_rollout_weight_update_pause_seconds_count")
                   for i in infos.values()):
            print(trainer.output()[-3000:])
    finally:
        for d in reversed(daemons):
            d.stop()
        for d in daemons:
            if d.process.returncode not in (0, None) and "rollout" in \
                    d.log_path:
                print(d.output()[-2000:])
        for d in daemons:
            if "rollout-inplace" in d.log_path:
                for line in d.output().splitlines():
                    if "in-place updates:" in line or " W [" in line:
                        print(line)
        shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    main()
