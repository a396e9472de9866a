"""The whole cluster from the launcher: every daemon serves, reports health
to an independent client, is scraped by a real Prometheus, and a killed
rollout worker is noticed by the coordinator and restarted by the launcher.

The tests share one cluster and run in the order of their names."""

import datetime
import json
import os
import signal
import subprocess
import time
import unittest

import harness

CONFIG_DIR = os.path.join(os.path.dirname(__file__), "config")
HEARTBEAT_TIMEOUT_S = 1.5  # config/coordinator.yaml


def cluster_status(address):
    out = subprocess.run(
        [harness.binary("tandemctl"), "status", "--coordinator", address,
         "--json"], capture_output=True, text=True, timeout=15, check=True)
    return json.loads(out.stdout)


class ClusterTest(unittest.TestCase):

    @classmethod
    def setUpClass(cls):
        cls.launcher = harness.Launcher(rollout_workers=2,
                                        config_dir=CONFIG_DIR)
        cls.ready = cls.launcher.wait_all_ready()
        cls.coordinator = cls.ready["coordinator"]["grpc_address"]

    @classmethod
    def tearDownClass(cls):
        cls.launcher.shutdown()

    def test_1_every_daemon_is_serving_to_an_independent_client(self):
        for name, info in self.ready.items():
            with self.subTest(daemon=name):
                status = harness.wait_for(
                    lambda: harness.health_check(info["grpc_address"]) ==
                    "SERVING", 10, f"{name} SERVING")
                self.assertTrue(status)

    def test_2_coordinator_lists_every_member_alive(self):
        def all_alive():
            members = cluster_status(self.coordinator).get("members", [])
            alive = [m for m in members if m.get("state") ==
                     "MEMBER_STATE_ALIVE"]
            return alive if len(alive) == 4 else None
        alive = harness.wait_for(all_alive, 15, "4 alive members")
        roles = sorted(m["role"] for m in alive)
        self.assertEqual(roles, ["ROLE_ROLLOUT", "ROLE_ROLLOUT",
                                 "ROLE_TRAINER", "ROLE_VERIFIER"])
        text = subprocess.run(
            [harness.binary("tandemctl"), "status", "--coordinator",
             self.coordinator], capture_output=True, text=True, timeout=15,
            check=True).stdout
        self.assertIn("queues:", text)
        self.assertEqual(text.count(" alive "), 4, text)

    def test_3_prometheus_scrapes_every_daemon(self):
        targets = {name: info["metrics_address"]
                   for name, info in self.ready.items()}
        prometheus = harness.Prometheus(targets)
        try:
            def all_up():
                result = prometheus.query("up")
                if not result:
                    return None
                up = {r["metric"]["job"]: r["value"][1] for r in result}
                return up if (len(up) == len(targets) and
                              all(v == "1" for v in up.values())) else None
            up = harness.wait_for(all_up, 60, "up == 1 for every daemon",
                                  interval=0.5)
            self.assertEqual(set(up), set(targets))
            versions = prometheus.query("tandem_policy_version")
            self.assertGreaterEqual(len(versions), 3)
        finally:
            prometheus.stop()

    def test_4_killed_rollout_is_declared_dead_and_restarted(self):
        victim = self.launcher.ready("rollout-0")
        old_pid = victim["pid"]
        before = {m["memberId"] for m in
                  cluster_status(self.coordinator)["members"]
                  if m.get("state") == "MEMBER_STATE_ALIVE"}
        os.kill(old_pid, signal.SIGKILL)
        killed_wall = time.time()

        def declared_dead():
            for m in cluster_status(self.coordinator)["members"]:
                if (m.get("grpcAddress") == victim["grpc_address"] and
                        m.get("state") == "MEMBER_STATE_DEAD"):
                    return m
            return None
        dead = harness.wait_for(declared_dead, HEARTBEAT_TIMEOUT_S + 10.0,
                                "coordinator to declare rollout-0 dead")
        self.assertIn(dead["memberId"], before)
        # When the coordinator noticed, from its own log line (UTC), so that
        # this test's polling does not count: within the heartbeat timeout
        # plus one expiry-loop period and scheduling slack.
        line = next(l for l in self.launcher.log("coordinator").splitlines()
                    if dead["memberId"] in l and "declared dead" in l)
        noticed = datetime.datetime.strptime(
            line[:23], "%Y-%m-%d %H:%M:%S.%f").replace(
                tzinfo=datetime.timezone.utc).timestamp()
        self.assertLess(noticed - killed_wall, HEARTBEAT_TIMEOUT_S + 1.0)

        def restarted():
            info = self.launcher.ready("rollout-0")
            return info if info and info["pid"] != old_pid else None
        new = harness.wait_for(restarted, 20, "launcher to restart rollout-0")
        self.assertEqual(harness.wait_for(
            lambda: harness.health_check(new["grpc_address"]) == "SERVING",
            10, "restarted rollout-0 SERVING"), True)

        def rejoined():
            for m in cluster_status(self.coordinator)["members"]:
                if (m.get("grpcAddress") == new["grpc_address"] and
                        m.get("state") == "MEMBER_STATE_ALIVE"):
                    return m
            return None
        harness.wait_for(rejoined, 10, "restarted rollout-0 to register")
        self.assertIn("restarted rollout-0",
                      self.launcher.launcher_output())

    def test_5_policy_versions_flow_from_trainer_to_rollout_workers(self):
        # The trainer trains on scored groups and publishes each version;
        # rollout workers pull it and commit it between engine steps, then
        # report it in their heartbeats.
        def followed():
            status = cluster_status(self.coordinator)
            version = int(status.get("policyVersion", 0))
            workers = [m for m in status["members"]
                       if m["role"] == "ROLE_ROLLOUT" and
                       m.get("state") == "MEMBER_STATE_ALIVE"]
            if version < 3 or len(workers) < 2:
                return None
            if all(int(m.get("policyVersion", 0)) >= 2 for m in workers):
                return version, workers
            return None
        try:
            version, workers = harness.wait_for(
                followed, 120, "rollout workers on version >= 2", interval=0.5)
        except AssertionError:
            print(json.dumps(cluster_status(self.coordinator), indent=1))
            print(self.launcher.log("trainer")[-3000:])
            raise
        self.assertGreaterEqual(version, 3)
        self.assertIn("published by", self.launcher.log("coordinator"))


if __name__ == "__main__":
    unittest.main(verbosity=2)
