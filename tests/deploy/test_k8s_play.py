"""The Kubernetes manifests run for real with `podman kube play` (issue 24
item 4): what of the rendered cpu overlay Podman 4.3 can play, on this
build's binaries.

    python3 tests/deploy/test_k8s_play.py    # as root; ctest:
    ctest -R deploy_k8s_play --output-on-failure

Steps, each printed with its time:
1. deploy/compose/podman-setup.sh (containers.conf, the debootstrap base
   image) and the image of this build's binaries (podman_fixture, tagged
   IMAGE; LibTorch mounted from the venv the build used, as hostPath
   volumes).
2. `kubectl kustomize deploy/k8s/overlays/cpu`, turned into what `podman
   kube play` accepts (playable(); docs/deployment.md, "Kubernetes
   manifests in Podman"):
   - kept as rendered: the Deployments' pod templates (containers, args,
     env, initContainers, securityContext, resources, ConfigMap, Secret,
     PVC and emptyDir volumes), the ConfigMap tandem-config, the PVCs
     (Podman makes each a named volume);
   - changed: the coordinator's StatefulSet becomes a Deployment and its
     volumeClaimTemplate a PVC (Podman 4.3 plays no StatefulSet); the
     image is IMAGE; the LibTorch directories are added as read-only
     hostPath volumes; $(POD_IP) in TANDEM_GRPC_ADDRESS becomes `auto`
     (the daemons bind the address of their interface; Podman 4.3 has no
     status.podIP); `coordinator` resolves through hostAliases to the
     coordinator pod's address (no Services in Podman); names get the
     prefix PREFIX; the trainer's warm start is shortened to SFT_STEPS
     steps (its defaults train ~2-5 minutes);
   - the Secrets that cert-manager's Certificates would issue come from
     `tandemctl certs init` (what components/dev-certs makes), mounted by
     hostPath (Podman 4.3 panics on secret volumes); the containers' ports
     lists are dropped (Podman 4.3 publishes each on the host's same port,
     so every pod's metrics port 9400 would collide); restartPolicy
     OnFailure (Podman 4.3 restarts initContainers under Always);
   - left out (printed): Namespace, Services, HorizontalPodAutoscalers,
     NetworkPolicies, cert-manager Issuers and Certificates.
3. `podman kube play --network NETWORK` of the coordinator, then trainer,
   verifier and rollout (each with hostAliases to the coordinator's
   address). The trainer's initContainer runs the warm start into the
   warm-start volume; the rollout's initContainer waits for it.
4. Every daemon healthy by its own probe: `podman healthcheck run` where
   Podman made a healthcheck of the livenessProbe, else `podman exec C
   tandem-health` (the probe's command, with the pod's TLS environment).
   The trainer and the worker started from the warm start's checkpoint
   (their logs name it); the policy version advances (`tandemctl status`
   in the coordinator's container, with its certificate).
5. `podman kube down` of each file, the volumes, network and Secrets
   removed; nothing of PREFIX left. Steps 2-5 run under try/finally.

Skips (exit 77) when not root or podman, runc, debootstrap or kubectl are
missing. Exit 0 on success, 1 on a failed check (every container's last
log lines are printed)."""

import base64
import copy
import json
import os
import shutil
import sys
import tempfile
import time

import yaml

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
from podman_fixture import (REPO, SKIP, bin_dir,  # noqa: E402
                            build_prebuilt_image, libtorch_dirs, log, run,
                            run_scenario, setup, skip_reason, wait_for)

IMAGE = "localhost/tandem:k8s-play"
# Every pod's infra container: Podman 4.3 otherwise builds a pause image
# from catatonit, which Debian's podman only recommends.
INFRA_IMAGE = "localhost/tandem-infra:k8s-play"
INFRA_CONTAINERFILE = """FROM debian:bookworm-slim
ENTRYPOINT ["sh", "-c", "trap 'exit 0' TERM INT; while :; do sleep 1; done"]
"""
PREFIX = "tandemk8s"
NETWORK = f"{PREFIX}-net"
SFT_STEPS = 20
# Played in this order: the members need the coordinator's address.
WORKLOADS = ("coordinator", "trainer", "verifier", "rollout")
DROPPED = ("Namespace", "Service", "HorizontalPodAutoscaler",
           "NetworkPolicy", "Certificate", "Issuer")
MODEL_PATH = "/var/lib/tandem/warm-start/arith3-add"


