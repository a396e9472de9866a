"""The coordinator's work flow against a real verifier: Python plays the
rollout workers and the trainer over real gRPC, with message classes that
protoc generates at test time from proto/tandem/v1 (python3-protobuf), so
nothing here shares code with our C++ clients.

- lease -> submit samples with right and wrong `arith` answers -> scored by
  the real tandem-verifier -> PullTrainingBatch returns the group with its
  rewards -> commit -> counters and metrics agree;
- a rollout worker process holding leases is killed with SIGKILL: the
  coordinator declares it dead, its prompts are leased again, and every
  prompt is trained exactly once."""

import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
import unittest
import urllib.request

import grpc

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import harness  # noqa: E402

GROUP_SIZE = 4
HEARTBEAT_MS = 200
HEARTBEAT_TIMEOUT_MS = 1000
EOS = "<|eos|>"
# The built-in task's character vocabulary (common/task/arith_tokenizer.h).
CHAR_IDS = {c: i for i, c in enumerate("0123456789+-= ")}
EOS_ID = 15


# A worker child process reuses its parent's stubs.
OWN_STUBS = "TANDEM_TEST_STUB_DIR" not in os.environ
STUB_DIR = (harness.proto_stubs("common.proto", "coordinator.proto")
            if OWN_STUBS else
            harness.proto_stubs(out_dir=os.environ["TANDEM_TEST_STUB_DIR"]))
from tandem.v1 import common_pb2 as common  # noqa: E402
from tandem.v1 import coordinator_pb2 as pb  # noqa: E402



class Client:
    """tandem.v1.Coordinator through grpc's generic unary calls."""

    def __init__(self, address):
        self.channel = grpc.insecure_channel(address)

    def call(self, method, request, timeout=10):
        return harness.unary_call(self.channel, "Coordinator", method,
                                  request, timeout)

    def close(self):
        self.channel.close()


class Member:
    """A registered member that heartbeats from a thread, like a daemon."""

    def __init__(self, client, role, previous_member_id=""):
        self.client = client
        response = client.call("Register", pb.RegisterRequest(
            role=role, grpc_address="127.0.0.1:1", hostname="test",
            pid=os.getpid(), previous_member_id=previous_member_id))
        self.member_id = response.member_id
        self.register_response = response
        self.stop = threading.Event()
        self.thread = threading.Thread(target=self._beat, daemon=True)
        self.thread.start()

    def _beat(self):
        while not self.stop.wait(HEARTBEAT_MS / 1000):
            try:
                self.client.call("Heartbeat", pb.HeartbeatRequest(
                    member_id=self.member_id,
                    state=common.MEMBER_STATE_ALIVE), timeout=2)
            except grpc.RpcError:
                pass

    def close(self):
        self.stop.set()
        self.thread.join()


def answer_of(prompt_text):
    """'123+45=' -> '168'; an independent reading of the task's format."""
    body = prompt_text.rstrip("=")
    op_index = max(body.rfind("+"), body.rfind("-"))
    a, b = int(body[:op_index]), int(body[op_index + 1:])
    return str(a + b if body[op_index] == "+" else a - b)


def make_samples(lease, worker_id, correct=lambda index: index % 2 == 0,
                 version=0):
    answer = answer_of(lease.prompt_text)
    samples = []
    for index in range(lease.group_size):
        text = answer if correct(index) else str(int(answer) + 1)
        tokens = [CHAR_IDS[c] for c in text] + [EOS_ID]
        samples.append(common.Sample(
            sample_id=f"{lease.lease_id}/{index}", lease_id=lease.lease_id,
            group_id=lease.group_id, sample_index=index,
            completion_token_ids=tokens,
            behavior_logprobs=[-0.25] * len(tokens),
            version_spans=[common.VersionSpan(policy_version=version,
                                              num_tokens=len(tokens))],
            finish_reason=common.FINISH_REASON_STOP,
            completion_text=text + EOS, worker_id=worker_id))
    return samples


def pull_groups(client, trainer_id, want, version=0, timeout=20):
    """Pulls until `want` groups arrived; returns [(batch_id, group)]."""
    got = []
    deadline = time.monotonic() + timeout
    while len(got) < want and time.monotonic() < deadline:
        response = client.call("PullTrainingBatch", pb.PullTrainingBatchRequest(
            member_id=trainer_id, max_groups=want - len(got),
            trainer_policy_version=version, wait_ms=1000), timeout=5)
        got += [(response.batch_id, g) for g in response.groups]
    return got


