"""The compose stack in real containers (issue 24 items 1 and 2): rootful
Podman with runc, Debian's docker-compose 1.29 on Podman's Docker API
socket, deploy/compose/docker-compose.yml as users run it.

    python3 tests/deploy/test_compose_stack.py    # as root; ctest:
    ctest -R deploy_compose_stack --output-on-failure

Steps, each printed with its time:
1. deploy/compose/podman-setup.sh --socket: containers.conf (runc,
   ulimits), the debootstrap base image tagged debian:bookworm-slim (made
   once, then cached), the API socket (started here unless it was running;
   then stopped here at the end).
2. Images: tandem:prebuilt from docker/Dockerfile.prebuilt with the
   binaries of $TANDEM_BIN_DIR (no compile), LibTorch bind-mounted
   read-only from the RUNPATH those binaries carry (the project venv), and
   tandem-prometheus:bookworm from docker/Dockerfile.prometheus (Debian's
   prometheus). Podman's layer cache makes a second run's builds seconds.
3. `docker-compose up -d --scale rollout=2` of coordinator, trainer,
   verifier, rollout and prometheus (Grafana has no image without a
   registry), with a compose override (a temporary file): the images above,
   the LibTorch mounts, the trainer's log at debug (its step lines name the
   groups each step trained), the warm-start service shortened to
   SFT_STEPS steps (the trainer and the workers must start from its
   checkpoint; its defaults train ~2-5 minutes: test_compose_learns.py runs
   them). A thread runs `podman healthcheck run` for
   every container of the project every 2 s (Podman 4.3 runs healthchecks
   from systemd timers, which these machines lack), so `depends_on:
   service_healthy` and the health states work.
4. Every daemon SERVING to grpc.health.v1 (python grpcio, from the host, on
   each container's address) over mTLS with the admin certificate that the
   stack's `certs` service put into volume certs-admin (docs/deployment.md,
   "Compose with mTLS"), and refusing a plaintext client; `tandemctl
   status` inside the coordinator's container with its own certificate; a
   worker's Pause refused to the coordinator's certificate and done (then
   Resume) by `docker-compose run --rm admin`; `docker-compose run --rm
   certs` while training: the coordinator and a worker present their new
   certificates to new connections and the version keeps advancing;
   the policy version advances. Every tandemctl of the test uses that
   admin certificate (TANDEM_TLS_*).
5. `up --scale rollout=4` while training runs: the new workers register,
   are ALIVE in the coordinator's membership epoch and hold the latest
   version; `docker kill` of one worker (POST /containers/ID/kill on the
   Docker API socket; Podman's restart policy may bring it back); `up --scale rollout=1`: the removed workers leave, and the
   version still advances.
6. Prometheus's HTTP API: every daemon's target up through compose DNS,
   the removed workers' targets dropped (not left down), data for the
   staleness histograms and the throughput series.
7. Counts like tests/integration/test_chaos.py's: groups lost (the
   coordinator's groupsLost), groups trained twice (group ids in more than
   one of the trainer's steps), and groups in = groups out
   (groupsCompleted + groupsRequeued = groupsTrained + groupsDroppedStale +
   ready + training), printed as "groups lost 0, groups trained twice 0".
8. `docker-compose down -v`: containers, network and volumes gone; no
   container, pod or network of the project is left, and the API socket is
   stopped if this test started it. Steps 3-8 run under try/finally.

With TANDEM_COMPOSE_IMAGE=NAME the stack runs that image instead (one that
carries LibTorch, e.g. docker/Dockerfile's tandem:cpu; tests/deploy/
test_image_full.py does so): no prebuilt image, nothing mounted.

Skips (exit 77, ctest's SKIP_RETURN_CODE) with a one-line reason when not
root or podman/docker-compose/debootstrap are missing. Exit 0 on success,
1 on a failed check (the last logs of every service are printed)."""

import collections
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import threading
import time
import urllib.parse
import urllib.request
from importlib.machinery import SourceFileLoader

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
from podman_fixture import (COMPOSE_DIR, REPO, SKIP, SOCKET,  # noqa: E402
                            bin_dir, build_prebuilt_image, libtorch_dirs,
                            log, run, skip_reason, wait_for)
import podman_fixture  # noqa: E402

PROJECT = "tandemctest"
IMAGE = "tandem:prebuilt"
PROM_IMAGE = "tandem-prometheus:bookworm"
GRPC_PORTS = {"coordinator": 50051, "rollout": 50052, "verifier": 50053,
              "trainer": 50054}
