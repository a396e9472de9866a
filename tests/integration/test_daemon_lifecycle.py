"""Each daemon on its own: clean exit on SIGTERM within the drain deadline,
health visible to an independent client, and configuration errors that name
the file, line and key."""

import os
import signal
import subprocess
import sys
import tempfile
import time
import unittest

import harness

DAEMONS = ["coordinator", "rollout", "verifier", "trainer"]
DRAIN_TIMEOUT_MS = 3000
DRAIN = ["--set", f"drain_timeout_ms={DRAIN_TIMEOUT_MS}"]


def ignores_signal(pid, number):
    """Whether process `pid` ignores signal `number` (/proc/PID/status)."""
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith("SigIgn:"):
                return bool(int(line.split()[1], 16) >> (number - 1) & 1)
    raise AssertionError(f"/proc/{pid}/status has no SigIgn line")


def process_alive(pid):
    """Whether `pid` runs (a zombie, dead but not reaped, counts as gone)."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except FileNotFoundError:
        return False


class LifecycleTest(unittest.TestCase):

    def setUp(self):
        self.tmp = tempfile.mkdtemp(prefix="tandem-life-")

    def test_sigterm_exits_zero_within_drain_deadline(self):
        coordinator = harness.Daemon("coordinator", self.tmp, DRAIN)
        address = coordinator.wait_ready()["grpc_address"]
        members = {name: harness.Daemon(
                       name, self.tmp,
                       [*DRAIN, "--set", f"coordinator_address={address}"])
                   for name in DAEMONS[1:]}
        for name, daemon in members.items():
            info = daemon.wait_ready()
            self.assertEqual(harness.wait_for(
                lambda: harness.health_check(info["grpc_address"]) ==
                "SERVING", 10, f"{name} SERVING"), True)
        # A peer that dies mid-write (a Gloo pair socket) must not kill a
        # daemon with SIGPIPE: each one ignores it (RunDaemon).
        for name, daemon in [("coordinator", coordinator),
                             *members.items()]:
            with self.subTest(daemon=name, check="SIGPIPE ignored"):
                self.assertTrue(ignores_signal(daemon.process.pid,
                                               signal.SIGPIPE))
        # Members first, then the coordinator, as an operator would.
        for name, daemon in list(members.items()) + [("coordinator",
                                                      coordinator)]:
            with self.subTest(daemon=name):
                started = time.monotonic()
                daemon.process.send_signal(signal.SIGTERM)
                try:
                    code = daemon.process.wait(
                        timeout=DRAIN_TIMEOUT_MS / 1000 + 5)
                except subprocess.TimeoutExpired:
                    daemon.process.kill()
                    self.fail(f"{name} still running after SIGTERM")
                elapsed = time.monotonic() - started
                self.assertEqual(code, 0, daemon.output())
                self.assertLess(elapsed, DRAIN_TIMEOUT_MS / 1000 + 2)
                self.assertIn("exited cleanly", daemon.output())
        self.assertIn("left (shutdown)", coordinator.output())
        for daemon in [coordinator, *members.values()]:
            daemon.log.close()

    def test_daemons_die_with_a_killed_test(self):
        # A test killed by SIGKILL (a ctest timeout) must not leave its
        # daemons running: harness.die_with_test() ties them to it.
        script = (
            "import sys, time\n"
            f"sys.path.insert(0, {os.path.dirname(harness.__file__)!r})\n"
            "import harness\n"
            f"d = harness.Daemon('verifier', {self.tmp!r})\n"
            "d.wait_ready()\n"
            "print(d.process.pid, flush=True)\n"
            "time.sleep(120)\n")
        test = subprocess.Popen([sys.executable, "-c", script],
                                stdout=subprocess.PIPE, text=True)
        try:
            daemon_pid = int(test.stdout.readline())
            self.assertTrue(process_alive(daemon_pid))
            test.kill()
            test.wait()
            self.assertTrue(harness.wait_for(
                lambda: not process_alive(daemon_pid), 15,
                "the orphaned verifier to exit"))
        finally:
            if test.poll() is None:
                test.kill()

    def write_config(self, daemon, text):
        path = os.path.join(self.tmp, f"{daemon}.yaml")
        with open(path, "w") as f:
            f.write(text)
        return path

    def run_with_config(self, daemon, text):
        """Runs a daemon whose config is expected to be refused."""
        path = self.write_config(daemon, text)
        result = subprocess.run(
            [harness.binary(f"tandem-{daemon}"), "--config", path,
             "--grpc-address", "127.0.0.1:0"],
            capture_output=True, text=True, timeout=20)
        return path, result

    def test_unknown_key_exits_nonzero_naming_file_line_and_key(self):
        for daemon in DAEMONS:
            with self.subTest(daemon=daemon):
                path, result = self.run_with_config(
                    daemon, "log:\n  level: info\n  colour: blue\n")
                self.assertNotEqual(result.returncode, 0)
                self.assertIn(f"{path}:3: unknown key 'log.colour'",
                              result.stderr)

    def test_out_of_range_and_wrong_type_name_the_key_and_value(self):
        path, result = self.run_with_config("coordinator",
                                            "group_size: 0\n")
        self.assertNotEqual(result.returncode, 0)
        self.assertIn(f"{path}:1: group_size must be in [1, 1024], got 0",
                      result.stderr)
        path, result = self.run_with_config(
            "rollout", "engine:\n  max_num_seqs: lots\n")
        self.assertNotEqual(result.returncode, 0)
        self.assertIn(f"{path}:2: engine.max_num_seqs expected an integer, "
                      "got 'lots'", result.stderr)

    def test_bad_trainer_training_values_exit_2_naming_key_and_value(self):
        for text, message in [
                ("training:\n  schedule: step\n",
                 "training.schedule must be one of"),
                ("training:\n  clip_high: -0.5\n",
                 "training.clip_high must be in [0, 10], got -0.5"),
                ("training:\n  aggregation: tokens\n",
                 "training.aggregation must be one of"),
                ("training:\n  dynamic_sampling: maybe\n",
                 "training.dynamic_sampling expected true or false, got "
                 "'maybe'"),
                ("training:\n  schedule: linear\n  warmup_steps: 10\n",
                 "training.schedule: linear needs training.total_steps > "
                 "training.warmup_steps, got 0 <= 10")]:
            with self.subTest(config=text):
                _, result = self.run_with_config("trainer", text)
                self.assertEqual(result.returncode, 2, result.stderr)
                self.assertIn(message, result.stderr)

    def test_malformed_yaml_exits_nonzero_naming_the_file(self):
        path, result = self.run_with_config("verifier",
                                            "worker_threads: [1,\n")
        self.assertNotEqual(result.returncode, 0)
        self.assertIn(path, result.stderr)
        self.assertIn("malformed YAML", result.stderr)

    def test_print_config_output_is_a_valid_config(self):
        for daemon in DAEMONS:
            with self.subTest(daemon=daemon):
                printed = subprocess.run(
                    [harness.binary(f"tandem-{daemon}"), "--print-config",
                     "--set", "log.level=debug"],
                    capture_output=True, text=True, timeout=20, check=True)
                self.assertIn('level: "debug"', printed.stdout)
                path = self.write_config(daemon, printed.stdout)
                again = subprocess.run(
                    [harness.binary(f"tandem-{daemon}"), "--config", path,
                     "--print-config"],
                    capture_output=True, text=True, timeout=20, check=True)
                self.assertEqual(again.stdout, printed.stdout)


if __name__ == "__main__":
    unittest.main(verbosity=2)
