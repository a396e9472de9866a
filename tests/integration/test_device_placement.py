"""Device and dtype placement of the trainer and the rollout workers
(model.device, model.dtype; docs/gpu.md), on the CPU:

1. A daemon asked for a device it cannot use exits 2 at start with a
   message naming the key and the value, before it listens or registers;
   nothing falls back to the CPU silently.
2. A whole cluster whose trainer computes in bfloat16 (mixed precision,
   float32 master weights) and whose rollout workers compute in bfloat16
   while the trainer publishes the built-in model's float32: versions
   advance, each worker converts what it receives and ends on the latest
   version with the digest of the trainer's published bytes.
"""

import os
import subprocess
import unittest

import harness

CONFIG_DIR = os.path.join(os.path.dirname(__file__), "config")
VERSIONS = 4
as_int = harness.as_int


class RefusedDeviceTest(unittest.TestCase):

    def start(self, daemon, *sets):
        args = [harness.binary(daemon), "--grpc-address", "127.0.0.1:0",
                "--metrics-address", "127.0.0.1:0"]
        for s in sets:
            args += ["--set", s]
        return subprocess.run(args, capture_output=True, text=True,
                              timeout=60)

    def test_unusable_device_exits_2_naming_key_and_value(self):
        # cuda:999 is unusable everywhere: no device here, out of range on
        # a GPU machine.
        for daemon in ("tandem-trainer", "tandem-rollout"):
            for value, reason in (("cuda:999", "'cuda:999'"),
                                  ("tpu", "is not a device")):
                with self.subTest(daemon=daemon, value=value):
                    out = self.start(daemon, f"model.device={value}")
                    self.assertEqual(out.returncode, 2, out.stderr)
                    self.assertIn(f"model.device: '{value}'", out.stderr)
                    self.assertIn(reason, out.stderr)

    def test_bad_dtype_is_refused(self):
        out = self.start("tandem-rollout", "model.dtype=float16")
        self.assertEqual(out.returncode, 2, out.stderr)
        self.assertIn("model.dtype: 'float16' is not a dtype", out.stderr)
        out = self.start("tandem-trainer", "model.dtype=half")
        self.assertEqual(out.returncode, 2, out.stderr)
        self.assertIn("model.dtype: 'half'", out.stderr)


class Bfloat16ClusterTest(unittest.TestCase):

    @classmethod
    def setUpClass(cls):
        # Inherited by every daemon; only the trainer and the rollout
        # workers have these keys.
        os.environ["TANDEM_MODEL_DTYPE"] = "bfloat16"
        try:
            cls.launcher = harness.Launcher(rollout_workers=2,
                                            config_dir=CONFIG_DIR)
            cls.ready = cls.launcher.wait_all_ready()
        finally:
            del os.environ["TANDEM_MODEL_DTYPE"]
        cls.coordinator = cls.ready["coordinator"]["grpc_address"]

    @classmethod
    def tearDownClass(cls):
        cls.launcher.shutdown()

    def dump(self):
        for name in ("coordinator", "trainer", "rollout-0"):
            print(f"==== {name} log (tail)")
            print(self.launcher.log(name)[-4000:])

    def test_bf16_compute_with_float32_versions(self):
        trainer_log = self.launcher.log("trainer")
        self.assertIn("forward and backward in bfloat16 (mixed precision",
                      trainer_log)
        self.assertIn("publishing float32", trainer_log)
        for i in range(2):
            self.assertIn("on cpu in bfloat16",
                          self.launcher.log(f"rollout-{i}"))

        def trained():
            status = harness.tandemctl_json("status", "--coordinator",
                                            self.coordinator)
            return as_int(status, "policyVersion") >= VERSIONS
        try:
            harness.wait_for(trained, 240, f"{VERSIONS} trained versions",
                             interval=0.5)
        except AssertionError:
            self.dump()
            raise
        workers = {f"rollout-{i}": self.ready[f"rollout-{i}"]["grpc_address"]
                   for i in range(2)}
        for address in workers.values():
            harness.tandemctl_json("worker", "pause", "--address", address)
        try:
            status, seen = harness.wait_settled(self.coordinator, workers,
                                                120)
        finally:
            for address in workers.values():
                harness.tandemctl_json("worker", "resume", "--address",
                                       address)
        self.assertTrue(status.get("weightsDigest"))
        for name, w in seen.items():
            with self.subTest(worker=name):
                self.assertEqual(w["weightsDigest"], status["weightsDigest"])
                self.assertGreaterEqual(as_int(w, "receivedPolicyVersion"), VERSIONS)
        for i in range(2):
            self.assertNotIn("rejected", self.launcher.log(f"rollout-{i}"))


if __name__ == "__main__":
    unittest.main(verbosity=2)
