"""Helpers for integration tests: real Tandem binaries as subprocesses on
loopback, an independent gRPC health client (Debian's python3-grpcio), and a
real Prometheus server."""

import ctypes
import importlib
import json
import os
import re
import shutil
import signal
import ssl
import socket
import subprocess
import sys
import tempfile
import threading
import time
import urllib.parse
import urllib.request

import grpc

BIN_DIR = os.environ.get("TANDEM_BIN_DIR", os.path.join(
    os.path.dirname(__file__), "..", "..", "build", "bin"))

# grpc.health.v1.HealthCheckResponse.ServingStatus
SERVING_STATUS = {0: "UNKNOWN", 1: "SERVING", 2: "NOT_SERVING",
                  3: "SERVICE_UNKNOWN"}


REPO = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", ".."))



_PR_SET_PDEATHSIG = 1


def _die_with_parent():
    """In the child, before exec: SIGTERM when the test process dies, even
    by SIGKILL (a ctest timeout), so no daemon outlives its test (orphaned
    clusters once used the machine's CPU for minutes)."""
    ctypes.CDLL(None, use_errno=True).prctl(_PR_SET_PDEATHSIG,
                                            int(signal.SIGTERM))


def die_with_test():
    """Popen keyword arguments that tie the child's life to this process.
    Only from the main thread: the signal follows the thread that forked,
    and a helper thread's exit would stop the child early."""
    if threading.current_thread() is threading.main_thread():
        return {"preexec_fn": _die_with_parent}
    return {}


def proto_stubs(*names, out_dir=None):
    """Generates the Python message classes of proto/tandem/v1/<name> for
    each name (protoc at test time, python3-protobuf), puts the folder on
    sys.path and returns it. A fresh temporary folder when out_dir is None
    (the caller removes it); no names: only puts out_dir on the path (a child
    process reusing its parent's stubs)."""
    proto_root = os.path.join(REPO, "proto")
    if out_dir is None:
        out_dir = tempfile.mkdtemp(prefix="tandem-pb-")
    if names:
        subprocess.run(
            ["protoc", f"--proto_path={proto_root}", f"--python_out={out_dir}",
             *[os.path.join(proto_root, "tandem", "v1", name)
               for name in names]], check=True)
    if out_dir not in sys.path:
        sys.path.insert(0, out_dir)
    return out_dir


def unary_call(channel, service, method, request, timeout=10):
    """Calls tandem.v1.<service>/<method> on `channel` through grpc's
    generic unary calls (no generated grpc stubs). The response class is
    read from the request module's service descriptor (proto_stubs), so a
    test keeps no table of response types of its own."""
    request_file = request.DESCRIPTOR.file
    output = request_file.pool.FindServiceByName(
        f"tandem.v1.{service}").methods_by_name[method].output_type
    module = importlib.import_module(
        output.file.name[:-len(".proto")].replace("/", ".") + "_pb2")
    rpc = channel.unary_unary(
        f"/tandem.v1.{service}/{method}",
        request_serializer=lambda m: m.SerializeToString(),
        response_deserializer=getattr(module, output.name).FromString)
    return rpc(request, timeout=timeout)


def certs_init(directory, *extra):
    """`tandemctl certs init --dir DIRECTORY [extra...]`: a development CA
    and one certificate per role (docs/operations.md)."""
    subprocess.run([binary("tandemctl"), "certs", "init", "--dir", directory,
                    *extra], check=True, capture_output=True, timeout=30)


def grpc_tls_credentials(ca_dir, cert_dir=None, role="admin"):
    """Python grpcio TLS credentials trusting the CA of `ca_dir`, with the
    client certificate `role`.pem of `cert_dir` (none when cert_dir is
    None)."""
    def read(name):
        with open(name, "rb") as f:
            return f.read()
    root = read(os.path.join(ca_dir, "ca.pem"))
    if cert_dir is None:
        return grpc.ssl_channel_credentials(root_certificates=root)
    return grpc.ssl_channel_credentials(
        root_certificates=root,
        private_key=read(os.path.join(cert_dir, f"{role}.key")),
        certificate_chain=read(os.path.join(cert_dir, f"{role}.pem")))


def write_mtls_configs(config_dir, certs, roles=None, extra=None,
                       tls_extra=""):
    """Writes <daemon>.yaml for the four daemons into `config_dir`: the
    test config of tests/integration/config, then `extra[daemon]`, then
    `tls.mode: mtls` with the certificate of `roles[daemon]` (default: the
    daemon's own role) from `certs`, then `tls_extra` (lines under tls:)."""
    os.makedirs(config_dir, exist_ok=True)
    for daemon in ("coordinator", "trainer", "verifier", "rollout"):
        role = (roles or {}).get(daemon, daemon)
        with open(os.path.join(REPO, "tests", "integration", "config",
                               f"{daemon}.yaml")) as f:
            text = f.read()
        text += (extra or {}).get(daemon, "")
        text += (f"tls:\n  mode: mtls\n"
                 f"  cert: {certs}/{role}.pem\n"
                 f"  key: {certs}/{role}.key\n"
                 f"  ca: {certs}/ca.pem\n" + tls_extra)
        with open(os.path.join(config_dir, f"{daemon}.yaml"), "w") as f:
            f.write(text)


