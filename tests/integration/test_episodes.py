"""Multi-turn episodes through real daemons on loopback (issue 23): a
coordinator serving a JSONL dataset whose rows name the `calculator`
environment, a real `tandem-verifier` hosting it, a real rollout worker with
environment.address set, and a real trainer publishing versions while the
episodes run.

The model is tiny and made here (episode_model.py): a Llama decoder with a
character tokenizer and a chat template, warm-started for a few seconds on
whole episodes so that it writes Hermes `<tool_call>` calls. At run time it
samples (temperature 0.7) and the rollout worker parses its turns, the
calculator answers, the observation is rendered with the chat template and
tokenized by the worker, and the model answers.

Checked, token by token, on every trained episode, read back from the
coordinator's journal (services/coordinator/journal.proto: the accepted
samples, their scores, and the batches the published versions trained):
  * source spans: model turn, environment observation, model turn; the
    first turn decodes to a call that parses as JSON, the environment's
    tokens are exactly the template's rendering of the calculator's
    result of that call's expression (computed here independently), with
    behaviour log-prob 0, the model's tokens log-probs < 0;
  * per-token policy versions cover every token, never go down, and change
    inside at least one episode (a weight update landed mid-episode);
  * the score is the environment's reward: 1 exactly when the last turn is
    the task's answer (end reason answered), and no verifier was asked
    (tandem_coordinator_verifier_* counters stay 0).
And a worker without environment.address returns the episode leases it
gets (its log names the key) instead of dropping them, backing off for a
second after each refusal; they are trained by the worker that has one.

ParkingTest: episodes waiting for a slow environment
(tests/bench/scripted_env.py) take no batch slot: a worker with 4 slots
holds more than 4 parked episodes and keeps generating; with
environment.max_parked 0 it holds at most 4.

KillTest: kill -9 of the rollout worker while episodes are open at the
environment, on a finite dataset (one epoch of 24 prompts): its leases go
back (groups_abandoned_total), a second worker finishes the dataset, and
the journal shows every prompt trained exactly once (one group of
GROUP_SIZE episodes each; none missing, none twice), with episodes of both
workers among them.

How to run (ctest runs it as integration_episodes):
    TANDEM_BIN_DIR=build/bin .venv/bin/python tests/integration/test_episodes.py
"""

import collections
import json
import os
import signal
import struct
import subprocess
import sys
import tempfile
import time
import unittest

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import episode_model  # noqa: E402
import harness  # noqa: E402

# (expression, the calculator's result). The answers are what `exact`
# compares the model's last turn with.
TASKS = [("3*4", "12"), ("17+25", "42"), ("9*9", "81"), ("100-58", "42")]
GROUP_SIZE = 2
TRAINED_GROUPS = 16
# tandem.v1.TokenSource
MODEL, ENVIRONMENT = 0, 1


def journal_stubs(out_dir):
    """Python classes of the coordinator's journal records."""
    root = harness.REPO
    subprocess.run(
        ["protoc", f"--proto_path={os.path.join(root, 'proto')}",
         f"--proto_path={root}", f"--python_out={out_dir}",
         "tandem/v1/common.proto", "services/coordinator/journal.proto"],
        check=True)
    sys.path.insert(0, out_dir)
    from services.coordinator import journal_pb2
    return journal_pb2


def read_journal(path, journal_pb2):
    """Records of a journal file: [u32 length][u32 crc][payload], little
    endian (services/coordinator/journal.cc); a torn tail is ignored."""
    with open(path, "rb") as f:
        data = f.read()
    records, offset = [], 0
    while offset + 8 <= len(data):
        length, _ = struct.unpack_from("<II", data, offset)
        if offset + 8 + length > len(data):
            break
        record = journal_pb2.Record()
        record.ParseFromString(data[offset + 8:offset + 8 + length])
        records.append(record)
        offset += 8 + length
    return records


