"""A trainer step skipped as non-finite hands its batch back at once, with
real daemons (coordinator, verifier, rollout worker, trainer):

While the trainer's fault-injection file exists
(TANDEM_TEST_POISON_REWARDS_FILE: every reward of a pulled batch becomes
NaN), every step is skipped (tandem_trainer_nonfinite_steps_total
{quantity="reward"}) and the trainer hands the batch back
(ReleaseTrainingBatch): the coordinator counts it released
(tandem_coordinator_training_batches_released_total) and its groups are
ready again within seconds, not after the 300 s batch timeout, so no group
stays in "training". Once the file is gone, the policy version advances
again."""

import os
import shutil
import tempfile
import unittest

import harness
from harness import metric_sum, scrape_metrics

CONFIG = os.path.join(os.path.dirname(__file__), "config")
# Far longer than the test: a batch back before it was handed back.
BATCH_TIMEOUT_S = 300
HANDBACK_LIMIT_S = 30


class BatchHandbackTest(unittest.TestCase):

    def setUp(self):
        self.tmp = tempfile.mkdtemp(prefix="tandem-handback-")
        self.daemons = []
        self.addCleanup(self.cleanup)
        config = os.path.join(self.tmp, "coordinator.yaml")
        with open(config, "w") as f:
            f.write(f"""heartbeat_interval_ms: 200
training:
  batch_timeout_ms: {BATCH_TIMEOUT_S * 1000}
""")
        self.coordinator = self.start("coordinator", ["--config", config])
        ready = self.coordinator.wait_ready()
        self.address = ready["grpc_address"]
        self.coordinator_metrics = ready["metrics_address"]
        member = ["--set", f"coordinator_address={self.address}"]
        self.start("verifier", member).wait_ready()
        self.start("rollout", ["--config", os.path.join(CONFIG, "rollout.yaml"),
                               *member]).wait_ready()
        self.poison = os.path.join(self.tmp, "poison-rewards")
        open(self.poison, "w").close()
        self.trainer = self.start(
            "trainer", member,
            env={"TANDEM_TEST_POISON_REWARDS_FILE": self.poison})
        self.trainer_metrics = self.trainer.wait_ready()["metrics_address"]

    def start(self, daemon, args, **kwargs):
        d = harness.Daemon(daemon, self.tmp, args, **kwargs)
        self.daemons.append(d)
        return d

    def cleanup(self):
        for d in reversed(self.daemons):
            d.stop()
        shutil.rmtree(self.tmp, ignore_errors=True)

    def coordinator_metric(self, name):
        return metric_sum(scrape_metrics(self.coordinator_metrics), name)

    def test_skipped_step_hands_its_batch_back_at_once(self):
        harness.wait_for(
            lambda: self.coordinator_metric(
                "tandem_coordinator_training_batches_released_total") >= 2,
            HANDBACK_LIMIT_S, "two batches handed back")
        trainer = scrape_metrics(self.trainer_metrics)
        self.assertGreaterEqual(
            metric_sum(trainer, "tandem_trainer_nonfinite_steps_total",
                       quantity="reward"), 2)
        self.assertEqual(self.coordinator_metric(
            "tandem_coordinator_training_batches_expired_total"), 0)
        status = harness.cluster_status(self.address)
        self.assertEqual(harness.as_int(status, "policyVersion"), 0)
        self.assertIn("handed back by", self.coordinator.output())
        # The run goes on once the fault is gone.
        os.remove(self.poison)
        harness.wait_for(
            lambda: harness.as_int(harness.cluster_status(self.address),
                                   "policyVersion") >= 2,
            60, "policy version 2 after the fault", interval=0.25)
        # Nothing is left waiting for the batch timeout.
        self.assertEqual(self.coordinator_metric(
            "tandem_coordinator_training_batches_expired_total"), 0)


if __name__ == "__main__":
    unittest.main()
