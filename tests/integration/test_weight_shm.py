"""The same-host shared-memory catch-up path across real daemons
(tandem-local on loopback): a trainer and a rollout worker in
weight_sync.mode pull, on one host. The trainer (weight_sync.shared_memory:
true) offers each full version as a /dev/shm segment and the
worker maps it instead of reading the bytes from a socket: the trainer's
tandem_weight_sync_bytes_total{direction="sent",transport="shm"} grows
while no full payload is streamed, the worker ends on the trainer's weights
(same digest as the published manifest), and the segments are the
trainer's own (named after its pid). A trainer killed with -9 leaves its
segments behind; the restarted trainer removes them.

WeightShmNotOfferedTest: a second cluster whose trainer keeps shared memory
off (its default). The worker asks for every full version in shared memory,
gets it over the socket, and counts each as
tandem_weight_sync_shm_fallbacks_total{reason="not_offered"}, which a real
Prometheus server scrapes from its /metrics.

The tests of a class share one cluster and run in the order of their
names."""

import os
import signal
import sys
import tempfile
import unittest

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import harness  # noqa: E402
from harness import metric_sum, scrape_metrics  # noqa: E402

as_int = harness.as_int


def write_configs(directory, trainer_shm=True):
    harness.write_files(directory, {
        "coordinator.yaml": """heartbeat_interval_ms: 200
heartbeat_timeout_ms: 1500
weight_sync:
  broadcast: false
""",
        "rollout.yaml": """engine:
  max_num_seqs: 8
weight_sync:
  mode: pull
""",
        "trainer.yaml": f"""checkpoint_dir: {directory}/checkpoints
weight_sync:
  broadcast: false
  shared_memory: {"true" if trainer_shm else "false"}
""",
        "verifier.yaml": "worker_threads: 1\n",
    })


def segments_of(pid):
    """Names of the weight segments made by process `pid` in /dev/shm."""
    prefix = f"tandem-w-{pid}-"
    return sorted(n for n in os.listdir("/dev/shm") if n.startswith(prefix))


class WeightShmTest(unittest.TestCase):

    @classmethod
    def setUpClass(cls):
        cls.config_dir = tempfile.mkdtemp(prefix="tandem-shm-config-")
        write_configs(cls.config_dir)
        cls.launcher = harness.Launcher(rollout_workers=1,
                                        config_dir=cls.config_dir)
        cls.ready = cls.launcher.wait_all_ready()
        cls.coordinator = cls.ready["coordinator"]["grpc_address"]

    @classmethod
    def tearDownClass(cls):
        trainer = cls.launcher.ready("trainer")
        cls.launcher.shutdown(cls.config_dir)
        # A trainer stopped cleanly unlinks its segments.
        if trainer:
            assert not segments_of(trainer["pid"]), segments_of(trainer["pid"])

    def dump(self):
        for name in ("coordinator", "trainer", "rollout-0"):
            print(f"==== {name} log (tail)")
            print(self.launcher.log(name)[-4000:])

    def settle(self, min_version):
        """Waits for `min_version`, pauses the worker until it holds the
        latest version; returns (cluster status, worker status)."""
        worker = self.launcher.ready("rollout-0")
        try:
            harness.wait_for(
                lambda: as_int(harness.cluster_status(self.coordinator),
                               "policyVersion") >= min_version,
                240, f"policy version {min_version}", interval=0.5)
        except AssertionError:
            self.dump()
            raise
        harness.tandemctl_json("worker", "pause", "--address",
                               worker["grpc_address"])
        try:
            status, seen = harness.wait_settled(
                self.coordinator, {"rollout-0": worker["grpc_address"]}, 120)
        except AssertionError:
            self.dump()
            raise
        finally:
            harness.tandemctl_json("worker", "resume", "--address",
                                   worker["grpc_address"])
        return status, seen["rollout-0"]

    def test_1_worker_maps_full_versions_from_shared_memory(self):
        status, w = self.settle(4)
        self.assertTrue(status.get("weightsDigest"))
        self.assertEqual(w["weightsDigest"], status["weightsDigest"])
        self.assertEqual(w["weightSyncTransport"], "shm")

        trainer_info = self.launcher.ready("trainer")
        trainer = scrape_metrics(trainer_info["metrics_address"])
        received = scrape_metrics(
            self.launcher.ready("rollout-0")["metrics_address"])
        published = metric_sum(trainer,
                               "tandem_weight_sync_published_bytes_total",
                               kind="full")
        shm = metric_sum(trainer, "tandem_weight_sync_bytes_total",
                         direction="sent", transport="shm", kind="full")
        streamed = metric_sum(trainer, "tandem_weight_sync_bytes_total",
                              direction="sent", transport="pull", kind="full")
        got = metric_sum(received, "tandem_weight_sync_bytes_total",
                         direction="received", kind="full")
        got_shm = metric_sum(received, "tandem_weight_sync_bytes_total",
                             direction="received", transport="shm",
                             kind="full")
        versions = metric_sum(received, "tandem_weight_sync_versions_total",
                              direction="received")
        print(f"trainer published {published:.0f} full bytes, offered "
              f"{shm:.0f} in shared memory, streamed {streamed:.0f}; the "
              f"worker received {int(versions)} versions, {got:.0f} bytes")
        # At least one pull (a worker that starts late may get the latest
        # version in its first pull; the unit test covers many versions).
        self.assertGreaterEqual(versions, 1)
        self.assertGreater(got, 0)
        # Every full version the worker received came through a segment.
        self.assertEqual(streamed, 0)
        self.assertGreaterEqual(shm, got)
        self.assertGreater(shm, 0)
        # The worker counts them under transport "shm" too.
        self.assertEqual(got_shm, got)
        # And fell back for none of them.
        self.assertEqual(
            metric_sum(received, "tandem_weight_sync_shm_fallbacks_total"), 0)
        # The retained versions' segments exist, named after the trainer.
        self.assertTrue(segments_of(trainer_info["pid"]))

    def test_2_restarted_trainer_removes_a_killed_ones_segments(self):
        old = self.launcher.ready("trainer")
        left = segments_of(old["pid"])
        self.assertTrue(left)
        os.kill(old["pid"], signal.SIGKILL)

        def restarted():
            info = self.launcher.ready("trainer")
            return info if info and info["pid"] != old["pid"] else None
        try:
            harness.wait_for(restarted, 60, "launcher to restart the trainer")
        except AssertionError:
            self.dump()
            raise
        self.assertEqual(segments_of(old["pid"]), [],
                         f"left by the killed trainer: {left}")
        # And the worker keeps catching up from the new trainer.
        status, w = self.settle(
            as_int(harness.cluster_status(self.coordinator),
                   "policyVersion") + 1)
        self.assertEqual(w["weightsDigest"], status["weightsDigest"])


