"""Weight sync by broadcast across real daemons (tandem-local on loopback):
the trainer broadcasts every version to the rollout workers of the current
membership epoch over Gloo; the coordinator forms epochs; a killed worker
does not stop the others, and its restarted successor catches up by pull
and joins a later epoch.

The tests share one cluster and run in the order of their names."""

import datetime
import os
import shutil
import signal
import tempfile
import time
import unittest

import harness
from harness import metric_sum, scrape_metrics

BROADCAST_TIMEOUT_S = 3.0  # weight_sync.timeout_ms below


def write_configs(directory, checkpoints):
    files = {
        "coordinator.yaml": """heartbeat_interval_ms: 200
heartbeat_timeout_ms: 1500
weight_sync:
  broadcast: true
  report_timeout_ms: 2000
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
    for name, text in files.items():
        with open(os.path.join(directory, name), "w") as f:
            f.write(text)


def cluster(address):
    return harness.tandemctl_json("status", "--coordinator", address)


def worker(address):
    return harness.tandemctl_json("worker", "status", "--address", address)



def log_time(line):
    return datetime.datetime.strptime(line[:23], "%Y-%m-%d %H:%M:%S.%f").replace(
        tzinfo=datetime.timezone.utc).timestamp()


def as_int(message, field):
    return int(message.get(field, 0))


class WeightBroadcastTest(unittest.TestCase):

    @classmethod
    def setUpClass(cls):
        cls.config_dir = tempfile.mkdtemp(prefix="tandem-bcast-config-")
        write_configs(cls.config_dir,
                      os.path.join(cls.config_dir, "checkpoints"))
        cls.launcher = harness.Launcher(rollout_workers=2,
                                        config_dir=cls.config_dir)
        cls.ready = cls.launcher.wait_all_ready()
        cls.coordinator = cls.ready["coordinator"]["grpc_address"]

    @classmethod
    def tearDownClass(cls):
        code = cls.launcher.stop()
        output = cls.launcher.launcher_output()
        if code != 0:
            output += "\n==== coordinator log (tail)\n" + \
                cls.launcher.log("coordinator")[-3000:]
        cls.launcher.cleanup()
        shutil.rmtree(cls.config_dir, ignore_errors=True)
        if code != 0:
            raise AssertionError(
                f"launcher exited {code} on Ctrl-C:\n{output}")

    def dump(self):
        for name in ("coordinator", "trainer", "rollout-0", "rollout-1"):
            print(f"==== {name} log (tail)")
            print(self.launcher.log(name)[-4000:])

    def workers(self):
        return {name: self.launcher.ready(name)
                for name in ("rollout-0", "rollout-1")}

    def test_1_every_worker_holds_the_trainers_weights_after_n_versions(self):
        # Both workers are in one epoch, and each, observed between two
        # coordinator snapshots of the same latest version (>= 4), holds
        # that version, received by broadcast, with the digest of the
        # trainer's published manifest.
        def both_in_group():
            status = cluster(self.coordinator)
            group = status.get("broadcastGroup", {})
            return (as_int(status, "policyVersion") >= 4 and
                    len(group.get("memberIds", [])) == 3)
        try:
            harness.wait_for(both_in_group, 120, "a group of both workers",
                             interval=0.2)
        except AssertionError:
            self.dump()
            raise
        # Pause both workers: no new samples, so the trainer runs out of
        # fresh groups and stops publishing; then every worker must hold
        # the last version, received by broadcast, with the digest of the
        # trainer's published manifest.
        for info in self.workers().values():
            harness.tandemctl_json("worker", "pause", "--address",
                                   info["grpc_address"])
        last = {}

        def settled():
            status = cluster(self.coordinator)
            version = as_int(status, "policyVersion")
            seen = {name: worker(info["grpc_address"])
                    for name, info in self.workers().items()}
            again = cluster(self.coordinator)
            last.update(status=status, workers=seen)
            if as_int(again, "policyVersion") != version:
                return None
            if all(as_int(w, "receivedPolicyVersion") == version
                   for w in seen.values()):
                return status, seen
            return None
        try:
            status, seen = harness.wait_for(
                settled, 180, "versions to settle with both workers on the "
                "latest", interval=0.5)
        except AssertionError:
            print(last)
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
                self.assertEqual(w["weightSyncTransport"], "broadcast")
                self.assertEqual(as_int(w, "broadcastEpoch"),
                                 as_int(status["broadcastGroup"], "epoch"))
        trainer_metrics = self.ready["trainer"]["metrics_address"]
        text = scrape_metrics(trainer_metrics)
        sent = metric_sum(
            text, "tandem_weight_sync_transfer_seconds_count",
            direction="sent", transport="broadcast")
        seconds = metric_sum(
            text, "tandem_weight_sync_transfer_seconds_sum",
            direction="sent", transport="broadcast")
        sent_bytes = metric_sum(
            text, "tandem_weight_sync_bytes_total",
            direction="sent", transport="broadcast")
        print(f"trainer broadcast {int(sent)} versions, "
              f"{sent_bytes / max(sent, 1) / 2**20:.2f} MiB each, "
              f"mean {1000 * seconds / max(sent, 1):.1f} ms per version "
              f"(to {len(seen)} receivers)")
        self.assertGreater(metric_sum(
            text, "tandem_weight_sync_bytes_total",
            direction="sent", transport="broadcast", kind="full"), 0)
        for name, info in self.workers().items():
            with self.subTest(worker=name):
                self.assertGreater(metric_sum(scrape_metrics(
                    info["metrics_address"]), "tandem_weight_sync_bytes_total",
                    direction="received", transport="broadcast"), 0)

    def test_2_killed_worker_does_not_stop_the_others_and_rejoins(self):
        victim = self.launcher.ready("rollout-0")
        survivor = self.launcher.ready("rollout-1")
        survivor_id = worker(survivor["grpc_address"])["memberId"]
        victim_id = worker(victim["grpc_address"])["memberId"]
        before = cluster(self.coordinator)
        epoch_before = as_int(before["broadcastGroup"], "epoch")
        os.kill(victim["pid"], signal.SIGKILL)
        killed = time.monotonic()
        killed_wall = time.time()

        # The survivor is in a later epoch without the victim (the
        # restarted worker may already be back in it) and receives new
        # versions by broadcast there.
        def survivor_in_next_epoch():
            status = cluster(self.coordinator)
            group = status.get("broadcastGroup", {})
            members = group.get("memberIds", [])
            if (as_int(group, "epoch") <= epoch_before or
                    survivor_id not in members or victim_id in members):
                return None
            w = worker(survivor["grpc_address"])
            if (as_int(w, "broadcastEpoch") == as_int(group, "epoch") and
                    w.get("weightSyncTransport") == "broadcast" and
                    as_int(w, "receivedPolicyVersion") >=
                    as_int(group, "firstPolicyVersion")):
                return time.monotonic() - killed, w
            return None
        try:
            elapsed, _ = harness.wait_for(
                survivor_in_next_epoch, 90,
                "survivor receiving by broadcast in a later epoch",
                interval=0.2)
        except AssertionError:
            self.dump()
            raise
        print(f"survivor seen back on broadcast {elapsed:.2f}s after the "
              "kill (upper bound: includes tandemctl calls)")
        # Exactly, from the survivor's own log: its first join of an epoch
        # after the kill.
        joins = [log_time(l) for l in
                 self.launcher.log("rollout-1").splitlines()
                 if "joined broadcast epoch" in l]
        rejoin = [t - killed_wall for t in joins if t > killed_wall]
        self.assertTrue(rejoin)
        print(f"survivor joined the next epoch {rejoin[0]:.2f}s after the "
              "kill")
        self.assertLess(rejoin[0], 30.0)

        # The restarted worker (new pid, new member id) catches up by pull
        # and then joins a later epoch with the survivor.
        def restarted():
            info = self.launcher.ready("rollout-0")
            return info if info and info["pid"] != victim["pid"] else None
        new = harness.wait_for(restarted, 30, "launcher to restart rollout-0")

        def rejoined():
            w = worker(new["grpc_address"])
            status = cluster(self.coordinator)
            group = status.get("broadcastGroup", {})
            members = group.get("memberIds", [])
            if (w.get("memberId") in members and survivor_id in members and
                    as_int(w, "broadcastEpoch") == as_int(group, "epoch") and
                    w.get("weightSyncTransport") == "broadcast"):
                return w
            return None
        try:
            w = harness.wait_for(rejoined, 120,
                                 "restarted rollout-0 back in the group",
                                 interval=0.2)
        except AssertionError:
            self.dump()
            raise
        self.assertGreater(metric_sum(scrape_metrics(
            new["metrics_address"]), "tandem_weight_sync_bytes_total",
            direction="received", transport="pull"), 0)
        self.assertGreater(as_int(w, "receivedPolicyVersion"), 0)
        # The survivor counted the aborted collective, or left without one
        # when the trainer's abort reached it first; either way the
        # coordinator heard of the failure or the expiry and moved on.
        self.assertIn("weight broadcast epoch",
                      self.launcher.log("coordinator"))


if __name__ == "__main__":
    unittest.main(verbosity=2)