STEP = re.compile(r"stepped to version (\d+) on batch (\S+): groups ([^\s\"]*)")
COUNTERS = ("groupsDispatched", "groupsCompleted", "groupsTrained",
            "groupsDroppedStale", "groupsRequeued", "groupsLost")
SFT_STEPS = 20
WARM_START = "/var/lib/tandem/warm-start/arith3-add"


class Stack:
    def __init__(self, tmp, image):
        self.tmp = tmp
        self.image = image
        self.env = dict(os.environ, DOCKER_HOST=f"unix://{SOCKET}",
                        TANDEM_IMAGE=image, PROMETHEUS_IMAGE=PROM_IMAGE,
                        COMPOSE_PROJECT_NAME=PROJECT)
        self.override = os.path.join(tmp, "docker-compose.ctest.yml")
        self.stop_health = threading.Event()
        self.health_thread = None

    def compose(self, *args, timeout=300, check=True):
        return run("docker-compose", "--project-directory", COMPOSE_DIR,
                   "-f", os.path.join(COMPOSE_DIR, "docker-compose.yml"),
                   "-f", self.override, *args, timeout=timeout, check=check,
                   env=self.env)

    def containers(self, service=None):
        """[(name, id)] of the project's running containers."""
        label = f"label=com.docker.compose.project={PROJECT}"
        args = ["podman", "ps", "--filter", label, "--format",
                "{{.Names}} {{.ID}}"]
        if service:
            args += ["--filter", f"label=com.docker.compose.service={service}"]
        out = run(*args).stdout.split()
        return sorted(zip(out[0::2], out[1::2]))

    def address(self, container):
        return run("podman", "inspect", "-f",
                   "{{range .NetworkSettings.Networks}}{{.IPAddress}} {{end}}",
                   container).stdout.split()[0]

    def healthchecks(self):
        while not self.stop_health.wait(2.0):
            try:
                for name, _ in self.containers():
                    run("podman", "healthcheck", "run", name, check=False,
                        timeout=20)
            except Exception:  # noqa: BLE001 - the stack may be going down
                pass

    def start_healthchecks(self):
        self.health_thread = threading.Thread(target=self.healthchecks)
        self.health_thread.start()

    def stop_healthchecks(self):
        self.stop_health.set()
        if self.health_thread:
            self.health_thread.join()


# The image's health probe, whose TLS channel (TANDEM_TLS_*) the host's
# checks share.
HEALTH = SourceFileLoader("tandem_health", os.path.join(
    REPO, "docker", "tandem-health")).load_module()
# TANDEM_TLS_* of the admin certificate on the host, set once the certs
# service has run (admin_tls).
ADMIN_TLS = {}


def admin_tls():
    """The certs-admin volume's files, as TANDEM_TLS_* for the host."""
    volume = run("podman", "volume", "inspect", "-f", "{{.Mountpoint}}",
                 f"{PROJECT}_certs-admin").stdout.strip()
    return {"TANDEM_TLS_MODE": "mtls",
            "TANDEM_TLS_CERT": os.path.join(volume, "tls.crt"),
            "TANDEM_TLS_KEY": os.path.join(volume, "tls.key"),
            "TANDEM_TLS_CA": os.path.join(volume, "ca.crt"),
            "TANDEM_TLS_SERVER_NAME": "tandem"}


def grpc_health(address, tls=True):
    channel = HEALTH.open_channel(
        address, HEALTH.tls_settings(ADMIN_TLS) if tls else None)
    with channel:
        rpc = channel.unary_unary("/grpc.health.v1.Health/Check",
                                  request_serializer=None,
                                  response_deserializer=None)
        response = rpc(b"", timeout=2.0)
    return response[:2] == b"\x08\x01"  # status SERVING


def peer_serial(address):
    """Serial number of the certificate the daemon at `address` presents
    to a new TLS connection (Python's ssl with the admin certificate)."""
    import socket
    import ssl
    from cryptography import x509
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
    context.load_verify_locations(ADMIN_TLS["TANDEM_TLS_CA"])
    context.load_cert_chain(ADMIN_TLS["TANDEM_TLS_CERT"],
                            ADMIN_TLS["TANDEM_TLS_KEY"])
    context.set_alpn_protocols(["h2"])
    host, port = address.rsplit(":", 1)
    with socket.create_connection((host, int(port)), timeout=5) as sock:
        with context.wrap_socket(sock, server_hostname="tandem") as tls:
            der = tls.getpeercert(binary_form=True)
    return x509.load_der_x509_certificate(der).serial_number