def tls_flags(certs, role="admin"):
    """tandemctl's and the launcher's TLS flags for `role`'s certificate."""
    return ["--tls-cert", os.path.join(certs, f"{role}.pem"),
            "--tls-key", os.path.join(certs, f"{role}.key"),
            "--tls-ca", os.path.join(certs, "ca.pem")]


def binary(name):
    path = os.path.join(BIN_DIR, name)
    if not os.access(path, os.X_OK):
        raise RuntimeError(f"{path} not found; build first")
    return path


def wait_for(predicate, timeout, what, interval=0.05):
    """Polls predicate() until it returns a truthy value; fails after timeout."""
    deadline = time.monotonic() + timeout
    last = None
    while time.monotonic() < deadline:
        last = predicate()
        if last:
            return last
        time.sleep(interval)
    raise AssertionError(f"timed out after {timeout}s waiting for {what}")


def remove_tmp(path):
    """Removes a test's temporary folder, or keeps it (and says where) when
    TANDEM_KEEP_TMP is set."""
    if os.environ.get("TANDEM_KEEP_TMP"):
        print(f"kept {path}")
        return
    shutil.rmtree(path, ignore_errors=True)


def read_json(path):
    try:
        with open(path) as f:
            return json.load(f)
    except (OSError, ValueError):
        return None


def health_check(address, service="", timeout=2.0):
    """Raw /grpc.health.v1.Health/Check; returns the status name.

    The request and response are encoded by hand (field 1: service string;
    field 1: status varint) so that this client shares nothing with ours."""
    request = b""
    if service:
        encoded = service.encode()
        request = b"\x0a" + bytes([len(encoded)]) + encoded
    with grpc.insecure_channel(address) as channel:
        check = channel.unary_unary("/grpc.health.v1.Health/Check",
                                    request_serializer=None,
                                    response_deserializer=None)
        response = check(request, timeout=timeout)
    if response == b"":
        return SERVING_STATUS[0]
    assert response[0] == 0x08, response
    return SERVING_STATUS.get(response[1], f"?{response[1]}")


def scrape_metrics(address, certs=None, role="admin"):
    """Text of http://<address>/metrics (a daemon's Prometheus endpoint);
    with `certs` (a `tandemctl certs init` directory), https:// checked
    against its CA, presenting the certificate of `role`
    (`metrics.tls: tls` or `mtls`)."""
    if certs is None:
        with urllib.request.urlopen(f"http://{address}/metrics",
                                    timeout=5) as r:
            return r.read().decode()
    context = ssl.create_default_context(cafile=os.path.join(certs, "ca.pem"))
    context.load_cert_chain(os.path.join(certs, f"{role}.pem"),
                            os.path.join(certs, f"{role}.key"))
    with urllib.request.urlopen(f"https://{address}/metrics", timeout=5,
                                context=context) as r:
        return r.read().decode()


def metric_sum(text, name, **labels):
    """Sum of the samples of `name` in exposition `text` whose labels include
    `labels`."""
    total = 0.0
    for line in text.splitlines():
        match = re.match(r"^(\w+)(\{[^}]*\})? (\S+)$", line)
        if not match or match.group(1) != name:
            continue
        have = dict(re.findall(r'(\w+)="([^"]*)"', match.group(2) or ""))
        if all(have.get(k) == v for k, v in labels.items()):
            total += float(match.group(3))
    return total


def stop_process(process, sig=signal.SIGTERM, timeout=30):
    """Sends `sig` to a running process, waits `timeout` seconds, then kills
    it; returns its exit code."""
    if process.poll() is None:
        process.send_signal(sig)
        try:
            process.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()
    return process.returncode


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


# The trainer's log line for each optimizer step
# (services/trainer/training_loop.cc).
TRAINER_STEP = re.compile(
    r"stepped to version (\d+) on batch (\S+): groups (\S*)")


def steps_of(log):
    """[(version, batch id, [group ids])] in the order a trainer's log took
    them."""
    return [(int(m.group(1)), m.group(2),
             m.group(3).split(",") if m.group(3) else [])
            for m in TRAINER_STEP.finditer(log)]


def group_ids(steps):
    """Every group id the steps trained, repeats kept."""
    return [g for _, _, groups in steps for g in groups]


