"""Throughput of the rollout worker's OpenAI endpoint against the engine's
own generate_bench on the same prompt (the ratio is the cost of HTTP, JSON,
tokenization and the hop between the io thread and the engine thread).

What: starts a coordinator throttled to one group in flight with no
trainer (so the worker's RL rollouts stop after that group and the engine
serves only the benchmark), a rollout worker on the built-in model with
openai.listen, and sends `--requests` completions with the official
`openai` client at each concurrency (threads, one client each): greedy,
the same prompt token ids, max_tokens C. It then runs generate_bench on the
same model (the built-in one, exported with `tandemctl export`) at batch 1
and 8 with the same prompt and C new tokens.

How to run (after building tandem-coordinator, tandem-rollout, tandemctl,
tandem-model and generate_bench; the openai client pinned in
tests/integration/requirements-openai.txt in the venv):
    .venv/bin/python tests/bench/openai_bench.py --bin-dir build/bin

Prints the time of a GET /v1/models through the client (HTTP and client
cost without the engine), one line per concurrency (requests/s, completion
tokens/s, mean latency) for the endpoint, generate_bench's JSON lines, and
the ratios; also the load average before and after. On a shared machine
run it with OMP_WAIT_POLICY=PASSIVE (LibTorch's OpenMP threads otherwise
spin and lose their cores to other processes, for 10-100x slower steps).
"""

import argparse
import concurrent.futures
import json
import os
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "integration"))
import harness  # noqa: E402
import openai  # noqa: E402

CONFIG = os.path.join(HERE, "..", "integration", "config")


def run_endpoint(address, prompt, max_tokens, concurrency, requests):
    clients = [openai.OpenAI(base_url=f"http://{address}/v1",
                             api_key="unused", max_retries=0, timeout=120)
               for _ in range(concurrency)]

    def one(i):
        start = time.perf_counter()
        r = clients[i % concurrency].completions.create(
            model="tandem-arith", prompt=prompt, max_tokens=max_tokens,
            temperature=0)
        return len(r.choices[0].model_dump()["token_ids"]), \
            time.perf_counter() - start

    for i in range(concurrency):  # warm-up: connections, first steps
        one(i)
    start = time.perf_counter()
    with concurrent.futures.ThreadPoolExecutor(concurrency) as pool:
        results = list(pool.map(one, range(requests)))
    seconds = time.perf_counter() - start
    tokens = sum(t for t, _ in results)
    return {"concurrency": concurrency, "requests": requests,
            "seconds": round(seconds, 3),
            "requests_per_second": round(requests / seconds, 2),
            "tokens_per_second": round(tokens / seconds, 1),
            "mean_tokens": tokens / requests,
            "mean_latency_ms": round(
                1000 * sum(s for _, s in results) / requests, 1)}


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--bin-dir", default="build/bin")
    parser.add_argument("--requests", type=int, default=48)
    parser.add_argument("--max-tokens", type=int, default=32)
    parser.add_argument("--concurrency", default="1,8")
    args = parser.parse_args()
    harness.BIN_DIR = os.path.abspath(args.bin_dir)
    print(f"load average before: {os.getloadavg()}")
    tmp = tempfile.mkdtemp(prefix="tandem-openai-bench-")
    coordinator = harness.Daemon(
        "coordinator", tmp,
        ["--config", os.path.join(CONFIG, "coordinator.yaml"),
         "--set", "training.groups_per_version=1", "--set", "max_lag=0"])
    daemons = [coordinator]
    try:
        address = coordinator.wait_ready()["grpc_address"]
        member = ["--set", f"coordinator_address={address}"]
        verifier = harness.Daemon("verifier", tmp, member)
        daemons.append(verifier)
        verifier.wait_ready()
        port = harness.free_port()
        worker = harness.Daemon(
            "rollout", tmp,
            [*member, "--set", f"openai.listen=127.0.0.1:{port}",
             "--set", "model.torch_threads=2"])
        daemons.append(worker)
        worker_address = worker.wait_ready(60)["grpc_address"]

        def generated():
            return int(harness.worker_status(worker_address).get(
                "generatedTokensTotal", 0))
        # Wait until the throttled rollouts stop.
        last = -1
        while generated() != last:
            last = generated()
            time.sleep(2)
        # The HTTP + client cost alone: GET /v1/models never touches the
        # engine.
        c = openai.OpenAI(base_url=f"http://127.0.0.1:{port}/v1",
                          api_key="unused", max_retries=0)
        c.models.list()
        start = time.perf_counter()
        for _ in range(args.requests):
            c.models.list()
        models_ms = 1000 * (time.perf_counter() - start) / args.requests
        print(f"GET /v1/models through the openai client: "
              f"{models_ms:.2f} ms per request", flush=True)
        prompt = [1, 2, 10, 3, 4, 12] * 3  # "12+34=" x3: 18 tokens
        results = []
        for c in [int(x) for x in args.concurrency.split(",")]:
            r = run_endpoint(f"127.0.0.1:{port}", prompt, args.max_tokens, c,
                             args.requests)
            results.append(r)
            print("endpoint", json.dumps(r), flush=True)
        rollout_tokens = generated() - last - sum(
            r["mean_tokens"] * (r["requests"] + r["concurrency"])
            for r in results)
        print(f"rollout tokens generated during the endpoint runs: "
              f"{rollout_tokens:.0f}")
    finally:
        for d in reversed(daemons):
            d.stop()
    model_dir = os.path.join(tmp, "arith")
    subprocess.run([harness.binary("tandemctl"), "export", "--model", "",
                    "--output", model_dir], check=True, capture_output=True)
    out = subprocess.run(
        [harness.binary("generate_bench"), "--model", model_dir,
         "--threads", "2", "--batch", "1,8", "--prompt-tokens",
         str(len(prompt)), "--new-tokens", str(args.max_tokens),
         "--prompt-ids", ",".join(map(str, prompt)), "--repeat", "3",
         "--prefill-tokens", "32"],
        capture_output=True, text=True, check=True)
    engine = {}
    for line in out.stdout.splitlines():
        if not line.startswith("{"):
            continue
        print("generate_bench", line)
        row = json.loads(line)
        if row["case"] == "decode":
            engine[row["batch"]] = row["tokens_per_second"]
    for r in results:
        if r["concurrency"] in engine:
            print(f"concurrency {r['concurrency']}: endpoint "
                  f"{r['tokens_per_second']} tok/s, generate_bench decode "
                  f"{engine[r['concurrency']]} tok/s, ratio "
                  f"{r['tokens_per_second'] / engine[r['concurrency']]:.2f}")
    print(f"load average after: {os.getloadavg()}")


if __name__ == "__main__":
    main()
