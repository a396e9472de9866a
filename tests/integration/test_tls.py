"""Mutual TLS on a real cluster (issue 25, stage 1).

`tandemctl certs init` makes a development CA and per-role certificates; the
launcher runs the integration cluster (coordinator, trainer, verifier, two
rollout workers) with `tls.mode: mtls` in every daemon's config and polls
status with the admin certificate. A daemon with a bad tls section exits 2 naming the file, line, key and
value, and one serving plaintext on a non-loopback address warns. Then,
with Debian's python3-grpcio and
Python's ssl module as independent clients:

  * the cluster trains: the policy version advances and workers follow;
  * a plaintext client, a TLS client without a client certificate and a
    client whose certificate comes from another CA are all refused;
  * a client with a valid certificate reads GetClusterStatus;
  * no call of the cluster's own daemons is refused by the coordinator's
    per-role authorization (tandem_coordinator_auth_refused_total is 0);
  * a rollout worker's Pause and the trainer's SaveCheckpoint need the
    admin certificate, the verifier's ScoreBatch the coordinator's
    (PERMISSION_DENIED for the others, counted);
  * `tandemctl status` works with --tls-* flags and fails without them;
  * every certificate and key is replaced on disk by a newly issued pair of
    the same CA while the cluster runs: new connections are served with the
    new certificate (read from the handshake) and the cluster keeps
    advancing;
  * weight broadcast rendezvous goes through the trainer's gRPC (the
    Rendezvous service, trainer and rollout roles only): the TCPStore port
    the trainer's config names is not open, workers receive versions by
    broadcast, and a verifier's certificate is refused PERMISSION_DENIED.

Run: TANDEM_BIN_DIR=build/bin /usr/bin/python3 tests/integration/test_tls.py
(ctest -R integration_tls). The tests share one cluster and run in order."""

import http.client
import json
import os
import shutil
import socket
import ssl
import subprocess
import tempfile
import unittest
import urllib.request

import grpc

import harness

ROLES = {"coordinator": "coordinator", "trainer": "trainer",
         "verifier": "verifier", "rollout": "rollout"}
REFRESH_S = 1  # tls.refresh_s of every daemon


def read(path, mode="r"):
    with open(path, mode) as f:
        return f.read()


def get_cluster_status(channel, timeout=5):
    """Raw /tandem.v1.Coordinator/GetClusterStatus (empty request): the
    serialized response bytes. Raises grpc.RpcError."""
    call = channel.unary_unary("/tandem.v1.Coordinator/GetClusterStatus",
                               request_serializer=None,
                               response_deserializer=None)
    return call(b"", timeout=timeout)


def refused_code(channel):
    """The status code of a GetClusterStatus through `channel`, which must
    fail (None if it succeeded)."""
    try:
        get_cluster_status(channel, timeout=3)
    except grpc.RpcError as e:
        return e.code()
    return None


def served_certificate(address, certs):
    """DER of the certificate the server at host:port presents to a new
    TLS connection (Python's ssl module, with the admin certificate)."""
    host, port = address.rsplit(":", 1)
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
    context.load_verify_locations(os.path.join(certs, "ca.pem"))
    context.load_cert_chain(os.path.join(certs, "admin.pem"),
                            os.path.join(certs, "admin.key"))
    context.set_alpn_protocols(["h2"])
    with socket.create_connection((host, int(port)), timeout=5) as raw:
        with context.wrap_socket(raw, server_hostname=host) as tls:
            return tls.getpeercert(binary_form=True)


def serves(address, certs, cert_path):
    """True once the server at `address` presents the certificate in
    `cert_path` to a new connection (False on a failed handshake too, e.g.
    while a key and certificate are being replaced)."""
    try:
        return served_certificate(address, certs) == ssl.PEM_cert_to_DER_cert(
            read(cert_path))
    except (OSError, ssl.SSLError):
        return False


