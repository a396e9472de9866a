"""Fault counters as a real Prometheus server scrapes them from a real
coordinator and a real verifier:

- tandem_coordinator_lease_expiries_total: a rollout worker that leases
  prompts and goes silent (no heartbeat renews its leases) loses them at
  the lease deadline, well before it is declared dead; the prompts are
  leased again to a live worker, whose heartbeats keep its own leases;
- tandem_verifier_sandbox_kills_total{reason}: `code` programs that spin,
  sleep, or flood stdout are killed by the sandbox for reasons `cpu`,
  `wall_clock` and `output`, each scored 0 with that reason, and the
  verifier keeps scoring.

Python plays the rollout workers over real gRPC (coordinator stubs from
test_coordinator_work) and calls the verifier's ScoreBatch directly
(stubs generated here from verifier.proto)."""

import json
import os
import shutil
import sys
import tempfile
import time
import unittest

import grpc

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import harness  # noqa: E402
import test_coordinator_work as work  # noqa: E402  (generates the stubs)
from test_coordinator_work import common, pb  # noqa: E402

harness.proto_stubs("verifier.proto", out_dir=work.STUB_DIR)
from tandem.v1 import verifier_pb2 as vpb  # noqa: E402

LEASE_TIMEOUT_MS = 600
# Far beyond the test's waits: the silent worker must lose its leases by
# expiry, not by being declared dead.
HEARTBEAT_TIMEOUT_MS = 30000
SILENT_LEASES = 3
CPU_SECONDS = 1
# Generous against the CPU limit, so a spinning program on a busy machine
# still reaches its CPU second before the wall clock runs out.
WALL_SECONDS = 6
TESTS = json.dumps([{"stdin": "", "expected_stdout": "ok"}])


def code_item(item_id, program):
    return vpb.ScoreItem(item_id=item_id, verifier="code",
                         prompt_text="print ok",
                         completion_text=f"```python\n{program}\n```",
                         metadata={"language": "python", "tests": TESTS})


def verifier_call(address, method, request, response_class, timeout):
    with grpc.insecure_channel(address) as channel:
        rpc = channel.unary_unary(
            f"/tandem.v1.Verifier/{method}",
            request_serializer=lambda m: m.SerializeToString(),
            response_deserializer=response_class.FromString)
        return rpc(request, timeout=timeout)