def tandemctl(*args, timeout=15):
    out = run(os.path.join(bin_dir(), "tandemctl"), *args, "--json",
              timeout=timeout, env=dict(os.environ, **ADMIN_TLS))
    return json.loads(out.stdout)


def status():
    """The coordinator's status; a failed call (issue 24 saw one
    GetClusterStatus Deadline Exceeded right after scaling) is printed and
    tried again, up to 3 times."""
    for attempt in range(1, 4):
        try:
            return tandemctl("status", "--coordinator", "127.0.0.1:50051")
        except (AssertionError, subprocess.TimeoutExpired) as e:
            if attempt == 3:
                raise
            log(f"tandemctl status failed (attempt {attempt}): "
                f"{str(e).strip()[-200:]}")
            time.sleep(1)


def version():
    return int(status().get("policyVersion", 0))


def counters(s):
    return {k: int(s.get("counters", {}).get(k, 0)) for k in COUNTERS}


def prometheus(expr):
    url = "http://127.0.0.1:9090/api/v1/query?" + urllib.parse.urlencode(
        {"query": expr})
    with urllib.request.urlopen(url, timeout=10) as r:
        body = json.load(r)
    if body.get("status") != "success":
        raise AssertionError(f"{expr}: {body}")
    return body["data"]["result"]


def setup():
    """podman-setup.sh --socket; the pid of the API service it started, or
    None when the socket was already answering."""
    return podman_fixture.setup(socket=True)


def build_images(tmp, prebuilt):
    if prebuilt:
        build_prebuilt_image(tmp, IMAGE)
    build_prometheus_image()


def build_prometheus_image():
    t = time.monotonic()
    run("podman", "build", "-q", "-f",
        os.path.join(REPO, "docker", "Dockerfile.prometheus"), "-t",
        PROM_IMAGE, os.path.join(REPO, "docker"), timeout=900)
    log(f"image {PROM_IMAGE}: {time.monotonic() - t:.0f} s")


def write_override(stack, warm_start_steps=SFT_STEPS):
    """The compose override: the LibTorch mounts, quick certificate
    rotation, the trainer's debug log, and the warm start cut to
    warm_start_steps (None: the compose file's own command, as users run
    it; test_compose_learns.py)."""
    mounts = []
    if stack.image == IMAGE:
        mounts = [f"{d}:{d}:ro" for d in
                  libtorch_dirs(os.path.join(bin_dir(), "tandem-trainer"))]
        if not mounts:
            raise AssertionError("no LibTorch directory in tandem-trainer's "
                                 "RUNPATH")
    services = {s: {"volumes": mounts} for s in
                ("coordinator", "trainer", "verifier", "rollout")}
    # Rotation is checked within seconds, not the default minute.
    for name in ("coordinator", "verifier", "rollout"):
        services[name]["environment"] = {"TANDEM_TLS_REFRESH_S": "2"}
    services["trainer"]["environment"] = {"TANDEM_LOG_LEVEL": "debug",
                                          "TANDEM_TLS_REFRESH_S": "2"}
    # The warm start shortened to seconds (its defaults train ~2-5 minutes):
    # this test checks that the stack runs it first and starts from its
    # checkpoint, not how well it learns (README: the full stack by hand).
    services["warm-start"] = {"volumes": mounts}
    if warm_start_steps is not None:
        services["warm-start"]["command"] = [
            "tandem-trainer", "sft", "--output",
            "/var/lib/tandem/warm-start/arith3-add", "--steps",
            str(warm_start_steps), "--eval-every", str(warm_start_steps),
            "--eval-problems", "64"]
    with open(stack.override, "w") as f:
        json.dump({"services": services}, f, indent=1)  # JSON is YAML


def check_workers(stack, want, at_least_version):
    """`want` rollout containers, each ALIVE in the coordinator's membership
    and holding at least `at_least_version`."""
    workers = stack.containers("rollout")
    if len(workers) != want:
        return False
    addresses = {f"{stack.address(n)}:{GRPC_PORTS['rollout']}" for n, _ in workers}
    alive = {m.get("grpcAddress") for m in status().get("members", [])
             if m.get("role") == "ROLE_ROLLOUT"
             and m.get("state") == "MEMBER_STATE_ALIVE"}
    if addresses != alive:
        return False
    return all(int(tandemctl("worker", "status", "--address", a).get(
        "receivedPolicyVersion", 0)) >= at_least_version for a in addresses)


