"""weight_sync.backend: nccl on a machine without a CUDA device, across real
daemons (tandem-local on loopback). The coordinator accepts the backend
(this build has NCCL) and hands it out with every broadcast epoch; the
trainer and each rollout worker fail to form the NCCL group at once
(FailedPrecondition: no CUDA device), log one clear error naming
weight_sync.backend 'nccl' and the cause, and stop taking part in
broadcast: no epoch loop, nothing hangs, and every version still reaches
every worker by pull, bit for bit (the worker's digest equals the digest
of the trainer's published manifest).

Skipped where a CUDA device is visible (the NCCL path then runs for real;
weights_nccl_test covers it) or in builds without NCCL (the coordinator
refuses the backend at start; coordinator_config_test covers that)."""

import os
import tempfile
import unittest

import harness
from harness import metric_sum, scrape_metrics

WORKERS = ("rollout-0", "rollout-1")


def nccl_built():
    """Whether this build has the NCCL transport (its CMake cache says)."""
    cache = os.path.join(os.environ.get("TANDEM_BIN_DIR", ""), "..",
                         "CMakeCache.txt")
    try:
        with open(cache) as f:
            return "TANDEM_ENABLE_NCCL:BOOL=ON" in f.read()
    except OSError:
        return True


def device_visible():
    return any(os.path.exists(p) for p in ("/dev/nvidiactl", "/dev/nvidia0",
                                           "/dev/dxg"))


def write_configs(directory, checkpoints):
    files = {
        "coordinator.yaml": """heartbeat_interval_ms: 200
heartbeat_timeout_ms: 3000
weight_sync:
  broadcast: true
  backend: nccl
  report_timeout_ms: 2000
  regroup_wait_ms: 200
""",
        "rollout.yaml": """engine:
  max_num_seqs: 8
weight_sync:
  mode: broadcast
  timeout_ms: 3000
""",
        "trainer.yaml": f"""checkpoint_dir: {checkpoints}
weight_sync:
  broadcast: true
  timeout_ms: 3000
""",
        "verifier.yaml": "worker_threads: 1\n",
    }
    harness.write_files(directory, files)


as_int = harness.as_int


