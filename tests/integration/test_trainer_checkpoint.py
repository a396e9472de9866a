"""A trainer stopped with SIGTERM in the middle of a run checkpoints, and a
new trainer process resumes from that checkpoint: policy versions keep
increasing by one and the coordinator accepts every one of them. A trainer
killed with SIGKILL resumes from its last periodic checkpoint and adopts the
coordinator's numbering. The trainer exports each step's statistics as
tandem_trainer_* metrics. SaveCheckpoint answers with a checkpoint whose
Hugging Face export loads (tandem-trainer export reads it with LoadHfModel).

Real coordinator, verifier, rollout worker and trainer; the tests share one
cluster and run in the order of their names."""

import json
import os
import re
import shutil
import signal
import subprocess
import tempfile
import unittest
import urllib.request

import grpc

import harness

CONFIG = os.path.join(os.path.dirname(__file__), "config")
CHECKPOINT_EVERY = 3
LR = 3e-4


def decode_save_checkpoint_response(data):
    """SaveCheckpointResponse {string path = 1; uint64 step = 2;} by hand."""
    fields, i = {}, 0
    while i < len(data):
        key = data[i]
        i += 1
        field, wire = key >> 3, key & 7
        value, shift = 0, 0
        while True:
            b = data[i]
            i += 1
            value |= (b & 0x7F) << shift
            shift += 7
            if b < 0x80:
                break
        if wire == 2:
            fields[field] = data[i:i + value].decode()
            i += value
        else:
            fields[field] = value
    return fields.get(1, ""), fields.get(2, 0)


