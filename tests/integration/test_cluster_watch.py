"""WatchCluster across real daemons (tandem-local on loopback, two rollout
workers by broadcast): `tandemctl watch` prints the snapshot and then every
new policy version and broadcast epoch as JSON lines; the coordinator's
tandem_coordinator_cluster_watchers gauge counts its stream and drops when
it is interrupted; an idle broadcast worker asks the coordinator about its
group about once a second instead of every 50 ms; an unknown member id is
refused with NOT_FOUND; on Ctrl-C of the cluster the watch gets a shutdown
event and exits 0.

The tests share one cluster and run in the order of their names."""

import json
import os
import queue
import signal
import subprocess
import tempfile
import threading
import time
import unittest

import harness
from harness import metric_sum, scrape_metrics

cluster = harness.cluster_status
as_int = harness.as_int


def write_configs(directory, checkpoints):
    harness.write_files(directory, {
        "coordinator.yaml": "heartbeat_interval_ms: 200\n",
        "rollout.yaml": """engine:
  max_num_seqs: 8
weight_sync:
  mode: broadcast
""",
        "trainer.yaml": f"checkpoint_dir: {checkpoints}\ncheckpoint_every: 0\n",
        "verifier.yaml": "worker_threads: 1\n",
    })


class Watch:
    """`tandemctl watch` as a subprocess; its JSON lines arrive on a queue."""

    def __init__(self, coordinator, *extra):
        self.process = subprocess.Popen(
            [harness.binary("tandemctl"), "watch", "--coordinator",
             coordinator, *extra],
            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        self.events = queue.Queue()
        self.reader = threading.Thread(target=self._read, daemon=True)
        self.reader.start()

    def _read(self):
        for line in self.process.stdout:
            self.events.put(json.loads(line))
        self.events.put(None)  # end of stream

    def close(self):
        """Waits for the process and releases its pipes."""
        code = self.process.wait(timeout=10)
        self.reader.join(timeout=10)
        self.process.stdout.close()
        self.process.stderr.close()
        return code

    def next(self, timeout):
        return self.events.get(timeout=timeout)

    def wait_for(self, predicate, timeout, what):
        deadline = time.monotonic() + timeout
        seen = []
        while time.monotonic() < deadline:
            try:
                event = self.next(max(0.01, deadline - time.monotonic()))
            except queue.Empty:
                break
            if event is None:
                break
            seen.append(event)
            if predicate(event):
                return event, seen
        raise AssertionError(f"no {what} within {timeout}s; saw {seen}")


def version_of(event):
    return int(event["policy_version"]["manifest"].get("policy_version", 0))


def epoch_of(event):
    return int(event["membership_epoch"]["group"].get("epoch", 0))


class ClusterWatchTest(unittest.TestCase):

    @classmethod
    def setUpClass(cls):
        cls.config_dir = tempfile.mkdtemp(prefix="tandem-watch-config-")
        write_configs(cls.config_dir,
                      os.path.join(cls.config_dir, "checkpoints"))
        cls.launcher = harness.Launcher(rollout_workers=2,
                                        config_dir=cls.config_dir)
        cls.ready = cls.launcher.wait_all_ready()
        cls.coordinator = cls.ready["coordinator"]["grpc_address"]
        cls.coordinator_metrics = cls.ready["coordinator"]["metrics_address"]
        cls.watch = None

    @classmethod
    def tearDownClass(cls):
        cls.launcher.shutdown(cls.config_dir)

    def watchers(self):
        return metric_sum(scrape_metrics(self.coordinator_metrics),
                          "tandem_coordinator_cluster_watchers")

    def workers(self):
        return {name: self.launcher.ready(name)
                for name in ("rollout-0", "rollout-1")}

    def dump(self):
        for name in ("coordinator", "trainer", "rollout-0", "rollout-1"):
            print(f"==== {name} log (tail)")
            print(self.launcher.log(name)[-3000:])

    def test_1_watch_prints_snapshot_then_new_versions_and_epochs(self):
        # Both workers in one epoch at version >= 2: then the snapshot has
        # a version and an epoch.
        def both_in_group():
            status = cluster(self.coordinator)
            return (as_int(status, "policyVersion") >= 2 and len(
                status.get("broadcastGroup", {}).get("memberIds", [])) == 3)
        try:
            harness.wait_for(both_in_group, 120, "a group of both workers",
                             interval=0.2)
        except AssertionError:
            self.dump()
            raise
        # The trainer and both workers watch as members.
        try:
            harness.wait_for(lambda: self.watchers() == 3, 10,
                             "three member streams")
        except AssertionError:
            print("watchers:", self.watchers())
            self.dump()
            raise
        watch = Watch(self.coordinator)
        first = watch.next(10)
        second = watch.next(10)
        self.assertIn("policy_version", first)
        self.assertIn("membership_epoch", second)
        snapshot_version = version_of(first)
        self.assertGreaterEqual(snapshot_version, 2)
        self.assertGreaterEqual(epoch_of(second), 1)
        self.assertEqual(len(second["membership_epoch"]["group"]["member_ids"]),
                         3)
        harness.wait_for(lambda: self.watchers() == 4, 10, "the watch stream")
        # Training goes on: the next versions arrive, in order.
        event, _ = watch.wait_for(
            lambda e: "policy_version" in e and
            version_of(e) >= snapshot_version + 2, 120, "two more versions")
        status = cluster(self.coordinator)
        self.assertLessEqual(version_of(event),
                             as_int(status, "policyVersion"))
        # Interrupted, its stream is cleaned up.
        watch.process.send_signal(signal.SIGINT)
        watch.close()
        harness.wait_for(lambda: self.watchers() == 3, 10,
                         "the cancelled stream to go")

    def test_2_idle_worker_asks_about_its_group_about_once_a_second(self):
        # Paused workers generate nothing, so the trainer stops publishing:
        # the idle cluster's only SyncWeightGroup calls are the workers'
        # fallback polls (1 s) - 20 per second each if they polled at 50 ms.
        for info in self.workers().values():
            harness.tandemctl_json("worker", "pause", "--address",
                                   info["grpc_address"])
        try:
            harness.wait_settled(
                self.coordinator,
                {n: i["grpc_address"] for n, i in self.workers().items()},
                180, quiet_queues=True, gap=0.5)
            window = 5.0
            before = metric_sum(scrape_metrics(self.coordinator_metrics),
                                "tandem_coordinator_weight_group_syncs_total")
            time.sleep(window)
            after = metric_sum(scrape_metrics(self.coordinator_metrics),
                               "tandem_coordinator_weight_group_syncs_total")
        finally:
            for info in self.workers().values():
                harness.tandemctl_json("worker", "resume", "--address",
                                       info["grpc_address"])
        per_worker = (after - before) / window / 2
        print(f"idle SyncWeightGroup calls: {per_worker:.2f}/s per worker")
        self.assertGreater(per_worker, 0.3)
        self.assertLess(per_worker, 3.0)

    def test_3_unknown_member_is_refused_with_not_found(self):
        out = subprocess.run(
            [harness.binary("tandemctl"), "watch", "--coordinator",
             self.coordinator, "--member-id", "rollout-999"],
            capture_output=True, text=True, timeout=15)
        self.assertEqual(out.returncode, 1)
        self.assertIn("'rollout-999' is not registered", out.stderr)
        self.assertEqual(out.stdout, "")

    def test_4_cluster_stop_sends_shutdown_and_the_watch_exits_0(self):
        watch = Watch(self.coordinator)
        watch.next(10)  # the snapshot is there: the stream is open
        harness.wait_for(lambda: self.watchers() == 4, 10, "the watch stream")
        code = self.launcher.stop()
        self.assertEqual(code, 0, self.launcher.launcher_output())
        event, _ = watch.wait_for(lambda e: "shutdown" in e, 30,
                                  "a shutdown event")
        self.assertEqual(event["shutdown"]["reason"],
                         "coordinator is shutting down")
        self.assertEqual(watch.process.wait(timeout=10), 0,
                         watch.process.stderr.read())
        watch.close()


if __name__ == "__main__":
    unittest.main(verbosity=2)
