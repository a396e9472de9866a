"""Scoring is routed by verifier name: two real verifier replicas serve
different verifiers (`verifiers:` in their configs, advertised when they
register), and the coordinator sends each sample only to a replica that
serves its verifier. While no replica serves a name, its samples wait
(counted and logged) without holding back the others, and are scored once
such a replica registers. Python plays the rollout worker and the trainer
over real gRPC (stubs from test_coordinator_work)."""

import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import unittest

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import harness  # noqa: E402
from harness import metric_sum, scrape_metrics  # noqa: E402
import test_coordinator_work as work  # noqa: E402  (generates the stubs)
from test_coordinator_work import common, pb  # noqa: E402

GROUP_SIZE = 2
# Alternating exact and math prompts; the answers are what the samples say.
PROMPTS = [
    {"id": f"p{i}", "prompt_token_ids": [1, 2, 3],
     "verifier": "exact" if i % 2 == 0 else "math",
     "metadata": {"answer": "7" if i % 2 == 0 else "42"}}
    for i in range(12)
]


def answer(prompt_id):
    return "7" if int(prompt_id[1:]) % 2 == 0 else "42"


def samples_for(lease, worker_id):
    text = answer(lease.prompt_id)
    return [common.Sample(
        sample_id=f"{lease.lease_id}/{i}", lease_id=lease.lease_id,
        group_id=lease.group_id, sample_index=i,
        completion_token_ids=[5], behavior_logprobs=[-0.5],
        version_spans=[common.VersionSpan(policy_version=0, num_tokens=1)],
        finish_reason=common.FINISH_REASON_STOP, completion_text=text,
        worker_id=worker_id) for i in range(lease.group_size)]