class TrainerCheckpointTest(unittest.TestCase):

    @classmethod
    def setUpClass(cls):
        cls.tmp = tempfile.mkdtemp(prefix="tandem-ckpt-")
        cls.checkpoint_dir = os.path.join(cls.tmp, "checkpoints")
        cls.coordinator = harness.Daemon(
            "coordinator", cls.tmp,
            ["--config", os.path.join(CONFIG, "coordinator.yaml")])
        cls.address = cls.coordinator.wait_ready()["grpc_address"]
        member = ["--set", f"coordinator_address={cls.address}"]
        cls.verifier = harness.Daemon("verifier", cls.tmp, member)
        cls.verifier.wait_ready()
        cls.rollout = harness.Daemon(
            "rollout", cls.tmp,
            ["--config", os.path.join(CONFIG, "rollout.yaml"), *member])
        cls.rollout.wait_ready()
        cls.trainers = []
        cls.trainer = cls.start_trainer()

    @classmethod
    def start_trainer(cls):
        name = f"trainer-{len(cls.trainers)}"
        trainer = harness.Daemon(
            "trainer", cls.tmp,
            ["--set", f"coordinator_address={cls.address}",
             "--set", f"checkpoint_dir={cls.checkpoint_dir}",
             "--set", f"checkpoint_every={CHECKPOINT_EVERY}",
             "--set", f"training.lr={LR}"], name=name)
        trainer.wait_ready()
        cls.trainers.append(trainer)
        return trainer

    @classmethod
    def tearDownClass(cls):
        for d in (cls.trainer, cls.rollout, cls.verifier, cls.coordinator):
            d.stop()
        shutil.rmtree(cls.tmp, ignore_errors=True)

    def coordinator_version(self):
        status = harness.tandemctl_json("status", "--coordinator",
                                        self.address)
        return int(status.get("policyVersion", 0))

    def wait_version(self, at_least, timeout=180):
        try:
            return harness.wait_for(
                lambda: (lambda v: v if v >= at_least else None)(
                    self.coordinator_version()),
                timeout, f"policy version >= {at_least}", interval=0.5)
        except AssertionError:
            print(self.trainer.output()[-3000:])
            raise

    def latest_state(self):
        return harness.read_json(os.path.join(
            self.checkpoint_dir, "latest", "trainer_state.json"))

    def published(self):
        """Versions the coordinator logged as published, in order."""
        return [int(v) for v in re.findall(r"policy version (\d+) published",
                                           self.coordinator.output())]

    def assert_versions_consecutive(self):
        published = self.published()
        self.assertEqual(published, list(range(1, len(published) + 1)),
                         published)

    def scrape_trainer(self):
        """{family: value} of the trainer's unlabelled samples."""
        address = harness.read_json(self.trainer.ready_file)["metrics_address"]
        with urllib.request.urlopen(f"http://{address}/metrics",
                                    timeout=5) as r:
            text = r.read().decode()
        return {m.group(1): float(m.group(2)) for m in re.finditer(
            r"^(tandem_\w+) (\S+)$", text, re.MULTILINE)}

    def test_0_step_metrics_are_exported_with_sane_values(self):
        self.wait_version(2)
        m = harness.wait_for(
            lambda: (lambda m: m if m.get("tandem_trainer_learning_rate")
                     else None)(self.scrape_trainer()),
            30, "tandem_trainer_learning_rate > 0 (a step was taken)")
        # Constant schedule without warmup: every step uses training.lr.
        self.assertAlmostEqual(m["tandem_trainer_learning_rate"], LR,
                               delta=1e-12)
        self.assertGreater(m["tandem_trainer_tokens_per_second"], 0)
        self.assertGreaterEqual(m["tandem_trainer_reward_std"], 0)
        self.assertGreaterEqual(m["tandem_trainer_clip_fraction"], 0)
        self.assertLessEqual(m["tandem_trainer_clip_fraction"], 1)
        # No reference model: the KL gauge stays 0.
        self.assertEqual(m["tandem_trainer_kl"], 0)
        self.assertGreater(m["tandem_trainer_entropy"], 0)
        self.assertGreater(m["tandem_trainer_ratio_mean"], 0)
        self.assertGreater(m["tandem_trainer_effective_sample_size"], 0)
        self.assertLessEqual(m["tandem_trainer_effective_sample_size"],
                             1 + 1e-6)
        self.assertGreater(m["tandem_trainer_trained_tokens_total"], 0)
        # The random initial model rarely solves a problem, so a batch's
        # rewards are usually all 0: every advantage is 0 and so is the
        # gradient (grad norm > 0 with spread rewards: the unit test
        # trainer_rl_schedule_test).
        self.assertGreaterEqual(m["tandem_trainer_grad_norm"], 0)
        if m["tandem_trainer_reward_std"] == 0:
            self.assertEqual(m["tandem_trainer_grad_norm"], 0)

    def test_1_sigterm_checkpoints_and_the_restart_continues_versions(self):
        self.wait_version(4)
        self.assertEqual(self.trainer.stop(signal.SIGTERM), 0,
                         self.trainer.output()[-3000:])
        stopped_at = self.coordinator_version()
        state = self.latest_state()
        self.assertIsNotNone(state, os.listdir(self.checkpoint_dir))
        # The stop checkpoint holds exactly what was last published.
        self.assertEqual(state["policy_version"], stopped_at)
        self.assertEqual(state["step"], stopped_at)
        self.assertIn("checkpoint " + os.path.join(
            self.checkpoint_dir, f"step-{stopped_at}"),
            self.trainer.output())

        type(self).trainer = self.start_trainer()
        self.wait_version(stopped_at + 3)
        log = self.trainer.output()
        self.assertIn(f"resumed from {self.checkpoint_dir}/step-{stopped_at}",
                      log)
        self.assertNotIn("go up by one", log)
        self.assertNotIn("training step failed", log)
        self.assert_versions_consecutive()
        # The trainer reports the step it resumed from plus its new steps.
        status = json.loads(subprocess.run(
            [harness.binary("tandemctl"), "status", "--coordinator",
             self.address, "--json"], capture_output=True, text=True,
            timeout=15, check=True).stdout)
        trainers = [m for m in status["members"]
                    if m["role"] == "ROLE_TRAINER" and
                    m.get("state") == "MEMBER_STATE_ALIVE"]
        self.assertEqual(len(trainers), 1)
        # Old checkpoints are pruned to checkpoint_keep (2).
        steps = [n for n in os.listdir(self.checkpoint_dir)
                 if n.startswith("step-")]
        self.assertLessEqual(len(steps), 2, steps)

    def test_2_sigkill_resumes_from_the_last_periodic_checkpoint(self):
        # Let a periodic checkpoint happen and at least one version after
        # it. The trainer is frozen (SIGSTOP) while both are read, so no
        # checkpoint can land between the check and the kill.
        def checkpointed_and_ahead():
            self.trainer.process.send_signal(signal.SIGSTOP)
            state = self.latest_state()
            version = self.coordinator_version()
            if state and state["step"] % CHECKPOINT_EVERY == 0 and \
                    version > state["policy_version"]:
                return state, version
            self.trainer.process.send_signal(signal.SIGCONT)
            return None
        harness.wait_for(checkpointed_and_ahead, 180,
                         "a periodic checkpoint behind the coordinator",
                         interval=0.2)
        self.trainer.stop(signal.SIGKILL)
        killed_at = self.coordinator_version()
        state = self.latest_state()
        type(self).trainer = self.start_trainer()
        self.wait_version(killed_at + 2)
        log = self.trainer.output()
        self.assertIn(f"resumed from {self.checkpoint_dir}/step-"
                      f"{state['step']}", log)
        # Versions were published after that checkpoint (waited for above):
        # the trainer continues from the checkpoint as the next version.
        self.assertLess(state["policy_version"], killed_at)
        self.assertIn("versions after the checkpoint are lost", log)
        self.assertNotIn("go up by one", log)
        self.assert_versions_consecutive()

    def test_3_save_checkpoint_rpc_and_export(self):
        ready = harness.read_json(self.trainer.ready_file)
        with grpc.insecure_channel(ready["grpc_address"]) as channel:
            save = channel.unary_unary("/tandem.v1.Trainer/SaveCheckpoint",
                                       request_serializer=None,
                                       response_deserializer=None)
            path, step = decode_save_checkpoint_response(
                save(b"", timeout=30))
        self.assertTrue(os.path.isfile(
            os.path.join(path, "hf", "model.safetensors")), path)
        self.assertEqual(path, os.path.join(self.checkpoint_dir,
                                            f"step-{step}"))
        # Asked for by an operator: pinned, so rotation never removes it.
        with open(os.path.join(path, "PINNED")) as f:
            self.assertIn("SaveCheckpoint", f.read())
        output = os.path.join(self.tmp, "export")
        exported = subprocess.run(
            [harness.binary("tandem-trainer"), "export", "--checkpoint",
             self.checkpoint_dir, "--output", output, "--dtype", "bfloat16"],
            capture_output=True, text=True, timeout=60)
        self.assertEqual(exported.returncode, 0, exported.stderr)
        for name in ("config.json", "model.safetensors", "tokenizer.json"):
            self.assertTrue(os.path.isfile(os.path.join(output, name)), name)
        with open(os.path.join(output, "config.json")) as f:
            self.assertEqual(json.load(f)["torch_dtype"], "bfloat16")

        # A corrupt checkpoint is refused with the file's name.
        corrupt = os.path.join(self.tmp, "corrupt")
        shutil.copytree(path, os.path.join(corrupt, "step-1"))
        os.symlink("step-1", os.path.join(corrupt, "latest"))
        with open(os.path.join(corrupt, "step-1", "optimizer.safetensors"),
                  "r+b") as f:
            f.seek(200)
            f.write(b"\xff\xff\xff\xff")
        refused = subprocess.run(
            [harness.binary("tandem-trainer"), "export", "--checkpoint",
             corrupt, "--output", os.path.join(self.tmp, "never")],
            capture_output=True, text=True, timeout=60)
        self.assertNotEqual(refused.returncode, 0)
        self.assertIn(os.path.join(corrupt, "step-1",
                                   "optimizer.safetensors"), refused.stderr)

    def test_4_a_new_run_does_not_resume_an_earlier_runs_checkpoint(self):
        # A fresh coordinator (no policy version) and the same
        # checkpoint_dir: the checkpoint belongs to the run above.
        tmp = os.path.join(self.tmp, "second-run")
        os.makedirs(tmp)
        coordinator = harness.Daemon(
            "coordinator", tmp,
            ["--config", os.path.join(CONFIG, "coordinator.yaml")])
        try:
            address = coordinator.wait_ready()["grpc_address"]
            trainer = harness.Daemon(
                "trainer", tmp,
                ["--set", f"coordinator_address={address}",
                 "--set", f"checkpoint_dir={self.checkpoint_dir}"])
            try:
                trainer.wait_ready()
                log = trainer.output()
                self.assertIn("belongs to an earlier run", log)
                self.assertNotIn("resumed from", log)
            finally:
                self.assertEqual(trainer.stop(), 0)
        finally:
            coordinator.stop()


if __name__ == "__main__":
    unittest.main(verbosity=2)