def decode(ids):
    inverse = {i: t for t, i in episode_model.VOCAB.items()}
    return "".join(inverse[i] for i in ids)


def per_token(spans, value_of):
    out = []
    for span in spans:
        out += [value_of(span)] * span.num_tokens
    return out


MODEL_DIR = None  # the warm-started model, made once (setUpModule)
STUB_DIR = None
journal_pb2 = None


def setUpModule():
    global MODEL_DIR, STUB_DIR, journal_pb2
    STUB_DIR = tempfile.mkdtemp(prefix="tandem-episodes-model-")
    journal_pb2 = journal_stubs(STUB_DIR)
    MODEL_DIR = os.path.join(STUB_DIR, "model")
    loss = episode_model.make_model(MODEL_DIR, TASKS)
    # Its final loss was 0.0014 here (400 AdamW steps on 4 tasks, seeded):
    # 0.05 leaves a 35x margin for other CPUs and BLAS kernels.
    assert loss < 0.05, f"the warm start did not converge: loss {loss}"


def tearDownModule():
    harness.remove_tmp(STUB_DIR)


def write_dataset(tmp, count, environment="calculator"):
    rows = []
    for i in range(count):
        expression, answer = TASKS[i % len(TASKS)]
        text = episode_model.prompt_text(expression)
        rows.append({"id": f"t{i}", "prompt": text,
                     "prompt_token_ids": episode_model.encode(text),
                     "verifier": "exact", "metadata": {"answer": answer},
                     "environment": environment})
    path = os.path.join(tmp, "episodes.jsonl")
    with open(path, "w") as f:
        for row in rows:
            f.write(json.dumps(row) + "\n")
    return path


class Cluster:
    """Coordinator (journal in tmp/journal), verifier (hosting calculator)
    and trainer on loopback; the tests start the rollout workers."""

    def __init__(self, tmp, dataset, coordinator_extra=()):
        self.tmp = tmp
        self.journal_dir = os.path.join(tmp, "journal")
        self.coordinator = harness.Daemon(
            "coordinator", tmp,
            ["--set", "heartbeat_interval_ms=200",
             "--set", "heartbeat_timeout_ms=3000",
             "--set", "dataset.kind=jsonl", "--set", f"dataset.path={dataset}",
             "--set", "dataset.add_bos=false",
             "--set", f"group_size={GROUP_SIZE}",
             "--set", "sampling.temperature=0.7",
             "--set", "sampling.max_tokens=160",
             "--set", "training.groups_per_version=2",
             "--set", f"journal.dir={self.journal_dir}",
             "--set", "journal.compact_bytes=1073741824",
             *coordinator_extra])
        ready = self.coordinator.wait_ready()
        self.address = ready["grpc_address"]
        self.coordinator_metrics_address = ready["metrics_address"]
        self.member = ["--set", f"coordinator_address={self.address}"]
        self.verifier = harness.Daemon("verifier", tmp, self.member)
        verifier_ready = self.verifier.wait_ready()
        self.environment_address = verifier_ready["grpc_address"]
        self.verifier_metrics_address = verifier_ready["metrics_address"]
        self.trainer = None
        self.workers = []

    def worker(self, name, environment=True):
        args = [*self.member, "--set", f"model.path={MODEL_DIR}",
                "--set", "engine.max_num_seqs=8",
                "--set", "prefetch_prompts=2"]
        if environment:
            args += ["--set",
                     f"environment.address={self.environment_address}",
                     "--set", "environment.max_turns=4",
                     "--set", "environment.max_turn_tokens=64",
                     # A call ends the turn: the worker closes it with
                     # <|im_end|> as the environment's token.
                     "--set", "environment.turn_stop_strings=</tool_call>"]
        daemon = harness.Daemon("rollout", self.tmp, args, name=name)
        daemon.wait_ready(120)
        self.workers.append(daemon)
        return daemon

    def start_trainer(self):
        self.trainer = harness.Daemon(
            "trainer", self.tmp,
            [*self.member, "--set", f"model.path={MODEL_DIR}",
             "--set", f"checkpoint_dir={os.path.join(self.tmp, 'ckpt')}",
             "--set", "training.lr=1e-5",
             "--set", "training.batch_max_groups=2"])
        self.trainer.wait_ready(120)

    def counter(self, field):
        status = harness.cluster_status(self.address)
        return harness.as_int(status.get("counters", {}), field)

    def wait_trained(self, groups, timeout=300):
        harness.wait_for(lambda: self.counter("groupsTrained") >= groups,
                         timeout, f"{groups} groups trained", interval=1.0)

    def stop(self):
        """Stops every daemon still running; returns the journal's
        records."""
        for daemon in [self.trainer, *self.workers, self.verifier,
                       self.coordinator]:
            if daemon is not None and daemon.process.poll() is None:
                daemon.stop()
        return read_journal(os.path.join(self.journal_dir, "journal"),
                            journal_pb2)


