"""The coordinator serving a JSONL dataset: malformed lines refuse the start
or are skipped with file and line in the log, prompt text is tokenized with
the configured tokenizer.json, and a finite dataset runs out."""

import json
import os
import shutil
import subprocess
import sys
import tempfile
import unittest

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import harness  # noqa: E402
import test_coordinator_work as work  # noqa: E402  (generates the stubs)
from test_coordinator_work import common, pb  # noqa: E402

GOOD = [
    {"id": "first", "prompt_token_ids": [1, 2, 12], "verifier": "exact",
     "metadata": {"answer": "12"}},
    {"id": "second", "prompt": "12+3=", "verifier": "arith",
     "metadata": {"answer": "15"}},
    {"id": "third", "prompt_token_ids": [5], "verifier": "regex",
     "metadata": {"pattern": "^5$"}},
]
BAD = {"id": "broken", "prompt": "1+1="}  # no verifier


def char_tokenizer_json():
    """A character-level tokenizer.json written independently of ours."""
    vocab = {c: i for i, c in enumerate("0123456789+-= ")}
    added = []
    for i, token in enumerate(["<|bos|>", "<|eos|>", "<|pad|>"]):
        vocab[token] = 14 + i
        added.append({"id": 14 + i, "content": token, "single_word": False,
                      "lstrip": False, "rstrip": False, "normalized": False,
                      "special": True})
    return {"version": "1.0", "added_tokens": added, "normalizer": None,
            "pre_tokenizer": None, "post_processor": None,
            "decoder": {"type": "ByteLevel", "add_prefix_space": False,
                        "trim_offsets": False, "use_regex": False},
            "model": {"type": "BPE", "dropout": None, "unk_token": None,
                      "fuse_unk": False, "byte_fallback": False,
                      "vocab": vocab, "merges": []}}


class CoordinatorDatasetTest(unittest.TestCase):

    def setUp(self):
        self.tmp = tempfile.mkdtemp(prefix="tandem-data-")
        self.dataset = os.path.join(self.tmp, "prompts.jsonl")
        with open(self.dataset, "w") as f:
            f.write(json.dumps(GOOD[0]) + "\n" + json.dumps(BAD) + "\n" +
                    "\n".join(json.dumps(p) for p in GOOD[1:]) + "\n")
        self.tokenizer = os.path.join(self.tmp, "tokenizer.json")
        with open(self.tokenizer, "w") as f:
            json.dump(char_tokenizer_json(), f)

    def tearDown(self):
        shutil.rmtree(self.tmp, ignore_errors=True)

    def config(self, bad_lines):
        path = os.path.join(self.tmp, f"coordinator-{bad_lines}.yaml")
        with open(path, "w") as f:
            f.write(f"""heartbeat_interval_ms: 200
heartbeat_timeout_ms: 1000
group_size: 2
dataset:
  kind: jsonl
  path: {self.dataset}
  tokenizer: {self.tokenizer}
  bad_lines: {bad_lines}
  epochs: 1
  shuffle: false
""")
        return path

    def test_refuse_names_file_and_line(self):
        result = subprocess.run(
            [harness.binary("tandem-coordinator"), "--config",
             self.config("refuse"), "--grpc-address", "127.0.0.1:0",
             "--metrics-address", "127.0.0.1:0"],
            capture_output=True, text=True, timeout=20)
        self.assertNotEqual(result.returncode, 0)
        output = result.stdout + result.stderr
        self.assertIn(f"{self.dataset}:2: verifier must be a non-empty "
                      "string", output)

    def test_skip_serves_the_good_lines_once(self):
        ready = os.path.join(self.tmp, "ready.json")
        log_path = os.path.join(self.tmp, "coordinator.log")
        with open(log_path, "w") as log:
            process = subprocess.Popen(
                [harness.binary("tandem-coordinator"), "--config",
                 self.config("skip"), "--grpc-address", "127.0.0.1:0",
                 "--metrics-address", "127.0.0.1:0", "--ready-file", ready],
                stdout=log, stderr=subprocess.STDOUT)
            try:
                address = harness.wait_for(lambda: harness.read_json(ready),
                                           20, "ready file")["grpc_address"]
                client = work.Client(address)
                worker = work.Member(client, common.ROLE_ROLLOUT)
                try:
                    leases = client.call("LeasePrompts", pb.LeasePromptsRequest(
                        member_id=worker.member_id, max_prompts=10)).leases
                    self.assertEqual([l.prompt_id for l in leases],
                                     ["first", "second", "third"])
                    self.assertEqual(list(leases[0].prompt_token_ids),
                                     [1, 2, 12])
                    self.assertEqual(list(leases[1].prompt_token_ids),
                                     [1, 2, 10, 3, 12])
                    self.assertEqual(leases[1].prompt_text, "12+3=")
                    self.assertEqual(leases[0].prompt_text, "12=")
                    more = client.call("LeasePrompts", pb.LeasePromptsRequest(
                        member_id=worker.member_id, max_prompts=1))
                    self.assertEqual(len(more.leases), 0)
                    self.assertFalse(more.exhausted)  # leases still out
                    client.call("ReturnLeases", pb.ReturnLeasesRequest(
                        member_id=worker.member_id,
                        lease_ids=[l.lease_id for l in leases]))
                    back = client.call("LeasePrompts", pb.LeasePromptsRequest(
                        member_id=worker.member_id, max_prompts=10)).leases
                    self.assertEqual(sorted(l.prompt_id for l in back),
                                     ["first", "second", "third"])
                finally:
                    worker.close()
                    client.close()
            finally:
                process.terminate()
                self.assertEqual(process.wait(timeout=20), 0)
        with open(log_path) as f:
            text = f.read()
        self.assertIn(f"skipped malformed dataset line: {self.dataset}:2:",
                      text)
        self.assertIn("3 prompts, 1 lines skipped", text)


if __name__ == "__main__":
    try:
        unittest.main(verbosity=2)
    finally:
        shutil.rmtree(work.STUB_DIR, ignore_errors=True)
