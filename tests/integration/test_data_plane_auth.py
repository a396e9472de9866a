"""The authenticated weight data plane (issue 25 item 3) on a real cluster.

`tandemctl certs init` makes a development CA and per-role certificates; the
launcher runs coordinator, trainer, verifier and two rollout workers
(weight_sync.mode pull, so every version crosses the trainer's raw data
port) with `tls.mode: mtls`. Then, with Debian's python3-grpcio, Python's
hmac and a plain socket as independent clients:

  * the cluster trains and the workers follow, pulling through the raw
    data port under the data-plane secret;
  * a rollout certificate that registers is handed the current data-plane
    secret (epoch, 32 bytes); a verifier certificate is handed none;
  * a raw connection that answers the trainer's challenge with HMAC-SHA256
    of that secret (computed here by Python's hmac, not our code) is
    served the whole payload, sealed: every record opens with AES-256-GCM
    under the HKDF-SHA256 key of docs/operations.md ("Sealed weight data"),
    derived and opened here by Debian's python3-cryptography, and nothing
    of the answer crosses in the clear; one that sends its request without a proof,
    or a garbage proof, is refused UNAUTHENTICATED at once (well under the
    raw path's 10 s request timeout) and counted;
  * when a member leaves, the coordinator rotates the secret: the trainer
    moves to the next epoch and the old secret is refused as stale, while
    the workers keep pulling;
  * the weight server's GetManifest refuses a verifier certificate
    (PERMISSION_DENIED, counted in tandem_trainer_auth_refused_total).

Run: TANDEM_BIN_DIR=build/bin /usr/bin/python3
tests/integration/test_data_plane_auth.py (ctest -R
integration_data_plane_auth). The tests share one cluster and run in
order."""

import hashlib
import hmac
import json
import os
import shutil
import socket
import struct
import subprocess
import tempfile
import time
import unittest

import grpc
from cryptography.hazmat.primitives import hashes
from cryptography.hazmat.primitives.ciphers.aead import AESGCM
from cryptography.hazmat.primitives.kdf.hkdf import HKDF

import harness

STUB_DIR = harness.proto_stubs("common.proto", "coordinator.proto")
from tandem.v1 import common_pb2 as common  # noqa: E402
from tandem.v1 import coordinator_pb2 as pb  # noqa: E402

RAW_MAGIC = 0x31445754       # "TWD1": a raw request or status
AUTH_MAGIC = 0x31415754      # "TWA1": challenge and proof
PROOF_CONTEXT = b"tandem weight data v1\x00"
SEAL_CONTEXT = b"tandem weight data enc v1\x00"
SEAL_TAG = 16
UNAUTHENTICATED = 16
RAW_END = 2


class SealedReader:
    """The plaintext of a raw stream sealed after the proof: records of
    u32 length (little-endian, the record's associated data), that many
    bytes of AES-256-GCM ciphertext and a 16-byte tag; the key is
    HKDF-SHA256(the epoch secret, salt = the challenge's 32-byte nonce,
    info = SEAL_CONTEXT || "raw" NUL || u64 epoch); record k's nonce is
    4 zero bytes || u64 k. Raises InvalidTag on a record that does not
    open. `wire` counts the bytes that crossed."""

    def __init__(self, sock, secret, epoch, nonce):
        info = SEAL_CONTEXT + b"raw\x00" + struct.pack("<Q", epoch)
        key = HKDF(algorithm=hashes.SHA256(), length=32, salt=nonce,
                   info=info).derive(secret)
        self.aead = AESGCM(key)
        self.sock = sock
        self.buffer = b""
        self.index = 0
        self.opened = 0
        self.wire = b""

    def read(self, n):
        while len(self.buffer) < n:
            head = recv_exactly(self.sock, 4)
            if len(head) < 4:
                break
            (length,) = struct.unpack("<I", head)
            body = recv_exactly(self.sock, length + SEAL_TAG)
            self.wire += head + body
            plain = self.aead.decrypt(
                b"\0" * 4 + struct.pack("<Q", self.index), body, head)
            self.buffer += plain
            self.opened += len(plain)
            self.index += 1
        out, self.buffer = self.buffer[:n], self.buffer[n:]
        return out


