"""Sparse delta weight sync across real daemons (tandem-local on loopback):
a cluster on a bfloat16 model with weight_sync.mode pull. The trainer
publishes each version as a sparse delta on the version before, with a full
anchor every weight_sync.anchor_every versions; the rollout worker pulls the
deltas from the trainer's weight server, replays them, and after N versions
holds the trainer's weights bit for bit, having received far fewer bytes
than N full copies. Also: an out-of-range delta setting is refused at start.
A second cluster (weight_sync.mode broadcast) receives the same deltas by
Gloo broadcast and also ends bit for bit on the trainer's weights.

The tests share one cluster and run in the order of their names. As a
benchmark (docs/benchmarks.md), TANDEM_DELTAS_VERSIONS, TANDEM_DELTAS_LR
and TANDEM_DELTAS_ANCHOR_EVERY override the run's length, learning rate and
anchor cadence; the test prints the bytes per version it measured."""

import os
import subprocess
import tempfile
import unittest

import harness
from harness import metric_sum, scrape_metrics

# Trained versions to wait for, the learning rate, and
# weight_sync.anchor_every.
VERSIONS = int(os.environ.get("TANDEM_DELTAS_VERSIONS", "10"))
LR = os.environ.get("TANDEM_DELTAS_LR", "1.0e-5")
ANCHOR_EVERY = int(os.environ.get("TANDEM_DELTAS_ANCHOR_EVERY", "4"))


def write_configs(directory, model, reference, checkpoints, broadcast=False):
    files = {
        "coordinator.yaml": f"""heartbeat_interval_ms: 200
heartbeat_timeout_ms: 1500
weight_sync:
  broadcast: {"true" if broadcast else "false"}
""",
        "rollout.yaml": f"""model:
  path: {model}
engine:
  max_num_seqs: 8
weight_sync:
  mode: {"broadcast" if broadcast else "pull"}
""",
        "trainer.yaml": f"""checkpoint_dir: {checkpoints}
checkpoint_every: 0
model:
  path: {model}
training:
  lr: {LR}
  kl_beta: 0.1
  reference_model: {reference}
weight_sync:
  broadcast: {"true" if broadcast else "false"}
  anchor_every: {ANCHOR_EVERY}
""",
        "verifier.yaml": "worker_threads: 1\n",
    }
    harness.write_files(directory, files)




as_int = harness.as_int