def scenario(stack, tmp, counts):
    log("docker-compose up -d --scale rollout=2")
    stack.start_healthchecks()
    services = ["certs", "warm-start", "coordinator", "trainer", "verifier",
                "rollout", "prometheus"]
    stack.compose("up", "-d", "--scale", "rollout=2", *services, timeout=600)
    log("up returned (coordinator healthy: depends_on service_healthy)")
    ADMIN_TLS.update(admin_tls())

    for service, port in GRPC_PORTS.items():
        for name, _ in stack.containers(service):
            address = f"{stack.address(name)}:{port}"
            wait_for(lambda: grpc_health(address), 60,
                     f"{name} ({address}) SERVING to grpc.health.v1 "
                     "over mTLS")
            try:
                grpc_health(address, tls=False)
                plaintext = "served"
            except Exception:  # grpc.RpcError: the handshake fails
                plaintext = "refused"
            if plaintext != "refused":
                raise AssertionError(f"{name} ({address}) served a "
                                     "plaintext health check")
    inside = stack.compose("exec", "-T", "coordinator", "tandemctl", "status",
                           "--coordinator", "coordinator:50051", "--json")
    log("tandemctl status inside the coordinator's container (its own "
        f"certificate): policy version "
        f"{json.loads(inside.stdout).get('policyVersion', 0)}")
    # Roles in containers: a worker's Pause needs the admin role. The
    # coordinator's certificate is refused; the `admin` service's (profile
    # tools, `docker-compose run --rm admin ...`) pauses and resumes it.
    worker = f"{stack.address(stack.containers('rollout')[0][0])}:" \
             f"{GRPC_PORTS['rollout']}"
    refused = stack.compose("exec", "-T", "coordinator", "tandemctl",
                            "worker", "pause", "--address", worker,
                            check=False)
    if refused.returncode == 0 or "Pause needs the admin role" not in (
            refused.stdout + refused.stderr):
        raise AssertionError("a worker's Pause with the coordinator's "
                             f"certificate was not refused: exit "
                             f"{refused.returncode} {refused.stderr[-500:]}")
    for action in ("pause", "resume"):
        stack.compose("run", "--rm", "admin", "worker", action, "--address",
                      worker, timeout=120)
    log(f"worker {worker}: Pause with the coordinator's certificate refused "
        "(needs the admin role); paused and resumed by the admin service")
    wait_for(lambda: all(
        run("podman", "inspect", "-f", "{{.State.Health.Status}}", n,
            check=False).stdout.strip() == "healthy"
        for n, _ in stack.containers()), 90, "every container healthy")
    log(f"every daemon SERVING (grpc.health.v1 over mTLS; plaintext "
        f"refused); {len(stack.containers())} containers healthy")

    v0 = wait_for(version, 180, "a first policy version")
    wait_for(lambda: version() >= v0 + 2, 180, "the policy version to advance")
    log(f"policy version advances: {v0} -> {version()}")

    # Rotation: the certs service run again issues new certificates of the
    # same CA into the volumes; running daemons present them to new
    # connections (TANDEM_TLS_REFRESH_S=2 here) with no restart.
    rotated = {name: f"{stack.address(name)}:{GRPC_PORTS[service]}"
               for service in ("coordinator", "rollout")
               for name, _ in stack.containers(service)[:1]}
    before = {name: peer_serial(a) for name, a in rotated.items()}
    stack.compose("run", "--rm", "certs", timeout=120)
    for name, address in rotated.items():
        wait_for(lambda: peer_serial(address) != before[name], 30,
                 f"{name} to present its new certificate")
    v = version()
    wait_for(lambda: version() >= v + 2, 120,
             "the policy version to advance after the rotation")
    log(f"certificates rotated (`docker-compose run --rm certs`): "
        f"{', '.join(rotated)} present new ones; version {v} -> {version()}")

    # --no-deps: the warm start (done) is not run again.
    stack.compose("up", "-d", "--no-deps", "--no-recreate", "--scale",
                  "rollout=4", "rollout")
    started = time.monotonic()
    v = version()
    wait_for(lambda: check_workers(stack, 4, v), 120,
             "4 rollout workers ALIVE holding the latest version")
    epoch = status().get("membershipEpoch")
    log(f"scaled to 4: new workers ALIVE in epoch {epoch} and hold version "
        f">= {v} after {time.monotonic() - started:.1f} s")

    victim = stack.containers("rollout")[-1][0]
    # `docker kill`: the Docker API's kill (SIGKILL) on Podman's socket.
    run("curl", "-sf", "--unix-socket", SOCKET, "-X", "POST",
        f"http://d/v1.40/containers/{victim}/kill?signal=KILL")
    v = version()
    wait_for(lambda: version() >= v + 2, 120,
             f"the policy version to advance after killing {victim}")
    log(f"killed {victim}: version {v} -> {version()}")

    stack.compose("up", "-d", "--no-deps", "--no-recreate", "--scale",
                  "rollout=1", "rollout", timeout=300)
    v = version()
    wait_for(lambda: check_workers(stack, 1, v), 120,
             "1 rollout worker ALIVE holding the latest version")
    wait_for(lambda: version() >= v + 2, 120,
             "the policy version to advance with 1 worker")
    left = collections.Counter(
        m.get("state") for m in status().get("members", [])
        if m.get("role") == "ROLE_ROLLOUT")
    log(f"scaled to 1: rollout members by state {dict(left)}; version "
        f"{v} -> {version()}")

    # Prometheus through the compose network (DNS service discovery).
    def scraped():
        up = prometheus("up")
        jobs = collections.Counter(r["metric"]["job"] for r in up
                                   if r["value"][1] == "1")
        return jobs if all(jobs.get(f"tandem-{s}", 0) >= 1 for s in
                           ("coordinator", "trainer", "verifier",
                            "rollout")) else None
    jobs = wait_for(scraped, 90, "Prometheus scraping every daemon", 3)
    log(f"Prometheus targets up by job: {dict(jobs)}")
    # DNS discovery drops the removed and the killed workers' targets (no
    # up == 0 is left behind: why TandemDaemonDown cannot fire here).
    t = time.monotonic()
    wait_for(lambda: [r["value"][1] for r in prometheus(
        'up{job="tandem-rollout"}')] == ["1"], 60,
        "Prometheus to scrape exactly the 1 remaining rollout worker", 2)
    log(f"Prometheus: 1 rollout target left, no up == 0, "
        f"{time.monotonic() - t:.0f} s after the first check")
    for expr in ("sum(rate(tandem_coordinator_trained_staleness_versions_count[1m]))",
                 "histogram_quantile(0.9, sum by (le) (rate("
                 "tandem_trainer_staleness_versions_bucket[1m])))",
                 "max(tandem_trainer_tokens_per_second)",
                 "sum(rate(tandem_rollout_generated_tokens_total[1m]))",
                 "sum(rate(tandem_trainer_trained_tokens_total[1m]))"):
        result = wait_for(lambda: prometheus(expr), 60, f"data for {expr}", 3)
        log(f"prometheus {expr} = {float(result[0]['value'][1]):.3g}")

    # Issue 24 saw Prometheus's DNS discovery fail for ~25 s at start.
    prom = stack.containers("prometheus")[0][0]
    out = run("podman", "logs", prom)
    dns = [line for line in (out.stdout + out.stderr).splitlines()
           if "DNS resolution failed" in line]
    log(f"Prometheus logged {len(dns)} DNS resolution failures"
        + (f", the last: {dns[-1][:200]}" if dns else ""))

    # Counts.
    # The trainer frozen (as test_chaos.py's SIGSTOP) while the status and
    # its log are read, so that both describe the same versions.
    trainer = stack.containers("trainer")[0][0]
    run("podman", "pause", trainer)
    try:
        s = status()
        out = run("podman", "logs", trainer)
        trainer_log = out.stdout + out.stderr
    finally:
        run("podman", "unpause", trainer)
    c = counters(s)
    at = int(s.get("policyVersion", 0))
    steps = [(int(m.group(1)), m.group(3).split(",") if m.group(3) else [])
             for m in STEP.finditer(trainer_log)]
    lineage = [g for v, gs in steps if v <= at for g in gs]
    twice = [g for g, k in collections.Counter(lineage).items() if k > 1]
    queues = s.get("queues", {})
    queued = sum(int(queues.get(q, 0)) for q in ("readyGroups", "trainingGroups"))
    counts.update(lost=c["groupsLost"], twice=len(twice))
    log(f"counters at version {at}: {c}; queued {queued}; "
        f"{len(steps)} trainer steps naming {len(lineage)} groups")
    print(f"groups lost {c['groupsLost']}, groups trained twice {len(twice)}",
          flush=True)
    problems = []
    if f"policy: {WARM_START}" not in trainer_log and \
            WARM_START not in trainer_log.split("stepped to version")[0]:
        problems.append(f"the trainer did not start from {WARM_START}")
    if not steps:
        problems.append("no step lines in the trainer's log")
    if c["groupsLost"] or twice:
        problems.append(f"groups lost {c['groupsLost']}, trained twice {twice}")
    if len(lineage) != c["groupsTrained"] - c["groupsRequeued"] - c["groupsLost"]:
        problems.append(f"the trainer's steps name {len(lineage)} groups; "
                        f"counters {c}")
    if c["groupsCompleted"] + c["groupsRequeued"] != \
            c["groupsTrained"] + c["groupsDroppedStale"] + queued:
        problems.append(f"groups in != groups out: {c}, queues {queues}")
    if problems:
        raise AssertionError("; ".join(problems))


