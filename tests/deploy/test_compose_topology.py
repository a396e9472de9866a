"""The compose topology as local processes: the services of
deploy/compose/docker-compose.yml (coordinator, trainer, verifier, and the
rollout service scaled to two replicas as `--scale rollout=2` would) run as
real binaries from $TANDEM_BIN_DIR on loopback, with the compose file's
commands, its TANDEM_* environment (addresses rewritten to loopback, data
directories to a temporary directory) and the very config files it mounts
from deploy/compose/config/. Each daemon gets a loopback address of its own
(127.a.b.N, like a container or pod IP) with metrics on port 9400. A real
Prometheus scrapes them with the jobs of deploy/prometheus/prometheus.yml
and the rules of deploy/prometheus/rules/ loaded; a second one runs
deploy/prometheus/prometheus-kubernetes.yml on the pod labels and
annotations of the cpu overlay. TLS as compose runs it: the `certs`
service's own script (paths rewritten to the temporary directory) issues
the certificates, each daemon gets its role's files where compose mounts
them, and the daemons run with compose's TANDEM_TLS_* (mutual TLS unless
TANDEM_TLS_MODE=off is in this test's environment, as for compose). The
test checks:

- every daemon is SERVING to an independent gRPC client and to the image's
  health probe (docker/tandem-health, the compose healthcheck command),
  over mTLS with the daemon's own certificate; a client without a
  certificate is refused; /metrics stays plain HTTP;
- the Kubernetes scrape config relabels the pods into the same jobs, with
  namespace and pod labels;
- every rule group loads and evaluates without error, and every recording
  rule returns data;
- every query of every panel of the Grafana dashboard returns data;
- killing a rollout worker puts TandemDaemonDown in pending and, once the
  coordinator declares it dead (heartbeat timeout of the compose config),
  fires TandemMembersExpired;
- SIGTERM stops every daemon cleanly (exit 0)."""

import json
import math
import os
import random
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
import unittest
import urllib.parse
import urllib.request

import yaml

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
sys.path.insert(0, os.path.join(HERE, "..", "integration"))
import common  # noqa: E402
import harness  # noqa: E402

from importlib.machinery import SourceFileLoader  # noqa: E402
# The image's health probe, whose channel set-up (TANDEM_TLS_*) the test's
# own clients share.
health_probe = SourceFileLoader(
    "tandem_health", os.path.join(common.DOCKER_DIR, "tandem-health")
).load_module()
TLS_MOUNT = "/etc/tandem-tls"
COMPOSE_VARIABLE = re.compile(r"\$\{(\w+):-([^}]*)\}")


def interpolate(value):
    """${NAME:-default} as docker-compose reads it, from this environment."""
    return COMPOSE_VARIABLE.sub(
        lambda m: os.environ.get(m.group(1)) or m.group(2), str(value))

ROLLOUT_REPLICAS = 2
# Grafana's interval variables, replaced the way Grafana would for a short
# dashboard range with a 1 s scrape interval.
GRAFANA_VARIABLES = {"$__rate_interval": "20s", "$__interval": "2s",
                     "$__range": "1m", "${datasource}": ""}


def generate_stubs(out_dir):
    os.makedirs(out_dir, exist_ok=True)
    proto_root = os.path.join(common.REPO, "proto")
    files = [os.path.join(proto_root, "tandem", "v1", name)
             for name in ("common.proto", "verifier.proto")]
    subprocess.run(["protoc", f"--proto_path={proto_root}",
                    f"--python_out={out_dir}", *files], check=True)
    sys.path.insert(0, out_dir)


