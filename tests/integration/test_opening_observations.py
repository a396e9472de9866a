"""Opening observations through real daemons on loopback (issue 23, item 2):
an environment that answers OpenEpisode with a first observation, like a
gym reset(), gets it in front of the model's first turn.

The environment is the Python example (examples/python_environment/
guess_number_env.py --opening, grpcio): each episode opens with "I am
thinking of a number between LO and HI.", a window drawn at random around
the task's secret, so the two samples of a group open differently. The
dataset's prompts are written without the chat template's generation
header (what tells the worker to wait for the opens). A real coordinator
(journal), a real verifier, a rollout worker with environment.address set
to the Python process, and a real trainer that trains the groups.

Checked on every trained sample, read back from the coordinator's journal:
the group's prompt ends without the header; the completion begins with the
environment's tokens, exactly the chat template's rendering of that
episode's own opening observation plus the assistant header (log-prob 0),
whose window holds the task's secret; then the model's tokens (log-prob
< 0); version spans cover every token. And the two samples of most groups
opened differently (each episode's prompt is its own).

How to run (ctest runs it as integration_opening_observations):
    TANDEM_BIN_DIR=build/bin .venv/bin/python \
        tests/integration/test_opening_observations.py
"""

import json
import os
import re
import subprocess
import sys
import tempfile
import unittest

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import episode_model  # noqa: E402
import harness  # noqa: E402
import test_episodes as episodes  # noqa: E402  (helpers only)

GROUP_SIZE = episodes.GROUP_SIZE
TRAINED_GROUPS = 4
SECRETS = [17, 42, 63, 88]
PROMPT = "<|im_start|>user:Guess my number with the guess tool.<|im_end|>"
OPENING = re.compile(r"^<\|im_start\|>user:I am thinking of a number between "
                     r"(\d+) and (\d+)\.<\|im_end\|><\|im_start\|>assistant:$")
MODEL, ENVIRONMENT = episodes.MODEL, episodes.ENVIRONMENT


def write_dataset(tmp):
    path = os.path.join(tmp, "guess.jsonl")
    with open(path, "w") as f:
        for i in range(2 * len(SECRETS)):
            secret = SECRETS[i % len(SECRETS)]
            f.write(json.dumps({
                "id": f"g{i}", "prompt": PROMPT,
                "prompt_token_ids": episode_model.encode(PROMPT),
                # The environment scores the episode; a dataset row names
                # a verifier all the same.
                "verifier": "exact",
                "metadata": {"secret": str(secret), "answer": str(secret)},
                "environment": "guess_number"}) + "\n")
    return path


class OpeningObservationsTest(unittest.TestCase):

    @classmethod
    def setUpClass(cls):
        cls.tmp = tempfile.mkdtemp(prefix="tandem-opening-")
        episodes.journal_pb2 = episodes.journal_stubs(cls.tmp)
        model_dir = os.path.join(cls.tmp, "model")
        # The calculator warm start: the model only has to write turns.
        episode_model.make_model(
            model_dir, [("3*4", "12"), ("9*9", "81")], steps=60)
        ready = os.path.join(cls.tmp, "env.json")
        cls.env = subprocess.Popen(
            ["/usr/bin/python3",
             os.path.join(harness.REPO, "examples", "python_environment",
                          "guess_number_env.py"),
             "--opening", "--ready-file", ready],
            stdout=subprocess.DEVNULL, stderr=subprocess.STDOUT)
        env_address = harness.wait_for(
            lambda: harness.read_json(ready), 30,
            "the Python environment")["grpc_address"]
        try:
            cluster = episodes.Cluster(cls.tmp, write_dataset(cls.tmp),
                                       ["--set", "max_lag=4"])
        except BaseException:
            harness.stop_process(cls.env)
            raise
        cls.cluster = cluster
        try:
            worker = harness.Daemon(
                "rollout", cls.tmp,
                [*cluster.member, "--set", f"model.path={model_dir}",
                 "--set", "engine.max_num_seqs=8",
                 "--set", "prefetch_prompts=2",
                 "--set", f"environment.address={env_address}",
                 "--set", "environment.max_turns=2",
                 "--set", "environment.max_turn_tokens=48",
                 # The prompt (43 tokens) and the episode stay inside the
                 # model's 256 positions.
                 "--set", "environment.max_episode_tokens=200",
                 "--set", "environment.turn_stop_strings=</tool_call>"],
                name="opening-worker")
            cluster.workers.append(worker)
            worker.wait_ready(120)
            cluster.trainer = harness.Daemon(
                "trainer", cls.tmp,
                [*cluster.member, "--set", f"model.path={model_dir}",
                 "--set",
                 f"checkpoint_dir={os.path.join(cls.tmp, 'ckpt')}",
                 "--set", "training.lr=1e-5",
                 "--set", "training.batch_max_groups=2"])
            cluster.trainer.wait_ready(120)
            cluster.wait_trained(TRAINED_GROUPS)
        finally:
            cls.records = cluster.stop()
            harness.stop_process(cls.env)

    @classmethod
    def tearDownClass(cls):
        harness.remove_tmp(cls.tmp)

    def test_each_trained_episode_opens_with_its_own_observation(self):
        prompts, secrets = {}, {}
        for r in self.records:
            if r.WhichOneof("record") == "dispatched":
                group = r.dispatched.group
                prompts[group.group_id] = list(group.prompt.token_ids)
                secrets[group.group_id] = int(group.prompt.metadata["secret"])
        trained = episodes.trained_samples(self.records, self)
        self.assertGreaterEqual(len(trained), TRAINED_GROUPS * GROUP_SIZE)
        openings = {}
        for sample, score, _, _ in trained:
            with self.subTest(sample=sample.sample_id):
                # The group's prompt is the dataset's, without the header.
                self.assertEqual(prompts[sample.group_id],
                                 episode_model.encode(PROMPT))
                tokens = list(sample.completion_token_ids)
                logprobs = list(sample.behavior_logprobs)
                sources = episodes.per_token(sample.source_spans,
                                             lambda s: s.source)
                versions = episodes.per_token(sample.version_spans,
                                              lambda s: s.policy_version)
                self.assertEqual(len(sources), len(tokens))
                self.assertEqual(len(versions), len(tokens))
                self.assertIsNotNone(score)
                self.assertTrue(sample.episode_end_reason)
                # The environment's opening run, then the model's turn.
                first = sources.index(MODEL)
                self.assertGreater(first, 0)
                self.assertEqual(set(sources[:first]), {ENVIRONMENT})
                self.assertEqual(logprobs[:first], [0.0] * first)
                self.assertLess(logprobs[first], 0.0)
                opening = episodes.decode(tokens[:first])
                match = OPENING.match(opening)
                self.assertIsNotNone(match, opening)
                self.assertEqual(tokens[:first], episode_model.encode(opening))
                low, high = int(match.group(1)), int(match.group(2))
                self.assertLessEqual(low, secrets[sample.group_id])
                self.assertGreaterEqual(high, secrets[sample.group_id])
                openings.setdefault(sample.group_id, set()).add(opening)
        # Windows drawn at random: the samples of a group open differently
        # (the same window twice: at most about 1 in 80 per group, for the
        # secret 88, whose upper end is often clipped to 100).
        differing = sum(1 for o in openings.values() if len(o) > 1)
        print(f"{len(trained)} trained episodes in {len(openings)} groups; "
              f"{differing} groups whose samples opened differently")
        self.assertGreater(differing, len(openings) // 2)


if __name__ == "__main__":
    unittest.main()