def remove_leftovers():
    """Removes the project's containers, networks and volumes (and any
    pod); returns what it found, one line per kind."""
    found = []
    label = f"label=com.docker.compose.project={PROJECT}"
    left = run("podman", "ps", "-aq", "--filter", label, check=False).stdout.split()
    if left:
        found.append(f"containers left: {left}")
        run("podman", "rm", "-f", *left, check=False)
    pods = run("podman", "pod", "ps", "-q", check=False).stdout.split()
    if pods:
        found.append(f"pods left: {pods}")
    nets = [n for n in run("podman", "network", "ls", "--format", "{{.Name}}",
                           check=False).stdout.split() if n.startswith(PROJECT)]
    if nets:
        found.append(f"networks left: {nets}")
        run("podman", "network", "rm", "-f", *nets, check=False)
    vols = [v for v in run("podman", "volume", "ls", "--format", "{{.Name}}",
                           check=False).stdout.split() if v.startswith(PROJECT)]
    if vols:
        found.append(f"volumes left: {vols}")
        run("podman", "volume", "rm", "-f", *vols, check=False)
    return found


def teardown(stack, service_pid):
    """Everything the test started goes, whatever happened."""
    failures = []
    try:
        out = stack.compose("down", "-v", "--remove-orphans", timeout=300,
                            check=False)
        log(f"docker-compose down -v: exit {out.returncode}")
        if out.returncode != 0:
            failures.append(f"down exited {out.returncode}: {out.stderr[-1000:]}")
    finally:
        stack.stop_healthchecks()
    failures += remove_leftovers()
    if service_pid:
        try:
            os.kill(service_pid, 15)
            wait_for(lambda: not os.path.exists(f"/proc/{service_pid}"), 20,
                     "the API service to stop", 0.2)
        except ProcessLookupError:
            pass
        for path in (SOCKET, "/run/podman/tandem-service.pid"):
            if os.path.exists(path):
                os.unlink(path)
        log("API socket stopped")
    return failures


