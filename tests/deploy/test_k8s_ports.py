"""The cpu overlay's pods as local processes, and the ports they really
listen on against its NetworkPolicy objects.

Each workload of `kubectl kustomize deploy/k8s/overlays/cpu` (rollout with
two replicas) runs as the binary and arguments of its container, with its
environment (`$(POD_IP)` and status.podIP = a loopback address of its own,
127.a.b.N, like a pod IP; `coordinator:50051` = the coordinator's), its
ConfigMap files (deploy/compose/config) and its TLS Secret's files made
the way components/dev-certs makes them (`tandemctl certs init`, copied as
tls.crt, tls.key, ca.crt): mTLS as the overlay runs. Once the trainer has
broadcast versions to both workers (Gloo pairs open), the test reads every
process's listening TCP sockets from /proc and fails if

- a port a daemon listens on is admitted to its pod by no NetworkPolicy of
  the overlay (check_k8s_trust.admitted), or
- a port the pod spec says the daemon listens on (check_k8s_trust.listening:
  gRPC, metrics, the trainer's store and data ports) has no listener, or
  the trainer's store port has one under mTLS (the rendezvous store is
  then a service of the trainer's gRPC server), or
  the broadcast members' pairs listen outside the admitted range, or
- a member (trainer, rollout, verifier), whose pod spec binds its pod IP,
  listens on any other address (every interface, say): such a listener is
  reachable on networks the pod never meant to serve. The coordinator binds
  0.0.0.0 by its pod spec.

    python3 tests/deploy/test_k8s_ports.py     # TANDEM_BIN_DIR: the build
Needs kubectl; runs the daemons on loopback, no cluster."""

import os
import random
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import unittest
import urllib.request

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
sys.path.insert(0, os.path.join(HERE, "..", "integration"))
import check_k8s  # noqa: E402
import check_k8s_trust  # noqa: E402
import common  # noqa: E402
import harness  # noqa: E402

ROLLOUT_REPLICAS = 2
TLS_FILES = {"tls.crt": "{role}.pem", "tls.key": "{role}.key",
             "ca.crt": "ca.pem"}


def listening_ports(pid):
    """{port: address} of the TCP sockets process `pid` listens on."""
    inodes = set()
    fd_dir = f"/proc/{pid}/fd"
    for fd in os.listdir(fd_dir):
        try:
            link = os.readlink(os.path.join(fd_dir, fd))
        except OSError:
            continue
        m = re.match(r"socket:\[(\d+)\]", link)
        if m:
            inodes.add(m.group(1))
    ports = {}
    for table in ("tcp", "tcp6"):
        with open(f"/proc/{pid}/net/{table}") as f:
            next(f)
            for line in f:
                fields = line.split()
                local, state, inode = fields[1], fields[3], fields[9]
                if state == "0A" and inode in inodes:  # TCP_LISTEN
                    address, port = local.rsplit(":", 1)
                    ports[int(port, 16)] = readable_address(address)
    return ports


def ipv4_of(address):
    """The IPv4 address of "a.b.c.d" or of an IPv4-mapped "[..ffff....]"."""
    if address.startswith("[00000000000000000000ffff"):
        raw = bytes.fromhex(address[25:33])
        return ".".join(str(b) for b in raw)
    return address


def readable_address(hex_address):
    """/proc/net/tcp{,6}'s local address (host byte order) as text."""
    raw = bytes.fromhex(hex_address)
    if len(raw) == 4:
        return ".".join(str(b) for b in reversed(raw))
    words = [raw[i:i + 4][::-1] for i in range(0, 16, 4)]
    return "[" + b"".join(words).hex() + "]"


class Pod:
    """One pod of the overlay as a local process."""

    def __init__(self, name, template, host, coordinator_host, certs, work):
        self.name = name
        self.template = template
        self.component = template["metadata"]["labels"][
            "app.kubernetes.io/component"]
        self.host = host
        self.dir = os.path.join(work, name)
        os.makedirs(self.dir)
        container = template["spec"]["containers"][0]
        self.container = container
        args = list(container["args"])
        args[0] = harness.binary(args[0])
        args = [a.replace("/etc/tandem/", common.CONFIG_DIR + "/")
                for a in args]
        tls_dir = os.path.join(self.dir, "tls")
        os.makedirs(tls_dir)
        secret_role = self.component
        for target, source in TLS_FILES.items():
            shutil.copy(os.path.join(certs, source.format(role=secret_role)),
                        os.path.join(tls_dir, target))
        env = {k: v for k, v in os.environ.items()
               if not k.startswith("TANDEM_")}
        values = {}
        for e in container.get("env", []):
            if e["name"] == "TANDEM_MODEL_PATH":
                # The warm start's checkpoint, made by an initContainer
                # that this test does not run (it is about sockets): the
                # trainer and the workers both start from the built-in
                # initial model instead, which is one model as well.
                continue
            value = e.get("value")
            field = e.get("valueFrom", {}).get("fieldRef", {}).get(
                "fieldPath")
            if field == "status.podIP":
                value = host
            value = re.sub(r"\$\((\w+)\)", lambda m: values[m.group(1)],
                           value or "")
            if value.startswith("/etc/tandem-tls/"):
                value = os.path.join(tls_dir, os.path.basename(value))
            elif value.startswith(("/var/lib/tandem/", "/run/tandem/")):
                value = os.path.join(self.dir, os.path.basename(value))
                if not e["name"].endswith("_FILE"):
                    os.makedirs(value, exist_ok=True)
            elif e["name"] == "TANDEM_COORDINATOR_ADDRESS":
                value = value.replace("coordinator:", f"{coordinator_host}:")
            elif e["name"] == "TANDEM_METRICS_ADDRESS":
                value = value.replace("0.0.0.0", host)
            values[e["name"]] = value
            env[e["name"]] = value
        self.env = env
        self.ready_file = env["TANDEM_READY_FILE"]
        self.log = open(os.path.join(self.dir, "log"), "w")
        self.process = subprocess.Popen(args, env=env, stdout=self.log,
                                        stderr=subprocess.STDOUT)

    def wait_ready(self, timeout=90):
        def ready():
            if self.process.poll() is not None:
                self.log.flush()
                with open(self.log.name) as f:
                    raise AssertionError(f"{self.name} exited "
                                         f"{self.process.returncode}:\n"
                                         f"{f.read()[-3000:]}")
            return harness.read_json(self.ready_file)
        return harness.wait_for(ready, timeout, f"{self.name} ready")

    def metric(self, name, label):
        """Sum of the samples of `name` that carry `label` (k="v")."""
        address = self.env["TANDEM_METRICS_ADDRESS"]
        with urllib.request.urlopen(f"http://{address}/metrics",
                                    timeout=3) as r:
            text = r.read().decode()
        return sum(float(line.rsplit(" ", 1)[1]) for line in
                   text.splitlines()
                   if line.startswith(name + "{") and label in line)

    def stop(self):
        code = harness.stop_process(self.process, signal.SIGTERM, 30)
        self.log.close()
        return code


