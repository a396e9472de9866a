"""`engine.update_mode: inplace` across real daemons: a coordinator,
trainer and verifier (tandem-local) with one rollout worker receiving by
broadcast, plus a second rollout worker started beside them that pulls.
Both hold one copy of the weights and receive every version straight into
it while the engine is parked. After several versions each worker holds the
trainer's latest weights (same digest as the published manifest), both
transports carried versions, and the samples the workers produced carry
per-token policy versions that never go down.

The tests share one cluster and run in the order of their names."""

import os
import sys
import tempfile
import unittest

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import harness  # noqa: E402
from harness import metric_sum, scrape_metrics  # noqa: E402

import grpc  # noqa: E402

STUB_DIR = harness.proto_stubs("common.proto", "coordinator.proto")
from tandem.v1 import coordinator_pb2 as pb  # noqa: E402

ROLLOUT_INPLACE = """engine:
  max_num_seqs: 8
  update_mode: inplace
weight_sync:
  mode: {mode}
  timeout_ms: 3000
"""


def write_configs(directory):
    files = {
        "coordinator.yaml": """heartbeat_interval_ms: 200
heartbeat_timeout_ms: 1500
weight_sync:
  broadcast: true
  report_timeout_ms: 2000
""",
        "rollout.yaml": ROLLOUT_INPLACE.format(mode="broadcast"),
        "rollout-pull.yaml": ROLLOUT_INPLACE.format(mode="pull"),
        "trainer.yaml": f"""checkpoint_dir: {directory}/checkpoints
weight_sync:
  broadcast: true
  timeout_ms: 3000
""",
        "verifier.yaml": "worker_threads: 1\n",
    }
    harness.write_files(directory, files)


cluster = harness.cluster_status
worker = harness.worker_status
as_int = harness.as_int


def pull_one_group(address):
    """Takes one scored group from the coordinator's ready queue (as a
    trainer would, without committing it: the coordinator hands it out again
    after its batch timeout)."""
    with grpc.insecure_channel(address) as channel:
        pull = channel.unary_unary(
            "/tandem.v1.Coordinator/PullTrainingBatch",
            request_serializer=pb.PullTrainingBatchRequest.SerializeToString,
            response_deserializer=pb.PullTrainingBatchResponse.FromString)
        response = pull(pb.PullTrainingBatchRequest(
            member_id="inplace-test", max_tokens=1, wait_ms=500), timeout=5)
    return list(response.groups)


