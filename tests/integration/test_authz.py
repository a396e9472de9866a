"""Per-role authorization in the coordinator over mutual TLS (issue 25,
stage 2).

A real tandem-coordinator with `tls.mode: mtls` and certificates from
`tandemctl certs init`: the role set ("dev"), a second set of the same CA
with another name ("intruder", so a second rollout identity), and a
certificate of that CA whose SAN names no tandem role (made with the
openssl command). Python's grpcio, with protoc-generated messages, is the
client. Each refusal is checked three ways: the status code and message,
that nothing it asked for happened (no version, no sample, no lease, no
member gone), and the coordinator's tandem_coordinator_auth_refused_total
on /metrics. The same request from the right certificate then succeeds, so
a refusal is never an artefact of a bad request.

The whole cluster (trainer, verifier, rollout workers) under these checks
is integration_tls (test_tls.py), which also checks that none of its calls
was refused.

Run: TANDEM_BIN_DIR=build/bin /usr/bin/python3 tests/integration/test_authz.py
(ctest -R integration_authz). The tests share one coordinator and run in
order."""

import os
import shutil
import subprocess
import sys
import tempfile
import unittest

import grpc

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import harness  # noqa: E402

GROUP_SIZE = 2
CHAR_IDS = {c: i for i, c in enumerate("0123456789+-= ")}
EOS_ID = 15

STUB_DIR = harness.proto_stubs("common.proto", "coordinator.proto")
from tandem.v1 import common_pb2 as common  # noqa: E402
from tandem.v1 import coordinator_pb2 as pb  # noqa: E402


def read(path):
    with open(path, "rb") as f:
        return f.read()


def sign_with_openssl(ca_dir, out_dir, name, san):
    """A client certificate of the CA in `ca_dir` with subjectAltName `san`,
    by the openssl command (not our certificate code)."""
    key = os.path.join(out_dir, f"{name}.key")
    csr = os.path.join(out_dir, f"{name}.csr")
    ext = os.path.join(out_dir, f"{name}.ext")
    with open(ext, "w") as f:
        f.write(f"subjectAltName={san}\nextendedKeyUsage=clientAuth\n"
                "basicConstraints=critical,CA:FALSE\n")
    subprocess.run(["openssl", "req", "-new", "-newkey", "ec", "-pkeyopt",
                    "ec_paramgen_curve:P-256", "-nodes", "-keyout", key,
                    "-subj", f"/O=Tandem/CN={name}", "-out", csr],
                   check=True, capture_output=True, timeout=30)
    subprocess.run(["openssl", "x509", "-req", "-in", csr, "-CA",
                    os.path.join(ca_dir, "ca.pem"), "-CAkey",
                    os.path.join(ca_dir, "ca.key"), "-CAcreateserial",
                    "-days", "2", "-sha256", "-extfile", ext, "-out",
                    os.path.join(out_dir, f"{name}.pem")],
                   check=True, capture_output=True, timeout=30)




class Client:
    """tandem.v1.Coordinator over mTLS with one certificate: `role`.pem of
    `cert_dir`, trusting the CA in `ca_dir`."""

    def __init__(self, address, ca_dir, cert_dir, role):
        creds = harness.grpc_tls_credentials(ca_dir, cert_dir, role)
        self.channel = grpc.secure_channel(address, creds)

    def call(self, method, request, timeout=10):
        return harness.unary_call(self.channel, "Coordinator", method,
                                  request, timeout)

    def register(self, role):
        return self.call("Register", pb.RegisterRequest(
            role=role, grpc_address="127.0.0.1:1", hostname="test",
            pid=os.getpid())).member_id

    def close(self):
        self.channel.close()


def answer_of(prompt_text):
    body = prompt_text.rstrip("=")
    op = max(body.rfind("+"), body.rfind("-"))
    a, b = int(body[:op]), int(body[op + 1:])
    return str(a + b if body[op] == "+" else a - b)


def samples_for(lease, worker_id):
    text = answer_of(lease.prompt_text)
    tokens = [CHAR_IDS[c] for c in text] + [EOS_ID]
    return [common.Sample(
        sample_id=f"{lease.lease_id}/{index}", lease_id=lease.lease_id,
        group_id=lease.group_id, sample_index=index,
        completion_token_ids=tokens,
        behavior_logprobs=[-0.25] * len(tokens),
        version_spans=[common.VersionSpan(policy_version=0,
                                          num_tokens=len(tokens))],
        finish_reason=common.FINISH_REASON_STOP, completion_text=text,
        worker_id=worker_id) for index in range(lease.group_size)]