@unittest.skipIf(device_visible(), "a CUDA device is visible")
@unittest.skipUnless(nccl_built(), "this build has no NCCL")
class WeightBroadcastNcclWithoutDeviceTest(unittest.TestCase):

    @classmethod
    def setUpClass(cls):
        cls.config_dir = tempfile.mkdtemp(prefix="tandem-nccl-config-")
        write_configs(cls.config_dir,
                      os.path.join(cls.config_dir, "checkpoints"))
        cls.launcher = harness.Launcher(rollout_workers=len(WORKERS),
                                        config_dir=cls.config_dir)
        cls.ready = cls.launcher.wait_all_ready()
        cls.coordinator = cls.ready["coordinator"]["grpc_address"]

    @classmethod
    def tearDownClass(cls):
        cls.launcher.shutdown(cls.config_dir)

    def dump(self):
        for name in ("coordinator", "trainer") + WORKERS:
            print(f"==== {name} log (tail)")
            print(self.launcher.log(name)[-4000:])

    def test_every_worker_gets_every_version_by_pull(self):
        # Several versions, so that several epochs could have been formed,
        # and every worker listed in one (each caught-up worker is a
        # candidate at the next publish) and given up there.
        def version():
            return as_int(harness.cluster_status(self.coordinator),
                          "policyVersion")

        def all_gave_up():
            return all("weight broadcast is off for this worker" in
                       self.launcher.log(name) for name in WORKERS)
        try:
            harness.wait_for(lambda: version() >= 5 and all_gave_up(), 240,
                             "5 published versions, every worker given up",
                             interval=0.5)
        except AssertionError:
            self.dump()
            raise

        # No epoch loop: after the last worker gave up, at most one more
        # epoch forms (the trainer alone), then none however many versions
        # follow.
        def formed():
            return metric_sum(scrape_metrics(
                self.ready["coordinator"]["metrics_address"]),
                "tandem_weight_sync_epochs_formed_total")
        formed_then = formed()
        for _ in range(2):
            target = version() + 3
            harness.wait_for(lambda: version() >= target, 120,
                             f"version {target}", interval=0.2)
        self.assertLessEqual(formed() - formed_then, 1)
        formed_then = formed()
        target = version() + 3
        harness.wait_for(lambda: version() >= target, 120,
                         f"version {target}", interval=0.2)
        self.assertEqual(formed(), formed_then)
        workers = {name: self.launcher.ready(name) for name in WORKERS}
        for info in workers.values():
            harness.tandemctl_json("worker", "pause", "--address",
                                   info["grpc_address"])
        try:
            status, seen = harness.wait_settled(
                self.coordinator,
                {name: info["grpc_address"] for name, info in workers.items()},
                120, quiet_queues=True)
        except AssertionError:
            self.dump()
            raise
        finally:
            for info in workers.values():
                harness.tandemctl_json("worker", "resume", "--address",
                                       info["grpc_address"])
        digest = status.get("weightsDigest")
        self.assertTrue(digest)
        version = as_int(status, "policyVersion")
        self.assertGreaterEqual(version, 5)
        for name, w in seen.items():
            with self.subTest(worker=name):
                self.assertEqual(as_int(w, "receivedPolicyVersion"), version)
                self.assertEqual(w["weightsDigest"], digest)
                self.assertEqual(w["weightSyncTransport"], "pull")
                self.assertEqual(as_int(w, "broadcastEpoch"), 0)

        # One clear error per member, naming the key, the value and the
        # cause.
        trainer_log = self.launcher.log("trainer")
        self.assertEqual(
            trainer_log.count("weight broadcast is off for this trainer"), 1,
            trainer_log[-4000:])
        self.assertIn("weight_sync.backend 'nccl': NCCL weight transport: "
                      "no CUDA device visible", trainer_log)
        # Nothing to re-send when broadcast is off: no re-send wait.
        self.assertNotIn("re-sending it in the next epoch", trainer_log)
        for name in WORKERS:
            with self.subTest(worker=name):
                log = self.launcher.log(name)
                errors = [line for line in log.splitlines()
                          if "weight broadcast is off for this worker" in line]
                self.assertEqual(len(errors), 1, log[-4000:])
                self.assertIn(" E [rollout] ", errors[0])
                self.assertIn("weight_sync.backend 'nccl': NCCL weight "
                              "transport: no CUDA device visible", errors[0])

        # Nothing was broadcast, every worker pulled, and no epoch loop:
        # at most one failed epoch per member, no stream of re-sends.
        trainer = scrape_metrics(self.ready["trainer"]["metrics_address"])
        self.assertEqual(metric_sum(trainer, "tandem_weight_sync_bytes_total",
                                    direction="sent", transport="broadcast"),
                         0)
        self.assertEqual(metric_sum(
            trainer, "tandem_weight_sync_aborted_collectives_total"), 1)
        for name, info in workers.items():
            with self.subTest(worker=name):
                text = scrape_metrics(info["metrics_address"])
                self.assertEqual(metric_sum(
                    text, "tandem_weight_sync_bytes_total",
                    direction="received", transport="broadcast"), 0)
                self.assertGreater(metric_sum(
                    text, "tandem_weight_sync_bytes_total",
                    direction="received", transport="pull"), 0)
                self.assertLessEqual(metric_sum(
                    text, "tandem_weight_sync_aborted_collectives_total"), 1)
        coordinator = scrape_metrics(
            self.ready["coordinator"]["metrics_address"])
        resends = metric_sum(coordinator,
                             "tandem_weight_sync_resend_epochs_total")
        formed = metric_sum(coordinator,
                            "tandem_weight_sync_epochs_formed_total")
        print(f"{version} versions: {int(formed)} epochs formed, "
              f"{int(resends)} re-send epochs")
        # Only the trainer's failure report asks for a re-send, and it
        # fails once.
        self.assertLessEqual(resends, 1)
        # Epochs with a worker still trying: the one the trainer failed in
        # and at most one per worker (the one it gave up in); each may be
        # followed by a trainer-only epoch. (The loop check is above.)
        self.assertLessEqual(formed, 2 * (1 + len(WORKERS)))


if __name__ == "__main__":
    unittest.main()