class WeightDeltasTest(unittest.TestCase):
    BROADCAST = False

    @classmethod
    def setUpClass(cls):
        cls.tmp = tempfile.mkdtemp(prefix="tandem-deltas-")
        # The policy: the built-in model in bfloat16. The random model
        # never answers correctly (reward 0, no policy gradient), so the
        # KL penalty to another random model (a different seed) is what
        # moves the weights: real AdamW steps on a real gradient.
        cls.model = os.path.join(cls.tmp, "model-bf16")
        reference = os.path.join(cls.tmp, "reference")
        for seed, output in (("1", cls.model), ("2", reference)):
            exported = subprocess.run(
                [harness.binary("tandem-trainer"), "export", "--builtin",
                 "--seed", seed, "--dtype", "bfloat16", "--output", output],
                capture_output=True, text=True, timeout=120)
            assert exported.returncode == 0, exported.stderr
        cls.config_dir = os.path.join(cls.tmp, "config")
        os.makedirs(cls.config_dir)
        write_configs(cls.config_dir, cls.model, reference,
                      os.path.join(cls.tmp, "checkpoints"), cls.BROADCAST)
        cls.launcher = harness.Launcher(rollout_workers=1,
                                        config_dir=cls.config_dir)
        cls.ready = cls.launcher.wait_all_ready()
        cls.coordinator = cls.ready["coordinator"]["grpc_address"]

    @classmethod
    def tearDownClass(cls):
        cls.launcher.shutdown(cls.tmp)

    def dump(self):
        for name in ("coordinator", "trainer", "rollout-0"):
            print(f"==== {name} log (tail)")
            print(self.launcher.log(name)[-4000:])

    def test_0_model_is_bfloat16(self):
        with open(os.path.join(self.model, "config.json")) as f:
            self.assertIn('"bfloat16"', f.read())
        self.assertIn("bfloat16: sparse deltas between full anchors",
                      self.launcher.log("trainer"))

    def wait_settled(self):
        """Waits for VERSIONS versions, pauses the worker until it holds the
        latest one; returns (cluster status, worker status)."""
        worker = self.ready["rollout-0"]

        def trained():
            status = harness.tandemctl_json("status", "--coordinator",
                                            self.coordinator)
            return as_int(status, "policyVersion") >= VERSIONS
        try:
            harness.wait_for(trained, 240 + 2 * VERSIONS,
                             f"{VERSIONS} trained versions",
                             interval=0.5)
        except AssertionError:
            self.dump()
            raise
        # Pause the worker: no new samples, so the trainer stops publishing;
        # the worker must then hold the last version with the digest of the
        # trainer's published manifest (CRC-32C of every bucket).
        harness.tandemctl_json("worker", "pause", "--address",
                               worker["grpc_address"])

        try:
            status, seen = harness.wait_settled(
                self.coordinator, {"rollout-0": worker["grpc_address"]}, 120)
            w = seen["rollout-0"]
        finally:
            harness.tandemctl_json("worker", "resume", "--address",
                                   worker["grpc_address"])
        self.assertTrue(status.get("weightsDigest"))
        self.assertEqual(w["weightsDigest"], status["weightsDigest"])
        return status, w

    def test_1_worker_replays_deltas_to_the_trainers_weights(self):
        if self.BROADCAST:
            self.skipTest("pull cluster only")
        worker = self.ready["rollout-0"]
        status, w = self.wait_settled()
        self.assertEqual(w["weightSyncTransport"], "pull")

        trainer = scrape_metrics(self.ready["trainer"]["metrics_address"])
        received = scrape_metrics(worker["metrics_address"])
        published = {kind: metric_sum(
            trainer, "tandem_weight_sync_published_payloads_total", kind=kind)
            for kind in ("full", "delta")}
        published_bytes = {kind: metric_sum(
            trainer, "tandem_weight_sync_published_bytes_total", kind=kind)
            for kind in ("full", "delta")}
        full_size = published_bytes["full"] / published["full"]
        density_sum = metric_sum(trainer,
                                 "tandem_weight_sync_delta_density_sum")
        density_count = metric_sum(trainer,
                                   "tandem_weight_sync_delta_density_count")
        got = {kind: metric_sum(received, "tandem_weight_sync_bytes_total",
                                direction="received", transport="pull",
                                kind=kind) for kind in ("full", "delta")}
        versions = metric_sum(received, "tandem_weight_sync_versions_total",
                              direction="received", transport="pull")
        sent_delta = metric_sum(trainer, "tandem_weight_sync_bytes_total",
                                direction="sent", transport="pull",
                                kind="delta")
        delta_size = published_bytes["delta"] / max(published["delta"], 1)
        print(f"published {int(published['full'])} full anchors of "
              f"{full_size:.0f} bytes and {int(published['delta'])} deltas "
              f"of {delta_size:.0f} bytes on average "
              f"({100 * delta_size / full_size:.2f}% of full), mean density "
              f"{density_sum / max(density_count, 1):.4f}; the worker "
              f"received {int(versions)} versions in "
              f"{got['full'] + got['delta']:.0f} bytes "
              f"({got['delta']:.0f} as deltas) vs "
              f"{versions * full_size:.0f} as full copies")
        # Deltas were published (between the anchors), served and replayed.
        self.assertGreater(published["delta"], 0)
        self.assertGreater(density_count, 0)
        self.assertGreater(sent_delta, 0)
        self.assertGreater(got["delta"], 0)
        self.assertGreaterEqual(versions, 2)
        self.assertLess(got["full"] + got["delta"], versions * full_size)
        self.assertLess(delta_size, full_size)
        # Anchors keep the cadence: v1 (no base) and every multiple of
        # ANCHOR_EVERY at least.
        self.assertGreaterEqual(published["full"], 1 + VERSIONS // ANCHOR_EVERY)

    def test_2_out_of_range_delta_density_is_refused(self):
        if self.BROADCAST:
            self.skipTest("pull cluster only")
        bad = os.path.join(self.tmp, "bad-trainer.yaml")
        with open(bad, "w") as f:
            f.write("weight_sync:\n  delta_max_density: 0\n")
        out = subprocess.run(
            [harness.binary("tandem-trainer"), "--config", bad,
             "--grpc-address", "127.0.0.1:0", "--metrics-address",
             "127.0.0.1:0"],
            capture_output=True, text=True, timeout=60)
        self.assertNotEqual(out.returncode, 0)
        self.assertIn("weight_sync.delta_max_density must be in (0, 1], "
                      "got 0", out.stdout + out.stderr)


class WeightDeltasBroadcastTest(WeightDeltasTest):
    """The same bf16 cluster with weight_sync.mode broadcast: versions after
    the first reach the worker as deltas by Gloo broadcast (the sender
    knows the worker holds v-1), and it ends on the trainer's weights."""
    BROADCAST = True

    def test_3_broadcast_deltas_reproduce_the_trainers_weights(self):
        worker = self.ready["rollout-0"]
        status, w = self.wait_settled()
        self.assertEqual(w["weightSyncTransport"], "broadcast")
        trainer = scrape_metrics(self.ready["trainer"]["metrics_address"])
        received = scrape_metrics(worker["metrics_address"])
        sent = {kind: metric_sum(trainer, "tandem_weight_sync_bytes_total",
                                 direction="sent", transport="broadcast",
                                 kind=kind) for kind in ("full", "delta")}
        got = {kind: metric_sum(received, "tandem_weight_sync_bytes_total",
                                direction="received", transport="broadcast",
                                kind=kind) for kind in ("full", "delta")}
        rejected = metric_sum(received,
                              "tandem_weight_sync_rejected_versions_total")
        print(f"broadcast: the trainer sent {sent['full']:.0f} bytes as full "
              f"versions and {sent['delta']:.0f} as deltas; the worker "
              f"received {got['full']:.0f} + {got['delta']:.0f}; "
              f"{int(rejected)} rejected")
        self.assertGreater(sent["delta"], 0)
        self.assertGreater(got["delta"], 0)
        # A delta the worker already held (pulled before joining) is taken
        # part in but not counted as received.
        self.assertLessEqual(got["delta"], sent["delta"])
        self.assertEqual(rejected, 0)

if __name__ == "__main__":
    unittest.main(verbosity=2)
