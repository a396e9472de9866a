"""The rollout worker's OpenAI-compatible endpoint, driven by the official
`openai` Python client (PyPI, pinned in requirements-openai.txt and
installed into this interpreter's environment on first run).

What it checks:
  * ServeTest: a coordinator, a verifier and a rollout worker generating RL
    rollouts on the built-in arithmetic model (no trainer: the weights stay
    at policy version 0, the model's seed-1 weights). Through the endpoint,
    sharing the worker's engine batch with those rollouts: models.list;
    completions non-streaming and streaming (same tokens as non-streaming);
    n=2; logprobs; stop strings; the extension fields (token_ids,
    behavior_logprobs, policy_versions, prompt_token_ids) present and
    consistent; greedy deterministic across calls; the log-probs equal to
    `tandemctl logprobs` on the same prompt + completion; bad requests
    (out-of-range max_tokens, a prompt longer than the context, chat without
    a chat template) raise openai.BadRequestError with our message; an
    oversized body is 413, an unknown route 404, bad JSON 400; a chat
    request through a second worker whose model directory (the built-in
    model exported with `tandemctl export`) has a chat template; a client
    that closes a stream mid-way does not hurt the worker.
  * TrainingTest: a whole cluster (tandem-local with a trainer); the policy
    versions a served request reports advance while the trainer publishes.

How to run (ctest runs it as integration_openai_endpoint):
    TANDEM_BIN_DIR=build/bin .venv/bin/python tests/integration/test_openai_endpoint.py
Prints unittest's report; exit 0 when every check passes.
"""

import json
import math
import os
import re
import shutil
import socket
import subprocess
import sys
import tempfile
import time
import unittest
import urllib.error
import urllib.request

import harness

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))
CONFIG = os.path.join(HERE, "config")


def import_openai():
    """The pinned openai client, installed into this environment if absent
    (constrained by deploy/local/requirements.txt so torch and transformers
    never change)."""
    try:
        import openai  # noqa: F401
    except ImportError:
        subprocess.run(
            [sys.executable, "-m", "pip", "install", "--quiet", "-r",
             os.path.join(HERE, "requirements-openai.txt"), "-c",
             os.path.join(ROOT, "deploy", "local", "requirements.txt")],
            check=True)
    import openai
    return openai


openai = import_openai()


def client(address):
    return openai.OpenAI(base_url=f"http://{address}/v1", api_key="unused",
                         max_retries=0, timeout=60)


def extras(model):
    """A response object's fields as a dict, extension fields included."""
    return model.model_dump()


def model_logprobs(tokens, model_dir=""):
    """Per-token log-probs of `tokens` under the model (tandemctl logprobs):
    entry i is the log-prob of tokens[i + 1]."""
    out = subprocess.run(
        [harness.binary("tandemctl"), "logprobs", "--model", model_dir],
        input=json.dumps({"tokens": tokens}) + "\n", capture_output=True,
        text=True, timeout=120)
    if out.returncode != 0:
        raise AssertionError(f"tandemctl logprobs: {out.stderr}")
    return json.loads(out.stdout.splitlines()[-1])["logprobs"]