def infra(tmp):
    """Builds INFRA_IMAGE and returns the environment that makes Podman use
    it: CONTAINERS_CONF, a copy of /etc/containers/containers.conf (which
    podman-setup.sh wrote) with [engine] infra_image set."""
    d = os.path.join(tmp, "infra")
    os.makedirs(d)
    with open(os.path.join(d, "Containerfile"), "w") as f:
        f.write(INFRA_CONTAINERFILE)
    run("podman", "build", "-q", "-t", INFRA_IMAGE, d, timeout=300)
    with open("/etc/containers/containers.conf") as f:
        conf = f.read()
    line = f'infra_image = "{INFRA_IMAGE}"'
    conf = (conf.replace("[engine]", f"[engine]\n{line}", 1)
            if "[engine]" in conf else f"{conf}\n[engine]\n{line}\n")
    path = os.path.join(tmp, "containers.conf")
    with open(path, "w") as f:
        f.write(conf)
    os.environ["CONTAINERS_CONF"] = path


def render():
    out = run("kubectl", "kustomize",
              os.path.join(REPO, "deploy", "k8s", "overlays", "cpu")).stdout
    return [o for o in yaml.safe_load_all(out) if o]


def tls_secrets(tmp, names):
    """{Secret name: directory with its tls.crt, tls.key and ca.crt}, from
    `tandemctl certs init` (what components/dev-certs turns into Secrets),
    owned by the image's user 10001. Podman 4.3 panics on a secret volume
    (a nil pointer in kube.VolumeFromSecret), so the pods mount these
    directories by hostPath instead."""
    certs = os.path.join(tmp, "certs")
    run(os.path.join(bin_dir(), "tandemctl"), "certs", "init", "--dir", certs,
        "--name", "k8s", "--hosts", "tandem,localhost,127.0.0.1")
    os.chmod(tmp, 0o711)
    dirs = {}
    for name in names:
        role = name.removeprefix("tandem-tls-")
        d = os.path.join(tmp, "secrets", name)
        os.makedirs(d)
        for key, f in (("tls.crt", f"{role}.pem"), ("tls.key", f"{role}.key"),
                       ("ca.crt", "ca.pem")):
            shutil.copy(os.path.join(certs, f), os.path.join(d, key))
            os.chown(os.path.join(d, key), 10001, 10001)
            os.chmod(os.path.join(d, key), 0o400)
        dirs[name] = d
    os.chmod(os.path.join(tmp, "secrets"), 0o755)
    return dirs


