"""Training a black-box agent harness through the rollout worker's OpenAI
endpoint (issue 23 item 5(a), docs/openai-endpoint.md, "Training a
black-box agent"), with real daemons on loopback: a coordinator serving a
JSONL dataset whose rows name the environment `harness`, a verifier, a
trainer, and a rollout worker with openai.harness_environment=harness.

The "agent" is a small Python loop that knows nothing of Tandem but three
HTTP calls: it claims an episode (POST /tandem/v1/episodes:claim), talks to
the model with the official `openai` client's chat.completions (the episode
id in `extra_body`), answers the model's tool call with a fake tool result
of its own, lets the model answer, and finishes the episode with a reward
(POST /tandem/v1/episodes/{id}:finish). The model is the tiny tool-calling
Llama of episode_model.py (it has a chat template).

Checked, token by token, on every trained sample of these episodes, read
back from the coordinator's journal:
  * the completion is exactly turn 1's tokens, the tokens the harness's
    second request added (the assistant turn's end and the tool message:
    the environment's), then turn 2's tokens;
  * source spans mark the model's tokens MODEL and the harness's
    ENVIRONMENT; behaviour log-probs and per-token policy versions of the
    model's tokens are the ones the responses returned, the environment's
    log-probs 0;
  * the score is the harness's reward (end reason "environment"), and no
    verifier was asked.
Bad input:
  * a chat request naming an unknown episode: 404 (openai.NotFoundError)
    naming the id; :finish of an unknown episode: 404;
  * a turn whose prompt does not extend the episode's tokens: 400 naming
    the episode and the first differing token position (computed here);
    the episode then goes on with a correct turn;
  * a temperature other than the task's, and n=2: 400;
  * :finish twice: 409;
  * a harness that claims an episode and vanishes: after
    openai.harness_idle_timeout_s the lease goes back to the coordinator
    (groups_abandoned_total grows, the worker logs it), a late :finish of
    that episode is a 409 saying its task went back, no sample of that
    lease is in the journal, and no group is trained twice.

How to run (ctest runs it as integration_openai_harness):
    TANDEM_BIN_DIR=build/bin .venv/bin/python tests/integration/test_openai_harness.py
"""

import collections
import json
import math
import os
import re
import sys
import tempfile
import time
import unittest
import urllib.error
import urllib.request

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import episode_model  # noqa: E402
import harness  # noqa: E402
import test_episodes  # noqa: E402  (journal helpers, dataset, cluster)
from test_openai_endpoint import openai  # noqa: E402  (the pinned client)

TASKS = test_episodes.TASKS
GROUP_SIZE = test_episodes.GROUP_SIZE
MODEL, ENVIRONMENT = test_episodes.MODEL, test_episodes.ENVIRONMENT
ENV_NAME = "harness"
IDLE_TIMEOUT_S = 20
TRAINED_GROUPS = 6
TEMPERATURE = 0.7


