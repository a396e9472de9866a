"""Kubernetes manifests: `kubectl kustomize` builds every overlay, every
object validates against the strict API schemas of Kubernetes K8S_VERSION
shipped by PyPI's kubernetes-validate (unknown fields, wrong types and kinds
without a schema fail), and the objects fit together (selectors, probes,
ConfigMap contents, environment variables naming real config keys, volumes,
HPA targets, GPU requests). A self-test first proves that the schema check
rejects broken objects.

    .venv/bin/python check_k8s.py"""

import copy
import os
import sys

import yaml

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import cert_manager  # noqa: E402
import common  # noqa: E402

try:
    import kubernetes_validate
    from kubernetes_validate.utils import VersionNotSupportedError
except ImportError:
    sys.exit(f"{sys.executable} cannot import kubernetes_validate: run "
             "deploy/local/install-deps.sh (deploy/local/requirements.txt "
             "pins kubernetes-validate)")

OVERLAYS = ("cpu", "gpu")
GRPC_PORTS = {"coordinator": 50051, "rollout": 50052, "verifier": 50053,
              "trainer": 50054}
# The Kubernetes release whose API schemas the objects must match: the newest
# that kubernetes-validate 1.37.0 ships.
K8S_VERSION = "1.37"


def build(overlay):
    kubectl = common.need("kubectl", "kubectl")
    out = common.run([kubectl, "kustomize",
                      os.path.join(common.K8S_DIR, "overlays", overlay)])
    return [o for o in yaml.safe_load_all(out) if o]


def describe(o):
    meta = o.get("metadata") if isinstance(o.get("metadata"), dict) else {}
    return f"{o.get('kind')}/{meta.get('name')} ({o.get('apiVersion')})"


def schema_error(o):
    """None when o is valid under the strict K8S_VERSION schema of its
    apiVersion and kind, else what is wrong. Strict schemas reject fields
    the API does not define; a kind with no schema is an error, not a
    skip."""
    if not o.get("apiVersion") or not o.get("kind"):
        return "no apiVersion or kind"
    if o["apiVersion"].startswith("cert-manager.io/"):
        # A CRD: no Kubernetes schema; cert_manager.py checks its structure.
        return cert_manager.error(o)
    try:
        used = kubernetes_validate.validate(o, K8S_VERSION, strict=True)
    except kubernetes_validate.ValidationError as e:
        path = ".".join(str(p) for p in e.path) or "(root)"
        return f"{path}: {e.message}"
    except kubernetes_validate.SchemaNotFoundError:
        return (f"kubernetes-validate {kubernetes_validate.__version__} has "
                f"no Kubernetes {K8S_VERSION} schema for {o['apiVersion']} "
                f"{o['kind']}")
    except VersionNotSupportedError:
        return (f"kubernetes-validate {kubernetes_validate.__version__} does "
                f"not ship Kubernetes {K8S_VERSION}")
    if used != K8S_VERSION:
        return f"validated against Kubernetes {used}, not {K8S_VERSION}"
    return None


def validate_schemas(objects, overlay, fail):
    print(f"--- kubernetes-validate {kubernetes_validate.__version__}, "
          f"Kubernetes {K8S_VERSION} strict, overlay {overlay}")
    for o in objects:
        error = schema_error(o)
        print(f"{'ok  ' if error is None else 'FAIL'} {describe(o)}"
              f"{'' if error is None else ': ' + error}")
        fail.check(error is None, f"{overlay}: {describe(o)}: {error}")


# A minimal valid Deployment, and broken copies of it that the schema check
# must reject.
SELF_TEST_DEPLOYMENT = {
    "apiVersion": "apps/v1",
    "kind": "Deployment",
    "metadata": {"name": "self-test", "namespace": "tandem"},
    "spec": {
        "replicas": 1,
        "selector": {"matchLabels": {"app": "self-test"}},
        "template": {
            "metadata": {"labels": {"app": "self-test"}},
            "spec": {"containers": [{"name": "c", "image": "tandem:cpu"}]},
        },
    },
}


def _container(o):
    return o["spec"]["template"]["spec"]["containers"][0]


SELF_TEST_BROKEN = (
    ("an unknown container field",
     lambda o: _container(o).update(imagePullPolicee="Always")),
    ("an unknown metadata field",
     lambda o: o["metadata"].update(label={"app": "self-test"})),
    ("replicas of the wrong type",
     lambda o: o["spec"].update(replicas="three")),
    ("a container without its required name",
     lambda o: _container(o).pop("name")),
    (f"an apiVersion Kubernetes {K8S_VERSION} no longer serves",
     lambda o: o.update(apiVersion="apps/v1beta1")),
    ("a kind without a schema",
     lambda o: o.update(apiVersion="monitoring.coreos.com/v1",
                        kind="ServiceMonitor")),
    ("a Deployment that calls itself a cert-manager object",
     lambda o: o.update(apiVersion="cert-manager.io/v1", kind="Certificate")),
)