class InplaceWeightsTest(unittest.TestCase):

    @classmethod
    def setUpClass(cls):
        cls.config_dir = tempfile.mkdtemp(prefix="tandem-inplace-config-")
        write_configs(cls.config_dir)
        cls.launcher = harness.Launcher(rollout_workers=1,
                                        config_dir=cls.config_dir)
        cls.ready = cls.launcher.wait_all_ready()
        cls.coordinator = cls.ready["coordinator"]["grpc_address"]
        cls.tmp = tempfile.mkdtemp(prefix="tandem-inplace-")
        cls.puller = harness.Daemon(
            "rollout", cls.tmp,
            ["--config", os.path.join(cls.config_dir, "rollout-pull.yaml"),
             "--set", f"coordinator_address={cls.coordinator}"],
            name="rollout-pull")
        cls.puller_info = cls.puller.wait_ready()

    @classmethod
    def tearDownClass(cls):
        cls.puller.stop()
        cls.launcher.shutdown(cls.config_dir, cls.tmp, STUB_DIR)

    def workers(self):
        return {"rollout-0": self.launcher.ready("rollout-0"),
                "rollout-pull": self.puller_info}

    def dump(self):
        for name in ("coordinator", "trainer", "rollout-0"):
            print(f"==== {name} log (tail)")
            print(self.launcher.log(name)[-4000:])
        print("==== rollout-pull log (tail)")
        print(self.puller.output()[-4000:])

    def test_1_samples_carry_monotone_per_token_versions(self):
        # While versions flow, take scored groups from the queue and check
        # the per-token versions of every sample of the in-place workers.
        ids = {name: worker(info["grpc_address"])["memberId"]
               for name, info in self.workers().items()}
        checked = {name: 0 for name in ids}
        versions_seen = set()
        mixed = 0

        def enough():
            nonlocal mixed
            for group in pull_one_group(self.coordinator):
                for scored in group.samples:
                    sample = scored.sample
                    name = next((n for n, i in ids.items()
                                 if i == sample.worker_id), None)
                    if name is None:
                        continue
                    spans = [s.policy_version for s in sample.version_spans
                             if s.num_tokens > 0]
                    self.assertEqual(
                        spans, sorted(spans),
                        f"{name}: sample {sample.sample_id} versions go down")
                    self.assertEqual(
                        sum(s.num_tokens for s in sample.version_spans),
                        len(sample.completion_token_ids))
                    checked[name] += 1
                    versions_seen.update(spans)
                    mixed += len(set(spans)) > 1
            return (all(n >= 8 for n in checked.values()) and
                    max(versions_seen, default=0) >= 3)
        try:
            harness.wait_for(enough, 180, "samples generated under several "
                             "in-place versions by both workers", interval=0.2)
        except AssertionError:
            print(checked, sorted(versions_seen))
            self.dump()
            raise
        print(f"checked {checked} samples; versions {sorted(versions_seen)}; "
              f"{mixed} samples span an update")

    def test_2_every_worker_holds_the_trainers_weights(self):
        def broadcasting():
            status = cluster(self.coordinator)
            return (as_int(status, "policyVersion") >= 4 and
                    len(status.get("broadcastGroup", {})
                        .get("memberIds", [])) == 2)
        try:
            harness.wait_for(broadcasting, 120,
                             "the broadcast worker in the group", interval=0.2)
        except AssertionError:
            self.dump()
            raise
        # Paused workers make no samples, so the trainer stops publishing;
        # then both must hold the last version with the manifest's digest.
        for info in self.workers().values():
            harness.tandemctl_json("worker", "pause", "--address",
                                   info["grpc_address"])
        try:
            status, seen = harness.wait_settled(
                self.coordinator,
                {name: info["grpc_address"]
                 for name, info in self.workers().items()}, 180)
        except AssertionError:
            self.dump()
            raise
        finally:
            for info in self.workers().values():
                harness.tandemctl_json("worker", "resume", "--address",
                                       info["grpc_address"])
        digest = status.get("weightsDigest")
        self.assertTrue(digest)
        self.assertGreaterEqual(as_int(status, "policyVersion"), 4)
        for name, w in seen.items():
            with self.subTest(worker=name):
                self.assertEqual(w["weightsDigest"], digest)
        self.assertEqual(seen["rollout-0"]["weightSyncTransport"], "broadcast")
        self.assertEqual(seen["rollout-pull"]["weightSyncTransport"], "pull")

        # Resumed, the engines take the held version at their next step.
        def engines_live():
            return all(as_int(worker(info["grpc_address"]), "policyVersion")
                       >= as_int(status, "policyVersion")
                       for info in self.workers().values())
        harness.wait_for(engines_live, 30, "engines on the latest version",
                         interval=0.2)

        for name, info in self.workers().items():
            with self.subTest(worker=name):
                text = scrape_metrics(info["metrics_address"])
                received = {t: metric_sum(
                    text, "tandem_weight_sync_bytes_total",
                    direction="received", transport=t)
                    for t in ("pull", "broadcast")}
                pauses = metric_sum(
                    text, "tandem_rollout_weight_update_pause_seconds_count")
                pause_s = metric_sum(
                    text, "tandem_rollout_weight_update_pause_seconds_sum")
                print(f"{name}: received {received}, {int(pauses)} parks, "
                      f"mean pause {1000 * pause_s / max(pauses, 1):.2f} ms")
                self.assertGreater(pauses, 0)
                # rollout-0 may have joined the group holding its initial
                # weights (v0) and then received everything by broadcast.
                self.assertGreater(received["broadcast" if name == "rollout-0"
                                            else "pull"], 0)
        log = self.launcher.log("rollout-0")
        self.assertIn("update_mode inplace: one copy of the weights", log)
        self.assertNotIn("live weights lost", log)


if __name__ == "__main__":
    unittest.main(verbosity=2)