class WeightShmNotOfferedTest(unittest.TestCase):

    @classmethod
    def setUpClass(cls):
        cls.config_dir = tempfile.mkdtemp(prefix="tandem-shm-off-config-")
        write_configs(cls.config_dir, trainer_shm=False)
        cls.launcher = harness.Launcher(rollout_workers=1,
                                        config_dir=cls.config_dir)
        cls.prometheus = None
        try:
            cls.ready = cls.launcher.wait_all_ready()
            cls.coordinator = cls.ready["coordinator"]["grpc_address"]
            cls.prometheus = harness.Prometheus({
                "rollout": cls.launcher.ready("rollout-0")["metrics_address"]})
        except BaseException:
            cls.tearDownClass()
            raise

    @classmethod
    def tearDownClass(cls):
        if cls.prometheus:
            cls.prometheus.stop()
        trainer = cls.launcher.ready("trainer")
        cls.launcher.shutdown(cls.config_dir)
        if trainer:
            assert not segments_of(trainer["pid"]), segments_of(trainer["pid"])

    def dump(self):
        for name in ("coordinator", "trainer", "rollout-0"):
            print(f"==== {name} log (tail)")
            print(self.launcher.log(name)[-4000:])

    def test_worker_counts_versions_not_offered_in_shared_memory(self):
        try:
            harness.wait_for(
                lambda: as_int(harness.cluster_status(self.coordinator),
                               "policyVersion") >= 3,
                240, "policy version 3", interval=0.5)
        except AssertionError:
            self.dump()
            raise
        trainer = self.launcher.ready("trainer")
        # The trainer made no segments.
        self.assertEqual(segments_of(trainer["pid"]), [])
        worker = self.launcher.ready("rollout-0")

        # Prometheus sees the fallbacks, all of them for "not_offered".
        last = {}

        def scraped():
            nonlocal last
            result = self.prometheus.query(
                "tandem_weight_sync_shm_fallbacks_total")
            if not result:
                return None
            last = {r["metric"].get("reason", ""): float(r["value"][1])
                    for r in result}
            return last.get("not_offered", 0) >= 1
        try:
            harness.wait_for(scraped, 60, "Prometheus: shm fallbacks",
                             interval=0.5)
        except AssertionError:
            self.dump()
            self.fail(f"Prometheus returned {last} for "
                      "tandem_weight_sync_shm_fallbacks_total")
        # Every reason is exported from the start (at 0); only not_offered
        # counts here.
        self.assertEqual(set(last), {"not_offered", "open_failed", "mismatch"})
        self.assertEqual(last["open_failed"], 0)
        self.assertEqual(last["mismatch"], 0)

        # On the worker, every full version it pulled is one fallback, and
        # none came from shared memory.
        text = scrape_metrics(worker["metrics_address"])
        not_offered = metric_sum(text, "tandem_weight_sync_shm_fallbacks_total",
                                 reason="not_offered")
        pulled = metric_sum(text, "tandem_weight_sync_versions_total",
                            direction="received", transport="pull")
        deltas = metric_sum(text, "tandem_weight_sync_bytes_total",
                            direction="received", kind="delta")
        shm = metric_sum(text, "tandem_weight_sync_versions_total",
                         direction="received", transport="shm")
        print(f"worker pulled {int(pulled)} versions over the socket, "
              f"{int(not_offered)} not offered in shared memory")
        self.assertEqual(shm, 0)
        self.assertEqual(deltas, 0)  # float32 weights: every version full
        self.assertGreaterEqual(not_offered, 1)
        # (A pull counts its fallback just before the version it delivers.)
        self.assertIn(not_offered, (pulled, pulled + 1))


if __name__ == "__main__":
    unittest.main()