class FaultMetricsTest(unittest.TestCase):

    @classmethod
    def setUpClass(cls):
        cls.tmp = tempfile.mkdtemp(prefix="tandem-faults-")
        cls.daemons = []
        cls.prometheus = None
        cls.client = None
        try:
            cls._start()
        except BaseException:
            cls.tearDownClass()
            raise

    @classmethod
    def _start(cls):
        config = os.path.join(cls.tmp, "coordinator.yaml")
        with open(config, "w") as f:
            f.write(f"""heartbeat_interval_ms: 200
heartbeat_timeout_ms: {HEARTBEAT_TIMEOUT_MS}
lease_timeout_ms: {LEASE_TIMEOUT_MS}
group_size: 2
dataset:
  kind: builtin_arith
  seed: 5
""")
        coordinator = harness.Daemon("coordinator", cls.tmp,
                                     ["--config", config])
        cls.daemons.append(coordinator)
        cls.coordinator_ready = coordinator.wait_ready()
        cls.address = cls.coordinator_ready["grpc_address"]
        verifier = harness.Daemon(
            "verifier", cls.tmp,
            ["--set", f"coordinator_address={cls.address}",
             "--set", f"code.cpu_seconds={CPU_SECONDS}",
             "--set", f"code.wall_seconds={WALL_SECONDS}",
             "--set", "worker_threads=2"])
        cls.daemons.append(verifier)
        cls.verifier_ready = verifier.wait_ready()
        cls.prometheus = harness.Prometheus({
            "coordinator": cls.coordinator_ready["metrics_address"],
            "verifier": cls.verifier_ready["metrics_address"]})
        cls.client = work.Client(cls.address)

    @classmethod
    def tearDownClass(cls):
        if cls.client:
            cls.client.close()
        if cls.prometheus:
            cls.prometheus.stop()
        codes = {d.log_path: d.stop() for d in reversed(cls.daemons)}
        shutil.rmtree(cls.tmp, ignore_errors=True)
        unclean = {p: c for p, c in codes.items() if c != 0}
        if unclean:
            raise AssertionError(f"daemons exited uncleanly: {unclean}")

    def scraped(self, expr, expect, label="reason", timeout=30):
        """Waits until Prometheus returns `expect` for `expr`, as
        {value of `label` ("" without it): sample value}."""
        last = {}

        def matches():
            nonlocal last
            result = self.prometheus.query(expr)
            if result is None:
                return None
            last = {r["metric"].get(label, ""): float(r["value"][1])
                    for r in result}
            return last == expect
        try:
            harness.wait_for(matches, timeout, f"Prometheus: {expr}",
                             interval=0.5)
        except AssertionError:
            self.fail(f"Prometheus returned {last} for {expr}, want {expect}")

    def test_silent_worker_leases_expire_and_prometheus_counts_them(self):
        # Registers and leases, then never heartbeats again.
        silent = self.client.call("Register", pb.RegisterRequest(
            role=common.ROLE_ROLLOUT, grpc_address="127.0.0.1:1",
            hostname="silent", pid=os.getpid())).member_id
        leases = self.client.call("LeasePrompts", pb.LeasePromptsRequest(
            member_id=silent, max_prompts=SILENT_LEASES)).leases
        self.assertEqual(len(leases), SILENT_LEASES)
        leased_at = time.monotonic()

        def expired():
            status = self.client.call("GetClusterStatus",
                                      pb.GetClusterStatusRequest())
            return status.counters.lease_expiries >= SILENT_LEASES and status
        status = harness.wait_for(expired, LEASE_TIMEOUT_MS / 1000 + 5,
                                  "the silent worker's leases to expire")
        self.assertGreaterEqual(time.monotonic() - leased_at,
                                LEASE_TIMEOUT_MS / 1000 * 0.9)
        self.assertEqual(status.counters.lease_expiries, SILENT_LEASES)
        self.assertEqual(status.counters.members_expired, 0)
        self.assertEqual(status.queues.leased_prompts, 0)
        self.assertEqual(status.queues.pending_prompts, SILENT_LEASES)

        # A live worker gets those prompts first, under new leases, and its
        # heartbeats renew them past the lease timeout.
        live = work.Member(self.client, common.ROLE_ROLLOUT)
        try:
            again = self.client.call("LeasePrompts", pb.LeasePromptsRequest(
                member_id=live.member_id, max_prompts=SILENT_LEASES)).leases
            self.assertEqual(sorted(l.prompt_id for l in again),
                             sorted(l.prompt_id for l in leases))
            self.assertFalse({l.lease_id for l in again} &
                             {l.lease_id for l in leases})
            late = self.client.call("SubmitSamples", pb.SubmitSamplesRequest(
                member_id=silent,
                samples=work.make_samples(leases[0], silent)))
            self.assertEqual(len(late.rejected_sample_ids), 2)
            time.sleep(3 * LEASE_TIMEOUT_MS / 1000)
            status = self.client.call("GetClusterStatus",
                                      pb.GetClusterStatusRequest())
            self.assertEqual(status.counters.lease_expiries, SILENT_LEASES)
            self.assertEqual(status.queues.leased_prompts, SILENT_LEASES)
            self.scraped("tandem_coordinator_lease_expiries_total",
                         {"": float(SILENT_LEASES)})
            self.client.call("ReturnLeases", pb.ReturnLeasesRequest(
                member_id=live.member_id,
                lease_ids=[l.lease_id for l in again], reason="test done"))
        finally:
            live.close()

    def test_sandbox_kills_are_scored_zero_and_prometheus_counts_them(self):
        items = [
            code_item("spin", "while True:\n    pass"),
            code_item("sleep", "import time\ntime.sleep(3600)"),
            code_item("flood", "import sys\nwhile True:\n"
                               "    sys.stdout.write('x' * 65536)"),
        ]
        started = time.monotonic()
        response = verifier_call(
            self.verifier_ready["grpc_address"], "ScoreBatch",
            vpb.ScoreBatchRequest(items=items), vpb.ScoreBatchResponse,
            timeout=4 * WALL_SECONDS + 10)
        elapsed = time.monotonic() - started
        scores = {r.item_id: r.score for r in response.results}
        for item_id, score in scores.items():
            # A machine without the namespaces the sandbox needs fails here,
            # saying so, instead of hanging.
            self.assertNotEqual(score.outcome, "sandbox_unavailable",
                                f"{item_id}: {score.reason}")
            self.assertEqual(score.reward, 0.0, f"{item_id}: {score.reason}")
        self.assertEqual(scores["spin"].outcome, "timeout", scores["spin"])
        self.assertIn(f"CPU limit of {CPU_SECONDS} s exceeded",
                      scores["spin"].reason)
        self.assertEqual(scores["sleep"].outcome, "timeout", scores["sleep"])
        self.assertIn("wall-clock limit", scores["sleep"].reason)
        self.assertEqual(scores["flood"].outcome, "output_limit",
                         scores["flood"])
        self.assertLess(elapsed, 3 * WALL_SECONDS)

        # The verifier keeps serving after the kills.
        ok = verifier_call(
            self.verifier_ready["grpc_address"], "ScoreBatch",
            vpb.ScoreBatchRequest(items=[code_item("fine", "print('ok')")]),
            vpb.ScoreBatchResponse, timeout=30)
        self.assertEqual(ok.results[0].score.reward, 1.0,
                         ok.results[0].score.reason)

        self.scraped("tandem_verifier_sandbox_kills_total",
                     {"cpu": 1.0, "wall_clock": 1.0, "output": 1.0,
                      "file_size": 0.0, "signal": 0.0})
        self.scraped('sum by (outcome) (tandem_verifier_requests_total'
                     '{verifier="code"}) > 0',
                     {"timeout": 2.0, "output_limit": 1.0, "correct": 1.0},
                     label="outcome")


if __name__ == "__main__":
    try:
        unittest.main(verbosity=2)
    finally:
        shutil.rmtree(work.STUB_DIR, ignore_errors=True)