def trained_samples(records, test=None):
    """(sample, score, the task's answer, prompt id) of every sample in a
    batch that a published (or committed) version trained."""
    samples, scores, pulled, answers, prompts = {}, {}, {}, {}, {}
    trained_batches = []
    for r in records:
        kind = r.WhichOneof("record")
        if kind == "dispatched":
            group = r.dispatched.group
            answers[group.group_id] = group.prompt.metadata["answer"]
            prompts[group.group_id] = group.prompt.id
        elif kind == "sample":
            samples[(r.sample.group_id,
                     r.sample.sample.sample_index)] = r.sample.sample
        elif kind == "score":
            scores[(r.score.group_id, r.score.score.index)] = \
                r.score.score.score
        elif kind == "pulled":
            pulled[r.pulled.batch_id] = list(r.pulled.group_ids)
        elif kind == "committed":
            trained_batches.append(r.committed.batch_id)
        elif kind == "published" and r.published.batch_id:
            trained_batches.append(r.published.batch_id)
    out = []
    for batch in dict.fromkeys(trained_batches):  # one batch, one version
        for group in pulled.get(batch, []):
            for index in range(GROUP_SIZE):
                key = (group, index)
                if test is not None:
                    test.assertIn(key, samples,
                                  f"{key} trained, never accepted")
                elif key not in samples:
                    continue
                out.append((samples[key], scores.get(key), answers[group],
                            prompts[group]))
    return out