class Daemon:
    """One daemon binary on ephemeral loopback ports (of `host`, any
    127.x.y.z address), logging to a file. `prefix` runs it under another
    command that execs it (e.g. `ip netns exec NAME`)."""

    def __init__(self, daemon, tmp, extra=(), name=None, host="127.0.0.1",
                 grpc_port=0, env=None, prefix=()):
        name = name or daemon
        self.ready_file = os.path.join(tmp, f"{name}.ready.json")
        self.log_path = os.path.join(tmp, f"{name}.log")
        self.log = open(self.log_path, "w")
        if os.path.exists(self.ready_file):
            os.remove(self.ready_file)  # a restart under the same name
        self.process = subprocess.Popen(
            [*prefix, binary(f"tandem-{daemon}"), "--grpc-address",
             f"{host}:{grpc_port}", "--metrics-address", f"{host}:0",
             "--ready-file", self.ready_file, *extra],
            stdout=self.log, stderr=subprocess.STDOUT,
            env=dict(os.environ, **(env or {})), **die_with_test())

    def wait_ready(self, timeout=30):
        def ready():
            if self.process.poll() is not None:
                raise AssertionError(
                    f"{self.log_path}: exited {self.process.returncode}:\n"
                    f"{self.output()}")
            return read_json(self.ready_file)
        return wait_for(ready, timeout, self.ready_file)

    def output(self):
        with open(self.log_path) as f:
            return f.read()

    def stop(self, sig=signal.SIGTERM, timeout=20):
        code = stop_process(self.process, sig, timeout)
        self.log.close()
        return code


def start_without_trainer(tmp, config_dir):
    """A coordinator from `config_dir`/coordinator.yaml that no trainer
    consumes from (so the staleness throttle never stops dispatch) and a
    verifier registered with it. Returns (coordinator, verifier, member):
    `member` is the --set a rollout worker needs to join them."""
    coordinator = Daemon(
        "coordinator", tmp,
        ["--config", os.path.join(config_dir, "coordinator.yaml"),
         "--set", "training.groups_per_version=100000"])
    address = coordinator.wait_ready()["grpc_address"]
    member = ["--set", f"coordinator_address={address}"]
    verifier = Daemon("verifier", tmp, member)
    verifier.wait_ready()
    return coordinator, verifier, member


def tandemctl_json(*args, timeout=15):
    out = subprocess.run([binary("tandemctl"), *args, "--json"],
                         capture_output=True, text=True, timeout=timeout)
    if out.returncode != 0:
        raise AssertionError(f"tandemctl {' '.join(args)}: {out.stderr}")
    return json.loads(out.stdout)


def write_files(directory, files):
    """Writes {name: text} into `directory` (config files of a test)."""
    for name, text in files.items():
        with open(os.path.join(directory, name), "w") as f:
            f.write(text)


def cluster_status(coordinator):
    """`tandemctl status` of the coordinator at `coordinator`, as JSON."""
    return tandemctl_json("status", "--coordinator", coordinator)


def worker_status(address):
    """`tandemctl worker status` of the rollout worker at `address`."""
    return tandemctl_json("worker", "status", "--address", address)


def as_int(message, field):
    """An integer field of tandemctl's JSON (proto3 JSON omits zeros and
    writes 64-bit integers as strings)."""
    return int(message.get(field, 0))


def wait_settled(coordinator, workers, timeout, quiet_queues=False,
                 gap=0.0, interval=0.5):
    """Waits until the coordinator's policy version is the same in two
    snapshots `gap` seconds apart (and, with quiet_queues, nothing is being
    scored, ready or trained) and every worker holds it. `workers` maps
    names to addresses, or is a callable returning that map (addresses of
    restarted workers change). Returns (cluster status, {name: worker
    status}); the timeout's AssertionError shows the last snapshot."""
    last = {}

    def settled():
        status = cluster_status(coordinator)
        version = as_int(status, "policyVersion")
        addresses = workers() if callable(workers) else workers
        seen = {name: worker_status(address)
                for name, address in addresses.items()}
        if gap:
            time.sleep(gap)
        again = cluster_status(coordinator)
        last.update(status=status, workers=seen)
        if as_int(again, "policyVersion") != version:
            return None
        queues = again.get("queues", {})
        if quiet_queues and any(as_int(queues, q) for q in (
                "scoringSamples", "readyGroups", "trainingGroups")):
            return None
        if all(as_int(w, "receivedPolicyVersion") == version
               for w in seen.values()):
            return status, seen
        return None
    try:
        return wait_for(settled, timeout, "every worker on the latest policy "
                        "version", interval=interval)
    except AssertionError as e:
        raise AssertionError(f"{e}; last snapshot: {last}") from None


