"""deploy/compose: `docker-compose config -q` accepts the compose file, and
the resolved configuration keeps the promises of the deployment: four
daemons from one image plus Prometheus and Grafana, gRPC health checks,
rollout workers (and verifiers) scalable with --scale (no container name,
no host port), config files mounted from deploy/compose/config, TANDEM_*
variables that name real config keys, and a Prometheus config that scrapes
every daemon service under the job names the rules use. TLS: mutual TLS
unless TANDEM_TLS_MODE=off is set; the `certs` service fills one volume
per role and holds the only mount of the CA volume; each daemon mounts only
its own role's volume, read-only, where TANDEM_TLS_* point; metrics are
scraped in plain HTTP."""

import os
import sys

import yaml

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import common  # noqa: E402

COMPOSE_FILE = os.path.join(common.COMPOSE_DIR, "docker-compose.yml")
SCALABLE = ("rollout", "verifier")
TLS_MOUNT = "/etc/tandem-tls"
ROLES = common.DAEMONS + ("admin",)
TLS_ENV = {"TANDEM_TLS_MODE": "mtls",
           "TANDEM_TLS_CERT": f"{TLS_MOUNT}/tls.crt",
           "TANDEM_TLS_KEY": f"{TLS_MOUNT}/tls.key",
           "TANDEM_TLS_CA": f"{TLS_MOUNT}/ca.crt",
           "TANDEM_TLS_SERVER_NAME": "tandem"}


def volume_mounts(service):
    """{target: (source, read_only)} of a resolved service."""
    mounts = {}
    for v in service.get("volumes", []):
        if isinstance(v, str):
            parts = v.split(":")
            mounts[parts[1]] = (parts[0], parts[2:3] == ["ro"])
        else:
            mounts[v["target"]] = (v.get("source"), bool(v.get("read_only")))
    return mounts


def check_tls(services, fail):
    certs = services.get("certs")
    if not fail.check(certs is not None, "no certs service"):
        return
    command = " ".join(certs.get("command", []))
    fail.check("tandemctl certs init" in command,
               f"certs: does not run tandemctl certs init: {command}")
    fail.check(certs.get("restart") == "no", "certs: must run once per up")
    certs_mounts = {source for source, _ in volume_mounts(certs).values()}
    for role in ROLES:
        fail.check(f"certs-{role}" in certs_mounts,
                   f"certs: does not fill volume certs-{role}")
        fail.check("for role in" in command and f" {role}" in command,
                   f"certs: the script does not copy role {role}")
    for name, s in services.items():
        mounts = volume_mounts(s)
        sources = {source for source, _ in mounts.values()}
        if name == "certs":
            continue
        fail.check("tandem-ca" not in sources,
                   f"{name}: mounts the CA volume (only certs may)")
        if name not in ROLES:
            fail.check(not any(x.startswith("certs-") for x in sources),
                       f"{name}: mounts certificates")
            continue
        environment = s.get("environment", {})
        for var, value in TLS_ENV.items():
            fail.check(environment.get(var) == value,
                       f"{name}: {var}={environment.get(var)}, want {value}")
        fail.check(mounts.get(TLS_MOUNT) == (f"certs-{name}", True),
                   f"{name}: {TLS_MOUNT} is {mounts.get(TLS_MOUNT)}, want "
                   f"volume certs-{name} read-only")
        others = {x for x in sources if x.startswith("certs-")} - {
            f"certs-{name}"}
        fail.check(not others, f"{name}: mounts other roles' keys {others}")
    fail.check("certs" in services["coordinator"].get("depends_on", {}),
               "coordinator: does not wait for the certs service")


