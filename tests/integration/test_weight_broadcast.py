"""Weight sync by broadcast across real daemons (tandem-local on loopback):
the trainer broadcasts every version to the rollout workers of the current
membership epoch over Gloo; the coordinator forms epochs; when a worker is
killed, the broadcast that fails on it is re-sent to the survivor in the
next epoch, and the killed worker's restarted successor catches up by pull
and joins a later epoch.

The tests share one cluster and run in the order of their names."""

import datetime
import os
import signal
import tempfile
import unittest

import harness
from harness import metric_sum, scrape_metrics

import re

BROADCAST_TIMEOUT_S = 3.0  # weight_sync.timeout_ms below


def write_configs(directory, checkpoints):
    files = {
        # A killed worker stays a member until a broadcast fails on it
        # (not expired first): heartbeat_timeout_ms is long.
        "coordinator.yaml": """heartbeat_interval_ms: 200
heartbeat_timeout_ms: 15000
weight_sync:
  broadcast: true
  report_timeout_ms: 2000
  regroup_wait_ms: 200
""",
        "rollout.yaml": """engine:
  max_num_seqs: 8
weight_sync:
  mode: broadcast
  timeout_ms: 3000
""",
        # A held-out evaluation after every version spaces the versions
        # out, so that a re-send after a failed broadcast is not overtaken
        # by the next version.
        "trainer.yaml": f"""checkpoint_dir: {checkpoints}
weight_sync:
  broadcast: true
  timeout_ms: 3000
eval:
  every_versions: 1
  problems: 64
""",
        "verifier.yaml": "worker_threads: 1\n",
    }
    harness.write_files(directory, files)


cluster = harness.cluster_status
worker = harness.worker_status
as_int = harness.as_int


