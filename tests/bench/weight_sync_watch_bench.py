#!/usr/bin/python3
"""WatchCluster against polling, side by side (docs/benchmarks.md, "Weight
sync: watch instead of polling").

Runs the real daemons twice, one after the other, with the same config but
for the rollout workers' weight_sync.watch: `watch` (the default: a
WatchCluster stream wakes the worker, which otherwise asks the coordinator
about its group every weight_sync.poll_interval_ms = 1000 ms) and `poll`
(watch false: SyncWeightGroup every 50 ms, as before WatchCluster was
served). Each run: tandem-local with N broadcast workers; once every worker
is in one epoch, `--versions` more versions while training, from which it
reports each worker's mean publish-to-staged and publish-to-live seconds
(tandem_weight_sync_publish_to_{staged,live}_seconds, deltas of _sum and
_count); then the workers are paused, the cluster settles, and the
coordinator's tandem_coordinator_weight_group_syncs_total over `--idle`
seconds gives SyncWeightGroup calls per second per idle worker.

Then (unless --skip-no-group) the same two runs with the coordinator's
weight_sync.backend: nccl on a machine without a CUDA device (builds with
NCCL only): the trainer and every worker give up broadcast at once, so
every worker stays outside every group and pulls. Once each worker has
given up, it reports the workers' mean publish-to-staged seconds by pull
over `--versions` more versions, then the idle SyncWeightGroup calls per
second per worker as above: with watch, a worker outside the group waits
for a newer version up to weight_sync.poll_interval_ms (an epoch event
ends the wait early); with watch false it asks after every 200 ms pull
slice, as every no-group worker did before.

    /usr/bin/python3 tests/bench/weight_sync_watch_bench.py --bin build/bin

--pull-baseline-bin DIR instead runs the pull-mode comparison (docs/
benchmarks.md, "Pull workers: long-polled GetManifest"): two runs of
`weight_sync.mode: pull` workers, the first with the daemons in DIR (the
baseline, e.g. a build whose workers do not long-poll), the second with
--bin; each reports the workers' mean publish-to-staged and
publish-to-live seconds over `--versions` versions, then pauses them and
counts the trainer's tandem_weight_sync_manifest_requests_total (both
wait labels) over `--idle` seconds: GetManifest calls per second per
idle worker.

    /usr/bin/python3 tests/bench/weight_sync_watch_bench.py --bin build/bin \
        --pull-baseline-bin /tmp/tandem-bin-no-long-poll --versions 20
"""

import argparse
import os
import shutil
import sys
import tempfile
import time

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)),
                                "..", "integration"))
import harness  # noqa: E402
from harness import metric_sum, scrape_metrics  # noqa: E402


def configs(watch, checkpoints, no_group=False):
    return {
        "coordinator.yaml": "heartbeat_interval_ms: 200\n" + (
            "weight_sync:\n  backend: nccl\n" if no_group else ""),
        "rollout.yaml": f"""engine:
  max_num_seqs: 8
weight_sync:
  mode: broadcast
  watch: {"true" if watch else "false"}
""",
        "trainer.yaml": f"checkpoint_dir: {checkpoints}\ncheckpoint_every: 0\n"
                        "checkpoint_on_stop: false\n",
        "verifier.yaml": "worker_threads: 1\n",
    }


def worker_sums(workers):
    out = {}
    for name, info in workers.items():
        text = scrape_metrics(info["metrics_address"])
        out[name] = {
            key: (metric_sum(text, f"tandem_weight_sync_{key}_seconds_sum"),
                  metric_sum(text, f"tandem_weight_sync_{key}_seconds_count"))
            for key in ("publish_to_staged", "publish_to_live")}
    return out


def pull_configs(checkpoints):
    return {
        "coordinator.yaml": "heartbeat_interval_ms: 200\n",
        "rollout.yaml": """engine:
  max_num_seqs: 8
weight_sync:
  mode: pull
""",
        "trainer.yaml": f"checkpoint_dir: {checkpoints}\ncheckpoint_every: 0\n"
                        "checkpoint_on_stop: false\n",
        "verifier.yaml": "worker_threads: 1\n",
    }