def main():
    fail = common.Failures()
    compose = common.need("docker-compose", "docker-compose")
    # The file as docker-compose validates it, with no variables set.
    env = {k: v for k, v in os.environ.items()
           if not k.startswith(("TANDEM_", "PROMETHEUS_", "GRAFANA_"))}
    common.run([compose, "-f", COMPOSE_FILE, "config", "-q"], env=env)
    resolved = yaml.safe_load(common.run(
        [compose, "-f", COMPOSE_FILE, "config"], env=env))
    services = resolved["services"]
    fail.check(set(services) == set(common.DAEMONS) |
               {"certs", "admin", "warm-start", "prometheus", "grafana"},
               f"services: {sorted(services)}")
    check_tls(services, fail)
    # Plaintext only when asked for.
    plain = yaml.safe_load(common.run(
        [compose, "-f", COMPOSE_FILE, "config"],
        env=dict(env, TANDEM_TLS_MODE="off")))["services"]
    for name in ROLES:
        fail.check(plain[name]["environment"].get("TANDEM_TLS_MODE") == "off",
                   f"{name}: TANDEM_TLS_MODE=off does not reach the daemon")
    keys = common.config_keys()
    images = set()

    for name in common.DAEMONS:
        s = services.get(name)
        if not fail.check(s is not None, f"no service {name}"):
            continue
        images.add(s.get("image"))
        fail.check(s.get("build", {}).get("dockerfile") == "docker/Dockerfile",
                   f"{name}: not built from docker/Dockerfile")
        context = s.get("build", {}).get("context", "")
        fail.check(os.path.realpath(context) == os.path.realpath(common.REPO),
                   f"{name}: build context {context} is not the repository")
        command = s.get("command", [])
        fail.check(command[:1] == [f"tandem-{name}"],
                   f"{name}: command {command}")
        config = command[command.index("--config") + 1] \
            if "--config" in command else None
        fail.check(config == f"/etc/tandem/{name}.yaml",
                   f"{name}: --config {config}")
        mounts = {}
        for v in s.get("volumes", []):
            if isinstance(v, str):
                parts = v.split(":")
                mounts[parts[1]] = parts[0]
            else:
                mounts[v["target"]] = v.get("source")
        source = mounts.get(f"/etc/tandem/{name}.yaml")
        fail.check(source and os.path.realpath(source) == os.path.realpath(
            os.path.join(common.CONFIG_DIR, f"{name}.yaml")),
            f"{name}: config not mounted from deploy/compose/config "
            f"({source})")
        hc = s.get("healthcheck", {})
        fail.check(hc.get("test") == ["CMD", "tandem-health"],
                   f"{name}: healthcheck {hc.get('test')}")
        environment = s.get("environment", {})
        for var in environment:
            if var.startswith("TANDEM_"):
                fail.check(common.env_to_key(var, keys) is not None,
                           f"{name}: {var} names no config key")
        fail.check(environment.get("TANDEM_METRICS_ADDRESS") == "0.0.0.0:9400",
                   f"{name}: metrics not on 0.0.0.0:9400")
        fail.check(environment.get("TANDEM_READY_FILE") ==
                   "/run/tandem/ready.json",
                   f"{name}: the health check reads /run/tandem/ready.json")
        if name != "coordinator":
            fail.check(environment.get("TANDEM_COORDINATOR_ADDRESS") ==
                       "coordinator:50051", f"{name}: coordinator address")
            fail.check(str(environment.get("TANDEM_GRPC_ADDRESS", ""))
                       .startswith("auto:"),
                       f"{name}: members must bind a routable address "
                       "(auto:PORT)")
            fail.check("coordinator" in s.get("depends_on", {}),
                       f"{name}: does not depend on the coordinator")
        if name in SCALABLE:
            fail.check("container_name" not in s,
                       f"{name}: a container_name prevents --scale")
            fail.check(not s.get("ports"),
                       f"{name}: host ports prevent --scale")
    fail.check(len(images) == 1, f"daemons use several images: {images}")
    fail.check("journal" in "".join(
        str(v) for v in services["coordinator"].get("volumes", [])),
        "coordinator: no journal volume")
    fail.check(services["coordinator"]["environment"].get(
        "TANDEM_JOURNAL_DIR") == "/var/lib/tandem/journal",
        "coordinator: TANDEM_JOURNAL_DIR")

    # Files mounted into Prometheus and Grafana exist.
    for name in ("prometheus", "grafana"):
        for v in services[name].get("volumes", []):
            source = v.split(":")[0] if isinstance(v, str) else v.get("source")
            if v.get("type") == "volume" if isinstance(v, dict) else False:
                continue
            if source and source.startswith("/"):
                fail.check(os.path.exists(source),
                           f"{name}: mounts missing {source}")

    # The compose Prometheus config scrapes every daemon service by DNS.
    with open(os.path.join(common.PROM_DIR, "prometheus.yml")) as f:
        prom = yaml.safe_load(f)
    jobs = {j["job_name"]: j for j in prom["scrape_configs"]}
    for name in common.DAEMONS:
        job = jobs.get(f"tandem-{name}")
        if fail.check(job is not None, f"prometheus.yml: no job tandem-{name}"):
            sd = job.get("dns_sd_configs", [{}])[0]
            fail.check(sd.get("names") == [name] and sd.get("port") == 9400,
                       f"prometheus.yml: tandem-{name} does not resolve "
                       f"service {name} on port 9400")
            fail.check(job.get("scheme", "http") == "http",
                       f"prometheus.yml: tandem-{name} scrapes "
                       f"{job.get('scheme')}; /metrics is plain HTTP")
    check_gpu_variant(compose, env, fail)
    fail.exit("compose")


def check_gpu_variant(compose, env, fail):
    """docker-compose.gpu.yml on top of the base file: the trainer and every
    rollout worker reserve one NVIDIA GPU, use the CUDA image and run on the
    GPU (TANDEM_MODEL_DEVICE); the other services stay as they were."""
    gpu_file = os.path.join(os.path.dirname(COMPOSE_FILE),
                            "docker-compose.gpu.yml")
    files = [compose, "-f", COMPOSE_FILE, "-f", gpu_file]
    common.run(files + ["config", "-q"], env=env)
    services = yaml.safe_load(common.run(files + ["config"], env=env))[
        "services"]
    for name in ("trainer", "rollout"):
        s = services[name]
        devices = (s.get("deploy", {}).get("resources", {})
                   .get("reservations", {}).get("devices", []))
        fail.check(len(devices) == 1 and devices[0].get("driver") == "nvidia"
                   and devices[0].get("count") == 1
                   and "gpu" in devices[0].get("capabilities", []),
                   f"gpu: {name} reserves no single NVIDIA GPU: {devices}")
        fail.check(s["environment"].get("TANDEM_MODEL_DEVICE") == "cuda",
                   f"gpu: {name} does not run on its GPU")
        fail.check(s["image"].endswith(":cuda"), f"gpu: {name} image "
                   f"{s['image']}")
        # The override adds to the base environment, it does not replace it.
        fail.check("TANDEM_COORDINATOR_ADDRESS" in s["environment"],
                   f"gpu: {name} lost its base environment")
    for name in ("coordinator", "verifier"):
        fail.check("deploy" not in services[name] and
                   "TANDEM_MODEL_DEVICE" not in
                   services[name].get("environment", {}),
                   f"gpu: {name} should not get a GPU")


if __name__ == "__main__":
    main()