class ServeTest(unittest.TestCase):

    @classmethod
    def setUpClass(cls):
        cls.tmp = tempfile.mkdtemp(prefix="tandem-openai-")
        cls.coordinator, cls.verifier, member = harness.start_without_trainer(
            cls.tmp, CONFIG)
        cls.port = harness.free_port()
        cls.worker = harness.Daemon(
            "rollout", cls.tmp,
            ["--config", os.path.join(CONFIG, "rollout.yaml"), *member,
             "--set", f"openai.listen=127.0.0.1:{cls.port}"])
        cls.worker_address = cls.worker.wait_ready(60)["grpc_address"]
        cls.address = f"127.0.0.1:{cls.port}"
        cls.client = client(cls.address)
        # A model directory with a chat template: the built-in model
        # exported, plus a tokenizer_config.json.
        cls.model_dir = os.path.join(cls.tmp, "arith-chat")
        subprocess.run([harness.binary("tandemctl"), "export", "--model", "",
                        "--output", cls.model_dir], check=True,
                       capture_output=True, timeout=120)
        template = ("{% for m in messages %}{{ m['content'] }}{% endfor %}"
                    "{% if add_generation_prompt %}={% endif %}")
        with open(os.path.join(cls.model_dir, "tokenizer_config.json"),
                  "w") as f:
            json.dump({"chat_template": template}, f)
        cls.chat_port = harness.free_port()
        cls.chat_worker = harness.Daemon(
            "rollout", cls.tmp,
            ["--config", os.path.join(CONFIG, "rollout.yaml"), *member,
             "--set", f"model.path={cls.model_dir}",
             "--set", f"openai.listen=127.0.0.1:{cls.chat_port}"],
            name="rollout-chat")
        cls.chat_worker.wait_ready(60)

    @classmethod
    def tearDownClass(cls):
        for d in (cls.chat_worker, cls.worker, cls.verifier, cls.coordinator):
            d.stop()
        shutil.rmtree(cls.tmp, ignore_errors=True)

    def complete(self, **kwargs):
        args = dict(model="tandem-arith", prompt="12+34=", max_tokens=12,
                    temperature=0)
        args.update(kwargs)
        return self.client.completions.create(**args)

    def check_extensions(self, choice):
        c = extras(choice)
        n = len(c["token_ids"])
        self.assertGreater(n, 0)
        self.assertEqual(len(c["behavior_logprobs"]), n)
        self.assertEqual(len(c["policy_versions"]), n)
        for lp in c["behavior_logprobs"]:
            self.assertTrue(math.isfinite(lp) and lp <= 0.0, lp)
        for v in c["policy_versions"]:
            self.assertGreaterEqual(v, 0)
        return c

    def test_models_list(self):
        models = self.client.models.list().data
        self.assertEqual([m.id for m in models], ["tandem-arith"])
        info = extras(models[0])
        self.assertEqual(info["max_model_len"], 64)
        self.assertIn("policy_version", info)

    def test_completion_has_consistent_extension_fields(self):
        r = self.complete(logprobs=0)
        self.assertEqual(len(r.choices), 1)
        choice = r.choices[0]
        self.assertIn(choice.finish_reason, ("stop", "length"))
        c = self.check_extensions(choice)
        self.assertEqual(choice.logprobs.token_logprobs,
                         c["behavior_logprobs"])
        self.assertEqual(len(choice.logprobs.tokens), len(c["token_ids"]))
        body = extras(r)
        self.assertEqual(body["prompt_token_ids"],
                         self.client.completions.create(
                             model="m", prompt=body["prompt_token_ids"],
                             max_tokens=1).model_dump()["prompt_token_ids"])
        self.assertEqual(r.usage.completion_tokens, len(c["token_ids"]))
        self.assertEqual(r.usage.prompt_tokens, len(body["prompt_token_ids"]))

    def test_greedy_is_deterministic_and_equals_the_models_logprobs(self):
        a = extras(self.complete(prompt="7+5="))
        b = extras(self.complete(prompt="7+5="))
        self.assertEqual(a["choices"][0]["token_ids"],
                         b["choices"][0]["token_ids"])
        self.assertEqual(a["choices"][0]["text"], b["choices"][0]["text"])
        prompt = a["prompt_token_ids"]
        completion = a["choices"][0]["token_ids"]
        self.assertEqual(set(a["choices"][0]["policy_versions"]), {0})
        reference = model_logprobs(prompt + completion)[len(prompt) - 1:]
        served = a["choices"][0]["behavior_logprobs"]
        self.assertEqual(len(served), len(reference))
        for j, (got, want) in enumerate(zip(served, reference)):
            self.assertAlmostEqual(got, want, delta=2e-3,
                                   msg=f"completion token {j}")
        print(f"\n  {len(served)} greedy tokens: max |served - tandemctl "
              f"logprobs| = {max(abs(g - w) for g, w in zip(served, reference)):.2e}",
              file=sys.stderr)

    def test_prompt_as_token_ids_equals_prompt_as_text(self):
        text = extras(self.complete(prompt="3+4="))
        ids = extras(self.complete(prompt=text["prompt_token_ids"]))
        self.assertEqual(ids["choices"][0]["token_ids"],
                         text["choices"][0]["token_ids"])

    def test_streaming_gives_the_same_tokens_as_non_streaming(self):
        plain = extras(self.complete(prompt="41+9=", max_tokens=20))
        chunks = list(self.complete(prompt="41+9=", max_tokens=20,
                                    stream=True))
        self.assertGreater(len(chunks), 1)
        text, tokens, logprobs, versions, finish = "", [], [], [], None
        for chunk in chunks:
            for choice in chunk.choices:
                c = extras(choice)
                text += c["text"]
                tokens += c["token_ids"]
                logprobs += c["behavior_logprobs"]
                versions += c["policy_versions"]
                finish = c["finish_reason"] or finish
        self.assertEqual(tokens, plain["choices"][0]["token_ids"])
        self.assertEqual(text, plain["choices"][0]["text"])
        self.assertEqual(len(logprobs), len(tokens))
        self.assertEqual(len(versions), len(tokens))
        self.assertEqual(finish, plain["choices"][0]["finish_reason"])

    def test_n2_gives_two_choices(self):
        r = self.complete(n=2, temperature=1.0, seed=5, max_tokens=10)
        self.assertEqual(sorted(c.index for c in r.choices), [0, 1])
        for choice in r.choices:
            self.check_extensions(choice)
        streamed = {}
        for chunk in self.complete(n=2, temperature=1.0, seed=5,
                                   max_tokens=10, stream=True):
            for choice in chunk.choices:
                streamed.setdefault(choice.index, []).extend(
                    extras(choice)["token_ids"])
        self.assertEqual(sorted(streamed), [0, 1])

    def test_stop_string_ends_the_text_before_it(self):
        # A seeded sample is the same in every run; pick a stop string from
        # its middle.
        reference = self.complete(temperature=1.0, seed=11, max_tokens=30,
                                  prompt="99+1=").choices[0].text
        self.assertGreaterEqual(len(reference), 4, reference)
        stop = reference[2:4]
        expected = reference[:reference.find(stop)]
        for stream in (False, True):
            if stream:
                text, finish = "", None
                for chunk in self.complete(temperature=1.0, seed=11,
                                           max_tokens=30, prompt="99+1=",
                                           stop=[stop, "@@"], stream=True):
                    for choice in chunk.choices:
                        text += choice.text
                        finish = choice.finish_reason or finish
            else:
                choice = self.complete(temperature=1.0, seed=11,
                                       max_tokens=30, prompt="99+1=",
                                       stop=[stop, "@@"]).choices[0]
                text, finish = choice.text, choice.finish_reason
            self.assertEqual(text, expected, f"stream={stream} stop={stop!r}")
            self.assertEqual(finish, "stop")

    def test_bad_requests_raise_bad_request_error_with_our_message(self):
        with self.assertRaises(openai.BadRequestError) as e:
            self.complete(max_tokens=-1)
        self.assertIn("'max_tokens' must be in [1, ", str(e.exception))
        with self.assertRaises(openai.BadRequestError) as e:
            self.complete(n=100)
        self.assertIn("'n' must be in [1, 16], got 100", str(e.exception))
        with self.assertRaises(openai.BadRequestError) as e:
            self.complete(prompt="1+" * 40)
        self.assertIn("context is 64 tokens", str(e.exception))
        with self.assertRaises(openai.BadRequestError) as e:
            self.complete(extra_body={"temperature": "hot"})
        self.assertIn("'temperature' must be a number", str(e.exception))
        with self.assertRaises(openai.BadRequestError) as e:
            self.client.chat.completions.create(
                model="tandem-arith",
                messages=[{"role": "user", "content": "1+1"}])
        self.assertIn("no chat template", str(e.exception))

    def test_chat_uses_the_models_chat_template(self):
        chat = client(f"127.0.0.1:{self.chat_port}")
        self.assertEqual([m.id for m in chat.models.list().data],
                         ["arith-chat"])
        r = chat.chat.completions.create(
            model="arith-chat", messages=[{"role": "user", "content": "8+8"}],
            max_tokens=6, temperature=0, logprobs=True, top_logprobs=0)
        body = extras(r)
        # The template renders "8+8" then "=": the same prompt as a
        # completion of "8+8=".
        same = extras(chat.completions.create(model="arith-chat",
                                              prompt="8+8=", max_tokens=6,
                                              temperature=0))
        self.assertEqual(body["prompt_token_ids"], same["prompt_token_ids"])
        self.assertEqual(body["choices"][0]["token_ids"],
                         same["choices"][0]["token_ids"])
        self.assertEqual(r.choices[0].message.content,
                         same["choices"][0]["text"])
        self.assertEqual(len(r.choices[0].logprobs.content),
                         len(body["choices"][0]["token_ids"]))
        text = ""
        for chunk in chat.chat.completions.create(
                model="arith-chat",
                messages=[{"role": "user", "content": "8+8"}], max_tokens=6,
                temperature=0, stream=True):
            for choice in chunk.choices:
                text += choice.delta.content or ""
        self.assertEqual(text, r.choices[0].message.content)

    def test_oversized_body_and_unknown_route_get_clear_errors(self):
        def post(path, body):
            request = urllib.request.Request(
                f"http://{self.address}{path}", data=body,
                headers={"Content-Type": "application/json"})
            try:
                with urllib.request.urlopen(request, timeout=30) as r:
                    return r.status, json.loads(r.read())
            except urllib.error.HTTPError as e:
                return e.code, json.loads(e.read())
        code, body = post("/v1/completions", b"{" + b" " * (5 << 20) + b"}")
        self.assertEqual(code, 413)
        self.assertIn("exceeds 4194304 bytes", body["error"]["message"])
        code, body = post("/v1/embeddings", b"{}")
        self.assertEqual(code, 404)
        self.assertIn("/v1/completions", body["error"]["message"])
        code, body = post("/v1/completions", b"{not json")
        self.assertEqual(code, 400)
        self.assertIn("not valid JSON", body["error"]["message"])

    def test_client_closing_a_stream_leaves_the_worker_serving(self):
        body = json.dumps({"prompt": "1+1=", "max_tokens": 59, "n": 16,
                           "stream": True}).encode()
        with socket.create_connection(("127.0.0.1", self.port)) as s:
            s.sendall(b"POST /v1/completions HTTP/1.1\r\nHost: x\r\n"
                      b"Content-Type: application/json\r\nContent-Length: " +
                      str(len(body)).encode() + b"\r\n\r\n" + body)
            self.assertIn(b"200 OK", s.recv(4096))
        harness.wait_for(
            lambda: re.search(r"client closed cmpl-\d+ mid-(generation|stream)"
                              r"; cancelled", self.worker.output()),
            10, "the worker to log the cancellation")
        r = self.complete(max_tokens=3)
        self.assertEqual(len(extras(r.choices[0])["token_ids"]), 3)
        status = harness.worker_status(self.worker_address)
        self.assertEqual(status["state"], "ROLLOUT_STATE_RUNNING")


