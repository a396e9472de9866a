"""A rollout worker at its limit of harness episodes
(openai.harness_max_episodes, docs/openai-endpoint.md) still runs the
other tasks of a mixed dataset, with real daemons on loopback: a
coordinator whose JSONL dataset alternates `harness` tasks and
`calculator` tasks, a verifier hosting the calculator environment, and one
rollout worker with openai.harness_environment=harness,
openai.harness_max_episodes=1 and no harness at all: the first harness
lease it takes fills its limit for good (nobody claims its episodes).

Checked:
  * calculator groups complete while the worker holds its harness
    episodes at the limit (its tandem_rollout_harness_episodes metric);
    a worker that leased nothing at its limit (as before LeasePrompts had
    exclude_environments) completes none;
  * the coordinator keeps the skipped harness tasks queued (its
    pending_prompts) rather than losing them, and no group it completed
    is a harness task;
  * no task is leased twice while it is held (the journal's dispatched
    records name distinct prompt ids within the dataset's first pass).

How to run (ctest runs it as integration_harness_mixed):
    TANDEM_BIN_DIR=build/bin .venv/bin/python tests/integration/test_harness_mixed.py
"""

import json
import os
import sys
import tempfile
import unittest

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import episode_model  # noqa: E402
import harness  # noqa: E402
import test_episodes  # noqa: E402  (model, journal helpers, cluster)

TASKS = test_episodes.TASKS
ROWS = 40  # half harness, half calculator
COMPLETED = 4  # calculator groups the worker must complete


def write_mixed_dataset(tmp):
    path = os.path.join(tmp, "mixed.jsonl")
    with open(path, "w") as f:
        for i in range(ROWS):
            expression, answer = TASKS[i % len(TASKS)]
            text = episode_model.prompt_text(expression)
            kind = "harness" if i % 2 == 0 else "calculator"
            f.write(json.dumps({
                "id": f"{kind[0]}{i}", "prompt": text,
                "prompt_token_ids": episode_model.encode(text),
                "verifier": "exact", "metadata": {"answer": answer},
                "environment": kind}) + "\n")
    return path


def setUpModule():
    test_episodes.setUpModule()


def tearDownModule():
    test_episodes.tearDownModule()


class MixedDatasetTest(unittest.TestCase):

    @classmethod
    def setUpClass(cls):
        cls.tmp = tempfile.mkdtemp(prefix="tandem-harness-mixed-")
        cluster = test_episodes.Cluster(
            cls.tmp, write_mixed_dataset(cls.tmp), ["--set", "max_lag=8"])
        try:
            worker = harness.Daemon(
                "rollout", cls.tmp,
                [*cluster.member,
                 "--set", f"model.path={test_episodes.MODEL_DIR}",
                 "--set", "engine.max_num_seqs=8",
                 "--set", "prefetch_prompts=2",
                 "--set",
                 f"environment.address={cluster.environment_address}",
                 "--set", "environment.max_turns=4",
                 "--set", "environment.max_turn_tokens=64",
                 "--set", "environment.turn_stop_strings=</tool_call>",
                 "--set", "openai.listen=127.0.0.1:0",
                 "--set", "openai.harness_environment=harness",
                 "--set", "openai.harness_max_episodes=1",
                 "--set", "openai.harness_idle_timeout_s=600"],
                name="mixed-worker")
            worker.wait_ready(120)
            cluster.workers.append(worker)
            metrics_address = worker.wait_ready()["metrics_address"]

            def held():
                return harness.metric_sum(
                    harness.scrape_metrics(metrics_address),
                    "tandem_rollout_harness_episodes")

            harness.wait_for(lambda: held() >= 1, 60,
                             "the worker at its harness limit")
            harness.wait_for(
                lambda: cluster.counter("groupsCompleted") >= COMPLETED,
                180, f"{COMPLETED} calculator groups completed at the "
                "harness limit", interval=0.5)
            cls.held = held()
            cls.status = harness.cluster_status(cluster.address)
        finally:
            cls.records = cluster.stop()

    @classmethod
    def tearDownClass(cls):
        harness.remove_tmp(cls.tmp)

    def dispatched(self):
        return [r.dispatched.group for r in self.records
                if r.WhichOneof("record") == "dispatched"]

    def test_other_tasks_run_while_the_harness_limit_is_reached(self):
        # A lease of GROUP_SIZE episodes reached the limit of 1 and stayed
        # (a lease taken just below it may pass it, never a later one).
        self.assertGreaterEqual(self.held, test_episodes.GROUP_SIZE)
        self.assertLessEqual(self.held, 2 * test_episodes.GROUP_SIZE)
        completed = harness.as_int(self.status["counters"], "groupsCompleted")
        self.assertGreaterEqual(completed, COMPLETED)

    def test_harness_tasks_stay_queued_and_none_completed(self):
        pending = harness.as_int(self.status.get("queues", {}),
                                 "pendingPrompts")
        self.assertGreater(pending, 0, self.status)
        groups = self.dispatched()
        harness_groups = [g for g in groups
                          if g.prompt.environment == "harness"]
        # The one lease that filled the limit (and perhaps one prefetched
        # before it was reached), no more.
        self.assertGreaterEqual(len(harness_groups), 1)
        self.assertLessEqual(len(harness_groups), 3)
        completed_ids = {r.sample.group_id for r in self.records
                         if r.WhichOneof("record") == "sample"}
        harness_ids = {g.group_id for g in harness_groups}
        self.assertFalse(completed_ids & harness_ids)

    def test_no_task_is_leased_twice(self):
        ids = [g.prompt.id for g in self.dispatched()]
        self.assertLess(len(ids), ROWS)  # within the first pass
        self.assertEqual(len(ids), len(set(ids)), ids)


if __name__ == "__main__":
    unittest.main()
