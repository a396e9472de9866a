"""kill -9 at the worst moments of the trainer's step/publish sequence, with
real daemons (coordinator with its journal, verifier, rollout worker,
trainer):

- The coordinator dies right after recording a version, before the trainer
  got its answer (TANDEM_TEST_KILL_COORDINATOR_AFTER_PUBLISH): the
  restarted coordinator acknowledges the trainer's retry of the same
  (batch, version) as a duplicate, the version is committed with its batch
  once, and versions go on within STALL_LIMIT_S.
- The coordinator dies after the trainer stepped and before the publish is
  acknowledged (the trainer holds there through its fault-injection hook,
  TANDEM_TEST_HOLD_PUBLISH_FILE), the publish is attempted while it is
  down, then it restarts on its port: the policy version advances again
  within STALL_LIMIT_S, the held version is committed with the batch that
  trained it, and no group is in two steps of the trainer.
- The trainer dies holding a batch (stepped, not published) with versions
  published after its last checkpoint: the batch is back in the ready queue
  within the heartbeat expiry, not after the 300 s batch timeout; the
  restarted trainer resumes from the older checkpoint, and every group of
  the versions after it is trained again or counted lost
  (tandem_coordinator_groups_{requeued,lost}_total, tandemctl status), so
  the surviving weights hold every committed group once.

Each trainer step is read from the trainer's debug log ("stepped to
version V on batch B: groups ...")."""

import collections
import os
import re
import shutil
import signal
import tempfile
import time
import unittest

import harness

CONFIG = os.path.join(os.path.dirname(__file__), "config")
HEARTBEAT_TIMEOUT_S = 1.5
STALL_LIMIT_S = 30
CHECKPOINT_EVERY = 3
# Large enough that the groups of the versions after the trainer's
# checkpoint can be trained again when it resumes (the unit tests cover
# the groups too stale for that).
MAX_LAG = 16
KILLED_AT_VERSION = 3
steps_of = harness.steps_of
group_ids = harness.group_ids