def playable(objects, tmp, torch_dirs):
    """{workload: [objects]} that `podman kube play` accepts, and the
    kinds left out."""
    left_out = sorted({f"{o['kind']}/{o['metadata']['name']}"
                       for o in objects if o["kind"] in DROPPED})
    unknown = sorted({o["kind"] for o in objects} - set(DROPPED) - {
        "ConfigMap", "PersistentVolumeClaim", "Deployment", "StatefulSet"})
    if unknown:
        raise AssertionError(f"the cpu overlay has kinds {unknown} that this "
                             "test neither plays nor lists as left out")
    workloads = sorted(o["metadata"]["name"] for o in objects
                       if o["kind"] in ("Deployment", "StatefulSet"))
    if workloads != sorted(WORKLOADS):
        raise AssertionError(f"workloads {workloads}, expected {WORKLOADS}")
    # The Secrets the pods mount (cert-manager would issue them).
    secret_names = sorted({
        v["secret"]["secretName"] for o in objects
        if o["kind"] in ("Deployment", "StatefulSet")
        for v in o["spec"]["template"]["spec"].get("volumes", [])
        if "secret" in v})
    secrets = tls_secrets(tmp, secret_names)
    configmaps, claims = [], {}
    for o in objects:
        if o["kind"] == "ConfigMap":
            configmaps.append(copy.deepcopy(o))
        elif o["kind"] == "PersistentVolumeClaim":
            claims[o["metadata"]["name"]] = copy.deepcopy(o)
    for o in configmaps + list(claims.values()):
        o["metadata"] = {"name": f"{PREFIX}-{o['metadata']['name']}"}

    files = {}
    for o in objects:
        if o["kind"] not in ("Deployment", "StatefulSet"):
            continue
        name = o["metadata"]["name"]
        pod = copy.deepcopy(o["spec"]["template"])
        own_claims = []
        for t in o["spec"].get("volumeClaimTemplates", []):
            claim = {"apiVersion": "v1", "kind": "PersistentVolumeClaim",
                     "metadata": {"name": f"{PREFIX}-{t['metadata']['name']}"},
                     "spec": t["spec"]}
            own_claims.append(claim)
            pod["spec"]["volumes"].append({
                "name": t["metadata"]["name"],
                "persistentVolumeClaim": {"claimName": t["metadata"]["name"]}})
        spec = pod["spec"]
        for v in spec.get("volumes", []):
            if "configMap" in v:
                v["configMap"]["name"] = f"{PREFIX}-{v['configMap']['name']}"
            if "secret" in v:
                v["hostPath"] = {"path": secrets[v.pop("secret")[
                    "secretName"]], "type": "Directory"}
            if "persistentVolumeClaim" in v:
                c = v["persistentVolumeClaim"]
                c["claimName"] = f"{PREFIX}-{c['claimName']}"
        for i, d in enumerate(torch_dirs):
            spec["volumes"].append({"name": f"libtorch-{i}", "hostPath": {
                "path": d, "type": "Directory"}})
        for c in spec.get("initContainers", []) + spec["containers"]:
            c["image"] = IMAGE
            c["imagePullPolicy"] = "Never"
            # Podman 4.3 publishes every containerPort on the host's same
            # port, so two pods exposing 9400 collide; the ports are
            # declarations only (the daemons listen on their own).
            c.pop("ports", None)
            c.setdefault("volumeMounts", []).extend(
                {"name": f"libtorch-{i}", "mountPath": d, "readOnly": True}
                for i, d in enumerate(torch_dirs))
            env = []
            for e in c.get("env", []):
                if e["name"] == "POD_IP":
                    continue
                if "$(POD_IP)" in e.get("value", ""):
                    e = {"name": e["name"],
                         "value": e["value"].replace("$(POD_IP)", "auto")}
                env.append(e)
            if env:
                c["env"] = env
            if c.get("args", [])[:2] == ["tandem-trainer", "sft"]:
                c["args"] += ["--steps", str(SFT_STEPS), "--eval-every",
                              str(SFT_STEPS), "--eval-problems", "64"]
        # Podman 4.3 applies the pod's restart policy to initContainers
        # too: under Always (a Deployment's) a finished initContainer is
        # started again and play fails removing it while it runs.
        spec["restartPolicy"] = "OnFailure"
        if name != "coordinator":
            spec["hostAliases"] = [{"ip": "COORDINATOR_IP",
                                    "hostnames": ["coordinator"]}]
        deployment = {"apiVersion": "apps/v1", "kind": "Deployment",
                      "metadata": {"name": f"{PREFIX}-{name}"},
                      "spec": {"replicas": 1,
                               "selector": o["spec"]["selector"],
                               "template": pod}}
        # Podman reads a pod's ConfigMaps from the same file.
        files[name] = configmaps + [deployment] + own_claims
    # A PVC becomes a volume where it is first played (a second one of the
    # same name is an error): with the first workload, in play order, that
    # mounts it.
    for claim in sorted(claims):
        for name in WORKLOADS:
            pod = files[name][len(configmaps)]["spec"]["template"]["spec"]
            if any(v.get("persistentVolumeClaim", {}).get("claimName") ==
                   f"{PREFIX}-{claim}" for v in pod["volumes"]):
                files[name].append(claims[claim])
                break
    return files, left_out


def pod_containers(workload):
    """Names of the running containers of the workload's pod, without the
    infra container."""
    out = run("podman", "ps", "--filter", f"pod={PREFIX}-{workload}-pod-0",
              "--format", "{{.Names}} {{.IsInfra}}").stdout.split("\n")
    return [line.split()[0] for line in out
            if line.strip() and line.split()[1] == "false"]


def container(workload):
    names = [n for n in pod_containers(workload)
             if n.endswith(f"-{workload}")]
    if len(names) != 1:
        raise AssertionError(f"{workload}: containers {names}")
    return names[0]


def pod_address(workload):
    infra = run("podman", "pod", "inspect", "-f", "{{.InfraContainerID}}",
                f"{PREFIX}-{workload}-pod-0").stdout.strip()
    return run("podman", "inspect", "-f",
               "{{range .NetworkSettings.Networks}}{{.IPAddress}} {{end}}",
               infra).stdout.split()[0]


def healthy(workload):
    """The pod's probe: Podman's healthcheck made from the livenessProbe
    when it made one, else the probe's own command."""
    c = container(workload)
    has_check = run("podman", "inspect", "-f",
                    "{{if .Config.Healthcheck}}yes{{end}}",
                    c).stdout.strip() == "yes"
    if has_check:
        return run("podman", "healthcheck", "run", c,
                   check=False).returncode == 0, "podman healthcheck run"
    return run("podman", "exec", c, "tandem-health",
               check=False).returncode == 0, "podman exec tandem-health"


def policy_version():
    out = run("podman", "exec", container("coordinator"), "tandemctl",
              "status", "--coordinator", "127.0.0.1:50051", "--json",
              timeout=30).stdout
    return int(json.loads(out).get("policyVersion", 0))


