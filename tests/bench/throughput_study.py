#!/usr/bin/env python3
"""The Olmo 3 throughput table for Tandem, end to end through all daemons.

Runs the whole suite (tandem-local: coordinator, trainer, verifier, N rollout
workers as processes) once per mode, same config otherwise:

  (a) static batching + drain-before-update
  (b) continuous batching + drain-before-update
  (c) continuous batching + inflight updates

and, for each, scrapes every daemon's /metrics after a warm-up and again
after the measurement window. Reports generated tokens/s, trainer versions/s
and step time, the staleness distribution of trained samples and the
inflight pause, plus ratios against (a) from the same script run.

  python3 tests/bench/throughput_study.py [--build build] [--model DIR]
      [--warmup 20] [--measure 60] [--rollout-workers 2]

--model defaults to the demo's cached warm start when it exists (so rewards
and sample lengths are those of the demo), else the built-in random model.
"""

import argparse
import json
import os
import re
import signal
import subprocess
import sys
import tempfile
import time
import urllib.request

MODES = [
    ("a", "static + drain", "static", "drain"),
    ("b", "continuous + drain", "continuous", "drain"),
    ("c", "continuous + inflight", "continuous", "inflight"),
]

SAMPLE = re.compile(r'^([a-zA-Z_:][a-zA-Z0-9_:]*)(\{[^}]*\})?\s+(\S+)')


def scrape(address):
    """{(name, labels): value} from a Prometheus text endpoint."""
    with urllib.request.urlopen(f"http://{address}/metrics", timeout=5) as r:
        text = r.read().decode()
    out = {}
    for line in text.splitlines():
        m = SAMPLE.match(line)
        if m and not line.startswith("#"):
            out[(m.group(1), m.group(2) or "")] = float(m.group(3))
    return out


def total(metrics, name):
    return sum(v for (n, _), v in metrics.items() if n == name)


def buckets(metrics, name):
    """{le: cumulative count} of a histogram summed over label sets."""
    out = {}
    for (n, labels), v in metrics.items():
        if n != name + "_bucket":
            continue
        le = re.search(r'le="([^"]+)"', labels).group(1)
        le = float("inf") if le == "+Inf" else float(le)
        out[le] = out.get(le, 0.0) + v
    return out


def quantile(cumulative, q):
    """Upper bound of the bucket holding quantile q."""
    if not cumulative:
        return float("nan")
    count = max(cumulative.values())
    if count <= 0:
        return float("nan")
    for le in sorted(cumulative):
        if cumulative[le] >= q * count:
            return le
    return float("inf")


def write_configs(directory, batching, update_policy):
    files = {
        "coordinator.yaml": """heartbeat_interval_ms: 500
heartbeat_timeout_ms: 3000
group_size: 8
max_lag: 4
dataset:
  kind: builtin_arith
  arith_digits: 3
  arith_subtraction: false
""",
        "trainer.yaml": """training:
  lr: 0.0003
""",
        "verifier.yaml": "worker_threads: 1\n",
        "rollout.yaml": f"""engine:
  max_num_seqs: 64
  batching: {batching}
  update_policy: {update_policy}
""",
    }
    for name, text in files.items():
        with open(os.path.join(directory, name), "w") as f:
            f.write(text)


def read_ready(run_dir):
    ready = {}
    ready_dir = os.path.join(run_dir, "ready")
    if not os.path.isdir(ready_dir):
        return ready
    for name in os.listdir(ready_dir):
        try:
            with open(os.path.join(ready_dir, name)) as f:
                ready[name[:-5]] = json.load(f)
        except (OSError, json.JSONDecodeError):
            pass
    return ready


def snapshot(ready):
    out = {}
    for name, info in ready.items():
        address = info.get("metrics_address")
        if address:
            try:
                out[name] = scrape(address)
            except OSError:
                pass
    return out