def print_logs(stack):
    for name, _ in stack.containers():
        out = run("podman", "logs", "--tail", "30", name, check=False)
        print(f"==== {name} (last 30 lines)\n{out.stdout}{out.stderr}",
              flush=True)


def main(run=None, warm_start_steps=SFT_STEPS):
    """The fixture around a scenario: `run(stack, tmp)` (default: this
    test's scenario) with the warm start cut to warm_start_steps (None: the
    compose file's own; test_compose_learns.py)."""
    reason = skip_reason((("podman", "podman"), ("runc", "runc"),
                          ("debootstrap", "debootstrap"),
                          ("docker-compose", "docker-compose"),
                          ("curl", "curl")))
    if reason:
        print(f"SKIP: {reason}")
        return SKIP
    tmp = tempfile.mkdtemp(prefix="tandem-compose-")
    image = os.environ.get("TANDEM_COMPOSE_IMAGE") or IMAGE
    stack = Stack(tmp, image)
    counts = {}
    service = {"pid": None}
    run = run or (lambda stack, tmp: scenario(stack, tmp, counts))

    def body():
        service["pid"] = setup()
        # A run killed by ctest's timeout could not tear down.
        for line in remove_leftovers():
            log(f"removed from an earlier run: {line}")
        log("podman ready")
        write_override(stack, warm_start_steps)
        build_images(tmp, image == IMAGE)
        run(stack, tmp)

    def cleanup():
        leftovers = teardown(stack, service["pid"])
        shutil.rmtree(tmp, ignore_errors=True)
        return leftovers

    return podman_fixture.run_scenario(body, lambda: print_logs(stack),
                                       cleanup)


if __name__ == "__main__":
    sys.exit(main())
