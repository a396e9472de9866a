"""Multi-turn episodes against single-turn completions, on the real
daemons: episodes/s, generated tokens/s and the share of the worker's time
its engine sat idle because every sequence it held waited for an
environment (issue 23's benchmark; docs/environments.md, "Throughput").

Runs, one after another, on loopback: a coordinator (JSONL dataset), a
verifier, one rollout worker, and for the episode rows the scripted
environment of tests/bench/scripted_env.py (Debian's python3), which ends
every episode after exactly K tool round trips, each answered after
--tool-ms of simulated tool time. No trainer: the policy stays at version
0, and the coordinator's in-flight bound is lifted so that it never
throttles. The model is tests/integration/episode_model.py's tiny
tool-calling Llama (2 layers, hidden 64, warm-started here in a few
seconds); every turn is capped at 48 generated tokens.

Rows:
  single     the same prompts without an environment (scored by `exact`):
             the baseline;
  episodes-K K = 0, 1, 4 tool round trips per episode (K + 1 model turns).

For each row it waits --warmup seconds, then reads the worker's /metrics
at the start and the end of a --window seconds window:
  samples/s      episodes (or single-turn samples) finished per second,
                 and its ratio to the single row;
  tok/s          generated tokens per second (the model's only), and its
                 ratio to the single row;
  idle           tandem_rollout_environment_idle_seconds_total over the
                 window's wall time: the engine had nothing to run while
                 episodes waited for their environment;
  idle steps     idle waits / (engine steps + idle waits);
  decode batch   mean sequences decoded per engine step (parked episodes
                 hold a slot of engine.max_num_seqs but decode nothing);
  prefill tok/s  tokens prefilled per second (prompts, and the
                 environment's observations appended to an episode);
  parked, kv     mean parked sequences and KV-cache use, read every second;
  parsed calls   tool calls the worker parsed from the model's turns per
                 episode (the scripted environment answers every turn, so
                 the round trips are K whatever this says);
  ended          episodes ended by reason over the whole row (the worker's
                 tandem_rollout_episodes_ended_total).

Run (the venv has torch and transformers; python3-grpcio serves the
environment):

    TANDEM_BIN_DIR=build/bin .venv/bin/python tests/bench/episode_bench.py

Prints one line per row and the load average before and after.
"""

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "integration"))
import episode_model  # noqa: E402
import harness  # noqa: E402

TASKS = [("3*4", "12"), ("17+25", "42"), ("9*9", "81"), ("100-58", "42")]
PROMPTS = 4096
TURN_TOKENS = 64


def write_dataset(path, environment):
    with open(path, "w") as f:
        for i in range(PROMPTS):
            expression, answer = TASKS[i % len(TASKS)]
            text = episode_model.prompt_text(expression)
            row = {"id": f"t{i}", "prompt": text,
                   "prompt_token_ids": episode_model.encode(text),
                   "verifier": "exact", "metadata": {"answer": answer}}
            if environment:
                row["environment"] = environment
            f.write(json.dumps(row) + "\n")


def counters(address):
    text = harness.scrape_metrics(address)
    return {
        "episodes": harness.metric_sum(
            text, "tandem_rollout_episodes_ended_total"),
        "samples": harness.metric_sum(
            text, "tandem_rollout_samples_finished_total"),
        "tokens": harness.metric_sum(
            text, "tandem_rollout_generated_tokens_total"),
        "steps": harness.metric_sum(
            text, "tandem_rollout_step_seconds_count"),
        "idle_waits": harness.metric_sum(
            text, "tandem_rollout_environment_idle_waits_total"),
        "idle_seconds": harness.metric_sum(
            text, "tandem_rollout_environment_idle_seconds_total"),
        "tool_calls": harness.metric_sum(
            text, "tandem_rollout_episode_tool_calls_total"),
        "prefill": harness.metric_sum(
            text, "tandem_rollout_prefill_tokens_total"),
        "batch_sum": harness.metric_sum(text, "tandem_rollout_batch_size_sum"),
        "batch_count": harness.metric_sum(
            text, "tandem_rollout_batch_size_count"),
    }