def credentials(certs, role):
    return harness.grpc_tls_credentials(certs, certs, role)


def recv_exactly(sock, n):
    out = b""
    while len(out) < n:
        got = sock.recv(n - len(out))
        if not got:
            break
        out += got
    return out


def fetch_request(version):
    """A serialized FetchWeightsRequest{policy_version, chunk_bytes 0}."""
    out = b"\x08"
    while True:
        byte = version & 0x7F
        version >>= 7
        if version:
            out += bytes([byte | 0x80])
        else:
            out += bytes([byte])
            return out


class DataPlaneTest(unittest.TestCase):

    @classmethod
    def setUpClass(cls):
        cls.tmp = tempfile.mkdtemp(prefix="tandem-dataplane-")
        cls.certs = os.path.join(cls.tmp, "certs")
        harness.certs_init(cls.certs)
        cls.config_dir = os.path.join(cls.tmp, "config")
        harness.write_mtls_configs(
            cls.config_dir, cls.certs,
            extra={"rollout": "weight_sync:\n  mode: pull\n",
                   "trainer": "weight_sync:\n  broadcast: false\n",
                   "coordinator": "weight_sync:\n  broadcast: false\n"})
        cls.launcher = harness.Launcher(
            rollout_workers=2, config_dir=cls.config_dir,
            extra_args=harness.tls_flags(cls.certs))
        cls.ready = cls.launcher.wait_all_ready()
        cls.coordinator = cls.ready["coordinator"]["grpc_address"]
        cls.trainer = cls.ready["trainer"]
        cls.rollout = grpc.secure_channel(cls.coordinator,
                                          credentials(cls.certs, "rollout"))

    @classmethod
    def tearDownClass(cls):
        try:
            cls.rollout.close()
            cls.launcher.shutdown()
        finally:
            shutil.rmtree(cls.tmp, ignore_errors=True)

    # -- helpers -----------------------------------------------------------

    def coordinator_call(self, channel, method, request, response):
        rpc = channel.unary_unary(
            f"/tandem.v1.Coordinator/{method}",
            request_serializer=lambda m: m.SerializeToString(),
            response_deserializer=response.FromString)
        return rpc(request, timeout=10)

    def register(self, channel, role):
        return self.coordinator_call(
            channel, "Register",
            pb.RegisterRequest(role=role, grpc_address="127.0.0.1:1",
                               hostname="test", pid=os.getpid()),
            pb.RegisterResponse)

    def manifest(self, role="rollout"):
        """(WeightManifest, raw data port) from the trainer's weight
        server, with `role`'s certificate."""
        with grpc.secure_channel(self.trainer["grpc_address"],
                                 credentials(self.certs, role)) as channel:
            rpc = channel.unary_unary(
                "/tandem.v1.WeightServer/GetManifest",
                request_serializer=None, response_deserializer=None)
            body, call = rpc.with_call(b"", timeout=10)
            port = dict(call.initial_metadata())["tandem-weight-data-port"]
            return common.WeightManifest.FromString(body), int(port)

    def connect(self, port):
        """A raw connection and the challenge the trainer sent on it:
        (socket, epoch, nonce)."""
        sock = socket.create_connection(("127.0.0.1", port), timeout=10)
        challenge = recv_exactly(sock, 44)
        self.assertEqual(len(challenge), 44)
        magic, epoch = struct.unpack("<IQ", challenge[:12])
        self.assertEqual(magic, AUTH_MAGIC)
        return sock, epoch, challenge[12:]

    def proof(self, secret, epoch, nonce):
        mac = hmac.new(secret, PROOF_CONTEXT + struct.pack("<Q", epoch) +
                       nonce, hashlib.sha256).digest()
        return struct.pack("<IQ", AUTH_MAGIC, epoch) + mac

    def request(self, version):
        body = fetch_request(version)
        return struct.pack("<II", RAW_MAGIC, len(body)) + body

    def answer(self, sock, reader=None):
        """The raw status (code, message) and the payload bytes after it,
        read from `reader` (a SealedReader) or in the clear from `sock`."""
        def read(n):
            return reader.read(n) if reader else recv_exactly(sock, n)
        head = read(12)
        self.assertEqual(len(head), 12)
        magic, code, length = struct.unpack("<III", head)
        self.assertEqual(magic, RAW_MAGIC)
        message = read(length).decode()
        payload = 0
        if code == 0:
            while True:
                h = read(24)
                self.assertEqual(len(h), 24)
                _, flags, _, size, _ = struct.unpack("<IIQII", h)
                payload += len(read(size))
                if flags & RAW_END:
                    break
        return code, message, payload

    def refused(self, reason):
        return harness.metric_sum(
            harness.scrape_metrics(self.trainer["metrics_address"]),
            "tandem_weight_sync_data_connections_dropped_total",
            reason=reason)

    def tandemctl(self, *args):
        out = subprocess.run(
            [harness.binary("tandemctl"), *args, "--json",
             *harness.tls_flags(self.certs)],
            capture_output=True, text=True, timeout=15)
        self.assertEqual(out.returncode, 0, out.stderr)
        return json.loads(out.stdout)

    def policy_version(self):
        status = self.tandemctl("status", "--coordinator", self.coordinator)
        return int(status.get("policyVersion", 0))

    def wait_version_above(self, version, timeout=180):
        return harness.wait_for(
            lambda: self.policy_version() > version or None, timeout,
            f"policy version > {version}", interval=0.5)

    # -- tests -------------------------------------------------------------

    def test_1_cluster_trains_and_workers_pull_raw(self):
        self.wait_version_above(2)
        for name in ("rollout-0", "rollout-1"):
            address = self.ready[name]["grpc_address"]
            with self.subTest(worker=name):
                self.assertTrue(harness.wait_for(
                    lambda: int(self.tandemctl(
                        "worker", "status", "--address", address).get(
                        "policyVersion", 0)) >= 2 or None, 120,
                    f"{name} follows"))
        # No worker was ever refused for a missing or wrong proof.
        self.assertEqual(self.refused("unauthenticated"), 0)
        self.assertEqual(self.refused("stale_epoch"), 0)
        # Both ends hold the coordinator's secret, and no worker pull fell
        # back from the raw port to FetchWeights.
        self.assertIn("raw weight data: data-plane epoch 1",
                      self.launcher.log("trainer"))
        for name in ("rollout-0", "rollout-1"):
            log = self.launcher.log(name)
            self.assertIn("raw weight data: data-plane epoch", log)
            self.assertNotIn("pulling over FetchWeights", log)

    def test_2_secret_goes_to_rollout_and_trainer_roles_only(self):
        response = self.register(self.rollout, common.ROLE_ROLLOUT)
        self.assertGreaterEqual(response.data_plane.epoch, 1)
        self.assertEqual(len(response.data_plane.secret), 32)
        with grpc.secure_channel(self.coordinator,
                                 credentials(self.certs, "verifier")) as ch:
            verifier = self.register(ch, common.ROLE_VERIFIER)
            self.assertEqual(verifier.data_plane.epoch, 0)
            self.assertEqual(verifier.data_plane.secret, b"")
            self.coordinator_call(
                ch, "Deregister",
                pb.DeregisterRequest(member_id=verifier.member_id,
                                     reason="test"), pb.DeregisterResponse)

    def test_3_a_proof_of_the_secret_is_served_the_weights(self):
        manifest, port = self.manifest()
        # Wait until the trainer holds the epoch this member was handed
        # (a member leaving rotates it; the trainer learns at its next
        # heartbeat).
        response = self.register(self.rollout, common.ROLE_ROLLOUT)
        secret = response.data_plane
        def at_epoch():
            sock, epoch, _ = self.connect(port)
            sock.close()
            return epoch == secret.epoch or None
        harness.wait_for(at_epoch, 10, f"trainer at epoch {secret.epoch}")
        for attempt in range(3):
            manifest, port = self.manifest()
            sock, epoch, nonce = self.connect(port)
            with sock:
                sock.sendall(self.proof(secret.secret, epoch, nonce) +
                             self.request(manifest.policy_version))
                reader = SealedReader(sock, secret.secret, epoch, nonce)
                code, message, payload = self.answer(sock, reader)
            if code != 5:  # NOT_FOUND: the version was dropped meanwhile
                break
        self.assertEqual(code, 0, message)
        self.assertEqual(payload, manifest.total_bytes)
        self.assertGreater(payload, 0)
        # Nothing of the answer crossed in the clear (not even the
        # status's magic), and every byte that crossed belongs to a record
        # that opened: its length, its ciphertext, its tag.
        self.assertNotIn(struct.pack("<I", RAW_MAGIC), reader.wire)
        self.assertGreater(reader.index, 0)
        self.assertEqual(len(reader.wire),
                         reader.opened + reader.index * (4 + SEAL_TAG))

    def test_4_no_or_garbage_proof_is_refused_at_once(self):
        _, port = self.manifest()
        before = self.refused("unauthenticated")
        cases = {
            "no proof": lambda epoch: self.request(1),
            "wrong MAC": lambda epoch: (struct.pack("<IQ", AUTH_MAGIC, epoch) +
                                        os.urandom(32)),
            "garbage": lambda epoch: b"X" + os.urandom(43),
        }
        for case, first in cases.items():
            with self.subTest(case=case):
                sock, epoch, _ = self.connect(port)
                with sock:
                    start = time.monotonic()
                    sock.sendall(first(epoch))
                    code, message, payload = self.answer(sock)
                    self.assertEqual(recv_exactly(sock, 1), b"")  # closed
                    elapsed = time.monotonic() - start
                self.assertEqual(code, UNAUTHENTICATED, message)
                self.assertEqual(payload, 0)
                self.assertLess(elapsed, 2.0)
        self.assertEqual(self.refused("unauthenticated"), before + 3)
        self.assertIn("raw weight data: refused 127.0.0.1",
                      self.launcher.log("trainer"))

    def test_5_a_leaving_member_makes_the_secret_stale(self):
        response = self.register(self.rollout, common.ROLE_ROLLOUT)
        old = response.data_plane
        self.coordinator_call(
            self.rollout, "Deregister",
            pb.DeregisterRequest(member_id=response.member_id,
                                 reason="test"), pb.DeregisterResponse)
        _, port = self.manifest()
        def rotated():
            sock, epoch, nonce = self.connect(port)
            if epoch == old.epoch:
                sock.close()
                return None
            return sock, epoch, nonce
        sock, epoch, nonce = harness.wait_for(rotated, 10,
                                              "trainer at the next epoch")
        self.assertGreater(epoch, old.epoch)
        before = self.refused("stale_epoch")
        with sock:
            sock.sendall(self.proof(old.secret, old.epoch, nonce) +
                         self.request(1))
            code, message, _ = self.answer(sock)
        self.assertEqual(code, UNAUTHENTICATED)
        self.assertIn("(stale secret)", message)
        self.assertEqual(self.refused("stale_epoch"), before + 1)
        # The workers keep pulling under the new secret.
        self.wait_version_above(self.policy_version(), 120)

    def test_6_weight_server_refuses_a_verifier_certificate(self):
        with self.assertRaises(grpc.RpcError) as raised:
            self.manifest(role="verifier")
        self.assertEqual(raised.exception.code(),
                         grpc.StatusCode.PERMISSION_DENIED)
        self.assertGreaterEqual(harness.metric_sum(
            harness.scrape_metrics(self.trainer["metrics_address"]),
            "tandem_trainer_auth_refused_total", reason="wrong_role"), 1)


if __name__ == "__main__":
    unittest.main()