class EpisodesTest(unittest.TestCase):

    @classmethod
    def setUpClass(cls):
        cls.tmp = tempfile.mkdtemp(prefix="tandem-episodes-")
        cluster = Cluster(cls.tmp, write_dataset(cls.tmp, 2 * len(TASKS)),
                          ["--set", "max_lag=4"])
        # A worker that cannot run episodes refuses the leases it gets.
        cls.plain = cluster.worker("plain-worker", environment=False)
        harness.wait_for(
            lambda: "has no environment.address" in cls.plain.output(), 60,
            "the plain worker refusing an episode lease")
        # It backs off after a refusal rather than leasing and returning
        # the same prompts in a tight loop.
        time.sleep(2)
        cls.plain_refusals = cls.plain.output().count(
            "has no environment.address")
        cls.plain.stop()
        worker = cluster.worker("episode-worker")
        cluster.start_trainer()
        cluster.wait_trained(TRAINED_GROUPS)

        # Then until a trained episode saw a weight update inside it (the
        # journal is read while it grows; a torn tail is ignored).
        def update_inside_an_episode():
            records = read_journal(
                os.path.join(cluster.journal_dir, "journal"), journal_pb2)
            return any(len({s.policy_version for s in sample.version_spans})
                       > 1 for sample, _, _, _ in trained_samples(records))
        harness.wait_for(update_inside_an_episode, 300,
                         "a weight update inside a trained episode",
                         interval=1.0)
        cls.coordinator_metrics = harness.scrape_metrics(
            cluster.coordinator_metrics_address)
        cls.env_metrics = harness.scrape_metrics(
            cluster.verifier_metrics_address)
        cls.worker_metrics = harness.scrape_metrics(
            worker.wait_ready()["metrics_address"])
        cls.records = cluster.stop()

    @classmethod
    def tearDownClass(cls):
        harness.remove_tmp(cls.tmp)

    def test_trained_episodes_token_by_token(self):
        trained = trained_samples(self.records, self)
        self.assertGreaterEqual(len(trained), TRAINED_GROUPS * GROUP_SIZE)
        with_calls = 0
        mid_episode_updates = 0
        answered_right = 0
        for sample, score, answer, _ in trained:
            with self.subTest(sample=sample.sample_id):
                tokens = list(sample.completion_token_ids)
                logprobs = list(sample.behavior_logprobs)
                # No spans: a one-turn episode, every token the model's.
                sources = (per_token(sample.source_spans, lambda s: s.source)
                           or [MODEL] * len(tokens))
                versions = per_token(sample.version_spans,
                                     lambda s: s.policy_version)
                self.assertEqual(len(sources), len(tokens))
                self.assertEqual(len(versions), len(tokens))
                self.assertEqual(versions, sorted(versions))
                self.assertTrue(sample.episode_end_reason)
                # The score is the environment's: the sample's reward, or
                # 0 with the end reason.
                self.assertIsNotNone(score)
                self.assertEqual(score.outcome, sample.episode_end_reason)
                if sample.HasField("environment_reward"):
                    self.assertEqual(score.reward, sample.environment_reward)
                else:
                    self.assertEqual(score.reward, 0.0)
                # Runs of one source: the model's turns and the
                # environment's observations between them.
                runs = []
                for i, source in enumerate(sources):
                    if not runs or runs[-1][0] != source:
                        runs.append((source, []))
                    runs[-1][1].append(i)
                for source, idx in runs:
                    for i in idx:
                        if source == ENVIRONMENT:
                            self.assertEqual(logprobs[i], 0.0)
                        else:
                            self.assertLess(logprobs[i], 0.0)
                if len(set(versions)) > 1:
                    mid_episode_updates += 1
                if len(runs) < 3:
                    continue  # no observation: ended before a call
                turn1 = decode([tokens[i] for i in runs[0][1]])
                observation = [tokens[i] for i in runs[1][1]]
                last = decode([tokens[i] for i in runs[-1][1]])
                self.assertTrue(turn1.startswith("<tool_call>"), turn1)
                # The stop string ended the turn: the model's turn ends
                # with it, and <|im_end|> is the environment's.
                self.assertTrue(turn1.endswith("</tool_call>"), turn1)
                body = turn1[len("<tool_call>"):turn1.index("</tool_call>")]
                call = json.loads(body)  # a real, well-formed call
                self.assertEqual(call["name"], "calculator")
                expression = call["arguments"]["expression"]
                # The calculator's answer, computed here: integers only.
                value = str(eval(expression, {"__builtins__": {}}))
                self.assertEqual(
                    observation,
                    episode_model.encode(
                        "<|im_end|>" + episode_model.observation_text(value)),
                    decode(observation))
                with_calls += 1
                if (sample.episode_end_reason == "answered" and
                        last.replace("<|im_end|>", "") == answer):
                    self.assertEqual(score.reward, 1.0)
                    answered_right += 1
        print(f"{len(trained)} trained episodes, {with_calls} with a parsed "
              f"call and its observation, {answered_right} answered right, "
              f"{mid_episode_updates} with a weight update inside")
        self.assertGreaterEqual(with_calls, len(trained) // 2)
        self.assertGreater(answered_right, 0)
        self.assertGreater(mid_episode_updates, 0)

    def test_the_worker_counts_its_episodes(self):
        self.assertGreater(harness.metric_sum(
            self.worker_metrics, "tandem_rollout_episodes_ended_total",
            reason="answered"), 0)
        self.assertGreater(harness.metric_sum(
            self.worker_metrics, "tandem_rollout_episode_tool_calls_total"),
            0)

    def test_the_environment_scored_and_no_verifier_was_asked(self):
        self.assertGreater(harness.metric_sum(
            self.env_metrics, "tandem_verifier_env_tool_calls_total",
            tool="calculator", outcome="ok"), 0)
        self.assertGreater(harness.metric_sum(
            self.env_metrics, "tandem_verifier_env_episodes_ended_total",
            reason="answered"), 0)
        self.assertEqual(harness.metric_sum(
            self.coordinator_metrics,
            "tandem_coordinator_score_calls_total"), 0)

    def test_a_worker_without_an_environment_returns_episode_leases(self):
        self.assertIn("environment.address", self.plain.output())
        # prefetch_prompts 2, a 1 s backoff after each refusal: a few
        # rounds in 2 s.
        self.assertLessEqual(self.plain_refusals, 12)
        self.assertGreater(harness.metric_sum(
            self.coordinator_metrics,
            "tandem_coordinator_groups_abandoned_total"), 0)



class ParkingTest(unittest.TestCase):
    """Episodes waiting for their environment take no batch slot: with a
    slow tool (tests/bench/scripted_env.py, 300 ms a round trip) a worker
    of engine.max_num_seqs 4 holds more than 4 parked episodes while it
    keeps generating; with environment.max_parked 0 the parked ones count
    against the 4 slots as before."""

    SLOTS = 4

    def setUp(self):
        self.tmp = tempfile.mkdtemp(prefix="tandem-episodes-parking-")
        ready = os.path.join(self.tmp, "env.json")
        self.env = subprocess.Popen(
            ["/usr/bin/python3", os.path.join(harness.REPO, "tests", "bench",
                                              "scripted_env.py"),
             "--tool-turns", "2", "--tool-ms", "300", "--ready-file", ready],
            stdout=subprocess.DEVNULL, stderr=subprocess.STDOUT)
        self.env_address = harness.wait_for(
            lambda: harness.read_json(ready), 30,
            "scripted environment")["grpc_address"]
        # No trainer: lift the in-flight bound so that only the worker's
        # own admission limits what it holds.
        self.cluster = Cluster(
            self.tmp, write_dataset(self.tmp, 512, environment="scripted"),
            ["--set", "max_lag=100",
             "--set", "training.groups_per_version=100000"])

    def tearDown(self):
        self.cluster.stop()
        harness.stop_process(self.env)
        harness.remove_tmp(self.tmp)

    def most_parked(self, max_parked):
        """The most parked sequences seen over 8 s, and the tokens
        generated meanwhile."""
        worker = harness.Daemon(
            "rollout", self.tmp,
            [*self.cluster.member, "--set", f"model.path={MODEL_DIR}",
             "--set", f"engine.max_num_seqs={self.SLOTS}",
             "--set", f"environment.address={self.env_address}",
             "--set", "environment.max_turns=3",
             "--set", "environment.max_turn_tokens=64",
             "--set", f"environment.max_parked={max_parked}"],
            name=f"parking-{max_parked}")
        self.cluster.workers.append(worker)
        metrics = worker.wait_ready(120)["metrics_address"]

        def scrape():
            text = harness.scrape_metrics(metrics)
            return (harness.metric_sum(text,
                                       "tandem_rollout_parked_sequences"),
                    harness.metric_sum(
                        text, "tandem_rollout_generated_tokens_total"))
        harness.wait_for(lambda: scrape()[0] > 0, 60, "a parked episode")
        most, tokens_before = 0, scrape()[1]
        deadline = time.monotonic() + 8
        while time.monotonic() < deadline:
            most = max(most, scrape()[0])
            time.sleep(0.05)
        tokens = scrape()[1] - tokens_before
        worker.stop()
        return most, tokens

    def test_parked_episodes_leave_the_batch_to_others(self):
        most, tokens = self.most_parked(max_parked=64)
        print(f"max_parked 64: at most {most:.0f} parked, {tokens:.0f} "
              f"tokens generated in 8 s")
        # A lease brings GROUP_SIZE sequences at once, so the worker may
        # overshoot its room by GROUP_SIZE - 1.
        self.assertGreater(most, self.SLOTS + GROUP_SIZE - 1)
        parked_tokens = tokens
        most, tokens = self.most_parked(max_parked=0)
        print(f"max_parked 0: at most {most:.0f} parked, {tokens:.0f} "
              f"tokens generated in 8 s")
        self.assertLessEqual(most, self.SLOTS + GROUP_SIZE - 1)
        # Measured 52,322 against 3,072 tokens (17x): 2x leaves room for
        # any machine's speed, both runs being on the same one.
        self.assertGreater(parked_tokens, 2 * tokens)


class KillTest(unittest.TestCase):
    """kill -9 of the rollout worker while episodes are open at the
    environment: a finite dataset (one epoch) is still trained whole, every
    prompt exactly once."""

    PROMPTS = 24

    def setUp(self):
        self.tmp = tempfile.mkdtemp(prefix="tandem-episodes-kill-")

    def tearDown(self):
        harness.remove_tmp(self.tmp)

    def test_kill_9_mid_episode_loses_no_episode_and_trains_none_twice(self):
        cluster = Cluster(
            self.tmp, write_dataset(self.tmp, self.PROMPTS),
            # The survivor joins with the starting weights and may
            # generate a few groups before its first version arrives:
            # groups dropped as stale must come back as prompts, or a
            # one-epoch dataset would not be trained whole.
            ["--set", "max_lag=8",
             "--set", "dataset.epochs=1", "--set", "dataset.shuffle=false"])
        try:
            cluster.start_trainer()
            victim = cluster.worker("victim")

            def mid_episode():
                # Episodes open at the environment, some already delivered.
                text = harness.scrape_metrics(
                    cluster.verifier_metrics_address)
                return (harness.metric_sum(
                    text, "tandem_verifier_env_episodes_open") > 0 and
                    cluster.counter("samplesReceived") >= 2 * GROUP_SIZE)
            harness.wait_for(mid_episode, 120, "episodes open mid-run",
                             interval=0.02)
            victim.stop(signal.SIGKILL)
            received_at_kill = cluster.counter("samplesReceived")
            self.assertLess(received_at_kill, self.PROMPTS * GROUP_SIZE)
            cluster.worker("survivor")
            cluster.wait_trained(self.PROMPTS)
            metrics = harness.scrape_metrics(
                cluster.coordinator_metrics_address)
        finally:
            records = cluster.stop()
        # The victim's leases went back (it died holding some).
        self.assertGreater(harness.metric_sum(
            metrics, "tandem_coordinator_groups_abandoned_total"), 0)
        trained = trained_samples(records, self)
        prompts = collections.Counter(p for _, _, _, p in trained)
        # Every prompt trained once: GROUP_SIZE samples of one group each.
        self.assertEqual(sorted(prompts),
                         sorted(f"t{i}" for i in range(self.PROMPTS)))
        self.assertEqual(set(prompts.values()), {GROUP_SIZE})
        workers = collections.Counter(s.worker_id for s, _, _, _ in trained)
        print(f"trained samples by worker: {dict(workers)}; "
              f"{received_at_kill} samples received before the kill")
        self.assertEqual(len(workers), 2, "both workers' episodes trained")
        for sample, score, _, _ in trained:
            self.assertTrue(sample.episode_end_reason)
            self.assertEqual(score.outcome, sample.episode_end_reason)


if __name__ == "__main__":
    unittest.main(verbosity=2)