class Daemon:
    """One compose service replica as a local process."""

    def __init__(self, service, replica, spec, work_dir, coordinator_address,
                 host, volumes):
        self.name = service if replica is None else f"{service}-{replica}"
        self.service = service
        # Like a container or pod IP: a loopback address of its own, so
        # every daemon serves metrics on port 9400 as in the compose file
        # and the manifests.
        self.host = host
        self.dir = os.path.join(work_dir, self.name)
        os.makedirs(self.dir)
        command = list(spec["command"])
        mounts = {}
        for v in spec.get("volumes", []):
            source, target = v.split(":")[:2]
            mounts[target] = source
        # --config /etc/tandem/x.yaml -> the file compose mounts there.
        i = command.index("--config")
        mounted = mounts[command[i + 1]]
        command[i + 1] = os.path.normpath(
            os.path.join(common.COMPOSE_DIR, mounted))
        self.config = command[i + 1]
        command[0] = harness.binary(command[0])
        env = {k: v for k, v in os.environ.items()
               if not k.startswith("TANDEM_")}
        for key, value in spec.get("environment", {}).items():
            value = str(value)
            if key == "TANDEM_GRPC_ADDRESS":
                value = f"{host}:0"
            elif key == "TANDEM_METRICS_ADDRESS":
                self.metrics_port = int(value.rsplit(":", 1)[1])
                value = f"{host}:{self.metrics_port}"
            elif key == "TANDEM_COORDINATOR_ADDRESS":
                value = coordinator_address
            elif key == "TANDEM_READY_FILE":
                value = os.path.join(self.dir, "ready.json")
            elif key == "TANDEM_MODEL_PATH":
                # The compose warm-start service's checkpoint: this test
                # starts from the built-in model's random weights instead.
                continue
            elif value.startswith(TLS_MOUNT + "/"):
                # The role's certificate volume, as the certs service
                # filled it.
                value = os.path.join(volumes[mounts[TLS_MOUNT]],
                                     os.path.basename(value))
            elif key == "TANDEM_TLS_MODE":
                value = interpolate(value)
            elif value.startswith("/var/lib/tandem/"):
                value = os.path.join(self.dir, os.path.basename(value))
                os.makedirs(value, exist_ok=True)
            env[key] = value
        self.ready_file = env["TANDEM_READY_FILE"]
        self.env = env
        self.tls = health_probe.tls_settings(env)
        self.log_path = os.path.join(self.dir, "log")
        self.log = open(self.log_path, "w")
        self.process = subprocess.Popen(command, env=env, stdout=self.log,
                                        stderr=subprocess.STDOUT)

    def wait_ready(self, timeout=60):
        def ready():
            if self.process.poll() is not None:
                raise AssertionError(
                    f"{self.name} exited {self.process.returncode}:\n"
                    f"{self.output()}")
            return harness.read_json(self.ready_file)
        self.info = harness.wait_for(ready, timeout, f"{self.name} ready file")
        return self.info

    def output(self):
        self.log.flush()
        with open(self.log_path) as f:
            return f.read()

    def stop(self, sig=signal.SIGTERM, timeout=30):
        code = harness.stop_process(self.process, sig, timeout)
        self.log.close()
        return code


def run_certs_service(spec, work_dir):
    """Runs the compose `certs` service's script on this machine, with its
    volumes' mount points (all under /var/lib/tandem/) moved under
    work_dir/root; returns {volume: directory}."""
    command = spec["command"]
    assert command[:2] == ["sh", "-euc"], command
    root = os.path.join(work_dir, "root")
    script = command[2].replace("$$", "$").replace(
        "/var/lib/tandem/", f"{root}/var/lib/tandem/")
    volumes = {}
    for v in spec["volumes"]:
        source, target = v.split(":")[:2]
        assert target.startswith("/var/lib/tandem/"), target
        volumes[source] = root + target
        os.makedirs(volumes[source])
    if os.getuid() != 0:  # only root can hand files to the image's user
        script = script.replace(" -o 10001 -g 10001", "")
    env = dict(os.environ, PATH=f"{harness.BIN_DIR}:{os.environ['PATH']}")
    env.update({k: interpolate(v)
                for k, v in spec.get("environment", {}).items()})
    r = subprocess.run(["sh", "-euc", script], env=env, capture_output=True,
                       text=True, timeout=60)
    if r.returncode != 0:
        raise AssertionError(f"certs service: exit {r.returncode}\n"
                             f"{r.stdout}{r.stderr}")
    return volumes