class K8sPortsTest(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        cls.objects = check_k8s.build("cpu")
        cls.work = tempfile.mkdtemp(prefix="tandem-k8s-ports-")
        cls.pods = []
        certs = os.path.join(cls.work, "certs")
        harness.certs_init(certs, "--name", "k8s", "--hosts",
                           "tandem,localhost,127.0.0.1")
        workloads = {o["metadata"]["name"]: t
                     for o, t in check_k8s.pod_specs(cls.objects)}
        net = f"127.{random.randint(1, 254)}.{random.randint(1, 254)}"
        hosts = iter(f"{net}.{i}" for i in range(2, 250))
        try:
            coordinator_host = next(hosts)
            cls.pods.append(Pod("coordinator-0", workloads["coordinator"],
                                coordinator_host, coordinator_host, certs,
                                cls.work))
            cls.pods[0].wait_ready()
            for name, replicas in (("verifier", 1), ("trainer", 1),
                                   ("rollout", ROLLOUT_REPLICAS)):
                for r in range(replicas):
                    cls.pods.append(Pod(f"{name}-{r}", workloads[name],
                                        next(hosts), coordinator_host, certs,
                                        cls.work))
            for p in cls.pods:
                p.wait_ready()
        except BaseException:
            cls.tearDownClass()
            raise

    @classmethod
    def tearDownClass(cls):
        for p in reversed(cls.pods):
            p.stop()
        if os.environ.get("TANDEM_KEEP_TEST_DIR"):
            print(f"kept {cls.work}")
        else:
            shutil.rmtree(cls.work, ignore_errors=True)

    def test_every_listening_port_is_admitted_by_a_policy(self):
        policies = [o for o in self.objects if o["kind"] == "NetworkPolicy"]
        pods = {p.component for p in self.pods}
        rollouts = [p for p in self.pods if p.component == "rollout"]

        # Broadcast to both workers: the Gloo pairs and the store are open.
        def broadcast():
            return all(p.metric("tandem_weight_sync_bytes_total",
                                'transport="broadcast"') > 0
                       for p in rollouts)
        harness.wait_for(broadcast, 240, "a Gloo broadcast to every worker",
                         interval=1.0)
        seen_pairs = set()
        for p in self.pods:
            listens = listening_ports(p.process.pid)
            labels = p.template["metadata"]["labels"]
            admitted = check_k8s_trust.admitted(policies, p.component,
                                                labels, pods)
            declared = check_k8s_trust.listening(p.container, p.component)
            print(f"{p.name} ({p.host}): listens on " + ", ".join(
                f"{a}:{port}" for port, a in sorted(listens.items())))
            for port in listens:
                self.assertTrue(
                    any(a[0] <= port <= a[1] for _, a in admitted),
                    f"{p.name} listens on {port}, which no NetworkPolicy "
                    f"of the cpu overlay admits: {admitted}")
                if not any(r[0] == port for r in declared.values()):
                    first, last = declared.get("pairs", (1, 0))
                    self.assertTrue(first <= port <= last,
                                    f"{p.name}: port {port} is neither in "
                                    f"its pod spec nor a broadcast pair")
                    seen_pairs.add(p.component)
            if p.component != "coordinator":
                for port, address in listens.items():
                    self.assertEqual(ipv4_of(address), p.host,
                                     f"{p.name} listens on {address}:{port}, "
                                     f"not only on its pod IP {p.host}")
            env = {e["name"]: e.get("value")
                   for e in p.container.get("env", [])}
            for name, (first, last) in declared.items():
                if (p.component == "trainer" and name == "store" and
                        env.get("TANDEM_TLS_MODE") == "mtls"):
                    # Under mTLS the rendezvous store is a service of the
                    # trainer's gRPC server: no TCPStore port is opened.
                    self.assertNotIn(first, listens, f"{p.name}: a TCPStore "
                                     f"listens on {first} under mTLS")
                    continue
                if first == last:
                    self.assertIn(first, listens, f"{p.name}: the pod spec's "
                                  f"{name} port {first} has no listener")
        self.assertEqual(seen_pairs, {"trainer", "rollout"},
                         "broadcast pairs seen listening")


if __name__ == "__main__":
    unittest.main(verbosity=2)
