"""Multi-node: every daemon on its own network namespace (its own address
on one bridge, as on separate nodes of a LAN), so that the control plane
(gRPC), the weight broadcast (the trainer's rendezvous store, Gloo pairs)
and the catch-up pulls all cross namespaces; then one rollout worker's
node is cut off in the middle of a broadcast (its link down) and
restored (issue 24, item 3).

Checks:
- every member registers with its node's address, the two workers form a
  broadcast epoch with the trainer and receive versions by broadcast;
- with the worker's link slowed to 2 Mbit/s (so a broadcast to it takes
  seconds) and then cut, the trainer's broadcast to that epoch fails, and
  the policy version goes on advancing while the node is away, with the
  other worker on the latest weights;
- once the link is back, the cut-off worker holds the latest version and
  joins a broadcast epoch again;
- no group was trained twice (the trainer's steps name each group once)
  and no group was counted lost.

Needs root, iproute2 and nftables (the test skips with the reason
otherwise). Run by ctest as integration_multinode; alone:
    python3 tests/integration/test_multinode.py"""

import collections
import os
import shutil
import tempfile
import time
import unittest

import harness
import netns
from harness import as_int, metric_sum, scrape_metrics

CONFIG = os.path.join(os.path.dirname(__file__), "config")
NODES = ("coordinator", "verifier", "trainer", "rollout-0", "rollout-1")
SUBNET = "10.234.0"
BROADCAST_TIMEOUT_MS = 4000
class MultiNodeTest(unittest.TestCase):

    @classmethod
    def setUpClass(cls):
        why = netns.available()
        if why:
            raise unittest.SkipTest(why)
        cls.tmp = tempfile.mkdtemp(prefix="tandem-multinode-")
        cls.daemons = {}
        cls.lan = netns.Lan("tmn", NODES, SUBNET)
        try:
            coordinator = cls.start("coordinator", [
                "--config", os.path.join(CONFIG, "coordinator.yaml"),
                "--set", f"journal.dir={os.path.join(cls.tmp, 'journal')}"])
            cls.coordinator = coordinator.wait_ready()["grpc_address"]
            member = ["--set", f"coordinator_address={cls.coordinator}",
                      "--set", f"weight_sync.timeout_ms={BROADCAST_TIMEOUT_MS}"]
            cls.start("verifier", member[:2]).wait_ready()
            cls.start("trainer", [
                *member, "--set", "log.level=debug", "--set",
                f"checkpoint_dir={os.path.join(cls.tmp, 'checkpoints')}"])
            for worker in ("rollout-0", "rollout-1"):
                cls.start(worker, [
                    "--config", os.path.join(CONFIG, "rollout.yaml"), *member,
                    "--set", "weight_sync.mode=broadcast"])
            cls.info = {name: d.wait_ready(timeout=60)
                        for name, d in cls.daemons.items()}
        except BaseException:
            cls.stop_all()
            raise

    @classmethod
    def start(cls, node, extra):
        d = harness.Daemon(node.split("-")[0], cls.tmp, extra, name=node,
                           host=cls.lan.address(node),
                           prefix=cls.lan.prefix(node))
        cls.daemons[node] = d
        return d

    @classmethod
    def stop_all(cls):
        for d in reversed(list(cls.daemons.values())):
            d.stop()
        cls.lan.teardown()
        if os.environ.get("TANDEM_KEEP_TEST_DIR"):
            print("kept", cls.tmp)
        else:
            shutil.rmtree(cls.tmp, ignore_errors=True)

    @classmethod
    def tearDownClass(cls):
        cls.stop_all()

    def dump(self):
        for name, d in self.daemons.items():
            print(f"==== {name} log (tail)")
            print(d.output()[-3000:])

    def status(self):
        return harness.cluster_status(self.coordinator)

    def version(self):
        return as_int(self.status(), "policyVersion")

    def worker(self, name):
        return harness.worker_status(self.info[name]["grpc_address"])

    def broadcast_bytes(self, name):
        return metric_sum(scrape_metrics(self.info[name]["metrics_address"]),
                          "tandem_weight_sync_bytes_total",
                          direction="received", transport="broadcast")

    def wait_epoch_of_both(self, timeout, what):
        def both():
            status = self.status()
            members = status.get("broadcastGroup", {}).get("memberIds", [])
            return len(members) == 3 and status
        return harness.wait_for(both, timeout, what, interval=0.25)

    def test_broadcast_and_catch_up_across_nodes_with_a_cut(self):
        try:
            self.run_scenario()
        except AssertionError:
            self.dump()
            raise

    def run_scenario(self):
        # 1. Every member sits on its node's address; both workers join an
        # epoch and receive versions by broadcast across namespaces.
        for name, info in self.info.items():
            self.assertTrue(info["grpc_address"].startswith(
                self.lan.address(name) + ":"), (name, info))
        self.wait_epoch_of_both(180, "an epoch of both workers")
        harness.wait_for(lambda: self.version() >= 3, 120, "version 3")
        for name in ("rollout-0", "rollout-1"):
            harness.wait_for(lambda: self.broadcast_bytes(name) > 0, 60,
                             f"{name} to receive by broadcast")
        print(f"every daemon on its own node; version {self.version()}, "
              "both workers receive by broadcast", flush=True)

        # 2. Slow rollout-1's link so that a broadcast to it takes seconds,
        # wait for a publish, then cut the node off inside that broadcast.
        trainer_log_before = len(self.daemons["trainer"].output())
        self.lan.fault("rollout-1", "slow")
        v = self.version()
        harness.wait_for(lambda: self.version() > v, 60, "a publish")
        time.sleep(0.3)
        self.lan.fault("rollout-1", "partition")
        cut_at = self.version()
        print(f"rollout-1 cut off at version {cut_at}", flush=True)
        # The run goes on without it: versions advance and rollout-0 holds
        # them.
        harness.wait_for(lambda: self.version() >= cut_at + 3, 90,
                         "versions to advance with rollout-1 cut off")
        away = self.version()
        harness.wait_for(
            lambda: as_int(self.worker("rollout-0"),
                           "receivedPolicyVersion") >= away, 60,
            f"rollout-0 to hold version {away} while rollout-1 is away")
        failed = [line for line in
                  self.daemons["trainer"].output()[trainer_log_before:]
                  .splitlines() if "broadcast of version" in line and
                  "failed" in line]
        self.assertTrue(failed, "no broadcast failed: the cut did not land "
                        "inside a broadcast or rendezvous")
        print(f"versions {cut_at} -> {away} while away; trainer: "
              f"{failed[0][:200]}", flush=True)

        # 3. Restore the link: rollout-1 catches up and joins an epoch again.
        self.lan.heal("rollout-1")
        restored = time.monotonic()
        received_before = self.broadcast_bytes("rollout-1")
        target = self.version()
        harness.wait_for(
            lambda: as_int(self.worker("rollout-1"),
                           "receivedPolicyVersion") >= target, 90,
            f"rollout-1 to hold version {target} after the link is back")
        caught_up = time.monotonic() - restored
        self.wait_epoch_of_both(120, "an epoch of both workers again")
        harness.wait_for(
            lambda: self.broadcast_bytes("rollout-1") > received_before, 90,
            "rollout-1 to receive by broadcast again")
        print(f"rollout-1 held version {target} {caught_up:.1f} s after "
              "the link came back, and receives by broadcast again",
              flush=True)

        # 4. Exactly once: no group in two steps, none counted lost.
        groups = harness.group_ids(
            harness.steps_of(self.daemons["trainer"].output()))
        twice = [g for g, k in collections.Counter(groups).items() if k > 1]
        counters = self.status().get("counters", {})
        print(f"groups trained {len(groups)}, trained twice {len(twice)}, "
              f"lost {as_int(counters, 'groupsLost')}", flush=True)
        self.assertGreater(len(groups), 0)
        self.assertEqual(twice, [])
        self.assertEqual(as_int(counters, "groupsLost"), 0)


if __name__ == "__main__":
    unittest.main(verbosity=2)