def run_mode(args, key, batching, update_policy, workdir):
    config_dir = os.path.join(workdir, f"config-{key}")
    run_dir = os.path.join(workdir, f"run-{key}")
    os.makedirs(config_dir)
    write_configs(config_dir, batching, update_policy)
    command = [
        os.path.join(args.build, "bin", "tandem-local"), "--config-dir",
        config_dir, "--run-dir", run_dir, "--warm-start", "off",
        "--rollout-workers", str(args.rollout_workers), "--duration",
        str(args.warmup + args.measure + 60)
    ]
    if args.model:
        # The launcher passes --config-dir files as they are; add the model.
        for daemon in ("trainer", "rollout"):
            with open(os.path.join(config_dir, f"{daemon}.yaml"), "a") as f:
                f.write(f"model:\n  path: {args.model}\n")
    log = open(os.path.join(workdir, f"launcher-{key}.log"), "w")
    launcher = subprocess.Popen(command, stdout=log, stderr=subprocess.STDOUT)
    try:
        expected = 3 + args.rollout_workers
        deadline = time.time() + 120
        while len(read_ready(run_dir)) < expected:
            if time.time() > deadline or launcher.poll() is not None:
                raise RuntimeError(f"mode {key}: daemons not ready; see "
                                   f"{run_dir}/logs")
            time.sleep(0.5)
        time.sleep(args.warmup)
        ready = read_ready(run_dir)
        t0, before = time.time(), snapshot(ready)
        time.sleep(args.measure)
        t1, after = time.time(), snapshot(read_ready(run_dir))
    finally:
        launcher.send_signal(signal.SIGINT)
        try:
            launcher.wait(timeout=60)
        except subprocess.TimeoutExpired:
            launcher.kill()
        log.close()
    dt = t1 - t0

    def delta(name, prefix):
        return sum(
            total(after.get(d, {}), name) - total(before.get(d, {}), name)
            for d in after if d.startswith(prefix))

    tokens = delta("tandem_rollout_generated_tokens_total", "rollout")
    steps = delta("tandem_trainer_step_seconds_count", "trainer")
    step_sum = delta("tandem_trainer_step_seconds_sum", "trainer")
    versions = (total(after.get("trainer", {}), "tandem_policy_version") -
                total(before.get("trainer", {}), "tandem_policy_version"))
    stale_after = buckets(after.get("trainer", {}),
                          "tandem_trainer_staleness_versions")
    stale_before = buckets(before.get("trainer", {}),
                           "tandem_trainer_staleness_versions")
    stale = {le: stale_after[le] - stale_before.get(le, 0.0)
             for le in stale_after}
    stale_count = delta("tandem_trainer_staleness_versions_count", "trainer")
    stale_sum = delta("tandem_trainer_staleness_versions_sum", "trainer")
    pauses = delta("tandem_rollout_weight_update_pause_seconds_count",
                   "rollout")
    pause_sum = delta("tandem_rollout_weight_update_pause_seconds_sum",
                      "rollout")
    distribution = {}
    previous = 0.0
    for le in sorted(stale):
        distribution[le] = stale[le] - previous
        previous = stale[le]
    return {
        "tokens_per_s": tokens / dt,
        "versions_per_s": versions / dt,
        "step_s": step_sum / steps if steps else float("nan"),
        "staleness_mean": stale_sum / stale_count if stale_count else
        float("nan"),
        "staleness_p50": quantile(stale, 0.5),
        "staleness_p90": quantile(stale, 0.9),
        "staleness_hist": {str(k): v for k, v in distribution.items() if v},
        "pause_mean_s": pause_sum / pauses if pauses else float("nan"),
        "updates": pauses,
        "seconds": dt,
    }


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--build", default="build")
    parser.add_argument("--model", default=None)
    parser.add_argument("--warmup", type=float, default=20)
    parser.add_argument("--measure", type=float, default=60)
    parser.add_argument("--rollout-workers", type=int, default=2)
    parser.add_argument("--json", default=None, help="also write results here")
    args = parser.parse_args()
    if args.model is None:
        cache = os.environ.get("TANDEM_CACHE_DIR") or os.path.join(
            os.environ.get("XDG_CACHE_HOME") or
            os.path.expanduser("~/.cache"), "tandem")
        candidate = os.path.join(cache, "warm-start", "arith3-add")
        if os.path.exists(os.path.join(candidate, "sft_meta.json")):
            args.model = candidate
    results = {}
    with tempfile.TemporaryDirectory(prefix="tandem-study-") as workdir:
        for key, label, batching, update_policy in MODES:
            print(f"running ({key}) {label} ...", file=sys.stderr, flush=True)
            results[key] = run_mode(args, key, batching, update_policy,
                                    workdir)
            results[key]["label"] = label
    base = results["a"]
    print(f"model: {args.model or 'built-in random'}; "
          f"{args.rollout_workers} rollout workers; warm-up {args.warmup:g} s, "
          f"window {args.measure:g} s\n")
    print("| mode | gen tok/s | ratio | versions/s | ratio | trainer step s "
          "| staleness mean / p50 / p90 | staleness histogram | mean pause |")
    print("|---|---|---|---|---|---|---|---|---|")
    for key, _, _, _ in MODES:
        r = results[key]
        hist = ", ".join(f"{float(k):g}:{int(v)}"
                         for k, v in r["staleness_hist"].items())
        print(f"| ({key}) {r['label']} | {r['tokens_per_s']:.0f} | "
              f"{r['tokens_per_s'] / base['tokens_per_s']:.2f} | "
              f"{r['versions_per_s']:.2f} | "
              f"{r['versions_per_s'] / base['versions_per_s']:.2f} | "
              f"{r['step_s']:.3f} | {r['staleness_mean']:.2f} / "
              f"{r['staleness_p50']:g} / {r['staleness_p90']:g} | {hist} | "
              f"{r['pause_mean_s'] * 1e3:.2f} ms |")
    if args.json:
        with open(args.json, "w") as f:
            json.dump(results, f, indent=2)


if __name__ == "__main__":
    main()