class PublishFaultTest(unittest.TestCase):

    def setUp(self):
        self.tmp = tempfile.mkdtemp(prefix="tandem-publish-")
        self.daemons = []
        self.addCleanup(self.cleanup)
        self.port = harness.free_port()
        self.address = f"127.0.0.1:{self.port}"
        self.coordinator_config = os.path.join(self.tmp, "coordinator.yaml")
        with open(self.coordinator_config, "w") as f:
            f.write(f"""heartbeat_interval_ms: 200
heartbeat_timeout_ms: {int(HEARTBEAT_TIMEOUT_S * 1000)}
max_lag: {MAX_LAG}
training:
  batch_timeout_ms: 300000
journal:
  dir: {self.tmp}/journal
""")
        self.checkpoint_dir = os.path.join(self.tmp, "checkpoints")
        self.hold = os.path.join(self.tmp, "hold-publish")
        self.coordinators = []
        self.trainers = []
        env = None
        if "after_recording" in self._testMethodName:
            env = {"TANDEM_TEST_KILL_COORDINATOR_AFTER_PUBLISH":
                   str(KILLED_AT_VERSION)}
        self.coordinator = self.start_coordinator(env)
        member = ["--set", f"coordinator_address={self.address}"]
        self.start("verifier", member).wait_ready()
        self.start("rollout", ["--config", os.path.join(CONFIG, "rollout.yaml"),
                               *member]).wait_ready()
        self.trainer = self.start_trainer(hold=True)

    def start(self, daemon, args, name=None, **kwargs):
        d = harness.Daemon(daemon, self.tmp, args, name=name, **kwargs)
        self.daemons.append(d)
        return d

    def start_coordinator(self, env=None):
        d = self.start("coordinator", ["--config", self.coordinator_config],
                       name=f"coordinator-{len(self.coordinators)}",
                       grpc_port=self.port, env=env)
        d.wait_ready()
        self.coordinators.append(d)
        return d

    def start_trainer(self, hold):
        env = {"TANDEM_TEST_HOLD_PUBLISH_FILE": self.hold} if hold else None
        d = self.start("trainer", [
            "--set", f"coordinator_address={self.address}",
            "--set", f"checkpoint_dir={self.checkpoint_dir}",
            "--set", f"checkpoint_every={CHECKPOINT_EVERY}",
            "--set", "log.level=debug"],
            name=f"trainer-{len(self.trainers)}", env=env)
        d.wait_ready()
        self.trainers.append(d)
        return d

    def cleanup(self):
        for d in reversed(self.daemons):
            d.stop()
        if os.environ.get("TANDEM_KEEP_TEST_DIR"):
            print("kept", self.tmp)
        else:
            shutil.rmtree(self.tmp, ignore_errors=True)

    def status(self):
        return harness.cluster_status(self.address)

    def version(self):
        return harness.as_int(self.status(), "policyVersion")

    def wait_version(self, at_least, timeout):
        try:
            return harness.wait_for(
                lambda: (lambda v: v if v >= at_least else None)(
                    self.version()),
                timeout, f"policy version >= {at_least}", interval=0.25)
        except AssertionError:
            print(self.trainer.output()[-4000:])
            print(self.coordinator.output()[-3000:])
            raise

    def hold_next_step(self):
        """Makes the trainer stop after its next step, before the publish;
        returns (version, batch id) it stepped to."""
        open(self.hold, "w").close()
        held = self.hold + ".held"
        harness.wait_for(lambda: os.path.exists(held), 60,
                         "the trainer to hold a step before its publish")
        with open(held) as f:
            version, batch = f.read().split()
        return int(version), batch

    def release(self):
        os.remove(self.hold)
        harness.wait_for(lambda: not os.path.exists(self.hold + ".held"),
                         10, "the trainer to leave the hold")

    def published(self):
        """Versions the coordinators logged as published, in order."""
        return [int(v) for d in self.coordinators for v in re.findall(
            r"policy version (\d+) published by", d.output())]

    def test_coordinator_killed_between_step_and_publish(self):
        self.wait_version(2, 120)
        version, batch = self.hold_next_step()
        self.assertEqual(self.version(), version - 1)
        self.coordinator.stop(signal.SIGKILL)
        # The trainer publishes while the coordinator is down.
        self.release()
        time.sleep(1.0)
        self.coordinator = self.start_coordinator()
        started = time.monotonic()
        self.wait_version(version + 2, STALL_LIMIT_S)
        log = self.trainer.output()
        self.assertIn(f"publishing version {version} (batch {batch}) failed",
                      log)
        self.assertNotIn("go up by one", log)
        self.assertNotIn("the coordinator refused", log)
        # The held version was committed with the batch that trained it.
        self.assertRegex(
            self.coordinator.output(),
            rf"policy version {version} published by \S+ \(batch "
            rf"{re.escape(batch)}, \d+ groups\)")
        published = self.published()
        self.assertEqual(published, list(range(1, len(published) + 1)))
        print(f"version advanced again {time.monotonic() - started:.1f} s "
              f"after the coordinator restarted")

        self.assert_each_group_trained_once()

    def assert_each_group_trained_once(self):
        """Every group in the weights once, and the coordinator counts what
        the weights hold (the trainer is frozen while both are read)."""
        self.trainer.process.send_signal(signal.SIGSTOP)
        try:
            status = self.status()
            steps = steps_of(self.trainer.output())
        finally:
            self.trainer.process.send_signal(signal.SIGCONT)
        at = harness.as_int(status, "policyVersion")
        ids = group_ids(steps)
        twice = [g for g, n in collections.Counter(ids).items() if n > 1]
        self.assertEqual(twice, [], "groups trained twice")
        self.assertEqual([v for v, _, _ in steps if v <= at],
                         list(range(1, at + 1)))
        self.assertEqual(len(group_ids([s for s in steps if s[0] <= at])),
                         harness.as_int(status["counters"], "groupsTrained"))

    def test_coordinator_killed_after_recording_the_publish(self):
        harness.wait_for(lambda: self.coordinator.process.poll() is not None,
                         120, f"the coordinator to kill itself after "
                         f"recording version {KILLED_AT_VERSION}")
        self.assertEqual(self.coordinator.process.returncode, -9)
        self.assertIn(f"policy version {KILLED_AT_VERSION} published by",
                      self.coordinator.output())
        batch = [b for v, b, _ in steps_of(self.trainer.output())
                 if v == KILLED_AT_VERSION][0]
        self.coordinator = self.start_coordinator()
        self.wait_version(KILLED_AT_VERSION + 2, STALL_LIMIT_S)
        # The trainer never got the first answer: its retry was a duplicate.
        self.assertIn(f"policy version {KILLED_AT_VERSION} (batch {batch}) "
                      "published again", self.coordinator.output())
        self.assertIn(f"version {KILLED_AT_VERSION} (batch {batch}) "
                      "acknowledged after", self.trainer.output())
        published = self.published()
        self.assertEqual(published, list(range(1, len(published) + 1)))
        self.assert_each_group_trained_once()

    def test_trainer_killed_resumes_without_silent_loss(self):
        self.wait_version(CHECKPOINT_EVERY + 1, 120)
        # Hold a step at a moment when versions were published after the
        # last checkpoint.
        while True:
            version, batch = self.hold_next_step()
            state = harness.read_json(os.path.join(
                self.checkpoint_dir, "latest", "trainer_state.json"))
            published = self.version()
            if state and state["policy_version"] < published:
                break
            self.release()
        self.assertEqual(published, version - 1)
        held_status = self.status()
        self.assertGreater(
            harness.as_int(held_status["queues"], "trainingGroups"), 0)
        self.trainer.stop(signal.SIGKILL)
        killed = time.monotonic()
        # The dead trainer's batch is back within the heartbeat expiry.
        harness.wait_for(
            lambda: harness.as_int(self.status()["queues"],
                                   "trainingGroups") == 0,
            HEARTBEAT_TIMEOUT_S + 3,
            "the dead trainer's batch to be released")
        released_after = time.monotonic() - killed
        self.assertIn("training batches released", self.coordinator.output())
        os.remove(self.hold)

        first = self.trainer
        self.trainer = self.start_trainer(hold=False)
        self.wait_version(published + 3, 120)
        log = self.trainer.output()
        checkpoint = state["policy_version"]
        self.assertIn(f"resumed from {self.checkpoint_dir}/step-"
                      f"{state['step']}", log)

        self.trainer.process.send_signal(signal.SIGSTOP)
        try:
            status = self.status()
            second_steps = steps_of(self.trainer.output())
        finally:
            self.trainer.process.send_signal(signal.SIGCONT)
        first_steps = steps_of(first.output())
        counters = status["counters"]
        requeued = harness.as_int(counters, "groupsRequeued")
        lost = harness.as_int(counters, "groupsLost")
        rewound = group_ids([s for s in first_steps
                             if checkpoint < s[0] <= published])
        held = group_ids([s for s in first_steps if s[0] == version])
        self.assertTrue(rewound, "no version after the checkpoint")
        self.assertGreater(requeued, 0)
        self.assertEqual(requeued + lost, len(rewound))
        again = set(group_ids(second_steps))
        self.assertEqual(len(set(rewound) & again), requeued)
        self.assertEqual(len(set(rewound) - again), lost)
        # The dead trainer's unpublished batch is trained by the new one.
        self.assertTrue(set(held) <= again, (held, again))
        self.assertGreaterEqual(
            harness.as_int(counters, "batchesReleased"), 1)
        # What survives in the weights: the first trainer's steps up to its
        # checkpoint, then the second trainer's; each group once.
        surviving = group_ids([s for s in first_steps
                               if s[0] <= checkpoint]) + group_ids(
                                   second_steps)
        twice = [g for g, n in collections.Counter(surviving).items()
                 if n > 1]
        self.assertEqual(twice, [], "groups trained twice")
        at = harness.as_int(status, "policyVersion")
        self.assertEqual(
            len(group_ids([s for s in first_steps if s[0] <= published])) +
            len(group_ids([s for s in second_steps if s[0] <= at])),
            harness.as_int(counters, "groupsTrained"))

        metrics = harness.scrape_metrics(
            harness.read_json(self.coordinator.ready_file)["metrics_address"])
        self.assertEqual(harness.metric_sum(
            metrics, "tandem_coordinator_groups_requeued_total"), requeued)
        self.assertEqual(harness.metric_sum(
            metrics, "tandem_coordinator_groups_lost_total"), lost)
        self.assertGreaterEqual(harness.metric_sum(
            metrics, "tandem_coordinator_training_batches_released_total"), 1)
        trainer_metrics = harness.scrape_metrics(
            harness.read_json(self.trainer.ready_file)["metrics_address"])
        self.assertEqual(harness.metric_sum(
            trainer_metrics, "tandem_trainer_resume_groups_lost"), lost)
        self.assertIn(f"{lost} are lost", log)
        ctl = harness.tandemctl_json("status", "--coordinator", self.address)
        self.assertEqual(harness.as_int(ctl["counters"], "groupsLost"), lost)
        print(f"batch released {released_after:.1f} s after the kill; "
              f"{len(rewound)} groups after the checkpoint: {requeued} "
              f"trained again, {lost} lost")


if __name__ == "__main__":
    unittest.main(verbosity=2)