class VerifierRoutingTest(unittest.TestCase):

    @classmethod
    def setUpClass(cls):
        cls.tmp = tempfile.mkdtemp(prefix="tandem-routing-")
        dataset = os.path.join(cls.tmp, "prompts.jsonl")
        with open(dataset, "w") as f:
            f.write("".join(json.dumps(p) + "\n" for p in PROMPTS))
        config = os.path.join(cls.tmp, "coordinator.yaml")
        with open(config, "w") as f:
            f.write(f"""heartbeat_interval_ms: 200
heartbeat_timeout_ms: 1000
group_size: {GROUP_SIZE}
dataset:
  kind: jsonl
  path: {dataset}
  epochs: 1
  shuffle: false
training:
  groups_per_version: 1000
scoring:
  batch_wait_ms: 2
  retry_backoff_ms: 50
""")
        cls.processes = {}
        cls.logs = {}
        cls.start("coordinator", ["--config", config])
        cls.address = cls.wait_ready("coordinator")["grpc_address"]
        cls.client = work.Client(cls.address)
        cls.start_verifier("exact")
        cls.start_verifier("math")

    @classmethod
    def start(cls, name, args):
        ready = os.path.join(cls.tmp, f"{name}.ready.json")
        if os.path.exists(ready):
            os.remove(ready)
        if name in cls.logs:
            cls.logs[name].close()
        log = open(os.path.join(cls.tmp, f"{name}.log"), "a")
        cls.logs[name] = log
        binary = name.split("-")[0]
        cls.processes[name] = subprocess.Popen(
            [harness.binary(f"tandem-{binary}"), "--grpc-address",
             "127.0.0.1:0", "--metrics-address", "127.0.0.1:0",
             "--ready-file", ready, *args],
            stdout=log, stderr=subprocess.STDOUT)

    @classmethod
    def wait_ready(cls, name):
        return harness.wait_for(
            lambda: harness.read_json(
                os.path.join(cls.tmp, f"{name}.ready.json")), 30,
            f"{name} ready")

    @classmethod
    def start_verifier(cls, serves):
        name = f"verifier-{serves}"
        config = os.path.join(cls.tmp, f"{name}.yaml")
        with open(config, "w") as f:
            f.write(f"coordinator_address: {cls.address}\n"
                    f"verifiers: [{serves}]\n")
        cls.start(name, ["--config", config])
        ready = cls.wait_ready(name)

        def registered():
            return any(m.role == common.ROLE_VERIFIER and
                       m.state == common.MEMBER_STATE_ALIVE and
                       m.grpc_address == ready["grpc_address"]
                       for m in cls.status().members)
        harness.wait_for(registered, 15, f"{name} to register")
        return ready

    @classmethod
    def status(cls):
        return cls.client.call("GetClusterStatus",
                               pb.GetClusterStatusRequest())

    @classmethod
    def stop(cls, name):
        process = cls.processes.pop(name)
        process.send_signal(signal.SIGTERM)
        try:
            return process.wait(timeout=20)
        except subprocess.TimeoutExpired:
            process.kill()
            return "hung"

    @classmethod
    def tearDownClass(cls):
        cls.client.close()
        codes = {name: cls.stop(name) for name in list(cls.processes)}
        for log in cls.logs.values():
            log.close()
        output = {}
        for name in cls.logs:
            with open(os.path.join(cls.tmp, f"{name}.log")) as f:
                output[name] = f.read()
        shutil.rmtree(cls.tmp, ignore_errors=True)
        if any(code != 0 for code in codes.values()):
            raise AssertionError(f"unclean exit {codes}:\n{output}")

    def log(self, name):
        with open(os.path.join(self.tmp, f"{name}.log")) as f:
            return f.read()

    def test_samples_go_only_to_replicas_serving_their_verifier(self):
        worker = work.Member(self.client, common.ROLE_ROLLOUT)
        trainer = work.Member(self.client, common.ROLE_TRAINER)
        try:
            leases = self.client.call("LeasePrompts", pb.LeasePromptsRequest(
                member_id=worker.member_id, max_prompts=8)).leases
            self.assertEqual(len(leases), 8)
            self.client.call("SubmitSamples", pb.SubmitSamplesRequest(
                member_id=worker.member_id,
                samples=[s for l in leases
                         for s in samples_for(l, worker.member_id)]))
            got = work.pull_groups(self.client, trainer.member_id, 8)
            self.assertEqual(len(got), 8)
            for _, group in got:
                for scored in group.samples:
                    self.assertEqual(scored.score.reward, 1.0,
                                     scored.score.reason)
            exact = scrape_metrics(self.wait_ready("verifier-exact")[
                "metrics_address"])
            math = scrape_metrics(
                self.wait_ready("verifier-math")["metrics_address"])
            name = "tandem_verifier_requests_total"
            self.assertEqual(metric_sum(exact, name, verifier="exact"),
                             4 * GROUP_SIZE)
            self.assertEqual(metric_sum(exact, name, verifier="math"), 0)
            self.assertEqual(metric_sum(math, name, verifier="math"),
                             4 * GROUP_SIZE)
            self.assertEqual(metric_sum(math, name, verifier="exact"), 0)

            # Train on them, as a trainer would: groups pulled and not
            # committed count as in flight, and the lease throttle allows
            # max_lag x (max_groups of the trainer's last pull) of those. When
            # scoring is slow the last pull asks for 1 or 2 groups, and the
            # 8 uncommitted ones would block the leases below.
            for batch_id in {b for b, _ in got}:
                self.client.call("CommitTrainingBatch",
                                 pb.CommitTrainingBatchRequest(
                                     member_id=trainer.member_id,
                                     batch_id=batch_id, policy_version=1))

            # No replica serves math any more: math samples wait, exact
            # ones are still scored.
            self.assertEqual(self.stop("verifier-math"), 0)
            rest = self.client.call("LeasePrompts", pb.LeasePromptsRequest(
                member_id=worker.member_id, max_prompts=4)).leases
            self.assertEqual(len(rest), 4)
            self.client.call("SubmitSamples", pb.SubmitSamplesRequest(
                member_id=worker.member_id,
                samples=[s for l in rest
                         for s in samples_for(l, worker.member_id)]))
            exact_groups = work.pull_groups(self.client, trainer.member_id, 2)
            self.assertEqual(
                sorted(g.prompt_id for _, g in exact_groups),
                sorted(l.prompt_id for l in rest
                       if answer(l.prompt_id) == "7"))
            metrics = self.wait_ready("coordinator")["metrics_address"]
            harness.wait_for(
                lambda: metric_sum(scrape_metrics(metrics),
                                "tandem_coordinator_scoring_unroutable_samples")
                == 2 * GROUP_SIZE, 10, "math samples counted as unroutable")
            self.assertGreater(metric_sum(
                scrape_metrics(metrics),
                "tandem_coordinator_scoring_unroutable_total"),
                0)
            self.assertIn("no live verifier replica serves verifier 'math'",
                          self.log("coordinator"))
            self.assertEqual(self.status().queues.scoring_samples,
                             2 * GROUP_SIZE)

            # A math replica registers: the waiting samples are scored.
            self.start_verifier("math")
            math_groups = work.pull_groups(self.client, trainer.member_id, 2)
            self.assertEqual(
                sorted(g.prompt_id for _, g in math_groups),
                sorted(l.prompt_id for l in rest
                       if answer(l.prompt_id) == "42"))
            harness.wait_for(
                lambda: metric_sum(scrape_metrics(metrics),
                                "tandem_coordinator_scoring_unroutable_samples")
                == 0, 10, "no unroutable samples")
        finally:
            worker.close()
            trainer.close()


if __name__ == "__main__":
    unittest.main(verbosity=2)