def worker_main(address):
    """Child mode: a rollout worker that leases prompts, reports them on
    stdout and heartbeats until it is killed."""
    client = Client(address)
    member = Member(client, common.ROLE_ROLLOUT)
    # A real worker leases at the policy version its heartbeat reports, so
    # its leases are not throttled as one version stale.
    version = client.call("Heartbeat", pb.HeartbeatRequest(
        member_id=member.member_id)).policy_version
    response = client.call("LeasePrompts", pb.LeasePromptsRequest(
        member_id=member.member_id, max_prompts=4, policy_version=version))
    leases = [{"lease_id": l.lease_id, "group_id": l.group_id,
               "prompt_id": l.prompt_id, "prompt_text": l.prompt_text,
               "group_size": l.group_size} for l in response.leases]
    print(json.dumps({"member_id": member.member_id, "leases": leases}),
          flush=True)
    while True:
        time.sleep(1)


class CoordinatorWorkTest(unittest.TestCase):

    @classmethod
    def setUpClass(cls):
        cls.tmp = tempfile.mkdtemp(prefix="tandem-work-")
        config = os.path.join(cls.tmp, "coordinator.yaml")
        with open(config, "w") as f:
            f.write(f"""heartbeat_interval_ms: {HEARTBEAT_MS}
heartbeat_timeout_ms: {HEARTBEAT_TIMEOUT_MS}
group_size: {GROUP_SIZE}
max_lag: 4
lease_timeout_ms: 30000
dataset:
  kind: builtin_arith
  seed: 11
scoring:
  batch_wait_ms: 2
""")
        cls.logs = {}
        cls.coordinator = cls.start(
            "coordinator", ["--config", config, "--grpc-address",
                            "127.0.0.1:0"])
        cls.address = cls.wait_ready("coordinator")["grpc_address"]
        cls.verifier = cls.start(
            "verifier", ["--grpc-address", "127.0.0.1:0", "--set",
                         f"coordinator_address={cls.address}"])
        cls.wait_ready("verifier")
        cls.client = Client(cls.address)

        def verifier_alive():
            status = cls.client.call("GetClusterStatus",
                                     pb.GetClusterStatusRequest())
            return any(m.role == common.ROLE_VERIFIER and
                       m.state == common.MEMBER_STATE_ALIVE
                       for m in status.members)
        harness.wait_for(verifier_alive, 15, "the verifier to register")

    @classmethod
    def start(cls, name, args):
        ready = os.path.join(cls.tmp, f"{name}.ready.json")
        log = open(os.path.join(cls.tmp, f"{name}.log"), "w")
        cls.logs[name] = log
        return subprocess.Popen(
            [harness.binary(f"tandem-{name}"), "--metrics-address",
             "127.0.0.1:0", "--ready-file", ready, *args],
            stdout=log, stderr=subprocess.STDOUT)

    @classmethod
    def wait_ready(cls, name):
        return harness.wait_for(
            lambda: harness.read_json(os.path.join(cls.tmp,
                                                   f"{name}.ready.json")),
            20, f"{name} ready")

    @classmethod
    def log_text(cls, name):
        with open(os.path.join(cls.tmp, f"{name}.log")) as f:
            return f.read()

    @classmethod
    def tearDownClass(cls):
        cls.client.close()
        codes = {}
        for name, process in (("verifier", cls.verifier),
                              ("coordinator", cls.coordinator)):
            process.send_signal(signal.SIGTERM)
            try:
                codes[name] = process.wait(timeout=20)
            except subprocess.TimeoutExpired:
                process.kill()
                codes[name] = "hung"
        for log in cls.logs.values():
            log.close()
        output = {n: cls.log_text(n) for n in cls.logs}
        shutil.rmtree(cls.tmp, ignore_errors=True)
        if any(code != 0 for code in codes.values()):
            raise AssertionError(f"unclean exit {codes}:\n{output}")

    def status(self):
        return self.client.call("GetClusterStatus",
                                pb.GetClusterStatusRequest())

    def test_1_scored_groups_reach_the_trainer_with_rewards(self):
        worker = Member(self.client, common.ROLE_ROLLOUT)
        trainer = Member(self.client, common.ROLE_TRAINER)
        try:
            self.assertEqual(worker.register_response.group_size, GROUP_SIZE)
            leases = self.client.call("LeasePrompts", pb.LeasePromptsRequest(
                member_id=worker.member_id, max_prompts=3)).leases
            self.assertEqual(len(leases), 3)
            for lease in leases:
                self.assertEqual(lease.group_size, GROUP_SIZE)
                self.assertRegex(lease.prompt_text, r"^\d+[+-]\d+=$")
                # <|bos|> then one id per character.
                self.assertEqual(list(lease.prompt_token_ids),
                                 [14] + [CHAR_IDS[c]
                                         for c in lease.prompt_text])
                self.assertIn(EOS_ID, lease.sampling.stop_token_ids)
            samples = [s for lease in leases
                       for s in make_samples(lease, worker.member_id)]
            submitted = self.client.call("SubmitSamples",
                                         pb.SubmitSamplesRequest(
                                             member_id=worker.member_id,
                                             samples=samples))
            self.assertEqual(submitted.accepted, len(samples))
            again = self.client.call("SubmitSamples", pb.SubmitSamplesRequest(
                member_id=worker.member_id, samples=samples[:2]))
            self.assertEqual((again.accepted, again.duplicates), (0, 2))

            got = pull_groups(self.client, trainer.member_id, 3)
            self.assertEqual(sorted(g.group_id for _, g in got),
                             sorted(l.group_id for l in leases))
            by_lease = {l.group_id: l for l in leases}
            for _, group in got:
                lease = by_lease[group.group_id]
                self.assertEqual(group.prompt_id, lease.prompt_id)
                self.assertEqual(len(group.samples), GROUP_SIZE)
                for index, scored in enumerate(group.samples):
                    expect = 1.0 if index % 2 == 0 else 0.0
                    self.assertEqual(scored.sample.sample_index, index)
                    self.assertEqual(scored.score.reward, expect,
                                     scored.score.reason)
                    self.assertEqual(scored.score.outcome,
                                     "correct" if expect else "incorrect")
            batches = {batch_id for batch_id, _ in got}
            committed = sum(self.client.call(
                "CommitTrainingBatch", pb.CommitTrainingBatchRequest(
                    member_id=trainer.member_id, batch_id=b,
                    policy_version=1)).groups_committed for b in batches)
            self.assertEqual(committed, 3)

            manifest = common.WeightManifest(policy_version=1)
            self.client.call("PublishPolicyVersion",
                             pb.PublishPolicyVersionRequest(
                                 member_id=trainer.member_id,
                                 manifest=manifest))
            with self.assertRaises(grpc.RpcError) as error:
                self.client.call("PublishPolicyVersion",
                                 pb.PublishPolicyVersionRequest(
                                     member_id=trainer.member_id,
                                     manifest=common.WeightManifest(
                                         policy_version=3)))
            self.assertEqual(error.exception.code(),
                             grpc.StatusCode.FAILED_PRECONDITION)
            beat = self.client.call("Heartbeat", pb.HeartbeatRequest(
                member_id=worker.member_id))
            self.assertEqual(beat.policy_version, 1)

            status = self.status()
            self.assertEqual(status.policy_version, 1)
            self.assertEqual(status.counters.groups_trained, 3)
            self.assertEqual(status.counters.groups_completed, 3)
            self.assertEqual(status.counters.samples_received, len(samples))
            self.assertEqual(status.queues.ready_groups, 0)
            self.assertEqual(status.queues.training_groups, 0)

            metrics_address = self.wait_ready("coordinator")[
                "metrics_address"]

            def scraped():
                with urllib.request.urlopen(
                        f"http://{metrics_address}/metrics", timeout=5) as r:
                    text = r.read().decode()
                return text if ("tandem_coordinator_groups_trained_total 3"
                                in text) else None
            text = harness.wait_for(scraped, 5, "groups trained metric")
            self.assertIn('tandem_coordinator_queue_depth{queue="ready"} 0',
                          text)
            self.assertIn("tandem_coordinator_trained_staleness_versions_count"
                          " 3", text)
            self.assertIn('tandem_coordinator_score_calls_total{outcome="ok"}',
                          text)
        finally:
            worker.close()
            trainer.close()

    def test_2_killed_worker_leases_are_re_leased_and_trained_once(self):
        # The coordinator dispatches at most (max_lag - lag) versions' worth
        # of groups, a version being the last pull's max_groups, and lag the
        # leasing worker's versions behind the policy (1 after test 1).
        # Test 1's last pull may have asked for 1 group (its pulls are
        # answered at the first ready group), so a worker one version
        # behind could lease only 3: both workers here lease at the current
        # version (lag 0), which leaves room for max_lag = 4 leases.
        trainer = Member(self.client, common.ROLE_TRAINER)
        worker_b = Member(self.client, common.ROLE_ROLLOUT)
        child = subprocess.Popen(
            [sys.executable, os.path.abspath(__file__), "--worker",
             self.address], stdout=subprocess.PIPE, text=True,
            env=dict(os.environ, TANDEM_TEST_STUB_DIR=STUB_DIR))
        try:
            line = child.stdout.readline()
            self.assertTrue(line, "the worker process reported no leases")
            victim = json.loads(line)
            victim_leases = victim["leases"]
            self.assertEqual(len(victim_leases), 4)
            prompts = {l["prompt_id"] for l in victim_leases}
            # The victim finished one group before dying.
            finished = pb.PromptLease(**{k: victim_leases[0][k] for k in
                                         ("lease_id", "group_id",
                                          "prompt_text", "group_size")})
            self.client.call("SubmitSamples", pb.SubmitSamplesRequest(
                member_id=victim["member_id"],
                samples=make_samples(finished, victim["member_id"])))
            os.kill(child.pid, signal.SIGKILL)
            child.wait()

            def dead():
                return any(m.member_id == victim["member_id"] and
                           m.state == common.MEMBER_STATE_DEAD
                           for m in self.status().members)
            harness.wait_for(dead, HEARTBEAT_TIMEOUT_MS / 1000 + 3,
                             "the killed worker to be declared dead")
            harness.wait_for(
                lambda: "3 leases back in the queue" in
                self.log_text("coordinator"), 5, "the coordinator's log")
            # Its unfinished prompts come first, under new leases.
            again = self.client.call("LeasePrompts", pb.LeasePromptsRequest(
                member_id=worker_b.member_id, max_prompts=3,
                policy_version=1)).leases
            self.assertEqual({l.prompt_id for l in again},
                             prompts - {finished_prompt_id(victim_leases)})
            old_ids = {l["lease_id"] for l in victim_leases}
            self.assertFalse(old_ids & {l.lease_id for l in again})
            # Samples under the dead worker's leases are refused.
            late = pb.PromptLease(**{k: victim_leases[1][k] for k in
                                     ("lease_id", "group_id", "prompt_text",
                                      "group_size")})
            refused = self.client.call("SubmitSamples",
                                       pb.SubmitSamplesRequest(
                                           member_id=victim["member_id"],
                                           samples=make_samples(
                                               late, victim["member_id"])))
            self.assertEqual(len(refused.rejected_sample_ids), GROUP_SIZE)
            # One of them is handed back and leased again.
            returned = self.client.call("ReturnLeases", pb.ReturnLeasesRequest(
                member_id=worker_b.member_id, lease_ids=[again[0].lease_id],
                reason="drain")).returned
            self.assertEqual(returned, 1)
            third = self.client.call("LeasePrompts", pb.LeasePromptsRequest(
                member_id=worker_b.member_id, max_prompts=1,
                policy_version=1)).leases
            self.assertEqual(third[0].prompt_id, again[0].prompt_id)
            for lease in list(again[1:]) + list(third):
                self.client.call("SubmitSamples", pb.SubmitSamplesRequest(
                    member_id=worker_b.member_id,
                    samples=make_samples(lease, worker_b.member_id,
                                         version=1)))

            got = pull_groups(self.client, trainer.member_id, 4, version=1)
            trained = [g.prompt_id for _, g in got]
            self.assertEqual(sorted(trained), sorted(prompts))
            for batch_id in {b for b, _ in got}:
                self.client.call("CommitTrainingBatch",
                                 pb.CommitTrainingBatchRequest(
                                     member_id=trainer.member_id,
                                     batch_id=batch_id, policy_version=2))
            # Nothing else is waiting: each prompt was trained exactly once.
            metrics_address = self.wait_ready("coordinator")[
                "metrics_address"]
            waited_before = harness.metric_sum(
                harness.scrape_metrics(metrics_address),
                "tandem_coordinator_trainer_wait_seconds_total")
            empty = self.client.call("PullTrainingBatch",
                                     pb.PullTrainingBatchRequest(
                                         member_id=trainer.member_id,
                                         trainer_policy_version=1,
                                         wait_ms=300))
            self.assertEqual(len(empty.groups), 0)
            # The pull was parked the whole 300 ms: the trainer starved
            # (the rollout autoscaling signal).
            waited = harness.metric_sum(
                harness.scrape_metrics(metrics_address),
                "tandem_coordinator_trainer_wait_seconds_total") - waited_before
            self.assertGreaterEqual(waited, 0.25)
            self.assertLess(waited, 5.0)
            status = self.status()
            self.assertEqual(status.counters.groups_trained, 3 + 4)
            self.assertGreaterEqual(status.counters.members_expired, 1)
        finally:
            if child.poll() is None:
                child.kill()
                child.wait()
            child.stdout.close()
            worker_b.close()
            trainer.close()


def finished_prompt_id(victim_leases):
    return victim_leases[0]["prompt_id"]


if __name__ == "__main__":
    if len(sys.argv) == 3 and sys.argv[1] == "--worker":
        worker_main(sys.argv[2])
    else:
        try:
            unittest.main(verbosity=2)
        finally:
            if OWN_STUBS:
                shutil.rmtree(STUB_DIR, ignore_errors=True)