class AuthzTest(unittest.TestCase):

    @classmethod
    def setUpClass(cls):
        cls.tmp = tempfile.mkdtemp(prefix="tandem-authz-")
        cls.certs = os.path.join(cls.tmp, "certs")
        cls.intruder = os.path.join(cls.tmp, "intruder")
        cls.stranger = os.path.join(cls.tmp, "stranger")
        harness.certs_init(cls.certs)
        harness.certs_init(cls.intruder, "--ca-dir", cls.certs, "--name", "intruder")
        os.makedirs(cls.stranger)
        # Same CA, but the SAN URI names no tandem role.
        sign_with_openssl(cls.certs, cls.stranger, "root",
                          "URI:spiffe://tandem/root/x,IP:127.0.0.1")
        config = os.path.join(cls.tmp, "coordinator.yaml")
        with open(config, "w") as f:
            f.write(f"""heartbeat_interval_ms: 1000
heartbeat_timeout_ms: 60000
group_size: {GROUP_SIZE}
lease_timeout_ms: 60000
tls:
  mode: mtls
  cert: {cls.certs}/coordinator.pem
  key: {cls.certs}/coordinator.key
  ca: {cls.certs}/ca.pem
""")
        cls.coordinator = harness.Daemon("coordinator", cls.tmp,
                                         ["--config", config])
        ready = cls.coordinator.wait_ready()
        cls.address = ready["grpc_address"]
        cls.metrics = ready["metrics_address"]
        cls.clients = []

    @classmethod
    def tearDownClass(cls):
        for client in cls.clients:
            client.close()
        try:
            cls.coordinator.stop()
        finally:
            shutil.rmtree(cls.tmp, ignore_errors=True)
            shutil.rmtree(STUB_DIR, ignore_errors=True)

    def client(self, role, cert_dir=None):
        c = Client(self.address, self.certs, cert_dir or self.certs, role)
        self.clients.append(c)
        return c

    def refused(self, reason):
        return harness.metric_sum(harness.scrape_metrics(self.metrics),
                                  "tandem_coordinator_auth_refused_total",
                                  reason=reason)

    def status(self):
        return self.client("admin").call("GetClusterStatus",
                                          pb.GetClusterStatusRequest())

    def assert_refused(self, call, code, *fragments):
        with self.assertRaises(grpc.RpcError) as error:
            call()
        self.assertEqual(error.exception.code(), code,
                         error.exception.details())
        for fragment in fragments:
            self.assertIn(fragment, error.exception.details())

    def test_0_certificate_without_a_tandem_identity_is_unauthenticated(self):
        before = self.refused("unauthenticated")
        stranger = self.client("root", self.stranger)
        self.assert_refused(
            lambda: stranger.call("GetClusterStatus",
                                  pb.GetClusterStatusRequest()),
            grpc.StatusCode.UNAUTHENTICATED, "unknown role 'root'")
        self.assert_refused(
            lambda: stranger.register(common.ROLE_ROLLOUT),
            grpc.StatusCode.UNAUTHENTICATED)
        self.assertEqual(self.refused("unauthenticated"), before + 2)
        self.assertEqual(len(self.status().members), 0)

    def test_1_rollout_certificate_cannot_publish_a_version(self):
        before = self.refused("wrong_role")
        rollout = self.client("rollout")
        worker = rollout.register(common.ROLE_ROLLOUT)
        request = pb.PublishPolicyVersionRequest(
            member_id=worker, manifest=common.WeightManifest(policy_version=1),
            weight_server_address="127.0.0.1:9")
        self.assert_refused(
            lambda: rollout.call("PublishPolicyVersion", request),
            grpc.StatusCode.PERMISSION_DENIED,
            "PublishPolicyVersion needs the trainer role",
            "the caller is rollout 'dev' (spiffe://tandem/rollout/dev)")
        # ...nor register as a trainer to get there.
        self.assert_refused(
            lambda: rollout.register(common.ROLE_TRAINER),
            grpc.StatusCode.PERMISSION_DENIED, "Register as trainer")
        self.assertEqual(self.refused("wrong_role"), before + 2)
        self.assertEqual(self.status().policy_version, 0)
        # The trainer's certificate publishes the same version.
        trainer = self.client("trainer")
        request.member_id = trainer.register(common.ROLE_TRAINER)
        trainer.call("PublishPolicyVersion", request)
        self.assertEqual(self.status().policy_version, 1)

    def test_2_trainer_certificate_cannot_lease_prompts(self):
        before = self.refused("wrong_role")
        trainer = self.client("trainer")
        member = trainer.register(common.ROLE_TRAINER)
        self.assert_refused(
            lambda: trainer.call("LeasePrompts", pb.LeasePromptsRequest(
                member_id=member, max_prompts=2, policy_version=1)),
            grpc.StatusCode.PERMISSION_DENIED,
            "LeasePrompts needs the rollout role", "the caller is trainer")
        self.assert_refused(
            lambda: trainer.register(common.ROLE_ROLLOUT),
            grpc.StatusCode.PERMISSION_DENIED, "Register as rollout")
        # Nor the verifier's, nor the admin's.
        for role in ("verifier", "admin"):
            other = self.client(role)
            self.assert_refused(
                lambda: other.call("LeasePrompts", pb.LeasePromptsRequest(
                    member_id=member, max_prompts=2, policy_version=1)),
                grpc.StatusCode.PERMISSION_DENIED,
                "LeasePrompts needs the rollout role")
        self.assertEqual(self.refused("wrong_role"), before + 4)
        self.assertEqual(self.status().queues.leased_prompts, 0)

    def test_3_rollout_certificate_cannot_use_another_members_lease(self):
        before = self.refused("other_member")
        owner = self.client("rollout")
        owner_id = owner.register(common.ROLE_ROLLOUT)
        leases = owner.call("LeasePrompts", pb.LeasePromptsRequest(
            member_id=owner_id, max_prompts=1, policy_version=1)).leases
        self.assertEqual(len(leases), 1)
        lease = leases[0]
        intruder = self.client("rollout", self.intruder)
        intruder_id = intruder.register(common.ROLE_ROLLOUT)
        samples = samples_for(lease, intruder_id)
        # Naming the owner's member id: the id is not the intruder's.
        for method, request in (
                ("SubmitSamples", pb.SubmitSamplesRequest(
                    member_id=owner_id, samples=samples)),
                ("RenewLeases", pb.RenewLeasesRequest(
                    member_id=owner_id, lease_ids=[lease.lease_id])),
                ("ReturnLeases", pb.ReturnLeasesRequest(
                    member_id=owner_id, lease_ids=[lease.lease_id])),
                ("Heartbeat", pb.HeartbeatRequest(member_id=owner_id)),
                ("Deregister", pb.DeregisterRequest(member_id=owner_id))):
            with self.subTest(method=method):
                self.assert_refused(
                    lambda: intruder.call(method, request),
                    grpc.StatusCode.PERMISSION_DENIED,
                    f"member '{owner_id}' belongs to "
                    "spiffe://tandem/rollout/dev",
                    "spiffe://tandem/rollout/intruder")
        self.assertEqual(self.refused("other_member"), before + 5)
        # Under its own id the lease is not its own (the ledger's check,
        # counted as a submit refusal, not an authorization one).
        self.assert_refused(
            lambda: intruder.call("SubmitSamples", pb.SubmitSamplesRequest(
                member_id=intruder_id, samples=samples)),
            grpc.StatusCode.PERMISSION_DENIED)
        self.assertEqual(self.refused("other_member"), before + 5)
        status = self.status()
        self.assertEqual(status.counters.samples_received, 0)
        self.assertEqual(status.queues.leased_prompts, 1)
        self.assertIn(owner_id, [m.member_id for m in status.members
                                 if m.state == common.MEMBER_STATE_ALIVE])
        # The owner submits the very same samples.
        response = owner.call("SubmitSamples", pb.SubmitSamplesRequest(
            member_id=owner_id, samples=samples))
        self.assertEqual(response.accepted, GROUP_SIZE)
        self.assertEqual(self.status().counters.samples_received, GROUP_SIZE)

    def test_4_only_admin_deregisters_another_member(self):
        before = self.refused("other_member")
        rollout = self.client("rollout")
        victim = rollout.register(common.ROLE_ROLLOUT)
        request = pb.DeregisterRequest(member_id=victim, reason="test")
        for role in ("trainer", "verifier"):
            other = self.client(role)
            self.assert_refused(lambda: other.call("Deregister", request),
                                grpc.StatusCode.PERMISSION_DENIED,
                                f"member '{victim}' belongs to")
        self.assertEqual(self.refused("other_member"), before + 2)
        alive = [m.member_id for m in self.status().members
                 if m.state == common.MEMBER_STATE_ALIVE]
        self.assertIn(victim, alive)
        self.client("admin").call("Deregister", request)
        left = [m.member_id for m in self.status().members
                if m.state == common.MEMBER_STATE_LEFT]
        self.assertIn(victim, left)

    def test_5_every_role_reads_cluster_status(self):
        for role in ("coordinator", "trainer", "rollout", "verifier",
                     "admin"):
            with self.subTest(role=role):
                response = self.client(role).call(
                    "GetClusterStatus", pb.GetClusterStatusRequest())
                self.assertEqual(response.policy_version, 1)


if __name__ == "__main__":
    unittest.main(verbosity=2)