class Prometheus:
    """A real Prometheus on loopback with the given configuration."""

    def __init__(self, directory, config):
        self.dir = directory
        os.makedirs(self.dir)
        self.config_path = os.path.join(self.dir, "prometheus.yml")
        with open(self.config_path, "w") as f:
            yaml.safe_dump(config, f)
        prometheus = shutil.which("prometheus")
        if prometheus is None:
            raise RuntimeError("prometheus not installed (Debian 'prometheus')")
        check = subprocess.run(["promtool", "check", "config",
                                self.config_path], capture_output=True,
                               text=True)
        if check.returncode != 0:
            raise RuntimeError(check.stdout + check.stderr)
        self.port = harness.free_port()
        self.log = open(os.path.join(self.dir, "log"), "w")
        self.process = subprocess.Popen(
            [prometheus, f"--config.file={self.config_path}",
             f"--storage.tsdb.path={self.dir}/data",
             f"--web.listen-address=127.0.0.1:{self.port}"],
            stdout=self.log, stderr=subprocess.STDOUT)

    def api(self, path, **params):
        url = f"http://127.0.0.1:{self.port}/api/v1/{path}"
        if params:
            url += "?" + urllib.parse.urlencode(params)
        try:
            with urllib.request.urlopen(url, timeout=3) as r:
                body = json.load(r)
        except OSError:
            return None
        return body["data"] if body.get("status") == "success" else None

    def query(self, expr):
        data = self.api("query", query=expr)
        return None if data is None else data["result"]

    def stop(self):
        self.process.terminate()
        try:
            self.process.wait(timeout=10)
        except subprocess.TimeoutExpired:
            self.process.kill()
        self.log.close()


FAST = {"scrape_interval": "1s", "scrape_timeout": "1s",
        "evaluation_interval": "1s"}
RULES = [os.path.join(common.PROM_DIR, "rules", "*.yml")]


def compose_prometheus_config(daemons):
    """deploy/prometheus/prometheus.yml with its Docker DNS discovery
    replaced by the daemons' addresses: same jobs, same rules."""
    with open(os.path.join(common.PROM_DIR, "prometheus.yml")) as f:
        config = yaml.safe_load(f)
    config["global"].update(FAST)
    config["rule_files"] = RULES
    jobs = []
    for job in config["scrape_configs"]:
        if not job["job_name"].startswith("tandem-"):
            continue
        sd = job.pop("dns_sd_configs")[0]
        job["static_configs"] = [{"targets": [
            f"{d.host}:{sd['port']}" for d in daemons
            if d.service in sd["names"]]}]
        jobs.append(job)
    config["scrape_configs"] = jobs
    return config


def meta_name(key):
    return re.sub(r"[^a-zA-Z0-9_]", "_", key)


def kubernetes_prometheus_config(daemons):
    """deploy/prometheus/prometheus-kubernetes.yml with its pod discovery
    replaced by what Kubernetes would discover for the cpu overlay's pods
    (their labels and annotations from `kubectl kustomize`, each daemon's
    loopback address as pod IP, the gRPC container port), so the
    relabelling as written decides what is scraped and under which job."""
    kubectl = common.need("kubectl", "kubectl")
    objects = [o for o in yaml.safe_load_all(common.run(
        [kubectl, "kustomize",
         os.path.join(common.K8S_DIR, "overlays", "cpu")])) if o]
    templates = {}
    for o in objects:
        if o["kind"] in ("Deployment", "StatefulSet"):
            templates[o["metadata"]["name"]] = (o["metadata"]["namespace"],
                                                o["spec"]["template"])
    with open(os.path.join(common.PROM_DIR,
                           "prometheus-kubernetes.yml")) as f:
        config = yaml.safe_load(f)
    config["global"].update(FAST)
    config["rule_files"] = RULES
    for job in config["scrape_configs"]:
        job.pop("kubernetes_sd_configs")
        job["static_configs"] = []
        for d in daemons:
            namespace, template = templates[d.service]
            labels = {"__meta_kubernetes_namespace": namespace,
                      "__meta_kubernetes_pod_name": f"{d.name}-pod",
                      "__meta_kubernetes_pod_phase": "Running"}
            for k, v in template["metadata"]["labels"].items():
                labels["__meta_kubernetes_pod_label_" + meta_name(k)] = v
            for k, v in template["metadata"].get("annotations", {}).items():
                labels["__meta_kubernetes_pod_annotation_" + meta_name(k)] = v
            port = template["spec"]["containers"][0]["ports"][0]
            job["static_configs"].append({
                "targets": [f"{d.host}:{port['containerPort']}"],
                "labels": labels})
    return config


def has_finite_value(result):
    for series in result or []:
        values = [series["value"]] if "value" in series else series["values"]
        if any(math.isfinite(float(v[1])) for v in values):
            return True
    return False


