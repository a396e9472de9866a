"""SIGKILL of a real rollout worker that holds leases, in a run of real
daemons: a coordinator serving a finite JSONL dataset (one epoch), a real
verifier and two real tandem-rollout workers generating with the built-in
model. Python plays the trainer over real gRPC (stubs from
test_coordinator_work) so that every trained group can be counted by its
prompt id.

Proves: the coordinator reports the victim's leases (leases_held) before
the kill; after it, the victim is declared dead, exactly its leases go back
to the queue (log, groups_abandoned_total, members_expired_total) and are
dispatched again (groups_dispatched_total = prompts + returned leases);
the surviving worker keeps generating and finishes the dataset; every
prompt of the dataset is trained exactly once (none missing, none twice)."""

import collections
import json
import os
import re
import shutil
import signal
import sys
import tempfile
import threading
import time
import unittest

import grpc

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import harness  # noqa: E402
from harness import metric_sum, scrape_metrics  # noqa: E402
import test_coordinator_work as work  # noqa: E402  (generates the stubs)
from test_coordinator_work import common, pb  # noqa: E402

NUM_PROMPTS = 160
GROUP_SIZE = 2
HEARTBEAT_TIMEOUT_MS = 1000
# Prompts in the built-in model's vocabulary (digits, '+', '='); `exact`
# scores whatever the untrained model writes, mostly 0: the rewards do not
# matter here, only that every group is scored and trained.
PROMPTS = [{"id": f"p{i:03d}",
            "prompt_token_ids": [14, 1 + i % 9, 10, 1 + i // 9 % 9, 12],
            "verifier": "exact", "metadata": {"answer": "7"}}
           for i in range(NUM_PROMPTS)]




class Trainer:
    """Pulls and commits training batches from a thread, recording each
    trained group's prompt, the workers that generated it and when."""

    def __init__(self, client):
        self.client = client
        self.member = work.Member(client, common.ROLE_TRAINER)
        self.lock = threading.Lock()
        self.trained = []  # (monotonic time, prompt_id, {worker ids})
        self.errors = []
        self.stop = threading.Event()
        self.thread = threading.Thread(target=self._run, daemon=True)
        self.thread.start()

    def _run(self):
        while not self.stop.is_set():
            try:
                response = self.client.call(
                    "PullTrainingBatch", pb.PullTrainingBatchRequest(
                        member_id=self.member.member_id, max_groups=64,
                        trainer_policy_version=0, wait_ms=200), timeout=5)
                if not response.groups:
                    continue
                self.client.call("CommitTrainingBatch",
                                 pb.CommitTrainingBatchRequest(
                                     member_id=self.member.member_id,
                                     batch_id=response.batch_id,
                                     policy_version=0), timeout=5)
                now = time.monotonic()
                with self.lock:
                    for group in response.groups:
                        self.trained.append((now, group.prompt_id, {
                            s.sample.worker_id for s in group.samples}))
            except grpc.RpcError as error:
                self.errors.append(error)
                time.sleep(0.1)

    def snapshot(self):
        with self.lock:
            return list(self.trained)

    def close(self):
        self.stop.set()
        self.thread.join()
        self.member.close()


class WorkerKillExactlyOnceTest(unittest.TestCase):

    def setUp(self):
        self.tmp = tempfile.mkdtemp(prefix="tandem-kill-")
        self.daemons = []
        self.trainer = None
        self.client = None
        # Runs even when setUp fails half-way, unlike tearDown.
        self.addCleanup(self.cleanup)
        dataset = os.path.join(self.tmp, "prompts.jsonl")
        with open(dataset, "w") as f:
            f.write("".join(json.dumps(p) + "\n" for p in PROMPTS))
        config = os.path.join(self.tmp, "coordinator.yaml")
        with open(config, "w") as f:
            f.write(f"""heartbeat_interval_ms: 200
heartbeat_timeout_ms: {HEARTBEAT_TIMEOUT_MS}
group_size: {GROUP_SIZE}
max_lag: 2
lease_timeout_ms: 60000
dataset:
  kind: jsonl
  path: {dataset}
  epochs: 1
  shuffle: false
sampling:
  max_tokens: 8
scoring:
  batch_wait_ms: 2
training:
  groups_per_version: 1000
""")
        self.coordinator = self.start("coordinator", ["--config", config])
        self.ready = self.coordinator.wait_ready()
        self.address = self.ready["grpc_address"]
        member = ["--set", f"coordinator_address={self.address}"]
        self.start("verifier", member).wait_ready()
        self.client = work.Client(self.address)
        # The trainer pulls from the start, so the run is under way (groups
        # trained) while most of the dataset is still to come.
        self.trainer = Trainer(self.client)
        # Few sequences at a time and a few prompts prefetched: each worker
        # holds leases for most of the run, and the dataset outlasts the kill.
        rollout = [*member, "--set", "engine.max_num_seqs=2", "--set",
                   "prefetch_prompts=3", "--set", "weight_sync.mode=pull"]
        self.victim = self.start("rollout", rollout, name="rollout-victim")
        self.survivor = self.start("rollout", rollout,
                                   name="rollout-survivor")
        self.victim.wait_ready()
        self.survivor.wait_ready()

    def start(self, daemon, args, name=None):
        d = harness.Daemon(daemon, self.tmp, args, name=name)
        self.daemons.append(d)
        return d

    def cleanup(self):
        if self.trainer:
            self.trainer.close()
        if self.client:
            self.client.close()
        unclean = {}
        for d in reversed(self.daemons):
            code = d.stop()
            if code != 0 and d is not getattr(self, "victim", None):
                unclean[d.log_path] = (code, d.output()[-2000:])
        shutil.rmtree(self.tmp, ignore_errors=True)
        if unclean:
            raise AssertionError(f"daemons exited uncleanly: {unclean}")

    def status(self):
        return self.client.call("GetClusterStatus",
                                pb.GetClusterStatusRequest())

    def member_of(self, daemon, status=None):
        for m in (status or self.status()).members:
            if m.pid == daemon.process.pid and m.role == common.ROLE_ROLLOUT:
                return m
        return None

    def test_killed_worker_leases_are_re_leased_and_each_prompt_trained_once(
            self):
        def members_alive():
            status = self.status()
            alive = [m for m in status.members
                     if m.state == common.MEMBER_STATE_ALIVE]
            return len(alive) == 4 and status
        harness.wait_for(members_alive, 20,
                         "both workers, the verifier and the trainer "
                         "to register")

        # The run is going (groups trained) and the coordinator says the
        # victim holds leases.
        def victim_holds_leases():
            status = self.status()
            victim = self.member_of(self.victim, status)
            if (victim and victim.load.leases_held > 0 and
                    status.counters.groups_trained > 0):
                return victim
            return None
        victim = harness.wait_for(victim_holds_leases, 30,
                                  "the victim to hold leases in a running run")
        os.kill(self.victim.process.pid, signal.SIGKILL)
        self.victim.process.wait()
        killed_at = time.monotonic()
        survivor_id = self.member_of(self.survivor).member_id

        def dead():
            m = self.member_of(self.victim)
            return m and m.state == common.MEMBER_STATE_DEAD
        harness.wait_for(dead, HEARTBEAT_TIMEOUT_MS / 1000 + 5,
                         "the killed worker to be declared dead")
        pattern = (rf"member {re.escape(victim.member_id)} .*declared dead; "
                   r"(\d+) leases back in the queue")
        match = harness.wait_for(
            lambda: re.search(pattern, self.coordinator.output()), 5,
            "the coordinator's log line about the dead worker")
        returned = int(match.group(1))
        self.assertGreaterEqual(returned, 1, "the victim held no lease when "
                                "it died; nothing was tested")
        after_death = self.member_of(self.victim)
        self.assertEqual(after_death.load.leases_held, 0)

        # Every prompt of the dataset is trained, and nothing more arrives.
        harness.wait_for(lambda: len(self.trainer.snapshot()) >= NUM_PROMPTS,
                         40, f"{NUM_PROMPTS} trained groups", interval=0.2)

        def drained():
            status = self.status()
            q = status.queues
            idle = (q.pending_prompts == 0 and q.leased_prompts == 0 and
                    q.scoring_samples == 0 and q.ready_groups == 0 and
                    q.training_groups == 0)
            return idle and status
        status = harness.wait_for(drained, 10, "empty queues")
        time.sleep(0.5)  # one more pull period: a duplicate would show here
        trained = self.trainer.snapshot()
        counts = collections.Counter(prompt for _, prompt, _ in trained)
        twice = sorted(p for p, n in counts.items() if n > 1)
        missing = sorted({p["id"] for p in PROMPTS} - set(counts))
        self.assertEqual(twice, [], "prompts trained more than once")
        self.assertEqual(missing, [], "prompts never trained")
        self.assertEqual(len(trained), NUM_PROMPTS)
        self.assertEqual(status.counters.groups_trained, NUM_PROMPTS)
        self.assertEqual(status.counters.members_expired, 1)
        self.assertEqual(self.trainer.errors, [])

        # Each group is one lease's work, by one of the two workers. The
        # survivor carried the run on: after the kill it generated at least
        # as many trained groups as the victim gave back (the victim's own
        # samples submitted just before it died may still be trained then).
        for _, prompt, workers in trained:
            self.assertEqual(len(workers), 1, prompt)
            self.assertIn(next(iter(workers)),
                          (victim.member_id, survivor_id))
        late = [p for t, p, workers in trained
                if t > killed_at and workers == {survivor_id}]
        self.assertGreaterEqual(len(late), returned)
        survivor = self.member_of(self.survivor)
        self.assertEqual(survivor.state, common.MEMBER_STATE_ALIVE)

        # The coordinator's metrics tell the same story: the dead worker's
        # leases went back to the queue (not by lease expiry) and were
        # dispatched once more.
        def caught_up():
            text = scrape_metrics(self.ready["metrics_address"])
            trained = metric_sum(text,
                                 "tandem_coordinator_groups_trained_total")
            return text if trained == NUM_PROMPTS else None
        text = harness.wait_for(caught_up, 5,
                                "the coordinator's metrics to catch up")
        expected = {
            ("tandem_coordinator_members_expired_total", "rollout"): 1,
            ("tandem_coordinator_groups_abandoned_total", None): returned,
            ("tandem_coordinator_lease_expiries_total", None): 0,
            ("tandem_coordinator_groups_dispatched_total", None):
                NUM_PROMPTS + returned,
            ("tandem_coordinator_groups_trained_total", None): NUM_PROMPTS,
        }
        for (name, role), value in expected.items():
            labels = {"role": role} if role else {}
            self.assertEqual(metric_sum(text, name, **labels), value, name)
        self.assertEqual(metric_sum(text, "tandem_coordinator_queue_depth",
                                queue="leased"), 0)

if __name__ == "__main__":
    try:
        unittest.main(verbosity=2)
    finally:
        shutil.rmtree(work.STUB_DIR, ignore_errors=True)
