"""Idle clients cannot exhaust a daemon (issue 19, "bounded everything").

Raw weight data path: 500 idle TCP connections to the trainer's raw data
port used to cost the trainer 500 threads (one per connection, no
timeout). Now the trainer's thread count stays put while they are open,
the connections are evicted as new ones arrive (counted in
tandem_weight_sync_data_connections_dropped_total{reason="evicted"}), and
a real rollout worker in pull mode still receives every version.

/metrics: hundreds of idle connections leave scrapes answering, also when
the daemon runs out of file descriptors (its accept loop used to spin on
EMFILE, at full CPU, while the scrape waited in the listen backlog): a
real Prometheus server keeps scraping the flooded endpoint."""

import os
import resource
import shutil
import socket
import tempfile
import time
import unittest

import harness
from harness import metric_sum, scrape_metrics

CONFIG = os.path.join(os.path.dirname(__file__), "config")
IDLE_RAW = 500
IDLE_METRICS = 400


def thread_count(pid):
    return len(os.listdir(f"/proc/{pid}/task"))


def cpu_seconds(pid):
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    # utime and stime, fields 14 and 15 (1-based) of stat.
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def open_idle(address, count):
    host, port = address.rsplit(":", 1)
    sockets = []
    for _ in range(count):
        s = socket.socket()
        s.settimeout(10)
        s.connect((host, int(port)))
        sockets.append(s)
    return sockets


class BoundedResourcesTest(unittest.TestCase):

    @classmethod
    def setUpClass(cls):
        cls.tmp = tempfile.mkdtemp(prefix="tandem-bounded-")
        cls.daemons = []
        cls.idle = []
        try:
            coordinator = cls.start(
                "coordinator",
                ["--config", os.path.join(CONFIG, "coordinator.yaml")])
            cls.coordinator_info = coordinator.wait_ready()
            cls.coordinator = coordinator
            cls.coordinator_address = cls.coordinator_info["grpc_address"]
            member = ["--set", f"coordinator_address={cls.coordinator_address}"]
            cls.start("verifier", member).wait_ready()
            cls.data_port = harness.free_port()
            cls.trainer = cls.start(
                "trainer",
                [*member, "--set",
                 f"checkpoint_dir={os.path.join(cls.tmp, 'checkpoints')}",
                 "--set", "weight_sync.broadcast=false",
                 "--set", f"weight_sync.data_port={cls.data_port}",
                 "--set", "weight_sync.data_max_connections=32"])
            cls.trainer_info = cls.trainer.wait_ready()
        except BaseException:
            cls.stop_all()
            raise

    @classmethod
    def start(cls, daemon, extra):
        d = harness.Daemon(daemon, cls.tmp, extra)
        cls.daemons.append(d)
        return d

    @classmethod
    def stop_all(cls):
        for s in cls.idle:
            s.close()
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

    def test_idle_raw_connections_cost_no_threads_and_pulls_go_on(self):
        pid = self.trainer.process.pid
        before = thread_count(pid)
        idle = open_idle(f"127.0.0.1:{self.data_port}", IDLE_RAW)
        self.idle.extend(idle)
        metrics = self.trainer_info["metrics_address"]

        def evicted():
            return metric_sum(
                scrape_metrics(metrics),
                "tandem_weight_sync_data_connections_dropped_total",
                reason="evicted")

        # Every connection accepted: the newest 32 hold the slots, the
        # others were evicted for them (a thread per connection, as before,
        # shows as hundreds of threads instead).
        harness.wait_for(
            lambda: evicted() >= IDLE_RAW - 32 or
            thread_count(pid) - before >= IDLE_RAW // 2,
            30, "the idle connections to be accepted", interval=0.2)
        time.sleep(0.5)
        during = thread_count(pid)
        print(f"trainer threads: {before} before, {during} with {IDLE_RAW} "
              "idle raw data connections open")
        self.assertLess(during - before, 10)
        self.assertGreaterEqual(evicted(), IDLE_RAW - 32)
        self.assertLessEqual(metric_sum(
            scrape_metrics(metrics), "tandem_weight_sync_data_connections"),
            32)

        # A real receiver: a rollout worker that pulls every version.
        worker = self.start(
            "rollout",
            ["--config", os.path.join(CONFIG, "rollout.yaml"),
             "--set", f"coordinator_address={self.coordinator_address}",
             "--set", "weight_sync.mode=pull"])
        worker_info = worker.wait_ready(timeout=60)

        def pulled():
            status = harness.worker_status(worker_info["grpc_address"])
            return (harness.as_int(status, "receivedPolicyVersion") >= 2 and
                    status.get("weightSyncTransport") == "pull")
        try:
            harness.wait_for(pulled, 180, "the worker to pull version 2",
                             interval=0.5)
        except AssertionError:
            self.dump()
            raise
        text = scrape_metrics(metrics)
        self.assertGreater(metric_sum(
            text, "tandem_weight_sync_bytes_total", direction="sent",
            transport="pull"), 0)
        self.assertEqual(metric_sum(
            text, "tandem_weight_sync_data_connections_dropped_total",
            reason="over_capacity"), 0)
        self.assertLess(thread_count(pid) - before, 10)

    def test_metrics_answer_with_idle_clients_and_no_descriptors_left(self):
        pid = self.coordinator.process.pid
        metrics = self.coordinator_info["metrics_address"]
        prometheus = harness.Prometheus({"coordinator": metrics})
        try:
            # 24 descriptors left: the flood exhausts them (before the
            # server's own connection cap would close the oldest).
            limit = len(os.listdir(f"/proc/{pid}/fd")) + 24
            resource.prlimit(pid, resource.RLIMIT_NOFILE, (limit, limit))
            idle = open_idle(metrics, IDLE_METRICS)
            self.idle.extend(idle)
            time.sleep(1)
            cpu_before = cpu_seconds(pid)
            time.sleep(2)
            busy = cpu_seconds(pid) - cpu_before
            print(f"coordinator CPU with {IDLE_METRICS} idle /metrics "
                  f"connections and {limit} descriptors: {busy:.2f} s in 2 s")
            self.assertLess(busy, 0.5, "the accept loop spins")
            text = scrape_metrics(metrics)
            self.assertIn("tandem_build_info", text)
            self.assertGreater(metric_sum(
                text, "tandem_metrics_connections_dropped_total",
                reason="accept_error"), 0)

            # A real Prometheus server scrapes it throughout.
            def scraped():
                result = prometheus.query('up{job="coordinator"}')
                return result and result[0]["value"][1] == "1"
            harness.wait_for(scraped, 30, "Prometheus to scrape the "
                             "flooded coordinator", interval=0.5)
            more = open_idle(metrics, 100)
            self.idle.extend(more)
            for _ in range(3):
                self.assertIn("tandem_build_info", scrape_metrics(metrics))
        finally:
            prometheus.stop()


if __name__ == "__main__":
    unittest.main()
