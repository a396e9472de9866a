"""`tandem-local --task tools`: the built-in multi-turn task runs as
calculator episodes through the real daemons.

The model is a one-step `tandem-trainer sft --task tools` checkpoint (the
task's tokenizer and chat template, weights near their random init) given
with --model, so the test does not wait for the warm start; whether the
task is learned is docs/environments.md's measurement, not this test's.

  * the launcher writes the train split as JSONL rows that name the
    `calculator` environment, with the task's chat-rendered prompts;
  * the verifier opens calculator episodes and the rollout worker ends them
    (its episode metrics), and the trainer publishes versions trained on
    them;
  * the trainer's held-out evaluation runs greedy calculator episodes and
    the progress line reports its accuracy;
  * --task tools with neither a warm start nor --model refuses to start,
    saying why;
  * the model directory's tokenizer.json and chat template give the ids and
    the prompts Tandem gives, read by Hugging Face's tokenizers and by
    transformers' AutoTokenizer (which loads it as a Qwen2 tokenizer)."""

import json
import os
import re
import shutil
import subprocess
import tempfile
import unittest

import harness


class ToolsTaskTest(unittest.TestCase):

    @classmethod
    def setUpClass(cls):
        cls.tmp = tempfile.mkdtemp(prefix="tandem-tools-")
        cls.model = os.path.join(cls.tmp, "model")
        subprocess.run(
            [harness.binary("tandem-trainer"), "sft", "--task", "tools",
             "--output", cls.model, "--steps", "1", "--eval-every", "1",
             "--eval-problems", "4", "--target-accuracy", "0",
             "--max-accuracy", "1"],
            check=True, capture_output=True, timeout=120)
        cls.launcher = harness.Launcher(
            rollout_workers=1,
            extra_args=["--task", "tools", "--model", cls.model])
        cls.ready = cls.launcher.wait_all_ready(timeout=90)

    @classmethod
    def tearDownClass(cls):
        cls.launcher.shutdown(cls.tmp)

    def metrics(self, name):
        return harness.scrape_metrics(self.ready[name]["metrics_address"])

    def test_dataset_rows_name_the_calculator(self):
        path = os.path.join(self.launcher.run_dir, "tools_train.jsonl")
        with open(path) as f:
            rows = [json.loads(next(f)) for _ in range(50)]
        for row in rows:
            self.assertEqual(row["environment"], "calculator")
            self.assertEqual(row["verifier"], "exact")
            a, b = row["id"].removeprefix("tools-").split("*")
            self.assertEqual(len(a), 4)
            self.assertEqual(len(b), 4)
            self.assertEqual(row["metadata"]["answer"], str(int(a) * int(b)))
            self.assertEqual(
                row["prompt"],
                f"<|im_start|>user\n{a}*{b}<|im_end|>\n"
                "<|im_start|>assistant\n")

    def test_hugging_face_reads_the_tokenizer_and_template_as_we_do(self):
        from tokenizers import Tokenizer
        from transformers import AutoTokenizer
        path = os.path.join(self.launcher.run_dir, "tools_train.jsonl")
        with open(path) as f:
            rows = [json.loads(next(f)) for _ in range(20)]
        texts = [row["id"].removeprefix("tools-") for row in rows]
        texts += [
            '<tool_call>{"name": "calculator", "arguments": {"expression": '
            '"4821*7312"}}</tool_call>',
            "35251152<|im_end|>",
            "error: unexpected '$' at 5 ~`{}[]|\\ ABCxyz !?#%&()_",
            "<|im_start|>user 12*34<|im_end|><|im_start|>assistant",
        ]
        ours = subprocess.run(
            [harness.binary("tandem-model"), "tokenize", "--model",
             self.model], input="\n".join(texts) + "\n", capture_output=True,
            text=True, check=True, timeout=60).stdout.splitlines()
        self.assertEqual(len(ours), len(texts))
        raw = Tokenizer.from_file(os.path.join(self.model, "tokenizer.json"))
        auto = AutoTokenizer.from_pretrained(self.model)
        for text, line in zip(texts, ours):
            with self.subTest(text=text):
                ids = json.loads(line)
                ids = ids["ids"] if isinstance(ids, dict) else ids
                self.assertEqual(
                    raw.encode(text, add_special_tokens=False).ids, ids)
                self.assertEqual(auto.encode(text, add_special_tokens=False),
                                 ids)
                self.assertEqual(raw.decode(ids, skip_special_tokens=False),
                                 text)
        # The coordinator's prompts are what transformers renders.
        for row, expression in zip(rows, texts):
            self.assertEqual(
                auto.apply_chat_template(
                    [{"role": "user", "content": expression}],
                    add_generation_prompt=True, tokenize=False),
                row["prompt"])

    def test_hugging_face_reads_the_arith_tokenizer_as_we_do(self):
        # The default task's tokenizer is written the same way (its space).
        from transformers import AutoTokenizer
        arith = os.path.join(self.tmp, "arith")
        subprocess.run(
            [harness.binary("tandem-trainer"), "sft", "--output", arith,
             "--steps", "1", "--eval-every", "1", "--eval-problems", "4",
             "--target-accuracy", "0", "--max-accuracy", "1"],
            check=True, capture_output=True, timeout=120)
        texts = ["892+5=897", "1 2 - 3 = 4", "15+687="]
        ours = subprocess.run(
            [harness.binary("tandem-model"), "tokenize", "--model", arith],
            input="\n".join(texts) + "\n", capture_output=True, text=True,
            check=True, timeout=60).stdout.splitlines()
        auto = AutoTokenizer.from_pretrained(arith)
        for text, line in zip(texts, ours):
            ids = json.loads(line)
            ids = ids["ids"] if isinstance(ids, dict) else ids
            self.assertEqual(auto.encode(text, add_special_tokens=False), ids,
                             text)

    def test_episodes_run_against_the_calculator_and_are_trained(self):
        def episodes():
            verifier = self.metrics("verifier")
            rollout = self.metrics("rollout-0")
            trainer = self.metrics("trainer")
            opened = harness.metric_sum(
                verifier, "tandem_verifier_env_episodes_opened_total",
                environment="calculator")
            ended = harness.metric_sum(
                rollout, "tandem_rollout_episodes_ended_total")
            version = harness.metric_sum(trainer, "tandem_policy_version")
            return ((opened, ended, version)
                    if opened >= 8 and ended >= 8 and version >= 1 else None)
        opened, ended, version = harness.wait_for(
            episodes, 120, "calculator episodes opened and ended, and a "
            "trained version", interval=0.5)
        self.assertGreaterEqual(opened, ended)

    def test_the_progress_line_reports_held_out_episodes(self):
        # The trainer evaluates greedy calculator episodes before its first
        # step (eval.task tools); the launcher's line shows the accuracy.
        line = harness.wait_for(
            lambda: re.search(r"held-out \d+\.\d%",
                              self.launcher.launcher_output()),
            120, "a held-out accuracy in the progress line", interval=0.5)
        self.assertIsNotNone(line)
        self.assertRegex(self.launcher.log("trainer"),
                         r"held-out accuracy at version \d+: [\d.]+ "
                         r"\(\d+/256,")

    def test_tools_without_a_model_refuses_to_start(self):
        run_dir = os.path.join(self.tmp, "refused")
        out = subprocess.run(
            [harness.binary("tandem-local"), "--task", "tools",
             "--warm-start", "off", "--run-dir", run_dir,
             "--bin-dir", harness.BIN_DIR],
            capture_output=True, text=True, timeout=60)
        self.assertNotEqual(out.returncode, 0)
        self.assertIn("--task tools needs the warm start's model",
                      out.stdout + out.stderr)


if __name__ == "__main__":
    unittest.main()