def run_pull(label, bin_dir, args):
    """Pull-mode workers with the daemons in `bin_dir`: publish-to-staged/
    live over --versions versions, then idle GetManifest calls per second
    per worker (the trainer's counter) while they are paused."""
    harness.BIN_DIR = bin_dir
    config_dir = tempfile.mkdtemp(prefix=f"tandem-pull-bench-{label}-")
    harness.write_files(config_dir,
                        pull_configs(os.path.join(config_dir, "checkpoints")))
    launcher = harness.Launcher(rollout_workers=args.workers,
                                config_dir=config_dir)
    try:
        ready = launcher.wait_all_ready(timeout=120)
        coordinator = ready["coordinator"]["grpc_address"]
        names = [f"rollout-{i}" for i in range(args.workers)]
        workers = {n: ready[n] for n in names}

        def version():
            return harness.as_int(harness.cluster_status(coordinator),
                                  "policyVersion")
        # Past the first versions (late joiners' full copies).
        harness.wait_for(lambda: version() >= 2, 300, "version 2",
                         interval=0.5)
        start_version = version()
        before = worker_sums(workers)
        harness.wait_for(lambda: version() >= start_version + args.versions,
                         60 * args.versions, f"{args.versions} versions",
                         interval=0.5)
        after = worker_sums(workers)
        latency = {}
        for key in ("publish_to_staged", "publish_to_live"):
            total = sum(after[n][key][0] - before[n][key][0] for n in names)
            count = sum(after[n][key][1] - before[n][key][1] for n in names)
            latency[key] = (total / count if count else float("nan"), count)
        for info in workers.values():
            harness.tandemctl_json("worker", "pause", "--address",
                                   info["grpc_address"])
        harness.wait_settled(coordinator,
                             {n: i["grpc_address"] for n, i in workers.items()},
                             300, quiet_queues=True, gap=0.5)
        trainer_metrics = ready["trainer"]["metrics_address"]
        requests = "tandem_weight_sync_manifest_requests_total"
        a = metric_sum(scrape_metrics(trainer_metrics), requests)
        time.sleep(args.idle)
        b = metric_sum(scrape_metrics(trainer_metrics), requests)
        return {"latency": latency,
                "idle_rate": (b - a) / args.idle / len(workers),
                "load": os.getloadavg()[0]}
    finally:
        code = launcher.stop()
        if code != 0:
            print(f"{label}: launcher exited {code}", file=sys.stderr)
        launcher.cleanup()
        shutil.rmtree(config_dir, ignore_errors=True)


def pull(args):
    results = {}
    for label, bin_dir in (("baseline", args.pull_baseline_bin),
                           ("this build", args.bin)):
        results[label] = run_pull(label.replace(" ", "-"),
                                  os.path.abspath(bin_dir), args)
        r = results[label]
        print(f"{label} ({bin_dir}): idle GetManifest {r['idle_rate']:.2f}/s "
              f"per worker; publish-to-staged "
              f"{1000 * r['latency']['publish_to_staged'][0]:.1f} ms, "
              f"publish-to-live {1000 * r['latency']['publish_to_live'][0]:.1f}"
              f" ms ({r['latency']['publish_to_live'][1]:.0f} versions made "
              f"live); load {r['load']:.1f}", flush=True)
    t, b = results["this build"], results["baseline"]
    print("\n| pull workers | this build | baseline | this / baseline |")
    print("| --- | --- | --- | --- |")
    print(f"| idle GetManifest calls per worker per second | "
          f"{t['idle_rate']:.2f} | {b['idle_rate']:.2f} | "
          f"{t['idle_rate'] / b['idle_rate']:.3f} |")
    for key, label in (("publish_to_staged", "publish-to-staged, mean"),
                       ("publish_to_live", "publish-to-live, mean")):
        tm, bm = t["latency"][key][0], b["latency"][key][0]
        print(f"| {label} | {1000 * tm:.1f} ms | {1000 * bm:.1f} ms | "
              f"{tm / bm:.2f} |")


def nccl_built(bin_dir):
    """Whether this build has the NCCL transport (its CMake cache says)."""
    try:
        with open(os.path.join(bin_dir, "..", "CMakeCache.txt")) as f:
            return "TANDEM_ENABLE_NCCL:BOOL=ON" in f.read()
    except OSError:
        return False