def log_time(line):
    return datetime.datetime.strptime(line[:23], "%Y-%m-%d %H:%M:%S.%f").replace(
        tzinfo=datetime.timezone.utc).timestamp()


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
        cls.launcher.shutdown(cls.config_dir)

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
        try:
            status, seen = harness.wait_settled(
                self.coordinator,
                {name: info["grpc_address"]
                 for name, info in self.workers().items()},
                180, quiet_queues=True)
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
                self.assertEqual(w["weightSyncTransport"], "broadcast")
                self.assertEqual(as_int(w, "broadcastEpoch"),
                                 as_int(status["broadcastGroup"], "epoch"))
        trainer_metrics = self.ready["trainer"]["metrics_address"]
        text = scrape_metrics(trainer_metrics)
        # eval.every_versions 1: the trainer evaluated the held-out problems
        # (through the engine) at the versions it published, without error.
        self.assertGreaterEqual(
            metric_sum(text, "tandem_trainer_heldout_policy_version"), 1)
        self.assertNotIn("held-out evaluation of version",
                         self.launcher.log("trainer"))
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
                metrics = scrape_metrics(info["metrics_address"])
                self.assertGreater(metric_sum(
                    metrics, "tandem_weight_sync_bytes_total",
                    direction="received", transport="broadcast"), 0)
                # Every version carried a SHA-256 and matched it (the
                # broadcast ones against the trainer's GetManifest).
                self.assertEqual(metric_sum(
                    metrics, "tandem_weight_sync_digest_mismatches_total"), 0)
                self.assertEqual(metric_sum(
                    metrics, "tandem_weight_sync_unsigned_versions_total"), 0)

    def settle(self, names):
        """Waits until the coordinator's latest version is stable across two
        snapshots and every named worker holds it; returns (cluster status,
        {name: worker status})."""
        try:
            return harness.wait_settled(
                self.coordinator,
                lambda: {name: self.launcher.ready(name)["grpc_address"]
                         for name in names},
                120, quiet_queues=True, gap=0.5, interval=0.2)
        except AssertionError:
            self.dump()
            raise

    def pause(self, info):
        harness.tandemctl_json("worker", "pause", "--address",
                               info["grpc_address"])

    def resume(self, info):
        harness.tandemctl_json("worker", "resume", "--address",
                               info["grpc_address"])

    def test_2_killed_worker_does_not_stop_the_others_and_rejoins(self):
        # The version whose broadcast fails on the killed worker is re-sent
        # to the survivor in epoch e+1 (by broadcast, well before the next
        # publish), the survivor's weights equal the trainer's, and the
        # killed worker's successor catches up by pull and rejoins.
        victim = self.launcher.ready("rollout-0")
        survivor = self.launcher.ready("rollout-1")
        survivor_id = worker(survivor["grpc_address"])["memberId"]
        victim_id = worker(victim["grpc_address"])["memberId"]
        # Quiet cluster: both paused, nothing being broadcast.
        self.pause(victim)
        self.pause(survivor)
        before, _ = self.settle(["rollout-0", "rollout-1"])
        version_before = as_int(before, "policyVersion")
        epoch_before = as_int(before["broadcastGroup"], "epoch")
        self.assertEqual(len(before["broadcastGroup"]["memberIds"]), 3)
        def pulled_bytes():
            return metric_sum(scrape_metrics(survivor["metrics_address"]),
                              "tandem_weight_sync_bytes_total",
                              direction="received", transport="pull")
        pulled_before = pulled_bytes()
        os.kill(victim["pid"], signal.SIGKILL)
        # The survivor's samples make the trainer publish; pause it again
        # as soon as one group is complete, so that the trainer publishes
        # the version that fails and (normally) no other for a while.
        completed = as_int(before.get("counters", {}), "groupsCompleted")
        self.resume(survivor)
        try:
            harness.wait_for(
                lambda: as_int(cluster(self.coordinator).get("counters", {}),
                               "groupsCompleted") > completed,
                60, "a group from the survivor", interval=0.05)
        finally:
            self.pause(survivor)

        failed_re = re.compile(r"broadcast of version (\d+) to epoch (\d+) "
                               r"\(2 receivers\) failed")

        def failure():
            for line in self.launcher.log("trainer").splitlines():
                m = failed_re.search(line)
                if m and int(m.group(1)) > version_before:
                    return log_time(line), int(m.group(1)), int(m.group(2))
            return None
        try:
            failed_at, failed_version, failed_epoch = harness.wait_for(
                failure, 60, "the trainer's broadcast to fail on the killed "
                "worker", interval=0.2)
        except AssertionError:
            self.dump()
            raise
        self.assertEqual(failed_epoch, epoch_before)
        resend_epoch = epoch_before + 1
        # The restarted worker may already be caught up and in it too.
        resent_re = re.compile(
            rf"weight broadcast epoch {resend_epoch} re-sends version "
            rf"{failed_version} after epoch {epoch_before} failed: "
            rf"\d+ receivers \((.*)\)")
        # Normally the failed version itself is re-sent; when the trainer
        # publishes a newer version before the re-send epoch forms (a loaded
        # machine), that publish forms epoch e+1 with the same survivors and
        # sends the newer version in full instead. Either way the survivor
        # gets it by broadcast in e+1, without pulling.
        received_re = re.compile(
            rf"received version (\d+) by broadcast, the first of "
            rf"epoch {resend_epoch} \(full")

        def received():
            for line in self.launcher.log("rollout-1").splitlines():
                m = received_re.search(line)
                if m:
                    return log_time(line), int(m.group(1))
            return None
        try:
            received_at, received_version = harness.wait_for(
                received, 30, f"the survivor to receive version "
                f"{failed_version} or newer by broadcast in epoch "
                f"{resend_epoch}", interval=0.2)
        except AssertionError:
            self.dump()
            raise
        self.assertGreaterEqual(received_version, failed_version)
        # It waited for the re-send instead of pulling the version.
        self.assertEqual(pulled_bytes(), pulled_before)
        if received_version == failed_version:
            resent = [m.group(1).split(", ") for m in map(
                resent_re.search,
                self.launcher.log("coordinator").splitlines()) if m]
            self.assertTrue(resent, f"the coordinator did not re-send "
                            f"version {failed_version} in epoch "
                            f"{resend_epoch}")
            self.assertIn(survivor_id, resent[0])
            self.assertNotIn(victim_id, resent[0])
            self.assertIn(f"re-sent version {failed_version} in broadcast "
                          f"epoch {resend_epoch}",
                          self.launcher.log("trainer"))
        print(f"survivor received version {received_version} (failed: "
              f"{failed_version}) by broadcast in epoch {resend_epoch} "
              f"{received_at - failed_at:.2f}s after the failed broadcast in "
              f"epoch {epoch_before}")
        self.assertLess(received_at - failed_at, BROADCAST_TIMEOUT_S)
        # The killed worker's successor (new pid, new member id) is started
        # by the launcher; pause it too, so that versions settle: the
        # survivor then holds the latest version, by broadcast, with the
        # trainer's digest, in an epoch without the killed worker.
        def restarted():
            info = self.launcher.ready("rollout-0")
            return info if info and info["pid"] != victim["pid"] else None
        new = harness.wait_for(restarted, 30, "launcher to restart rollout-0")
        self.pause(new)
        status, seen = self.settle(["rollout-1"])
        group = status["broadcastGroup"]
        self.assertNotIn(victim_id, group["memberIds"])
        w = seen["rollout-1"]
        self.assertEqual(w["weightsDigest"], status["weightsDigest"])
        self.assertEqual(w["weightSyncTransport"], "broadcast")
        self.assertEqual(as_int(w, "broadcastEpoch"), as_int(group, "epoch"))
        self.assertGreaterEqual(as_int(group, "epoch"), resend_epoch)
        self.assertGreaterEqual(as_int(w, "receivedPolicyVersion"),
                                failed_version)
        self.resume(survivor)
        self.resume(new)

        # The restarted worker catches up by pull and then joins a later
        # epoch with the survivor.
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