def scenario(files, tmp):
    address = None
    for workload in WORKLOADS:
        text = yaml.safe_dump_all(files[workload], sort_keys=False)
        if address:
            text = text.replace("COORDINATOR_IP", address)
        path = os.path.join(tmp, f"{workload}.yaml")
        with open(path, "w") as f:
            f.write(text)
        t = time.monotonic()
        run("podman", "kube", "play", "--network", NETWORK, path,
            timeout=900)
        log(f"podman kube play {workload}: {time.monotonic() - t:.0f} s "
            f"(containers {pod_containers(workload)})")
        if workload == "coordinator":
            address = pod_address("coordinator")
            log(f"coordinator pod at {address} (hostAliases of the others)")
    probes = {}
    for workload in WORKLOADS:
        probes[workload] = wait_for(
            lambda: (lambda ok, how: how if ok else None)(*healthy(workload)),
            120, f"{workload} healthy by its probe", interval=2)
        c = container(workload)
        check = run("podman", "inspect", "-f", "{{.Config.Healthcheck.Test}}",
                    c).stdout.strip()
        memory = int(run("podman", "inspect", "-f",
                         "{{.HostConfig.Memory}}", c).stdout)
        log(f"{workload}: healthy ({probes[workload]}: {check}; "
            f"memory limit {memory >> 20} MiB)")
    for workload in ("trainer", "rollout"):
        out = run("podman", "logs", container(workload)).stderr + \
            run("podman", "logs", container(workload)).stdout
        if MODEL_PATH not in out:
            raise AssertionError(f"{workload} does not say it loaded the "
                                 f"warm start {MODEL_PATH}:\n{out[-2000:]}")
    log(f"trainer and rollout loaded the warm start {MODEL_PATH}")
    start = policy_version()
    advanced = wait_for(lambda: (lambda v: v if v >= start + 2 else None)(
        policy_version()), 240, f"the policy version past {start + 1}",
        interval=3)
    log(f"policy version {start} -> {advanced}")


def teardown(files, tmp):
    """Everything the test made goes, whatever happened; returns what was
    left after `podman kube down`."""
    for workload in reversed(WORKLOADS):
        path = os.path.join(tmp, f"{workload}.yaml")
        if os.path.exists(path):
            out = run("podman", "kube", "down", path, check=False,
                      timeout=120)
            log(f"podman kube down {workload}: exit {out.returncode}")
    return remove_leftovers()


def remove_leftovers():
    """Removes every pod, volume, Secret and network named PREFIX...;
    returns the pods found (kube down should have removed them) and
    anything that is still there afterwards."""
    def names(kind):
        args = ["podman", kind, "ls", "--format", "{{.Name}}"]
        if kind == "pod":
            args[2] = "ps"
        return [n for n in run(*args, check=False).stdout.split()
                if n.startswith(PREFIX)]

    found = []
    pods = names("pod")
    if pods:
        found.append(f"pods left: {pods}")
        run("podman", "pod", "rm", "-f", *pods, check=False, timeout=120)
    # Volumes and Secrets that kube play made, and the network this test
    # made: kube down leaves them.
    for kind in ("volume", "network"):
        if names(kind):
            run("podman", kind, "rm", "-f", *names(kind), check=False)
    if names("secret"):
        run("podman", "secret", "rm", *names("secret"), check=False)
    for kind in ("pod", "volume", "secret", "network"):
        if names(kind):
            found.append(f"{kind}s not removable: {names(kind)}")
    return found


def print_logs():
    for workload in WORKLOADS:
        out = run("podman", "ps", "-a", "--filter",
                  f"pod={PREFIX}-{workload}-pod-0", "--format", "{{.Names}}",
                  check=False).stdout.split()
        for name in out:
            logs = run("podman", "logs", "--tail", "30", name, check=False)
            print(f"==== {name} (last 30 lines)\n{logs.stdout}{logs.stderr}",
                  flush=True)


def main():
    reason = skip_reason((("podman", "podman"), ("runc", "runc"),
                          ("debootstrap", "debootstrap"),
                          ("kubectl", "kubectl")))
    if reason:
        print(f"SKIP: {reason}")
        return SKIP
    tmp = tempfile.mkdtemp(prefix="tandem-k8s-play-")
    files = {}

    def body():
        setup(socket=False)
        for line in remove_leftovers():
            log(f"removed from an earlier run: {line}")
        torch = libtorch_dirs(os.path.join(bin_dir(), "tandem-trainer"))
        if not torch:
            raise AssertionError("no LibTorch directory in tandem-trainer's "
                                 "RUNPATH")
        build_prebuilt_image(tmp, IMAGE)
        infra(tmp)
        played, left_out = playable(render(), tmp, torch)
        files.update(played)
        log("not played (no Podman equivalent): " + ", ".join(left_out))
        run("podman", "network", "create", NETWORK)
        scenario(files, tmp)

    def cleanup():
        leftovers = teardown(files, tmp)
        shutil.rmtree(tmp, ignore_errors=True)
        return leftovers

    return run_scenario(body, print_logs, cleanup)


if __name__ == "__main__":
    sys.exit(main())