def idle_sync_rate(coordinator, coordinator_metrics, workers, seconds):
    """Pauses the workers, waits for the cluster to settle, and returns the
    coordinator's SyncWeightGroup calls per second per worker over
    `seconds`."""
    for info in workers.values():
        harness.tandemctl_json("worker", "pause", "--address",
                               info["grpc_address"])
    harness.wait_settled(coordinator,
                         {n: i["grpc_address"] for n, i in workers.items()},
                         300, quiet_queues=True, gap=0.5)
    syncs = "tandem_coordinator_weight_group_syncs_total"
    a = metric_sum(scrape_metrics(coordinator_metrics), syncs)
    time.sleep(seconds)
    b = metric_sum(scrape_metrics(coordinator_metrics), syncs)
    return (b - a) / seconds / len(workers)


def run_no_group(mode, args):
    """A cluster whose broadcast backend nobody here can run: every worker
    stays outside every group."""
    config_dir = tempfile.mkdtemp(prefix=f"tandem-watch-bench-{mode}-nogroup-")
    harness.write_files(config_dir, configs(
        mode == "watch", os.path.join(config_dir, "checkpoints"),
        no_group=True))
    launcher = harness.Launcher(rollout_workers=args.workers,
                                config_dir=config_dir)
    try:
        ready = launcher.wait_all_ready(timeout=120)
        coordinator = ready["coordinator"]["grpc_address"]
        names = [f"rollout-{i}" for i in range(args.workers)]
        workers = {n: ready[n] for n in names}

        def version():
            return harness.as_int(harness.cluster_status(coordinator),
                                  "policyVersion")
        harness.wait_for(
            lambda: all("weight broadcast is off for this worker" in
                        launcher.log(n) for n in names), 300,
            "every worker to give up broadcast", interval=0.5)
        start_version = version()
        before = worker_sums(workers)
        harness.wait_for(lambda: version() >= start_version + args.versions,
                         60 * args.versions, f"{args.versions} versions",
                         interval=0.5)
        after = worker_sums(workers)
        key = "publish_to_staged"
        total = sum(after[n][key][0] - before[n][key][0] for n in names)
        count = sum(after[n][key][1] - before[n][key][1] for n in names)
        idle_rate = idle_sync_rate(coordinator,
                                   ready["coordinator"]["metrics_address"],
                                   workers, args.idle)
        return {"staged": (total / count if count else float("nan"), count),
                "idle_rate": idle_rate, "load": os.getloadavg()[0]}
    finally:
        code = launcher.stop()
        if code != 0:
            print(f"{mode} (no group): launcher exited {code}",
                  file=sys.stderr)
        launcher.cleanup()
        shutil.rmtree(config_dir, ignore_errors=True)


