"""A coordinator killed with SIGKILL in the middle of a run restarts from
its journal: the policy version, trained and open batches, leases, scored
and unscored samples are all still there, the real verifier re-registers by
itself, and every prompt is trained exactly once across the restart."""

import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import unittest

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import harness  # noqa: E402
import test_coordinator_work as work  # noqa: E402  (generates the stubs)
from test_coordinator_work import common, pb  # noqa: E402

GROUP_SIZE = 2


class CoordinatorRestartTest(unittest.TestCase):

    def setUp(self):
        self.tmp = tempfile.mkdtemp(prefix="tandem-restart-")
        self.port = harness.free_port()
        self.address = f"127.0.0.1:{self.port}"
        self.config = os.path.join(self.tmp, "coordinator.yaml")
        with open(self.config, "w") as f:
            f.write(f"""heartbeat_interval_ms: 200
heartbeat_timeout_ms: 1000
group_size: {GROUP_SIZE}
max_lag: 4
lease_timeout_ms: 20000
dataset:
  seed: 5
scoring:
  batch_wait_ms: 2
journal:
  dir: {self.tmp}/journal
""")
        self.logs = []
        self.coordinator = self.start_coordinator()
        self.verifier = self.spawn(
            "verifier", ["--grpc-address", "127.0.0.1:0", "--set",
                         f"coordinator_address={self.address}"])

    def tearDown(self):
        for process in (self.verifier, self.coordinator):
            harness.stop_process(process, timeout=20)
        for log in self.logs:
            log.close()
        shutil.rmtree(self.tmp, ignore_errors=True)

    def spawn(self, name, args):
        log = open(os.path.join(self.tmp, f"{name}-{len(self.logs)}.log"),
                   "w")
        self.logs.append(log)
        return subprocess.Popen(
            [harness.binary(f"tandem-{name}"), "--metrics-address",
             "127.0.0.1:0", *args], stdout=log, stderr=subprocess.STDOUT)

    def start_coordinator(self):
        process = self.spawn("coordinator", ["--config", self.config,
                                              "--grpc-address", self.address])
        harness.wait_for(lambda: harness.health_check(self.address) ==
                         "SERVING" if self._reachable() else False, 20,
                         "coordinator SERVING")
        return process

    def _reachable(self):
        try:
            return harness.health_check(self.address, timeout=0.5) is not None
        except Exception:  # noqa: BLE001 - not listening yet
            return False

    def wait_verifier(self, client):
        def alive():
            status = client.call("GetClusterStatus",
                                 pb.GetClusterStatusRequest())
            return any(m.role == common.ROLE_VERIFIER and
                       m.state == common.MEMBER_STATE_ALIVE
                       for m in status.members)
        harness.wait_for(alive, 20, "the verifier to register")

    def submit(self, client, member_id, lease):
        response = client.call("SubmitSamples", pb.SubmitSamplesRequest(
            member_id=member_id,
            samples=work.make_samples(lease, member_id)))
        self.assertEqual(response.accepted, GROUP_SIZE)

    def test_restart_resumes_from_the_journal_and_trains_each_prompt_once(self):
        client = work.Client(self.address)
        self.wait_verifier(client)
        worker = work.Member(client, common.ROLE_ROLLOUT)
        trainer = work.Member(client, common.ROLE_TRAINER)
        leases = client.call("LeasePrompts", pb.LeasePromptsRequest(
            member_id=worker.member_id, max_prompts=6)).leases
        self.assertEqual(len(leases), 6)
        prompts = [l.prompt_id for l in leases]
        for lease in leases[:4]:
            self.submit(client, worker.member_id, lease)
        got = work.pull_groups(client, trainer.member_id, 2)
        self.assertEqual(len(got), 2)
        for batch_id in {b for b, _ in got}:
            client.call("CommitTrainingBatch", pb.CommitTrainingBatchRequest(
                member_id=trainer.member_id, batch_id=batch_id,
                policy_version=1))
        client.call("PublishPolicyVersion", pb.PublishPolicyVersionRequest(
            member_id=trainer.member_id,
            manifest=common.WeightManifest(policy_version=1),
            weight_server_address="127.0.0.1:7"))
        trained = [g.prompt_id for _, g in got]
        open_batch = work.pull_groups(client, trainer.member_id, 1, version=1)
        self.assertEqual(len(open_batch), 1)
        before = client.call("GetClusterStatus", pb.GetClusterStatusRequest())
        worker.close()
        trainer.close()
        client.close()
        time.sleep(0.3)  # a maintenance tick writes the journal's tail

        self.coordinator.send_signal(signal.SIGKILL)
        self.coordinator.wait()
        self.coordinator = self.start_coordinator()
        client = work.Client(self.address)
        try:
            status = client.call("GetClusterStatus",
                                 pb.GetClusterStatusRequest())
            self.assertEqual(status.policy_version, 1)
            self.assertEqual(status.counters.groups_trained, 2)
            self.assertEqual(status.counters.groups_dispatched,
                             before.counters.groups_dispatched)
            self.assertEqual(status.queues.leased_prompts, 2)
            self.assertEqual(status.queues.training_groups, 1)
            # The verifier notices by itself and registers again.
            self.wait_verifier(client)
            # The worker registers again naming its old id, as the
            # rollout worker does: it still holds its old leases (member ids
            # never repeat across coordinator starts).
            worker = work.Member(client, common.ROLE_ROLLOUT,
                                 previous_member_id=worker.member_id)
            trainer = work.Member(client, common.ROLE_TRAINER)
            self.assertEqual(trainer.register_response.policy_version, 1)
            self.assertEqual(
                trainer.register_response.weight_server_address,
                "127.0.0.1:7")
            # The open batch commits after the restart.
            committed = client.call(
                "CommitTrainingBatch", pb.CommitTrainingBatchRequest(
                    member_id=trainer.member_id,
                    batch_id=open_batch[0][0], policy_version=2))
            self.assertEqual(committed.groups_committed, 1)
            trained += [g.prompt_id for _, g in open_batch]
            # The leases survived: the worker delivers the rest of its work.
            for lease in leases[4:]:
                self.submit(client, worker.member_id, lease)
            more = client.call("LeasePrompts", pb.LeasePromptsRequest(
                member_id=worker.member_id, policy_version=1,
                max_prompts=2)).leases
            self.assertEqual(len(more), 2)
            self.assertFalse({l.prompt_id for l in more} & set(prompts))
            for lease in more:
                self.submit(client, worker.member_id, lease)
            rest = work.pull_groups(client, trainer.member_id, 5, version=1)
            for batch_id in {b for b, _ in rest}:
                client.call("CommitTrainingBatch",
                            pb.CommitTrainingBatchRequest(
                                member_id=trainer.member_id,
                                batch_id=batch_id, policy_version=2))
            trained += [g.prompt_id for _, g in rest]
            self.assertEqual(sorted(trained),
                             sorted(prompts + [l.prompt_id for l in more]))
            status = client.call("GetClusterStatus",
                                 pb.GetClusterStatusRequest())
            self.assertEqual(status.counters.groups_trained, 8)
            worker.close()
            trainer.close()
        finally:
            client.close()


if __name__ == "__main__":
    try:
        unittest.main(verbosity=2)
    finally:
        shutil.rmtree(work.STUB_DIR, ignore_errors=True)