class ScoringLoad:
    """Keeps the verifier busy with `arith` items, right and wrong, so its
    request counters and scoring histogram move."""

    def __init__(self, address, stub_dir, tls):
        generate_stubs(stub_dir)
        from tandem.v1 import verifier_pb2 as vpb
        self.vpb = vpb
        # With mTLS only the coordinator's certificate may call ScoreBatch.
        self.channel = health_probe.open_channel(address, tls)
        self.rpc = self.channel.unary_unary(
            "/tandem.v1.Verifier/ScoreBatch",
            request_serializer=lambda m: m.SerializeToString(),
            response_deserializer=vpb.ScoreBatchResponse.FromString)
        self.scored = 0
        self.stop_event = threading.Event()
        self.thread = threading.Thread(target=self._run, daemon=True)
        self.thread.start()

    def _run(self):
        n = 0
        while not self.stop_event.wait(0.2):
            items = []
            for k in range(4):
                n += 1
                answer = n + k
                got = answer if k % 2 == 0 else answer + 1
                items.append(self.vpb.ScoreItem(
                    item_id=f"i{n}-{k}", verifier="arith",
                    prompt_text=f"{n}+{k}=", completion_text=f"{got}",
                    metadata={"answer": str(answer)}))
            try:
                response = self.rpc(self.vpb.ScoreBatchRequest(items=items),
                                    timeout=5)
                self.scored += len(response.results)
            except Exception:  # the verifier may be stopping
                pass

    def stop(self):
        self.stop_event.set()
        self.thread.join()
        self.channel.close()


