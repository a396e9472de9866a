"""A rollout worker generating for a real coordinator and verifier: samples
flow and get scored, pause/resume/drain behave as documented, and SIGTERM
gives unfinished leases back to the coordinator."""

import os
import shutil
import signal
import tempfile
import time
import unittest

import harness

CONFIG = os.path.join(os.path.dirname(__file__), "config")


class RolloutWorkerTest(unittest.TestCase):

    @classmethod
    def setUpClass(cls):
        cls.tmp = tempfile.mkdtemp(prefix="tandem-rollout-")
        cls.coordinator, cls.verifier, member = harness.start_without_trainer(
            cls.tmp, CONFIG)
        cls.address = cls.coordinator.wait_ready()["grpc_address"]
        cls.worker = harness.Daemon(
            "rollout", cls.tmp,
            ["--config", os.path.join(CONFIG, "rollout.yaml"), *member])
        cls.worker_address = cls.worker.wait_ready()["grpc_address"]

    @classmethod
    def tearDownClass(cls):
        for d in (cls.worker, cls.verifier, cls.coordinator):
            d.stop()
        shutil.rmtree(cls.tmp, ignore_errors=True)

    def cluster(self):
        return harness.tandemctl_json("status", "--coordinator", self.address)

    def worker_status(self, action="status"):
        return harness.tandemctl_json("worker", action, "--address",
                                      self.worker_address)

    def tokens(self):
        return int(self.worker_status()["generatedTokensTotal"])

    def test_1_samples_are_generated_and_scored(self):
        def scored_groups():
            status = self.cluster()
            ready = int(status["queues"].get("readyGroups", 0))
            received = int(status["counters"].get("samplesReceived", 0))
            return (ready, received) if ready > 0 and received > 0 else None
        ready, received = harness.wait_for(scored_groups, 60,
                                           "scored groups", interval=0.5)
        self.assertGreater(received, 0)
        self.assertGreater(self.tokens(), 0)

    def test_2_pause_stops_generation_and_resume_continues(self):
        paused = self.worker_status("pause")
        self.assertEqual(paused["state"], "ROLLOUT_STATE_PAUSED")
        time.sleep(0.3)  # the step in progress may still finish
        before = self.tokens()
        time.sleep(1.0)
        self.assertEqual(self.tokens(), before)
        resumed = self.worker_status("resume")
        self.assertEqual(resumed["state"], "ROLLOUT_STATE_RUNNING")
        harness.wait_for(lambda: self.tokens() > before, 20,
                         "tokens after resume")

    def test_3_drain_finishes_in_flight_work_then_reports_drained(self):
        # Drain answers once drained, or just before the call's deadline
        # (tandemctl's --timeout) with DRAINING.
        self.assertIn(self.worker_status("drain")["state"],
                      ("ROLLOUT_STATE_DRAINING", "ROLLOUT_STATE_DRAINED"))
        drained = harness.wait_for(
            lambda: (lambda s: s if s["state"] == "ROLLOUT_STATE_DRAINED"
                     else None)(self.worker_status()), 60, "DRAINED")
        self.assertEqual(int(drained["runningSequences"]), 0)
        self.assertEqual(int(drained["prefetchedPrompts"]), 0)
        # Nothing leased stays with a drained worker.
        harness.wait_for(
            lambda: int(self.cluster()["queues"].get("leasedPrompts", 0)) == 0,
            20, "no leased prompts")
        self.assertEqual(self.worker_status("resume")["state"],
                         "ROLLOUT_STATE_RUNNING")

    def test_4_sigterm_returns_unfinished_leases(self):
        harness.wait_for(
            lambda: int(self.cluster()["queues"].get("leasedPrompts", 0)) > 0,
            30, "leases held by the worker")
        code = self.worker.stop(signal.SIGTERM)
        self.assertEqual(code, 0, self.worker.output())
        self.assertRegex(self.worker.output(),
                         r"returned [1-9]\d* lease\(s\) to the coordinator "
                         r"\(shutdown\)")
        harness.wait_for(
            lambda: int(self.cluster()["queues"].get("leasedPrompts", 0)) == 0,
            20, "leases back in the queue")


if __name__ == "__main__":
    unittest.main(verbosity=2)
