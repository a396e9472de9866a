"""Weight-sync sockets follow each daemon's grpc_address by default.

In docker-compose and Kubernetes every daemon binds gRPC on its own
container or pod IP. The trainer's rendezvous store and Gloo pairs, and the
rollout workers' Gloo pairs, must bind and advertise that IP too, or the
other containers cannot reach them and every version silently goes by pull.
Here each daemon gets its own loopback address (127.0.0.2 for the trainer,
127.0.0.3 for the worker) and no weight_sync host setting: the trainer must
advertise its store on 127.0.0.2, and the worker must receive versions by
broadcast with the trainer's digest."""

import os
import shutil
import tempfile
import unittest

import harness
from harness import metric_sum, scrape_metrics

CONFIG = os.path.join(os.path.dirname(__file__), "config")
TRAINER_HOST = "127.0.0.2"
WORKER_HOST = "127.0.0.3"


class WeightSyncHostsTest(unittest.TestCase):

    @classmethod
    def setUpClass(cls):
        cls.tmp = tempfile.mkdtemp(prefix="tandem-sync-hosts-")
        cls.daemons = []
        try:
            coordinator = cls.start(
                "coordinator",
                ["--config", os.path.join(CONFIG, "coordinator.yaml")])
            cls.coordinator = coordinator.wait_ready()["grpc_address"]
            member = ["--set", f"coordinator_address={cls.coordinator}"]
            cls.start("verifier", member).wait_ready()
            cls.trainer = cls.start(
                "trainer",
                [*member, "--set",
                 f"checkpoint_dir={os.path.join(cls.tmp, 'checkpoints')}"],
                host=TRAINER_HOST)
            cls.trainer_info = cls.trainer.wait_ready()
            cls.worker = cls.start(
                "rollout",
                ["--config", os.path.join(CONFIG, "rollout.yaml"), *member,
                 "--set", "weight_sync.mode=broadcast"],
                host=WORKER_HOST)
            cls.worker_info = cls.worker.wait_ready(timeout=60)
        except BaseException:
            cls.stop_all()
            raise

    @classmethod
    def start(cls, daemon, extra, host="127.0.0.1"):
        d = harness.Daemon(daemon, cls.tmp, extra, host=host)
        cls.daemons.append(d)
        return d

    @classmethod
    def stop_all(cls):
        for d in reversed(cls.daemons):
            d.stop()
        shutil.rmtree(cls.tmp, ignore_errors=True)

    @classmethod
    def tearDownClass(cls):
        cls.stop_all()

    def dump(self):
        for d in self.daemons:
            print(f"==== {d.log_path} (tail)")
            print(d.output()[-3000:])

    def test_broadcast_binds_the_grpc_host(self):
        self.assertTrue(
            self.trainer_info["grpc_address"].startswith(TRAINER_HOST + ":"),
            self.trainer_info)
        store_lines = [line for line in self.trainer.output().splitlines()
                       if "weight broadcast rendezvous store on" in line]
        self.assertEqual(len(store_lines), 1, self.trainer.output()[-3000:])
        self.assertIn(f"rendezvous store on {TRAINER_HOST}:", store_lines[0])

        def group_formed():
            status = harness.cluster_status(self.coordinator)
            group = status.get("broadcastGroup", {})
            return (harness.as_int(status, "policyVersion") >= 2 and
                    len(group.get("memberIds", [])) == 2 and
                    group.get("storeAddress", "").startswith(
                        TRAINER_HOST + ":"))
        try:
            harness.wait_for(group_formed, 180,
                             "a broadcast group on the trainer's host",
                             interval=0.2)
            harness.tandemctl_json("worker", "pause", "--address",
                                   self.worker_info["grpc_address"])
            status, seen = harness.wait_settled(
                self.coordinator,
                {"rollout": self.worker_info["grpc_address"]}, 180,
                quiet_queues=True)
        except AssertionError:
            self.dump()
            raise
        self.assertEqual(seen["rollout"]["weightsDigest"],
                         status.get("weightsDigest"))
        self.assertEqual(seen["rollout"]["weightSyncTransport"], "broadcast")
        received = metric_sum(
            scrape_metrics(self.worker_info["metrics_address"]),
            "tandem_weight_sync_bytes_total", direction="received",
            transport="broadcast")
        self.assertGreater(received, 0)


if __name__ == "__main__":
    unittest.main()