def self_test_schemas(fail):
    """The schema check can fail: it accepts SELF_TEST_DEPLOYMENT and rejects
    every broken copy of it, so a validator that accepts everything (or
    nothing) fails the test."""
    error = schema_error(SELF_TEST_DEPLOYMENT)
    fail.check(error is None,
               f"self-test: the valid Deployment was rejected: {error}")
    for what, breaks in SELF_TEST_BROKEN:
        o = copy.deepcopy(SELF_TEST_DEPLOYMENT)
        breaks(o)
        error = schema_error(o)
        if fail.check(error is not None,
                      f"self-test: a Deployment with {what} was accepted"):
            print(f"self-test: rejected {what}: {error}")


def pod_specs(objects):
    for o in objects:
        template = o.get("spec", {}).get("template")
        if o["kind"] in ("Deployment", "StatefulSet") and template:
            yield o, template


def check_overlay(overlay, objects, keys, fail):
    by_kind = {}
    for o in objects:
        by_kind.setdefault(o["kind"], {})[o["metadata"]["name"]] = o
        if o["kind"] != "Namespace":
            fail.check(o["metadata"].get("namespace") == "tandem",
                       f"{overlay}: {o['kind']}/{o['metadata']['name']} "
                       "is not in namespace tandem")

    workloads = {o["metadata"]["name"]: o for o, _ in pod_specs(objects)}
    fail.check(set(workloads) == set(common.DAEMONS),
               f"{overlay}: workloads {sorted(workloads)} != daemons")

    # The coordinator: one-replica StatefulSet with a journal volume.
    sts = by_kind.get("StatefulSet", {}).get("coordinator")
    if fail.check(sts is not None, f"{overlay}: no coordinator StatefulSet"):
        spec = sts["spec"]
        fail.check(spec.get("replicas") == 1,
                   f"{overlay}: coordinator replicas {spec.get('replicas')}")
        claims = [c["metadata"]["name"]
                  for c in spec.get("volumeClaimTemplates", [])]
        fail.check("journal" in claims, f"{overlay}: no journal claim")
        c = spec["template"]["spec"]["containers"][0]
        env = {e["name"]: e.get("value") for e in c.get("env", [])}
        mounts = {m["name"]: m["mountPath"] for m in c["volumeMounts"]}
        fail.check(env.get("TANDEM_JOURNAL_DIR") == mounts.get("journal"),
                   f"{overlay}: TANDEM_JOURNAL_DIR is not the journal mount")
        fail.check(spec.get("serviceName") in by_kind.get("Service", {}),
                   f"{overlay}: StatefulSet serviceName has no Service")
        governing = by_kind["Service"].get(spec.get("serviceName"), {})
        fail.check(governing.get("spec", {}).get("clusterIP") == "None",
                   f"{overlay}: the StatefulSet's Service is not headless")
    for name in ("rollout", "verifier", "trainer"):
        fail.check(name in by_kind.get("Deployment", {}),
                   f"{overlay}: {name} is not a Deployment")

    configmaps = by_kind.get("ConfigMap", {})
    config = [cm for n, cm in configmaps.items()
              if n.startswith("tandem-config")]
    if fail.check(len(config) == 1, f"{overlay}: ConfigMap tandem-config"):
        data = config[0]["data"]
        for d in common.DAEMONS:
            with open(os.path.join(common.CONFIG_DIR, f"{d}.yaml")) as f:
                fail.check(data.get(f"{d}.yaml") == f.read(),
                           f"{overlay}: ConfigMap {d}.yaml differs from "
                           f"deploy/compose/config/{d}.yaml")

    services = by_kind.get("Service", {})
    for name, o in workloads.items():
        template = o["spec"]["template"]
        labels = template["metadata"]["labels"]
        selector = o["spec"]["selector"]["matchLabels"]
        fail.check(all(labels.get(k) == v for k, v in selector.items()),
                   f"{overlay}: {name} selector does not match its pods")
        annotations = template["metadata"].get("annotations", {})
        fail.check(annotations.get("prometheus.io/scrape") == "true" and
                   annotations.get("prometheus.io/port") == "9400",
                   f"{overlay}: {name} pods lack scrape annotations")
        fail.check(labels.get("app.kubernetes.io/part-of") == "tandem",
                   f"{overlay}: {name} pods lack part-of=tandem (scrape "
                   "config keeps only those)")
        fail.check(labels.get("app.kubernetes.io/component") == name,
                   f"{overlay}: {name} pods: component label (job name)")
        pod = template["spec"]
        fail.check(pod.get("securityContext", {}).get("runAsNonRoot") is True,
                   f"{overlay}: {name} may run as root")
        volumes = {v["name"]: v for v in pod.get("volumes", [])}
        claim_names = {c["metadata"]["name"]
                       for c in o["spec"].get("volumeClaimTemplates", [])}
        c = pod["containers"][0]
        fail.check(c["args"][0] == f"tandem-{name}",
                   f"{overlay}: {name} runs {c['args'][0]}")
        config_arg = c["args"][c["args"].index("--config") + 1]
        fail.check(config_arg == f"/etc/tandem/{name}.yaml",
                   f"{overlay}: {name} --config {config_arg}")
        for m in c.get("volumeMounts", []):
            fail.check(m["name"] in volumes or m["name"] in claim_names,
                       f"{overlay}: {name} mounts unknown volume {m['name']}")
        cfg = volumes.get("config", {}).get("configMap", {}).get("name", "")
        fail.check(cfg in configmaps,
                   f"{overlay}: {name} ConfigMap '{cfg}' does not exist")
        for v in volumes.values():
            claim = v.get("persistentVolumeClaim", {}).get("claimName")
            if claim:
                fail.check(claim in by_kind.get("PersistentVolumeClaim", {}),
                           f"{overlay}: {name} claim {claim} does not exist")
        ports = {p["name"]: p["containerPort"] for p in c["ports"]}
        fail.check(ports.get("grpc") == GRPC_PORTS[name] and
                   ports.get("metrics") == 9400,
                   f"{overlay}: {name} ports {ports}")
        env = {e["name"]: e for e in c.get("env", [])}
        tls = env.get("TANDEM_TLS_MODE", {}).get("value", "off") == "mtls"
        for probe in ("readinessProbe", "livenessProbe"):
            p = c.get(probe, {})
            if tls:
                # The kubelet's gRPC probe has no client certificate: the
                # image's probe with the daemon's TANDEM_TLS_* instead.
                fail.check(p.get("exec", {}).get("command") ==
                           ["tandem-health"] and "grpc" not in p,
                           f"{overlay}: {name} {probe} with mTLS is not "
                           "exec tandem-health")
            else:
                fail.check(p.get("grpc", {}).get("port") == GRPC_PORTS[name],
                           f"{overlay}: {name} {probe} is not a gRPC probe "
                           f"on {GRPC_PORTS[name]}")
        requests = c.get("resources", {}).get("requests", {})
        fail.check("cpu" in requests and "memory" in requests,
                   f"{overlay}: {name} has no cpu/memory requests")
        for var in env:
            if var.startswith("TANDEM_"):
                fail.check(common.env_to_key(var, keys) is not None,
                           f"{overlay}: {name} sets {var}, which names no "
                           "config key")
        grpc_address = env.get("TANDEM_GRPC_ADDRESS", {}).get("value", "")
        fail.check(grpc_address.endswith(f":{GRPC_PORTS[name]}"),
                   f"{overlay}: {name} binds {grpc_address}")
        if name != "coordinator":
            fail.check(env.get("TANDEM_COORDINATOR_ADDRESS", {}).get("value")
                       == "coordinator:50051",
                       f"{overlay}: {name} coordinator address")
            # Members must register an address others can dial.
            fail.check(grpc_address == f"$(POD_IP):{GRPC_PORTS[name]}" and
                       env.get("POD_IP", {}).get("valueFrom", {})
                       .get("fieldRef", {}).get("fieldPath") == "status.podIP",
                       f"{overlay}: {name} does not bind its pod IP")
        # Every workload has a Service selecting it.
        selecting = [s for s in services.values()
                     if s["spec"].get("selector") and
                     all(labels.get(k) == v
                         for k, v in s["spec"]["selector"].items())]
        fail.check(selecting, f"{overlay}: no Service selects {name}")
        if overlay == "gpu" and name in ("rollout", "trainer"):
            limits = c.get("resources", {}).get("limits", {})
            fail.check(limits.get("nvidia.com/gpu") == "1",
                       f"{overlay}: {name} requests no GPU")
            fail.check(c["image"].endswith(":cuda"),
                       f"{overlay}: {name} image {c['image']}")
            fail.check(env.get("TANDEM_MODEL_DEVICE", {}).get("value") ==
                       "cuda",
                       f"{overlay}: {name} gets a GPU but does not run on "
                       "it (TANDEM_MODEL_DEVICE)")
        if overlay == "cpu":
            fail.check(c["image"] == "tandem:cpu",
                       f"{overlay}: {name} image {c['image']}")
            fail.check("nvidia.com/gpu" not in
                       c.get("resources", {}).get("limits", {}),
                       f"{overlay}: {name} requests a GPU")
            fail.check(env.get("TANDEM_MODEL_DEVICE", {}).get("value",
                                                            "cpu") == "cpu",
                       f"{overlay}: {name} asks for a GPU device")

    for name in ("rollout", "verifier", "trainer"):
        s = services.get(name)
        if fail.check(s is not None, f"{overlay}: no Service {name}"):
            fail.check(s["spec"].get("clusterIP") == "None",
                       f"{overlay}: Service {name} is not headless")
    fail.check("coordinator" in services, f"{overlay}: no coordinator Service")

    hpas = by_kind.get("HorizontalPodAutoscaler", {})
    fail.check("rollout" in hpas, f"{overlay}: no rollout HPA")
    for name, h in hpas.items():
        ref = h["spec"]["scaleTargetRef"]
        fail.check(ref["name"] in by_kind.get(ref["kind"], {}),
                   f"{overlay}: HPA {name} targets missing {ref}")
        for m in h["spec"]["metrics"]:
            fail.check(m["type"] in ("Pods", "Object"),
                       f"{overlay}: HPA {name} metric type {m['type']} is not "
                       "from the custom metrics API")