def http(address, path, body=None):
    """(status, JSON body or None) of a POST to the worker's endpoint."""
    data = json.dumps(body if body is not None else {}).encode()
    request = urllib.request.Request(
        f"http://{address}{path}", data=data, method="POST",
        headers={"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(request, timeout=90) as response:
            text = response.read()
            return response.status, (json.loads(text) if text else None)
    except urllib.error.HTTPError as e:
        text = e.read()
        return e.code, (json.loads(text) if text else None)


def claim(address, wait_ms=10000):
    status, body = http(address, "/tandem/v1/episodes:claim",
                        {"wait_ms": wait_ms})
    if status == 204:
        return None
    assert status == 200, (status, body)
    return body


def finish(address, episode_id, reward):
    return http(address, f"/tandem/v1/episodes/{episode_id}:finish",
                {"reward": reward})


def question(claimed):
    """The task's question, from the prompt the claim carries (the
    dataset's prompt is the chat template's rendering of it)."""
    match = re.fullmatch(r"<\|im_start\|>user:(.*)<\|im_end\|>"
                         r"<\|im_start\|>assistant:", claimed["prompt"])
    assert match, claimed["prompt"]
    return match.group(1)


def choice_of(response):
    c = response.choices[0]
    d = c.model_dump()
    return {"content": c.message.content or "",
            "token_ids": d["token_ids"],
            "logprobs": d["behavior_logprobs"],
            "versions": d["policy_versions"],
            "prompt_token_ids": response.model_dump()["prompt_token_ids"]}


class Agent:
    """The black-box harness: chat turns with a fake tool in between."""

    def __init__(self, address):
        self.address = address
        self.client = openai.OpenAI(base_url=f"http://{address}/v1",
                                    api_key="unused", max_retries=0,
                                    timeout=90)

    def chat(self, episode_id, messages, **kwargs):
        kwargs.setdefault("temperature", TEMPERATURE)
        return self.client.chat.completions.create(
            model="m", messages=messages, max_tokens=64,
            extra_body={"tandem_episode_id": episode_id}, **kwargs)

    def run(self, claimed):
        """Runs one claimed episode to its finish; returns its transcript
        (the turns as the responses returned them, the reward)."""
        episode_id = claimed["episode_id"]
        messages = [{"role": "user", "content": question(claimed)}]
        turn1 = choice_of(self.chat(episode_id, messages))
        # The fake tool: whatever the model asked, the "tool" answers with
        # the task's answer (the harness's own business).
        tool_result = claimed["metadata"]["answer"]
        messages += [{"role": "assistant", "content": turn1["content"]},
                     {"role": "tool", "content": tool_result}]
        turn2 = choice_of(self.chat(episode_id, messages))
        reward = 1.0 if turn2["content"] == tool_result else 0.0
        status, body = finish(self.address, episode_id, reward)
        assert status == 200, (status, body)
        return {"claim": claimed, "turns": [turn1, turn2], "reward": reward}


def openai_address(worker):
    match = re.search(r"OpenAI endpoint on http://([0-9.:]+)/v1",
                      worker.output())
    assert match, "the worker logged no OpenAI endpoint"
    return match.group(1)


class HarnessTest(unittest.TestCase):

    @classmethod
    def setUpClass(cls):
        cls.tmp = tempfile.mkdtemp(prefix="tandem-harness-")
        cluster = test_episodes.Cluster(
            cls.tmp, test_episodes.write_dataset(cls.tmp, 2 * len(TASKS),
                                                 environment=ENV_NAME),
            ["--set", "max_lag=4"])
        cls.cluster = cluster
        try:
            cls.run_cluster(cluster)
        finally:
            cls.records = cluster.stop()

    @classmethod
    def run_cluster(cls, cluster):
        worker = harness.Daemon(
            "rollout", cls.tmp,
            [*cluster.member, "--set", f"model.path={test_episodes.MODEL_DIR}",
             "--set", "engine.max_num_seqs=8", "--set", "prefetch_prompts=2",
             "--set", "openai.listen=127.0.0.1:0",
             "--set", f"openai.harness_environment={ENV_NAME}",
             "--set", f"openai.harness_idle_timeout_s={IDLE_TIMEOUT_S}",
             "--set", "openai.harness_max_episodes=4"],
            name="harness-worker")
        worker.wait_ready(120)
        cluster.workers.append(worker)
        cls.worker = worker
        harness.wait_for(lambda: "OpenAI endpoint on" in worker.output(),
                         60, "the OpenAI endpoint")
        address = openai_address(worker)
        agent = Agent(address)
        cls.tool_calls = cls.tool_call_answers(agent)
        cls.bad = cls.bad_input(agent)

        # The harness that claims and vanishes.
        vanished = claim(address)
        assert vanished is not None
        cls.vanished = vanished
        harness.wait_for(
            lambda: f"lease {vanished['lease_id']} given back" in
            worker.output(), 30 + IDLE_TIMEOUT_S, "the vanished lease back")
        cls.late_finish = finish(address, vanished["episode_id"], 1.0)
        cls.worker_log = worker.output()

        cluster.start_trainer()
        cls.transcripts = {}
        cls.finish_twice = None
        deadline = time.monotonic() + 300
        while cluster.counter("groupsTrained") < TRAINED_GROUPS:
            assert time.monotonic() < deadline, "groups not trained in time"
            claimed = claim(address, wait_ms=2000)
            if claimed is None:
                continue
            try:
                t = agent.run(claimed)
            except (openai.BadRequestError, openai.ConflictError) as e:
                # A turn the model wrote so that its re-rendering differs
                # (the worker refuses to guess), or a group that idled out
                # on a slow machine: give the task back.
                print(f"episode {claimed['episode_id']} refused: {e}")
                http(address,
                     f"/tandem/v1/episodes/{claimed['episode_id']}:abort",
                     {"reason": "turn refused"})
                continue
            cls.transcripts[(claimed["lease_id"], claimed["sample_index"])] = t
            if cls.finish_twice is None:
                cls.finish_twice = finish(address, claimed["episode_id"], 1.0)
        cls.coordinator_metrics = harness.scrape_metrics(
            cluster.coordinator_metrics_address)
        cls.worker_metrics = harness.scrape_metrics(
            worker.wait_ready()["metrics_address"])
        cls.transcript_turns = sum(len(t["turns"])
                                   for t in cls.transcripts.values())

    @classmethod
    def tool_call_answers(cls, agent):
        """A plain chat request (no episode) with `tools`, answered greedy,
        non-streaming and streaming, and the same without `tools`."""
        tools = [{"type": "function", "function": {
            "name": "calculator", "description": "evaluates arithmetic",
            "parameters": {"type": "object", "properties": {
                "expression": {"type": "string"}}}}}]
        messages = [{"role": "user", "content": f"{TASKS[0][0]}=?"}]
        ask = dict(model="m", messages=messages, max_tokens=64, temperature=0)
        out = {"plain": agent.client.chat.completions.create(**ask),
               "tools": agent.client.chat.completions.create(
                   tools=tools, **ask),
               "none": agent.client.chat.completions.create(
                   tools=tools, tool_choice="none", **ask)}
        stream = agent.client.chat.completions.create(
            tools=tools, stream=True, **ask)
        out["chunks"] = [chunk.model_dump() for chunk in stream]
        return out

    @classmethod
    def bad_input(cls, agent):
        """Bad requests against a live worker; returns what they raised."""
        out = {}
        messages = [{"role": "user", "content": "3*4=?"}]
        try:
            agent.chat("ep-bogus", messages)
        except openai.NotFoundError as e:
            out["unknown_chat"] = str(e)
        out["unknown_finish"] = finish(agent.address, "ep-bogus", 1.0)
        claimed = claim(agent.address)
        episode_id = claimed["episode_id"]
        messages = [{"role": "user", "content": question(claimed)}]
        try:
            agent.chat(episode_id, messages, temperature=1.0)
        except openai.BadRequestError as e:
            out["temperature"] = str(e)
        try:
            agent.chat(episode_id, messages, n=2)
        except openai.BadRequestError as e:
            out["n"] = str(e)
        turn1 = choice_of(agent.chat(episode_id, messages))
        # Turn 2 claims the model said something else.
        altered = "X" + turn1["content"]
        wrong = messages + [{"role": "assistant", "content": altered},
                            {"role": "tool", "content": "1"}]
        episode_tokens = turn1["prompt_token_ids"] + turn1["token_ids"]
        wrong_tokens = episode_model.encode(
            "".join(f"<|im_start|>{m['role']}:{m['content']}<|im_end|>"
                    for m in wrong) + "<|im_start|>assistant:")
        out["expected_position"] = next(
            i for i, (a, b) in enumerate(zip(episode_tokens, wrong_tokens))
            if a != b)
        try:
            agent.chat(episode_id, wrong)
        except openai.BadRequestError as e:
            out["not_extending"] = str(e)
        out["episode_id"] = episode_id
        out["lease_id"] = claimed["lease_id"]
        # The episode goes on: a correct turn 2 and a finish.
        right = messages + [{"role": "assistant", "content": turn1["content"]},
                            {"role": "tool", "content": "1"}]
        agent.chat(episode_id, right)
        out["finish_after_refusal"] = finish(agent.address, episode_id, 0.0)
        # Its group's other episode: abort it, so the group goes back.
        other = claim(agent.address)
        out["abort"] = http(agent.address,
                            f"/tandem/v1/episodes/{other['episode_id']}:abort",
                            {"reason": "test"})
        return out

    @classmethod
    def tearDownClass(cls):
        harness.remove_tmp(cls.tmp)

    def test_trained_episodes_token_by_token(self):
        trained = test_episodes.trained_samples(self.records, self)
        mine = [(s, score) for s, score, _, _ in trained
                if (s.lease_id, s.sample_index) in self.transcripts]
        self.assertGreaterEqual(len(mine), GROUP_SIZE)
        for sample, score in mine:
            with self.subTest(sample=sample.sample_id):
                t = self.transcripts[(sample.lease_id, sample.sample_index)]
                turn1, turn2 = t["turns"]
                prompt = t["claim"]["prompt_token_ids"]
                self.assertEqual(turn1["prompt_token_ids"], prompt)
                # What the harness added between the turns.
                after1 = len(prompt) + len(turn1["token_ids"])
                self.assertEqual(turn2["prompt_token_ids"][:after1],
                                 prompt + turn1["token_ids"])
                tool = turn2["prompt_token_ids"][after1:]
                self.assertTrue(tool)
                expected = turn1["token_ids"] + tool + turn2["token_ids"]
                self.assertEqual(list(sample.completion_token_ids), expected)
                sources = test_episodes.per_token(sample.source_spans,
                                                  lambda s: s.source)
                self.assertEqual(
                    sources, [MODEL] * len(turn1["token_ids"]) +
                    [ENVIRONMENT] * len(tool) +
                    [MODEL] * len(turn2["token_ids"]))
                logprobs = list(sample.behavior_logprobs)
                self.assertEqual(len(logprobs), len(expected))
                want = turn1["logprobs"] + [0.0] * len(tool) + \
                    turn2["logprobs"]
                for got, w in zip(logprobs, want):
                    self.assertTrue(math.isclose(got, w, rel_tol=1e-5,
                                                 abs_tol=1e-6), (got, w))
                versions = test_episodes.per_token(
                    sample.version_spans, lambda s: s.policy_version)
                self.assertEqual(len(versions), len(expected))
                n1 = len(turn1["token_ids"])
                self.assertEqual(versions[:n1], turn1["versions"])
                self.assertEqual(versions[len(expected) - len(turn2["token_ids"]):],
                                 turn2["versions"])
                self.assertEqual(versions, sorted(versions))
                self.assertEqual(sample.episode_end_reason, "environment")
                self.assertEqual(score.reward, t["reward"])
                self.assertEqual(score.outcome, "environment")
        print(f"{len(mine)} trained harness episodes checked token by "
              f"token; {len(self.transcripts)} run")
        self.assertEqual(harness.metric_sum(
            self.coordinator_metrics, "tandem_coordinator_score_calls_total"),
            0)

    def test_the_tool_tokens_are_the_harness_messages(self):
        # The environment's tokens are exactly the chat template's
        # rendering of the end of the assistant turn and the tool message
        # (the model's EOS, when it wrote one, is its own token).
        for t in self.transcripts.values():
            turn1, turn2 = t["turns"]
            after1 = len(turn1["prompt_token_ids"]) + len(turn1["token_ids"])
            tool = turn2["prompt_token_ids"][after1:]
            text = (f"<|im_start|>tool:{t['claim']['metadata']['answer']}"
                    "<|im_end|><|im_start|>assistant:")
            if not turn1["token_ids"] or \
                    turn1["token_ids"][-1] != episode_model.IM_END:
                text = "<|im_end|>" + text
            self.assertEqual(tool, episode_model.encode(text))

    def test_bad_input(self):
        self.assertIn("no episode ep-bogus", self.bad["unknown_chat"])
        self.assertEqual(self.bad["unknown_finish"][0], 404)
        self.assertIn("temperature 1", self.bad["temperature"])
        self.assertIn("'n' must be 1", self.bad["n"])
        message = self.bad["not_extending"]
        self.assertIn(self.bad["episode_id"], message)
        self.assertIn(
            f"differs at token position {self.bad['expected_position']} ",
            message)
        self.assertEqual(self.bad["finish_after_refusal"][0], 200)
        self.assertEqual(self.bad["abort"][0], 200)

    def test_worker_metrics(self):
        def metric(name, **labels):
            return harness.metric_sum(self.worker_metrics, name, **labels)
        # Every turn of the trained transcripts, and bad_input's two good
        # ones, were accepted; its unknown episode, wrong temperature and
        # prompt that did not extend were refused.
        self.assertGreaterEqual(
            metric("tandem_rollout_harness_turns_total", outcome="accepted"),
            self.transcript_turns + 2)
        self.assertGreaterEqual(
            metric("tandem_rollout_harness_turns_total", outcome="refused"), 3)
        # bad_input's abort and the vanished harness's idle lease.
        self.assertGreaterEqual(
            metric("tandem_rollout_harness_leases_returned_total",
                   reason="aborted"), 1)
        self.assertGreaterEqual(
            metric("tandem_rollout_harness_leases_returned_total",
                   reason="idle_timeout"), 1)
        self.assertEqual(
            metric("tandem_rollout_harness_leases_returned_total",
                   reason="lifetime"), 0)
        # Held episodes never pass openai.harness_max_episodes (4) in sum.
        self.assertLessEqual(
            metric("tandem_rollout_harness_episodes"), 4)

    def test_tool_calls_parsed_when_the_request_sends_tools(self):
        plain = self.tool_calls["plain"].choices[0]
        # The model (greedy) writes one Hermes call; without tools it is text.
        self.assertTrue(plain.message.content.startswith("<tool_call>"),
                        plain.message.content)
        self.assertIsNone(plain.message.tool_calls)
        expected = json.loads(plain.message.content[
            len("<tool_call>"):plain.message.content.index("</tool_call>")])
        # With tools the openai client reads it as a call.
        c = self.tool_calls["tools"].choices[0]
        self.assertEqual(c.finish_reason, "tool_calls")
        self.assertIsNone(c.message.content)
        self.assertEqual(len(c.message.tool_calls), 1)
        call = c.message.tool_calls[0]
        self.assertEqual(call.type, "function")
        self.assertEqual(call.function.name, expected["name"])
        self.assertEqual(json.loads(call.function.arguments),
                         expected["arguments"])
        self.assertTrue(call.id.startswith("call_"), call.id)
        # The tokens are the same either way (the parse only reads them).
        self.assertEqual(c.model_dump()["token_ids"],
                         plain.model_dump()["token_ids"])
        # tool_choice "none": text, as without tools.
        none = self.tool_calls["none"].choices[0]
        self.assertIsNone(none.message.tool_calls)
        self.assertEqual(none.message.content, plain.message.content)
        # Streaming: the call goes out piecewise as the model writes it, as
        # OpenAI and vLLM stream calls: a first part with the call's index,
        # id, type and name, then parts with fragments of its arguments;
        # the call's markup is never content; the last chunk says
        # tool_calls; what the client accumulates is the response's call.
        chunks = [ch for ch in self.tool_calls["chunks"] if ch["choices"]]
        deltas = [ch["choices"][0] for ch in chunks]
        self.assertEqual(deltas[-1]["finish_reason"], "tool_calls")
        self.assertTrue(all(d["finish_reason"] is None for d in deltas[:-1]))
        calls, fragments = {}, 0
        for d in deltas:
            content = d["delta"].get("content") or ""
            self.assertNotIn("tool_call", content)
            self.assertNotIn("{", content)
            for part in d["delta"].get("tool_calls") or []:
                function = part.get("function") or {}
                if part["index"] not in calls:
                    # The header comes first, with the name.
                    self.assertEqual(part["type"], "function")
                    self.assertTrue(part["id"], part)
                    self.assertTrue(function.get("name"), part)
                    calls[part["index"]] = {"id": part["id"],
                                            "name": function["name"],
                                            "arguments": ""}
                else:
                    self.assertIsNone(function.get("name"), part)
                arguments = function.get("arguments") or ""
                fragments += bool(arguments)
                calls[part["index"]]["arguments"] += arguments
        self.assertGreater(fragments, 1, deltas)
        self.assertEqual(sorted(calls), [0])
        self.assertRegex(calls[0]["id"], r"^call_\d+_0_0$")
        self.assertEqual(calls[0]["name"], call.function.name)
        self.assertEqual(calls[0]["arguments"], call.function.arguments)
        self.assertEqual(
            "".join(d["delta"].get("content") or "" for d in deltas),
            c.message.content or "")
        # The call's header went out before its arguments were complete.
        first_call = next(i for i, d in enumerate(deltas)
                          if d["delta"].get("tool_calls"))
        self.assertLess(first_call, len(deltas) - 1)
        tokens = [t for d in deltas for t in (d.get("token_ids") or [])]
        self.assertEqual(tokens, plain.model_dump()["token_ids"])

    def test_finish_twice_is_a_conflict(self):
        self.assertIsNotNone(self.finish_twice)
        status, body = self.finish_twice
        self.assertEqual(status, 409, body)
        self.assertIn("finished", body["error"]["message"])

    def test_a_vanished_harness_gives_the_task_back(self):
        status, body = self.late_finish
        self.assertEqual(status, 409, body)
        self.assertIn("went back to the coordinator",
                      body["error"]["message"])
        self.assertIn("idle for", body["error"]["message"])
        self.assertRegex(
            self.worker_log,
            f"harness episodes of lease {self.vanished['lease_id']} given "
            r"back: harness episode \S+ \((never )?claimed\) idle for")
        self.assertGreater(harness.metric_sum(
            self.coordinator_metrics,
            "tandem_coordinator_groups_abandoned_total"), 0)
        accepted = [r.sample.sample for r in self.records
                    if r.WhichOneof("record") == "sample"]
        leases = {s.lease_id for s in accepted}
        self.assertNotIn(self.vanished["lease_id"], leases)
        # The aborted group of bad_input: nothing of it accepted either.
        self.assertNotIn(self.bad["lease_id"], leases)
        # Nothing trained twice: a (group, index) is in one trained batch.
        trained = test_episodes.trained_samples(self.records, self)
        keys = collections.Counter((s.group_id, s.sample_index)
                                   for s, _, _, _ in trained)
        self.assertEqual(set(keys.values()), {1})


def setUpModule():
    test_episodes.setUpModule()


def tearDownModule():
    test_episodes.tearDownModule()


if __name__ == "__main__":
    unittest.main(verbosity=2)