class TrainingTest(unittest.TestCase):
    """Served requests see the trainer's new policy versions."""

    @classmethod
    def setUpClass(cls):
        cls.config_dir = tempfile.mkdtemp(prefix="tandem-openai-config-")
        for name in ("coordinator", "trainer", "verifier"):
            shutil.copy(os.path.join(CONFIG, f"{name}.yaml"), cls.config_dir)
        cls.port = harness.free_port()
        with open(os.path.join(CONFIG, "rollout.yaml")) as f:
            rollout = f.read()
        with open(os.path.join(cls.config_dir, "rollout.yaml"), "w") as f:
            f.write(rollout + f"openai:\n  listen: 127.0.0.1:{cls.port}\n")
        cls.launcher = harness.Launcher(rollout_workers=1,
                                        config_dir=cls.config_dir)
        cls.launcher.wait_all_ready(120)

    @classmethod
    def tearDownClass(cls):
        cls.launcher.shutdown(cls.config_dir)

    def test_policy_versions_advance_while_serving(self):
        c = client(f"127.0.0.1:{self.port}")
        seen = set()

        def advanced():
            r = c.completions.create(model="tandem-arith", prompt="5+6=",
                                     max_tokens=8, temperature=1.0)
            seen.update(extras(r.choices[0])["policy_versions"])
            listed = extras(c.models.list().data[0])["policy_version"]
            return len(seen) >= 2 and listed >= max(seen)
        harness.wait_for(advanced, 180, "served tokens under two policy "
                         "versions", interval=0.5)
        self.assertGreater(max(seen), min(seen))


if __name__ == "__main__":
    unittest.main(verbosity=2)