def run_row(tmp, model_dir, tool_turns, args):
    """One row: None = single-turn; else tool_turns round trips."""
    row_dir = tempfile.mkdtemp(dir=tmp)
    dataset = os.path.join(row_dir, "data.jsonl")
    write_dataset(dataset, None if tool_turns is None else "scripted")
    daemons, env = [], None
    try:
        coordinator = harness.Daemon(
            "coordinator", row_dir,
            ["--set", "dataset.kind=jsonl", "--set", f"dataset.path={dataset}",
             "--set", "dataset.add_bos=false",
             "--set", f"group_size={args.group_size}",
             "--set", "sampling.temperature=0.7",
             "--set", f"sampling.max_tokens={TURN_TOKENS}",
             # No trainer: never throttle on the in-flight bound.
             "--set", "max_lag=1000",
             "--set", "training.groups_per_version=1000000"])
        daemons.append(coordinator)
        member = ["--set",
                  f"coordinator_address={coordinator.wait_ready()['grpc_address']}"]
        verifier = harness.Daemon("verifier", row_dir, member)
        daemons.append(verifier)
        verifier.wait_ready()
        worker_args = [*member, "--set", f"model.path={model_dir}",
                       "--set", f"engine.max_num_seqs={args.max_num_seqs}",
                       "--set", f"engine.num_kv_blocks={args.kv_blocks}"]
        if tool_turns is not None:
            ready = os.path.join(row_dir, "env.json")
            env = subprocess.Popen(
                ["/usr/bin/python3", os.path.join(HERE, "scripted_env.py"),
                 "--tool-turns", str(tool_turns),
                 "--tool-ms", str(args.tool_ms),
                 "--threads", str(args.env_threads), "--ready-file", ready],
                stdout=subprocess.DEVNULL, stderr=subprocess.STDOUT)
            address = harness.wait_for(lambda: harness.read_json(ready), 30,
                                       "scripted environment")["grpc_address"]
            worker_args += [
                "--set", f"environment.address={address}",
                "--set", f"environment.max_turns={tool_turns + 1}",
                "--set", f"environment.max_parked={args.max_parked}",
                "--set", f"environment.max_turn_tokens={TURN_TOKENS}",
                "--set", f"environment.max_episode_tokens="
                         f"{(tool_turns + 1) * TURN_TOKENS * 4}"]
        worker = harness.Daemon("rollout", row_dir, worker_args)
        daemons.append(worker)
        metrics = worker.wait_ready(120)["metrics_address"]
        harness.wait_for(lambda: counters(metrics)["tokens"] > 0, 60,
                         "first generated tokens")
        time.sleep(args.warmup)
        start, t0 = counters(metrics), time.monotonic()
        gauges = []
        while time.monotonic() - t0 < args.window:
            time.sleep(min(1.0, max(0.0, args.window -
                                    (time.monotonic() - t0))))
            text = harness.scrape_metrics(metrics)
            gauges.append((
                harness.metric_sum(text, "tandem_rollout_parked_sequences"),
                harness.metric_sum(text,
                                   "tandem_rollout_kv_cache_usage_ratio")))
        end, t1 = counters(metrics), time.monotonic()
        ended = {reason: harness.metric_sum(
            harness.scrape_metrics(metrics),
            "tandem_rollout_episodes_ended_total", reason=reason)
            for reason in ("environment", "turn_limit", "token_limit",
                           "timeout", "environment_failed")}
    finally:
        for daemon in reversed(daemons):
            if daemon.process.poll() is None:
                daemon.stop()
        if env is not None:
            harness.stop_process(env)
    wall = t1 - t0
    delta = {k: end[k] - start[k] for k in end}
    finished = delta["samples"] if tool_turns is None else delta["episodes"]
    waits = delta["idle_waits"]
    return {
        "samples_per_s": finished / wall,
        "tokens_per_s": delta["tokens"] / wall,
        "idle_share": delta["idle_seconds"] / wall,
        "idle_steps": waits / max(delta["steps"] + waits, 1),
        "prefill_per_s": delta["prefill"] / wall,
        "mean_batch": delta["batch_sum"] / max(delta["batch_count"], 1),
        "mean_parked": sum(p for p, _ in gauges) / max(len(gauges), 1),
        "mean_kv": sum(k for _, k in gauges) / max(len(gauges), 1),
        "ended": {k: v for k, v in ended.items() if v},
        "tool_calls_per_episode": (delta["tool_calls"] / finished
                                   if tool_turns is not None and finished
                                   else 0.0),
    }


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--tool-ms", type=float, default=20.0,
                        help="simulated tool time per round trip")
    parser.add_argument("--warmup", type=float, default=5.0)
    parser.add_argument("--window", type=float, default=30.0)
    parser.add_argument("--group-size", type=int, default=4)
    parser.add_argument("--max-num-seqs", type=int, default=32)
    parser.add_argument("--env-threads", type=int, default=1024,
                        help="the scripted environment's server threads")
    parser.add_argument("--kv-blocks", type=int, default=4096,
                        help="the worker's engine.num_kv_blocks (16 tokens "
                             "each)")
    parser.add_argument("--max-parked", type=int, default=1024,
                        help="the worker's environment.max_parked")
    parser.add_argument("--turns", default="0,1,4",
                        help="tool round trips per episode, one row each")
    args = parser.parse_args()
    tmp = tempfile.mkdtemp(prefix="tandem-episode-bench-")
    try:
        model_dir = os.path.join(tmp, "model")
        episode_model.make_model(model_dir, TASKS)
        print(f"load average before: {os.getloadavg()}", flush=True)
        print(f"tool time {args.tool_ms:g} ms, group size {args.group_size}, "
              f"engine.max_num_seqs {args.max_num_seqs}, engine.num_kv_blocks "
              f"{args.kv_blocks}, environment.max_parked "
              f"{args.max_parked}, {TURN_TOKENS} tokens "
              f"per turn at most, window {args.window:g} s", flush=True)
        rows = [("single", None)] + [
            (f"episodes-{k}", int(k)) for k in args.turns.split(",")]
        baseline = None
        for name, turns in rows:
            r = run_row(tmp, model_dir, turns, args)
            baseline = baseline or r
            print(f"{name:12s} samples/s {r['samples_per_s']:7.2f} "
                  f"({r['samples_per_s'] / baseline['samples_per_s']:4.2f}x)  "
                  f"tok/s {r['tokens_per_s']:7.1f} "
                  f"({r['tokens_per_s'] / baseline['tokens_per_s']:4.2f}x)  "
                  f"idle {100 * r['idle_share']:5.1f}%  "
                  f"idle steps {100 * r['idle_steps']:5.1f}%  "
                  f"decode batch {r['mean_batch']:5.1f}  "
                  f"prefill tok/s {r['prefill_per_s']:7.1f}  "
                  f"parked {r['mean_parked']:5.1f}  "
                  f"kv {100 * r['mean_kv']:3.0f}%  "
                  f"parsed calls/episode {r['tool_calls_per_episode']:.2f}  "
                  f"ended {r['ended']}",
                  flush=True)
        print(f"load average after: {os.getloadavg()}", flush=True)
    finally:
        if not os.environ.get("TANDEM_KEEP_TMP"):
            shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    main()
