"""Latency of the verifier's Environment service, for docs/environments.md.

Starts build/bin/tandem-verifier ($TANDEM_BIN_DIR) on loopback, opens
calculator episodes with a grpcio client and times, one call at a time:
  - Step with one calculator tool call (expression "(12 + 3) * 4 / 5 ** 2"),
  - Step with a tool call of garbage arguments,
  - OpenEpisode + an answering Step (exact scorer) + CloseEpisode,
and, for comparison, ListEnvironments (a call that does no work).

Run: TANDEM_BIN_DIR=build/bin /usr/bin/python3 tests/integration/bench_environment.py
Prints one line per kind: calls, median and p99 in microseconds, and the
load average before and after.
"""

import json
import os
import shutil
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import harness  # noqa: E402
import test_environment as t  # noqa: E402  (message classes and client)

N = 2000


def timed(fn, n=N):
    samples = []
    for _ in range(n):
        start = time.perf_counter()
        fn()
        samples.append(time.perf_counter() - start)
    samples.sort()
    return samples[len(samples) // 2] * 1e6, samples[int(len(samples) * 0.99)] * 1e6


def main():
    tmp = tempfile.mkdtemp(prefix="tandem-envbench-")
    config = os.path.join(tmp, "verifier.yaml")
    with open(config, "w") as f:
        f.write("coordinator_address: 127.0.0.1:1\n"
                "environment:\n  max_turns: 1000\n")
    daemon = harness.Daemon("verifier", tmp, extra=["--config", config])
    try:
        client = t.Client(daemon.wait_ready()["grpc_address"])
        print("load average before:", os.getloadavg())
        eid = [client.open().episode_id]
        turns = [0]

        def step(call):
            turns[0] += 1
            if turns[0] >= 999:  # Stay under max_turns.
                client.close(eid[0])
                eid[0] = client.open().episode_id
                turns[0] = 0
            client.call(eid[0], call)

        results = {
            "ListEnvironments": timed(lambda: client.ListEnvironments(
                t.pb.ListEnvironmentsRequest(), timeout=10)),
            "Step calculator": timed(
                lambda: step(t.calc("(12 + 3) * 4 / 5 ** 2"))),
            "Step bad arguments": timed(
                lambda: step(("calculator", "{{garbage"))),
        }

        def episode():
            e = client.open().episode_id
            client.call(e, text="42")
            client.close(e)
        results["Open+answer+Close"] = timed(episode, N // 4)
        for name, (median, p99) in results.items():
            print(f"{name:22s} median {median:7.0f} us  p99 {p99:7.0f} us")
        print("load average after:", os.getloadavg())
        client.channel.close()
    finally:
        daemon.stop()
        shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    main()