class ComposeTopologyTest(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        with open(os.path.join(common.COMPOSE_DIR, "docker-compose.yml")) as f:
            compose = yaml.safe_load(f)
        cls.services = compose["services"]
        cls.work = tempfile.mkdtemp(prefix="tandem-deploy-it-")
        cls.daemons = []
        cls.prometheus = None
        cls.k8s_prometheus = None
        cls.load = None
        # A random 127.a.b.0/24 for the daemons' "pod IPs".
        net = f"127.{random.randint(1, 254)}.{random.randint(1, 254)}"
        hosts = (f"{net}.{i}" for i in range(2, 250))
        try:
            cls.volumes = run_certs_service(cls.services["certs"], cls.work)
            coordinator = Daemon("coordinator", None,
                                 cls.services["coordinator"], cls.work, "",
                                 next(hosts), cls.volumes)
            cls.daemons.append(coordinator)
            address = coordinator.wait_ready()["grpc_address"]
            for service, replicas in (("trainer", None), ("verifier", None),
                                      ("rollout", ROLLOUT_REPLICAS)):
                for r in ([None] if replicas is None else range(replicas)):
                    cls.daemons.append(Daemon(service, r,
                                              cls.services[service],
                                              cls.work, address, next(hosts),
                                              cls.volumes))
            for d in cls.daemons:
                d.wait_ready()
            cls.prometheus = Prometheus(
                os.path.join(cls.work, "prometheus"),
                compose_prometheus_config(cls.daemons))
            cls.k8s_prometheus = Prometheus(
                os.path.join(cls.work, "prometheus-k8s"),
                kubernetes_prometheus_config(cls.daemons))
            verifier = cls.daemon("verifier")
            cls.load = ScoringLoad(verifier.info["grpc_address"],
                                   os.path.join(cls.work, "stubs"),
                                   coordinator.tls)
        except BaseException:
            cls.tearDownClass()
            raise

    @classmethod
    def tearDownClass(cls):
        if cls.load:
            cls.load.stop()
        for p in (cls.prometheus, cls.k8s_prometheus):
            if p:
                p.stop()
        cls.codes = {}
        for d in reversed(cls.daemons):
            cls.codes[d.name] = d.stop()
        if os.environ.get("TANDEM_KEEP_TEST_DIR"):
            print(f"kept {cls.work}")
        else:
            shutil.rmtree(cls.work, ignore_errors=True)

    @classmethod
    def daemon(cls, name):
        return next(d for d in cls.daemons if d.name == name)

    def test_1_every_daemon_serves_health(self):
        probe = os.path.join(common.DOCKER_DIR, "tandem-health")
        for d in self.daemons:
            address = d.info["grpc_address"]
            if d.tls is None:
                self.assertEqual(
                    harness.wait_for(lambda: harness.health_check(address) ==
                                     "SERVING", 20, f"{d.name} SERVING"),
                    True)
            else:
                # The plaintext client of the other branch is refused...
                with self.assertRaises(Exception, msg=d.name):
                    harness.health_check(address, timeout=1)
                # ...and a TLS client with the certificate of another
                # role's volume (each holds the same CA) is served.
                other = dict(d.env, TANDEM_TLS_CERT=os.path.join(
                    self.volumes["certs-admin"], "tls.crt"),
                    TANDEM_TLS_KEY=os.path.join(
                        self.volumes["certs-admin"], "tls.key"))
                self.assertEqual(health_probe.check(
                    address, "", 2.0, health_probe.tls_settings(other)),
                    "SERVING", d.name)
            # The compose healthcheck: tandem-health finds the address in
            # the ready file named by TANDEM_READY_FILE, and its TLS files
            # in the container's TANDEM_TLS_* (the daemon's own).
            tls_env = {k: v for k, v in d.env.items()
                       if k.startswith("TANDEM_TLS_")}
            r = subprocess.run([sys.executable, probe],
                               env=dict(os.environ, **tls_env,
                                        TANDEM_READY_FILE=d.ready_file),
                               capture_output=True, text=True)
            self.assertEqual(r.returncode, 0, f"{d.name}: {r.stderr}")
            # Each daemon runs the compose config file it mounts.
            self.assertTrue(d.config.startswith(common.CONFIG_DIR), d.config)
        # The probe fails on a port where nothing serves health.
        r = subprocess.run([sys.executable, probe,
                            f"127.0.0.1:{harness.free_port()}",
                            "--timeout", "0.5"], capture_output=True)
        self.assertEqual(r.returncode, 1)

    def test_2_prometheus_scrapes_every_daemon(self):
        expected = 3 + ROLLOUT_REPLICAS

        def all_up():
            result = self.prometheus.query('up{job=~"tandem-.*"}')
            if not result or len(result) != expected:
                return False
            return all(s["value"][1] == "1" for s in result)
        harness.wait_for(all_up, 60, "every daemon scraped", interval=0.5)

    def test_2b_kubernetes_scrape_config_relabels_the_pods(self):
        """prometheus-kubernetes.yml on the cpu overlay's pod labels and
        annotations: every pod scraped on its annotated port under job
        tandem-<component>, with namespace and pod labels (for
        prometheus-adapter), and the same rules evaluate."""
        expected = {f"tandem-{d.service}" for d in self.daemons}

        def all_up():
            result = self.k8s_prometheus.query('up{job=~"tandem-.*"}')
            if not result or len(result) != len(self.daemons):
                return None
            if not all(s["value"][1] == "1" for s in result):
                return None
            return result
        result = harness.wait_for(all_up, 60, "every pod scraped",
                                  interval=0.5)
        self.assertEqual({s["metric"]["job"] for s in result}, expected)
        for s in result:
            self.assertEqual(s["metric"]["namespace"], "tandem")
            self.assertTrue(s["metric"]["pod"].endswith("-pod"))
            self.assertEqual(s["metric"]["instance"], s["metric"]["pod"])
        # One lag series per rollout pod (the rule may first be evaluated
        # before every pod's first scrape).
        harness.wait_for(
            lambda: len(self.k8s_prometheus.query(
                "tandem:rollout_policy_version_lag") or []) ==
            ROLLOUT_REPLICAS, 30,
            "rollout lag recorded for every pod", interval=0.5)
        data = self.k8s_prometheus.api("rules")
        for g in data["groups"]:
            for r in g["rules"]:
                self.assertEqual(r["health"], "ok", r["name"])
        # Each prometheus-adapter rule's query (what the adapter sends for
        # an HPA's metric, its templates filled for this namespace) selects
        # series of the scraped pods.
        with open(os.path.join(common.REPO, "deploy", "k8s", "components",
                               "autoscaling",
                               "prometheus-adapter-rules.yaml")) as f:
            adapter = yaml.safe_load(yaml.safe_load(f)["data"]["config.yaml"])
        for rule in adapter["rules"]:
            series = rule["seriesQuery"].strip("'").split("{")[0]
            query = (rule["metricsQuery"].replace("<<.Series>>", series)
                     .replace("<<.LabelMatchers>>", 'namespace="tandem"')
                     .replace("<<.GroupBy>>", "pod"))
            result = harness.wait_for(
                lambda: self.k8s_prometheus.query(query), 60,
                f"prometheus-adapter query {query}", interval=1)
            self.assertTrue(all(s["metric"].get("pod") for s in result),
                            result)

    def test_3_rules_load_and_evaluate(self):
        with open(os.path.join(common.PROM_DIR, "rules",
                               "tandem.rules.yml")) as f:
            defined = yaml.safe_load(f)["groups"]

        def evaluated():
            data = self.prometheus.api("rules")
            if not data:
                return None
            groups = {g["name"]: g for g in data["groups"]}
            if set(groups) != {g["name"] for g in defined}:
                return None
            rules = [r for g in groups.values() for r in g["rules"]]
            if any(r.get("lastEvaluation", "").startswith("0001") or
                   "lastEvaluation" not in r for r in rules):
                return None
            return rules
        rules = harness.wait_for(evaluated, 30, "rules evaluated",
                                 interval=0.5)
        self.assertEqual(len(rules), sum(len(g["rules"]) for g in defined))
        for r in rules:
            self.assertEqual(r["health"], "ok", f"{r['name']}: "
                             f"{r.get('lastError')}")
        recording = [r["name"] for r in rules if r["type"] == "recording"]
        missing = []

        def all_recorded():
            missing[:] = [n for n in recording
                          if not has_finite_value(self.prometheus.query(n))]
            return not missing
        try:
            harness.wait_for(all_recorded, 60, "recording rules with data",
                             interval=1)
        except AssertionError:
            self.fail(f"recording rules without data: {missing}")

    def test_4_every_dashboard_query_returns_data(self):
        with open(os.path.join(common.GRAFANA_DIR, "dashboards",
                               "tandem.json")) as f:
            dashboard = json.load(f)
        queries = []
        for panel in dashboard["panels"]:
            for target in panel.get("targets", []):
                expr = target["expr"]
                for var, value in GRAFANA_VARIABLES.items():
                    expr = expr.replace(var, value)
                self.assertNotIn("$", expr, f"unknown variable in {expr}")
                queries.append((panel["title"], expr))
        self.assertGreater(len(queries), 0)
        missing = []

        def all_have_data():
            missing[:] = [(t, e) for t, e in queries
                          if not has_finite_value(self.prometheus.query(e))]
            return not missing
        try:
            harness.wait_for(all_have_data, 90, "dashboard data", interval=1)
        except AssertionError:
            self.fail("panels without data: " + "; ".join(
                f"{t}: {e}" for t, e in missing))
        self.assertGreater(self.load.scored, 0)

    def test_5_killed_worker_raises_alerts(self):
        victim = self.daemon("rollout-0")
        instance = victim.info["metrics_address"]
        victim.process.kill()
        victim.process.wait()

        def alert(name, state, **labels):
            matchers = "".join(f',{k}="{v}"' for k, v in labels.items())
            return self.prometheus.query(
                f'ALERTS{{alertname="{name}",alertstate="{state}"{matchers}}}')
        harness.wait_for(
            lambda: alert("TandemDaemonDown", "pending", instance=instance,
                          job="tandem-rollout"),
            30, "TandemDaemonDown pending for the killed worker", interval=0.5)
        # heartbeat_timeout_ms of deploy/compose/config/coordinator.yaml.
        with open(os.path.join(common.CONFIG_DIR, "coordinator.yaml")) as f:
            timeout_s = yaml.safe_load(f)["heartbeat_timeout_ms"] / 1000
        harness.wait_for(
            lambda: alert("TandemMembersExpired", "firing", role="rollout"),
            timeout_s + 30, "TandemMembersExpired firing", interval=0.5)
        self.assertIn("declared dead", self.daemon("coordinator").output())

    def test_6_sigterm_stops_every_daemon_cleanly(self):
        if self.load:
            self.load.stop()
            type(self).load = None
        members = [d for d in self.daemons
                   if d.service != "coordinator" and d.process.poll() is None]
        for d in members:
            d.process.send_signal(signal.SIGTERM)
        for d in members:
            self.assertEqual(d.process.wait(timeout=40), 0,
                             f"{d.name}:\n{d.output()[-2000:]}")
        coordinator = self.daemon("coordinator")
        coordinator.process.send_signal(signal.SIGTERM)
        self.assertEqual(coordinator.process.wait(timeout=40), 0)


if __name__ == "__main__":
    unittest.main(verbosity=2)
