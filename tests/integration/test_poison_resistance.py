"""Poisoned samples and oversized fields against a real cluster (tandem-local:
coordinator, trainer, verifier, one rollout worker), with Debian's
python3-grpcio as the attacker (coordinator stubs from
test_coordinator_work, nothing shared with our C++ clients).

Proves: while the run trains, a registered member's SubmitSamples calls
carrying NaN behavior log-probs, a future policy version, or a 40 MiB
completion text are refused with INVALID_ARGUMENT naming the field, one
for a lease another member holds with PERMISSION_DENIED, and a Register
with a 40 MiB host name with INVALID_ARGUMENT, as is a rollout worker's Drain with a 40 MiB
reason; each poisoned call also
carried a valid sample, and none of them was stored (the lease's valid
samples are all accepted afterwards, none a duplicate); the refusals are
counted by reason (tandem_coordinator_submit_refusals_total); `tandemctl
status` keeps working; and the run keeps learning: the policy version
advances, the trainer skipped no step for a non-finite loss or gradient,
and its loss stays finite."""

import math
import os
import shutil
import sys
import time
import unittest

import grpc

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import harness  # noqa: E402
from harness import metric_sum, scrape_metrics  # noqa: E402
import test_coordinator_work as work  # noqa: E402  (generates the stubs)
from test_coordinator_work import common, pb  # noqa: E402

harness.proto_stubs("rollout.proto", out_dir=work.STUB_DIR)
from tandem.v1 import rollout_pb2 as rpb  # noqa: E402

CONFIG_DIR = os.path.join(os.path.dirname(__file__), "config")
HUGE = 40 << 20  # under gRPC's 64 MiB message cap, far over any field limit