class Launcher:
    """tandem-local running a whole cluster in a temporary run directory."""

    def __init__(self, rollout_workers=2, config_dir=None, extra_args=()):
        self.run_dir = tempfile.mkdtemp(prefix="tandem-it-")
        args = [binary("tandem-local"), "--run-dir", self.run_dir,
                "--rollout-workers", str(rollout_workers),
                "--bin-dir", BIN_DIR, *extra_args]
        if config_dir:
            args += ["--config-dir", config_dir]
        self.names = (["coordinator", "trainer", "verifier"] +
                      [f"rollout-{i}" for i in range(rollout_workers)])
        self.output = open(os.path.join(self.run_dir, "launcher.out"), "w+")
        self.process = subprocess.Popen(args, stdout=self.output,
                                        stderr=subprocess.STDOUT,
                                        **die_with_test())

    def ready(self, name):
        return read_json(os.path.join(self.run_dir, "ready", f"{name}.json"))

    def wait_all_ready(self, timeout=60):
        def all_ready():
            if self.process.poll() is not None:
                raise AssertionError(
                    f"launcher exited early:\n{self.launcher_output()}")
            infos = {n: self.ready(n) for n in self.names}
            return infos if all(infos.values()) else None
        return wait_for(all_ready, timeout, "every daemon's ready file")

    def log(self, name):
        with open(os.path.join(self.run_dir, "logs", f"{name}.log")) as f:
            return f.read()

    def launcher_output(self):
        if not self.output.closed:
            self.output.flush()
        with open(self.output.name) as f:
            return f.read()

    def stop(self, timeout=40):
        if self.process.poll() is None:
            self.process.send_signal(signal.SIGINT)
            try:
                self.process.wait(timeout=timeout)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()
        self.output.close()
        return self.process.returncode

    def cleanup(self):
        shutil.rmtree(self.run_dir, ignore_errors=True)

    def shutdown(self, *dirs):
        """Stops the cluster with Ctrl-C, removes its run directory and
        `dirs`, and raises AssertionError (with the launcher's output and
        the coordinator's log tail) unless it exited 0."""
        code = self.stop()
        output = self.launcher_output()
        if code != 0:
            try:
                output += ("\n==== coordinator log (tail)\n" +
                           self.log("coordinator")[-3000:])
            except OSError:
                pass
        self.cleanup()
        for d in dirs:
            shutil.rmtree(d, ignore_errors=True)
        if code != 0:
            raise AssertionError(
                f"launcher exited {code} on Ctrl-C:\n{output}")


class Prometheus:
    """A real Prometheus server on loopback scraping the given targets."""

    def __init__(self, targets, scrape_interval="1s", certs=None,
                 role="admin"):
        """With `certs` (a `tandemctl certs init` directory), every target
        is scraped over https, checked against its CA, presenting the
        certificate of `role`."""
        self.dir = tempfile.mkdtemp(prefix="tandem-prom-")
        self.port = free_port()
        tls = ""
        if certs is not None:
            tls = (f"""    scheme: https
    tls_config:
      ca_file: {os.path.join(certs, "ca.pem")}
      cert_file: {os.path.join(certs, f"{role}.pem")}
      key_file: {os.path.join(certs, f"{role}.key")}
""")
        jobs = []
        for job, target in targets.items():
            jobs.append(f"""  - job_name: "{job}"
    scrape_interval: {scrape_interval}
{tls}    static_configs:
      - targets: ["{target}"]
""")
        config = os.path.join(self.dir, "prometheus.yml")
        with open(config, "w") as f:
            f.write("global:\n  scrape_interval: " + scrape_interval +
                    "\nscrape_configs:\n" + "".join(jobs))
        prometheus = shutil.which("prometheus")
        if prometheus is None:
            raise RuntimeError("prometheus not installed (Debian package "
                               "'prometheus'; run deploy/local/install-deps.sh)")
        self.log = open(os.path.join(self.dir, "prometheus.log"), "w")
        self.process = subprocess.Popen(
            [prometheus, f"--config.file={config}",
             f"--storage.tsdb.path={self.dir}/data",
             f"--web.listen-address=127.0.0.1:{self.port}"],
            stdout=self.log, stderr=subprocess.STDOUT, **die_with_test())

    def query(self, expr):
        url = (f"http://127.0.0.1:{self.port}/api/v1/query?" +
               urllib.parse.urlencode({"query": expr}))
        try:
            with urllib.request.urlopen(url, timeout=2) as r:
                body = json.load(r)
        except OSError:
            return None
        if body.get("status") != "success":
            return None
        return body["data"]["result"]

    def stop(self):
        self.process.terminate()
        try:
            self.process.wait(timeout=10)
        except subprocess.TimeoutExpired:
            self.process.kill()
        self.log.close()
        shutil.rmtree(self.dir, ignore_errors=True)