def run(mode, args):
    config_dir = tempfile.mkdtemp(prefix=f"tandem-watch-bench-{mode}-")
    harness.write_files(config_dir, configs(
        mode == "watch", os.path.join(config_dir, "checkpoints")))
    launcher = harness.Launcher(rollout_workers=args.workers,
                                config_dir=config_dir)
    try:
        ready = launcher.wait_all_ready(timeout=120)
        coordinator = ready["coordinator"]["grpc_address"]
        coordinator_metrics = ready["coordinator"]["metrics_address"]
        names = [f"rollout-{i}" for i in range(args.workers)]
        workers = {n: ready[n] for n in names}

        def all_in_group():
            status = harness.cluster_status(coordinator)
            members = status.get("broadcastGroup", {}).get("memberIds", [])
            return len(members) == args.workers + 1 and status
        harness.wait_for(all_in_group, 300, "every worker in one epoch",
                         interval=0.2)
        start_version = harness.as_int(harness.cluster_status(coordinator),
                                       "policyVersion")
        before = worker_sums(workers)
        t0 = time.monotonic()
        harness.wait_for(
            lambda: harness.as_int(harness.cluster_status(coordinator),
                                   "policyVersion") >=
            start_version + args.versions,
            60 * args.versions, f"{args.versions} versions", interval=0.5)
        train_seconds = time.monotonic() - t0
        after = worker_sums(workers)
        latency = {}
        for key in ("publish_to_staged", "publish_to_live"):
            total = sum(after[n][key][0] - before[n][key][0] for n in names)
            count = sum(after[n][key][1] - before[n][key][1] for n in names)
            latency[key] = (total / count if count else float("nan"), count)

        idle_rate = idle_sync_rate(coordinator, coordinator_metrics, workers,
                                   args.idle)
        load = os.getloadavg()[0]
        return {"latency": latency, "idle_rate": idle_rate,
                "train_seconds": train_seconds, "load": load}
    finally:
        code = launcher.stop()
        if code != 0:
            print(f"{mode}: launcher exited {code}", file=sys.stderr)
        launcher.cleanup()
        shutil.rmtree(config_dir, ignore_errors=True)


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--bin", default=harness.BIN_DIR)
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--versions", type=int, default=10)
    parser.add_argument("--idle", type=float, default=10.0)
    parser.add_argument("--skip-group", action="store_true",
                        help="only the runs outside every group")
    parser.add_argument("--skip-no-group", action="store_true",
                        help="only the runs in one broadcast group")
    parser.add_argument("--pull-baseline-bin",
                        help="run only the pull-mode comparison against the "
                             "daemons in this directory")
    args = parser.parse_args()
    harness.BIN_DIR = os.path.abspath(args.bin)
    if args.pull_baseline_bin:
        pull(args)
        return
    if not args.skip_group:
        in_group(args)
    if not args.skip_no_group:
        if not nccl_built(harness.BIN_DIR):
            print("no-group runs skipped: this build has no NCCL")
        elif any(os.path.exists(p) for p in ("/dev/nvidiactl", "/dev/nvidia0",
                                             "/dev/dxg")):
            print("no-group runs skipped: a CUDA device is visible (NCCL "
                  "broadcast would work)")
        else:
            no_group(args)


def no_group(args):
    results = {}
    for mode in ("watch", "poll"):
        results[mode] = run_no_group(mode, args)
        r = results[mode]
        print(f"{mode}, outside every group: idle SyncWeightGroup "
              f"{r['idle_rate']:.2f}/s per worker; publish-to-staged by pull "
              f"{1000 * r['staged'][0]:.1f} ms ({r['staged'][1]:.0f} "
              f"versions); load {r['load']:.1f}", flush=True)
    w, p = results["watch"], results["poll"]
    print("\n| outside every group (backend nccl, no device) | watch | "
          "poll (200 ms pull slices) | watch / poll |")
    print("| --- | --- | --- | --- |")
    print(f"| idle SyncWeightGroup calls per worker per second | "
          f"{w['idle_rate']:.2f} | {p['idle_rate']:.2f} | "
          f"{w['idle_rate'] / p['idle_rate']:.3f} |")
    print(f"| publish-to-staged by pull, mean | {1000 * w['staged'][0]:.1f} ms"
          f" | {1000 * p['staged'][0]:.1f} ms | "
          f"{w['staged'][0] / p['staged'][0]:.2f} |", flush=True)


def in_group(args):
    results = {}
    for mode in ("watch", "poll"):
        results[mode] = run(mode, args)
        r = results[mode]
        print(f"{mode}: idle SyncWeightGroup {r['idle_rate']:.2f}/s per "
              f"worker; publish-to-staged "
              f"{1000 * r['latency']['publish_to_staged'][0]:.1f} ms, "
              f"publish-to-live {1000 * r['latency']['publish_to_live'][0]:.1f}"
              f" ms ({r['latency']['publish_to_live'][1]:.0f} versions made "
              f"live over {r['train_seconds']:.0f} s); load {r['load']:.1f}",
              flush=True)
    w, p = results["watch"], results["poll"]
    print("\n| | watch | poll 50 ms | watch / poll |")
    print("| --- | --- | --- | --- |")
    print(f"| idle SyncWeightGroup calls per worker per second | "
          f"{w['idle_rate']:.2f} | {p['idle_rate']:.2f} | "
          f"{w['idle_rate'] / p['idle_rate']:.3f} |")
    for key, label in (("publish_to_staged", "publish-to-staged, mean"),
                       ("publish_to_live", "publish-to-live, mean")):
        wm, pm = w["latency"][key][0], p["latency"][key][0]
        print(f"| {label} | {1000 * wm:.1f} ms | {1000 * pm:.1f} ms | "
              f"{wm / pm:.2f} |")


if __name__ == "__main__":
    main()