class PoisonResistanceTest(unittest.TestCase):

    @classmethod
    def setUpClass(cls):
        cls.launcher = harness.Launcher(rollout_workers=1,
                                        config_dir=CONFIG_DIR)
        try:
            cls.ready = cls.launcher.wait_all_ready()
        except BaseException:
            cls.launcher.shutdown()
            raise
        cls.coordinator = cls.ready["coordinator"]["grpc_address"]
        cls.client = work.Client(cls.coordinator)

    @classmethod
    def tearDownClass(cls):
        cls.client.close()
        cls.launcher.shutdown()

    def version(self):
        return self.client.call("GetClusterStatus",
                                pb.GetClusterStatusRequest()).policy_version

    def refused(self, code, member_id, samples, fragment):
        with self.assertRaises(grpc.RpcError) as raised:
            self.client.call("SubmitSamples", pb.SubmitSamplesRequest(
                member_id=member_id, samples=samples), timeout=30)
        self.assertEqual(raised.exception.code(), code,
                         raised.exception.details())
        self.assertIn(fragment, raised.exception.details())

    def test_poisoned_submits_are_refused_and_the_run_keeps_learning(self):
        harness.wait_for(lambda: self.version() >= 1, 90,
                         "the trainer's first version")
        attacker = work.Member(self.client, common.ROLE_ROLLOUT)
        victim = work.Member(self.client, common.ROLE_ROLLOUT)
        try:
            def lease_for(member):
                return harness.wait_for(lambda: list(self.client.call(
                    "LeasePrompts", pb.LeasePromptsRequest(
                        member_id=member.member_id, max_prompts=1,
                        policy_version=self.version())).leases), 30,
                    "a lease")[0]
            lease = lease_for(attacker)
            victims_lease = lease_for(victim)
            version = lease.dispatch_policy_version

            def valid():
                return work.make_samples(lease, attacker.member_id,
                                         version=version)

            # NaN log-probs next to a valid sample.
            samples = valid()[:2]
            samples[1].behavior_logprobs[0] = math.nan
            self.refused(grpc.StatusCode.INVALID_ARGUMENT, attacker.member_id,
                         samples, "samples[1].behavior_logprobs[0] is nan")
            # A future version, which would never count as stale.
            samples = valid()[:2]
            samples[1].version_spans[0].policy_version = version + 10**6
            self.refused(grpc.StatusCode.INVALID_ARGUMENT, attacker.member_id,
                         samples,
                         f"samples[1].version_spans[0].policy_version is "
                         f"{version + 10**6}")
            # An oversized field.
            samples = valid()[:2]
            samples[1].completion_text = "7" * HUGE
            self.refused(grpc.StatusCode.INVALID_ARGUMENT, attacker.member_id,
                         samples,
                         f"SubmitSamplesRequest.samples[1].completion_text is "
                         f"{HUGE} bytes")
            # The victim's lease.
            stolen = work.make_samples(victims_lease, attacker.member_id,
                                       version=version)
            self.refused(grpc.StatusCode.PERMISSION_DENIED,
                         attacker.member_id, stolen,
                         f"'{victims_lease.lease_id}' is held by member "
                         f"'{victim.member_id}'")
            # Two 40 MiB host names broke GetClusterStatus before.
            for _ in range(2):
                with self.assertRaises(grpc.RpcError) as raised:
                    self.client.call("Register", pb.RegisterRequest(
                        role=common.ROLE_ROLLOUT, grpc_address="127.0.0.1:1",
                        hostname="h" * HUGE), timeout=30)
                self.assertEqual(raised.exception.code(),
                                 grpc.StatusCode.INVALID_ARGUMENT)
                self.assertIn(f"RegisterRequest.hostname is {HUGE} bytes",
                              raised.exception.details())
            # The rollout worker's Drain reason goes to its log: bounded too.
            with grpc.insecure_channel(
                    self.ready["rollout-0"]["grpc_address"]) as channel:
                drain = channel.unary_unary(
                    "/tandem.v1.RolloutWorker/Drain",
                    request_serializer=lambda m: m.SerializeToString(),
                    response_deserializer=rpb.RolloutStatus.FromString)
                with self.assertRaises(grpc.RpcError) as raised:
                    drain(rpb.DrainRequest(reason="r" * HUGE), timeout=30)
            self.assertEqual(raised.exception.code(),
                             grpc.StatusCode.INVALID_ARGUMENT)
            self.assertIn(f"DrainRequest.reason is {HUGE} bytes",
                          raised.exception.details())
            status = harness.cluster_status(self.coordinator)
            self.assertTrue(all(len(m.get("hostname", "")) < 256
                                for m in status["members"]))

            # Nothing of the refused calls was stored: every valid sample of
            # the lease is new now.
            accepted = self.client.call("SubmitSamples", pb.SubmitSamplesRequest(
                member_id=attacker.member_id, samples=valid()))
            self.assertEqual(accepted.accepted, lease.group_size)
            self.assertEqual(accepted.duplicates, 0)
            self.client.call("ReturnLeases", pb.ReturnLeasesRequest(
                member_id=victim.member_id,
                lease_ids=[victims_lease.lease_id], reason="test done"))

            metrics = scrape_metrics(self.ready["coordinator"]
                                     ["metrics_address"])
            for reason, count in (("logprob_value", 1), ("version_range", 1),
                                  ("too_large", 1), ("lease_not_held", 1)):
                self.assertEqual(metric_sum(
                    metrics, "tandem_coordinator_submit_refusals_total",
                    reason=reason), count, reason)
            # ...and nothing else: the real rollout worker was never refused.
            self.assertEqual(metric_sum(
                metrics, "tandem_coordinator_submit_refusals_total"), 4)
            self.assertEqual(metric_sum(
                metrics, "tandem_coordinator_oversized_requests_total",
                rpc="Register"), 2)
        finally:
            attacker.close()
            victim.close()

        # The run keeps learning on finite weights.
        after = self.version()
        harness.wait_for(lambda: self.version() >= after + 3, 90,
                         "three more policy versions")
        trainer = scrape_metrics(self.ready["trainer"]["metrics_address"])
        self.assertEqual(
            metric_sum(trainer, "tandem_trainer_nonfinite_steps_total"), 0)
        self.assertTrue(math.isfinite(metric_sum(trainer,
                                                 "tandem_trainer_loss")))
        self.assertNotIn("is not finite", self.launcher.log("trainer"))


if __name__ == "__main__":
    try:
        unittest.main(verbosity=2)
    finally:
        shutil.rmtree(work.STUB_DIR, ignore_errors=True)