def check_warm_start(overlay, workloads, fail):
    """The trainer and every rollout worker start from one checkpoint: the
    trainer's initContainer `tandem-trainer sft --output DIR` writes it into
    a volume that both mount, both set TANDEM_MODEL_PATH=DIR, and the
    workers' initContainer waits for DIR/sft_meta.json (written last).
    Both call those weights version 0, so a worker that loaded other
    weights would generate with them under the trainer's version 0."""
    def claim_of(pod, mount_path):
        for c in pod["containers"]:
            for m in c.get("volumeMounts", []):
                if mount_path.startswith(m["mountPath"].rstrip("/") + "/"):
                    for v in pod.get("volumes", []):
                        if v["name"] == m["name"]:
                            return v.get("persistentVolumeClaim", {}).get(
                                "claimName")
        return None

    paths, claims = {}, {}
    for name in ("trainer", "rollout"):
        pod = workloads[name]["spec"]["template"]["spec"]
        env = {e["name"]: e.get("value")
               for e in pod["containers"][0].get("env", [])}
        paths[name] = env.get("TANDEM_MODEL_PATH")
        claims[name] = claim_of(pod, paths[name] or "/nonexistent")
    fail.check(paths["trainer"] and paths["trainer"] == paths["rollout"],
               f"{overlay}: trainer and rollout TANDEM_MODEL_PATH "
               f"{paths['trainer']} != {paths['rollout']}: the workers' "
               "version 0 is not the trainer's")
    fail.check(claims["trainer"] and claims["trainer"] == claims["rollout"],
               f"{overlay}: the model path is not on one shared volume "
               f"(trainer {claims['trainer']}, rollout {claims['rollout']})")
    trainer_init = workloads["trainer"]["spec"]["template"]["spec"].get(
        "initContainers", [])
    sft = [c for c in trainer_init if c.get("args", [])[:2] ==
           ["tandem-trainer", "sft"]]
    if fail.check(len(sft) == 1,
                  f"{overlay}: trainer has no warm-start initContainer"):
        args = sft[0]["args"]
        fail.check(args[args.index("--output") + 1] == paths["trainer"],
                   f"{overlay}: the warm start writes "
                   f"{args[args.index('--output') + 1]}, not the model path")
    rollout_init = workloads["rollout"]["spec"]["template"]["spec"].get(
        "initContainers", [])
    marker = f"{paths['rollout']}/sft_meta.json"
    fail.check(any(marker in " ".join(c.get("command", []) + c.get("args", []))
                   for c in rollout_init),
               f"{overlay}: rollout workers do not wait for {marker}")


def main():
    fail = common.Failures()
    self_test_schemas(fail)
    keys = common.config_keys()
    for overlay in OVERLAYS:
        objects = build(overlay)
        print(f"overlay {overlay}: {len(objects)} objects")
        validate_schemas(objects, overlay, fail)
        check_overlay(overlay, objects, keys, fail)
        check_warm_start(overlay, {o["metadata"]["name"]: o
                                   for o, _ in pod_specs(objects)}, fail)
    fail.exit("k8s manifests")


if __name__ == "__main__":
    main()