class TlsClusterTest(unittest.TestCase):

    @classmethod
    def setUpClass(cls):
        cls.tmp = tempfile.mkdtemp(prefix="tandem-tls-")
        cls.certs = os.path.join(cls.tmp, "certs")
        cls.other = os.path.join(cls.tmp, "other-ca")
        harness.certs_init(cls.certs)
        harness.certs_init(cls.other)
        cls.config_dir = os.path.join(cls.tmp, "config")
        # The TCPStore port the trainer would open without mTLS.
        cls.store_port = harness.free_port()
        # Every /metrics endpoint is HTTPS and wants a client certificate
        # of the CA (metrics.tls: mtls).
        metrics_tls = "metrics:\n  tls: mtls\n"
        harness.write_mtls_configs(
            cls.config_dir, cls.certs, roles=ROLES,
            extra={"coordinator": metrics_tls, "verifier": metrics_tls,
                   "rollout": metrics_tls,
                   "trainer": metrics_tls + "weight_sync:\n"
                              f"  store_port: {cls.store_port}\n"},
            tls_extra=f"  refresh_s: {REFRESH_S}\n")
        cls.launcher = harness.Launcher(
            rollout_workers=2, config_dir=cls.config_dir,
            extra_args=harness.tls_flags(cls.certs))
        cls.ready = cls.launcher.wait_all_ready()
        cls.coordinator = cls.ready["coordinator"]["grpc_address"]

    @classmethod
    def tearDownClass(cls):
        try:
            cls.launcher.shutdown()
        finally:
            shutil.rmtree(cls.tmp, ignore_errors=True)

    def status(self):
        out = subprocess.run(
            [harness.binary("tandemctl"), "status", "--coordinator",
             self.coordinator, "--json", *harness.tls_flags(self.certs)],
            capture_output=True, text=True, timeout=15)
        self.assertEqual(out.returncode, 0, out.stderr)
        return json.loads(out.stdout)

    def wait_version_above(self, version, timeout):
        def advanced():
            status = self.status()
            v = int(status.get("policyVersion", 0))
            workers = [m for m in status.get("members", [])
                       if m["role"] == "ROLE_ROLLOUT" and
                       m.get("state") == "MEMBER_STATE_ALIVE"]
            if v > version and len(workers) == 2:
                return v
            return None
        try:
            return harness.wait_for(advanced, timeout,
                                    f"policy version > {version}",
                                    interval=0.5)
        except AssertionError:
            print(self.launcher.launcher_output()[-3000:])
            print(self.launcher.log("trainer")[-3000:])
            raise

    def test_0_bad_tls_config_exits_2_naming_file_line_key_and_value(self):
        bad = os.path.join(self.tmp, "bad.yaml")
        with open(bad, "w") as f:
            f.write(f"tls:\n  mode: mtls\n  cert: {self.certs}/coordinator.pem\n"
                    f"  key: {self.tmp}/missing.key\n"
                    f"  ca: {self.certs}/ca.pem\n")
        out = subprocess.run(
            [harness.binary("tandem-coordinator"), "--config", bad],
            capture_output=True, text=True, timeout=15)
        self.assertEqual(out.returncode, 2, out.stderr)
        self.assertIn(f"{bad}:4: tls.key cannot read '{self.tmp}/missing.key'",
                      out.stderr)
        # HTTPS /metrics without the files it needs (tls.mode off).
        with open(bad, "w") as f:
            f.write(f"metrics:\n  tls: mtls\n"
                    f"tls:\n  cert: {self.certs}/coordinator.pem\n"
                    f"  key: {self.certs}/coordinator.key\n")
        out = subprocess.run(
            [harness.binary("tandem-coordinator"), "--config", bad],
            capture_output=True, text=True, timeout=15)
        self.assertEqual(out.returncode, 2, out.stderr)
        self.assertIn(f"{bad}:2: metrics.tls is mtls but tls.ca is not set",
                      out.stderr)
        # A daemon on a non-loopback address without TLS says so once.
        daemon = harness.Daemon("coordinator", self.tmp, host="0.0.0.0",
                                name="plaintext-coordinator")
        try:
            daemon.wait_ready()
        finally:
            daemon.stop()
        self.assertEqual(daemon.output().count("in plaintext (tls.mode: off)"),
                         1, daemon.output())

    def test_1_cluster_trains_over_mtls(self):
        version = self.wait_version_above(2, 180)
        self.assertGreaterEqual(version, 3)
        members = self.status()["members"]
        self.assertEqual(
            sorted(m["role"] for m in members
                   if m.get("state") == "MEMBER_STATE_ALIVE"),
            ["ROLE_ROLLOUT", "ROLE_ROLLOUT", "ROLE_TRAINER", "ROLE_VERIFIER"])
        self.assertNotIn("coordinator unreachable",
                         self.launcher.launcher_output())
        # Every call of the cluster's own daemons passed authorization
        # (coordinator_authz.h, and the other daemons' admin checks): none
        # was refused, and the coordinator's scoring calls reached the
        # verifier.
        for name, info in self.ready.items():
            daemon = name.split("-")[0]
            metrics = harness.scrape_metrics(info["metrics_address"], self.certs)
            for reason in ("unauthenticated", "wrong_role", "other_member"):
                with self.subTest(daemon=name, reason=reason):
                    self.assertEqual(harness.metric_sum(
                        metrics, f"tandem_{daemon}_auth_refused_total",
                        reason=reason), 0)
            if daemon == "verifier":
                self.assertGreater(harness.metric_sum(
                    metrics, "tandem_verifier_requests_total"), 0)

    def test_2_plaintext_client_is_refused(self):
        for name, info in self.ready.items():
            with self.subTest(daemon=name):
                with grpc.insecure_channel(info["grpc_address"]) as channel:
                    self.assertEqual(refused_code(channel),
                                     grpc.StatusCode.UNAVAILABLE)

    def test_3_tls_client_without_certificate_is_refused(self):
        with grpc.secure_channel(self.coordinator,
                                 harness.grpc_tls_credentials(self.certs)) as channel:
            self.assertEqual(refused_code(channel),
                             grpc.StatusCode.UNAVAILABLE)

    def test_4_certificate_of_another_ca_is_refused(self):
        # Trusting the cluster's CA but presenting the other CA's admin
        # certificate: the server refuses it.
        creds = harness.grpc_tls_credentials(self.certs, cert_dir=self.other)
        with grpc.secure_channel(self.coordinator, creds) as channel:
            self.assertEqual(refused_code(channel),
                             grpc.StatusCode.UNAVAILABLE)
        # Trusting only the other CA: the client refuses the server.
        creds = harness.grpc_tls_credentials(self.other, cert_dir=self.other)
        with grpc.secure_channel(self.coordinator, creds) as channel:
            self.assertEqual(refused_code(channel),
                             grpc.StatusCode.UNAVAILABLE)

    def test_5_valid_certificate_reads_cluster_status(self):
        creds = harness.grpc_tls_credentials(self.certs, cert_dir=self.certs)
        with grpc.secure_channel(self.coordinator, creds) as channel:
            response = get_cluster_status(channel)
        self.assertGreater(len(response), 0)
        # Every role may read the cluster status (docs/operations.md,
        # "Roles and authorization"); test_authz.py checks the rest.
        creds = harness.grpc_tls_credentials(self.certs, cert_dir=self.certs,
                                 role="rollout")
        with grpc.secure_channel(self.coordinator, creds) as channel:
            self.assertGreater(len(get_cluster_status(channel)), 0)

    def test_6_tandemctl_needs_its_tls_flags(self):
        self.assertIn("members", self.status())
        out = subprocess.run(
            [harness.binary("tandemctl"), "status", "--coordinator",
             self.coordinator, "--timeout", "2"],
            capture_output=True, text=True, timeout=15)
        self.assertEqual(out.returncode, 1, out.stdout)
        health = subprocess.run(
            [harness.binary("tandemctl"), "health", "--address",
             self.ready["verifier"]["grpc_address"], *harness.tls_flags(self.certs)],
            capture_output=True, text=True, timeout=15)
        self.assertEqual(health.stdout.strip(), "SERVING", health.stderr)

    def test_7_rotated_certificates_are_used_without_a_restart(self):
        before = served_certificate(self.coordinator, self.certs)
        self.assertEqual(before, ssl.PEM_cert_to_DER_cert(
            read(os.path.join(self.certs, "coordinator.pem"))))
        version = int(self.status().get("policyVersion", 0))
        fresh = os.path.join(self.tmp, "fresh")
        harness.certs_init(fresh, "--ca-dir", self.certs)
        # Replace each pair by rename, key first (what a secret mount or a
        # cert-manager update does, file by file).
        for role in [*ROLES.values(), "admin"]:
            for ext in ("key", "pem"):
                staged = os.path.join(self.certs, f".{role}.{ext}.new")
                shutil.copyfile(os.path.join(fresh, f"{role}.{ext}"), staged)
                os.replace(staged, os.path.join(self.certs, f"{role}.{ext}"))
        new = ssl.PEM_cert_to_DER_cert(
            read(os.path.join(self.certs, "coordinator.pem")))
        self.assertNotEqual(new, before)
        harness.wait_for(
            lambda: serves(self.coordinator, self.certs,
                           os.path.join(self.certs, "coordinator.pem")),
            REFRESH_S + 10, "the coordinator to serve the new certificate",
            interval=0.2)
        # A new client connection with the new admin certificate works.
        creds = harness.grpc_tls_credentials(self.certs, cert_dir=self.certs)
        with grpc.secure_channel(self.coordinator, creds) as channel:
            self.assertGreater(len(get_cluster_status(channel)), 0)
        # And the cluster keeps training on the rotated certificates.
        self.wait_version_above(version + 1, 120)
        for name, info in self.ready.items():
            cert = os.path.join(self.certs,
                                f"{ROLES[name.split('-')[0]]}.pem")
            addresses = [info["metrics_address"]]
            if name != "coordinator":
                addresses.append(info["grpc_address"])
            for address in addresses:
                with self.subTest(daemon=name, address=address):
                    self.assertTrue(harness.wait_for(
                        lambda: serves(address, self.certs, cert),
                        REFRESH_S + 10,
                        f"{name} to serve its new certificate on {address}",
                        interval=0.2))

    def worker(self, action, address, role="admin"):
        """`tandemctl worker <action>` with `role`'s certificate: (exit
        code, JSON or None, stderr)."""
        out = subprocess.run(
            [harness.binary("tandemctl"), "worker", action, "--address",
             address, "--json", *harness.tls_flags(self.certs, role)],
            capture_output=True, text=True, timeout=15)
        return (out.returncode,
                json.loads(out.stdout) if out.returncode == 0 else None,
                out.stderr)

    def test_8_admin_rpcs_of_workers_and_trainer_need_the_admin_role(self):
        worker = self.ready["rollout-0"]
        for role in ("rollout", "trainer", "verifier"):
            with self.subTest(role=role):
                code, _, err = self.worker("pause", worker["grpc_address"],
                                           role)
                self.assertEqual(code, 1, err)
                self.assertIn("Pause needs the admin role", err)
                code, status, err = self.worker(
                    "status", worker["grpc_address"], role)
                self.assertEqual(code, 0, err)
                self.assertEqual(status["state"], "ROLLOUT_STATE_RUNNING")
        self.assertEqual(harness.metric_sum(
            harness.scrape_metrics(worker["metrics_address"], self.certs),
            "tandem_rollout_auth_refused_total", reason="wrong_role"), 3)
        # The admin certificate pauses and resumes it.
        code, status, err = self.worker("pause", worker["grpc_address"])
        self.assertEqual(code, 0, err)
        self.assertEqual(status["state"], "ROLLOUT_STATE_PAUSED")
        code, status, err = self.worker("resume", worker["grpc_address"])
        self.assertEqual(code, 0, err)
        self.assertEqual(status["state"], "ROLLOUT_STATE_RUNNING")
        # SaveCheckpoint pins weights on disk: admin only.
        trainer = self.ready["trainer"]
        creds = harness.grpc_tls_credentials(self.certs, cert_dir=self.certs,
                                 role="rollout")
        with grpc.secure_channel(trainer["grpc_address"], creds) as channel:
            save = channel.unary_unary("/tandem.v1.Trainer/SaveCheckpoint",
                                       request_serializer=None,
                                       response_deserializer=None)
            with self.assertRaises(grpc.RpcError) as error:
                save(b"", timeout=10)
        self.assertEqual(error.exception.code(),
                         grpc.StatusCode.PERMISSION_DENIED)
        self.assertIn("SaveCheckpoint needs the admin role; the caller is "
                      "rollout 'dev'", error.exception.details())
        self.assertEqual(harness.metric_sum(
            harness.scrape_metrics(trainer["metrics_address"], self.certs),
            "tandem_trainer_auth_refused_total", reason="wrong_role"), 1)
        # ScoreBatch runs candidate code: only the coordinator may ask.
        verifier = self.ready["verifier"]
        creds = harness.grpc_tls_credentials(self.certs, cert_dir=self.certs)
        with grpc.secure_channel(verifier["grpc_address"], creds) as channel:
            score = channel.unary_unary("/tandem.v1.Verifier/ScoreBatch",
                                        request_serializer=None,
                                        response_deserializer=None)
            with self.assertRaises(grpc.RpcError) as error:
                score(b"", timeout=10)
        self.assertEqual(error.exception.code(),
                         grpc.StatusCode.PERMISSION_DENIED)
        self.assertIn("ScoreBatch needs the coordinator role; the caller is "
                      "admin 'dev'", error.exception.details())
        self.assertEqual(harness.metric_sum(
            harness.scrape_metrics(verifier["metrics_address"], self.certs),
            "tandem_verifier_auth_refused_total", reason="wrong_role"), 1)


    def test_9_broadcast_rendezvous_is_over_the_trainers_grpc(self):
        trainer = self.ready["trainer"]
        # No TCPStore: its port is not open.
        with self.assertRaises(ConnectionRefusedError):
            socket.create_connection(("127.0.0.1", self.store_port),
                                     timeout=5).close()
        self.assertIn("rendezvous store on the trainer's gRPC server",
                      self.launcher.log("trainer"))

        def broadcast_bytes():
            sent = harness.metric_sum(
                harness.scrape_metrics(trainer["metrics_address"], self.certs),
                "tandem_weight_sync_bytes_total", direction="sent",
                transport="broadcast")
            received = sum(harness.metric_sum(
                harness.scrape_metrics(info["metrics_address"], self.certs),
                "tandem_weight_sync_bytes_total", direction="received",
                transport="broadcast")
                for name, info in self.ready.items()
                if name.startswith("rollout"))
            return (sent, received) if sent > 0 and received > 0 else None
        try:
            harness.wait_for(broadcast_bytes, 120,
                             "versions sent and received by broadcast",
                             interval=1)
        except AssertionError:
            print(self.launcher.log("trainer")[-3000:])
            print(self.launcher.log("rollout-0")[-3000:])
            raise
        # Every version crossed the pair sockets sealed and opened: the
        # workers count their decrypt failures (the family is exposed under
        # mtls) and have none.
        for name, info in self.ready.items():
            if not name.startswith("rollout"):
                continue
            text = harness.scrape_metrics(info["metrics_address"], self.certs)
            self.assertIn('tandem_weight_sync_decrypt_failures_total'
                          '{transport="broadcast"}', text)
            self.assertEqual(harness.metric_sum(
                text, "tandem_weight_sync_decrypt_failures_total"), 0)
        # Only trainer and rollout certificates may use the store.
        refused_before = harness.metric_sum(
            harness.scrape_metrics(trainer["metrics_address"], self.certs),
            "tandem_trainer_auth_refused_total", reason="wrong_role")
        creds = harness.grpc_tls_credentials(self.certs, cert_dir=self.certs,
                                             role="verifier")
        with grpc.secure_channel(trainer["grpc_address"], creds) as channel:
            store_set = channel.unary_unary(
                "/tandem.v1.Rendezvous/StoreSet", request_serializer=None,
                response_deserializer=None)
            with self.assertRaises(grpc.RpcError) as error:
                store_set(b"", timeout=10)
        self.assertEqual(error.exception.code(),
                         grpc.StatusCode.PERMISSION_DENIED)
        self.assertEqual(harness.metric_sum(
            harness.scrape_metrics(trainer["metrics_address"], self.certs),
            "tandem_trainer_auth_refused_total", reason="wrong_role"),
            refused_before + 1)

    def test_10_prometheus_scrapes_https_metrics_with_a_certificate(self):
        """metrics.tls: mtls on every daemon: a real Prometheus with the
        admin certificate scrapes them all; plain HTTP, HTTPS without a
        client certificate and a certificate of another CA get nothing."""
        targets = {name: info["metrics_address"]
                   for name, info in self.ready.items()}
        prometheus = harness.Prometheus(targets, certs=self.certs)
        try:
            def all_up():
                result = prometheus.query("up")
                if not result or len(result) != len(targets):
                    return None
                if any(r["value"][1] != "1" for r in result):
                    return None
                return result
            harness.wait_for(all_up, 60, "every /metrics target up over "
                             "https", interval=1)
            build = prometheus.query("tandem_build_info")
            self.assertEqual(sorted(r["metric"]["job"] for r in build),
                             sorted(targets))
        finally:
            prometheus.stop()
        for name, address in targets.items():
            with self.subTest(daemon=name, client="plain http"):
                with self.assertRaises((OSError, http.client.HTTPException)):
                    harness.scrape_metrics(address)
            with self.subTest(daemon=name, client="no certificate"):
                context = ssl.create_default_context(
                    cafile=os.path.join(self.certs, "ca.pem"))
                with self.assertRaises((OSError, http.client.HTTPException)):
                    with urllib.request.urlopen(
                            f"https://{address}/metrics", timeout=5,
                            context=context) as r:
                        r.read()
            with self.subTest(daemon=name, client="another CA"):
                context = ssl.create_default_context(
                    cafile=os.path.join(self.certs, "ca.pem"))
                context.load_cert_chain(
                    os.path.join(self.other, "admin.pem"),
                    os.path.join(self.other, "admin.key"))
                with self.assertRaises((OSError, http.client.HTTPException)):
                    with urllib.request.urlopen(
                            f"https://{address}/metrics", timeout=5,
                            context=context) as r:
                        r.read()
            with self.subTest(daemon=name, client="the CA's rollout"):
                self.assertIn("tandem_build_info", harness.scrape_metrics(
                    address, self.certs, role="rollout"))


if __name__ == "__main__":
    unittest.main(verbosity=2)
