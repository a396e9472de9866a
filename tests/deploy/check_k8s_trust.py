"""The trust components of deploy/k8s (issue 25 item 4) in every overlay:

- mTLS: every daemon runs with TANDEM_TLS_MODE=mtls and its role's Secret
  (tandem-tls-<role>) mounted read-only where TANDEM_TLS_* point; its
  probes exec tandem-health; no workload mounts the CA's Secret.
- cert-manager: every object valid (cert_manager.py, after a self-test);
  each Secret a workload mounts is issued by a Certificate whose SAN URI
  names that workload's role (spiffe://<domain>/<role>/<name>, the form
  the role check reads), which carries TANDEM_TLS_SERVER_NAME as a DNS
  name, with server and client auth; issuers resolve to a CA Certificate.
- Without cert-manager: `tandemctl certs init` ($TANDEM_BIN_DIR) into
  components/dev-certs of a copy of deploy/, an overlay of mtls, dev-certs
  and network-policy: the generated Secrets validate, hold a certificate
  signed by their ca.crt with its key, and pass the checks above (role URI,
  DNS name, usages) read from the certificate itself.
- NetworkPolicy: the ports each daemon listens on, read from its container
  (TANDEM_GRPC_ADDRESS, TANDEM_METRICS_ADDRESS, the trainer's
  TANDEM_WEIGHT_SYNC_STORE_PORT and _DATA_PORT, TANDEM_OPENAI_LISTEN) plus
  the ephemeral range where broadcast members' Gloo/NCCL pairs listen,
  against the policies: every listening port is admitted by some policy
  for its pod, no policy admits a port nothing listens on, a default deny
  covers every pod, and the (client, server, port) paths admitted are
  exactly PATHS, the architecture's. A self-test removes a path, adds a
  stray port and gives a worker the admin's Secret, and requires each to
  fail.

    .venv/bin/python check_k8s_trust.py"""

import base64
import copy
import os
import re
import shutil
import subprocess
import sys
import tempfile

import yaml

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import cert_manager  # noqa: E402
import check_k8s  # noqa: E402
import common  # noqa: E402

TLS_MOUNT = "/etc/tandem-tls"
TLS_ENV = {"TANDEM_TLS_MODE": "mtls",
           "TANDEM_TLS_CERT": f"{TLS_MOUNT}/tls.crt",
           "TANDEM_TLS_KEY": f"{TLS_MOUNT}/tls.key",
           "TANDEM_TLS_CA": f"{TLS_MOUNT}/ca.crt"}
SPIFFE = re.compile(r"^spiffe://[^/]+/([a-z]+)/[A-Za-z0-9._-]+$")
# Where Linux binds port 0 (net.ipv4.ip_local_port_range's default): Gloo's
# TCP pairs and NCCL's sockets listen there on every broadcast member.
EPHEMERAL = (32768, 60999)
BROADCAST_MEMBERS = ("trainer", "rollout")
PROMETHEUS = "prometheus"
# Who dials whom, on which of the server's listening ports (by name), from
# DESIGN.md and the clients in the code: members -> coordinator gRPC
# (register, heartbeat, leases, batches); coordinator -> verifier
# ScoreBatch; rollout -> verifier Environment; rollout -> trainer
# WeightServer, rendezvous store, raw data port; broadcast members ->
# each other's Gloo/NCCL pairs; admin (tandemctl) -> every daemon's gRPC;
# Prometheus -> every /metrics.
PATHS = {
    ("trainer", "coordinator", "grpc"), ("rollout", "coordinator", "grpc"),
    ("verifier", "coordinator", "grpc"), ("admin", "coordinator", "grpc"),
    ("coordinator", "verifier", "grpc"), ("rollout", "verifier", "grpc"),
    ("admin", "verifier", "grpc"),
    ("rollout", "trainer", "grpc"), ("admin", "trainer", "grpc"),
    ("rollout", "trainer", "store"), ("rollout", "trainer", "weight-data"),
    ("rollout", "trainer", "pairs"),
    ("trainer", "rollout", "pairs"), ("rollout", "rollout", "pairs"),
    ("admin", "rollout", "grpc"),
} | {(PROMETHEUS, d, "metrics") for d in common.DAEMONS}


def port_of(address):
    return int(address.rsplit(":", 1)[1]) if address else None


def listening(container, component):
    """{name: (first, last)} of the ports the daemon in `container` listens
    on, from its environment (what the daemon binds), not its ports list."""
    env = {e["name"]: e.get("value") for e in container.get("env", [])}
    ports = {"grpc": port_of(env.get("TANDEM_GRPC_ADDRESS")),
             "metrics": port_of(env.get("TANDEM_METRICS_ADDRESS"))}
    if component == "trainer":
        ports["store"] = int(env.get("TANDEM_WEIGHT_SYNC_STORE_PORT", 0))
        ports["weight-data"] = int(env.get("TANDEM_WEIGHT_SYNC_DATA_PORT", 0))
    if env.get("TANDEM_OPENAI_LISTEN"):
        ports["openai"] = port_of(env["TANDEM_OPENAI_LISTEN"])
    ranges = {n: (p, p) for n, p in ports.items() if p is not None}
    if component in BROADCAST_MEMBERS:
        ranges["pairs"] = EPHEMERAL
    return ranges


def selects(selector, labels):
    return all(labels.get(k) == v
               for k, v in selector.get("matchLabels", {}).items())


def peer_components(peer, pods):
    """Components a `from` peer admits: tandem pods by labels, or
    PROMETHEUS for the monitoring peer. None when the peer is neither."""
    sel = peer.get("podSelector", {})
    if "namespaceSelector" in peer:
        return {PROMETHEUS} if sel.get("matchLabels", {}).get(
            "app.kubernetes.io/name") == "prometheus" else None
    if sel.get("matchLabels", {}).get("app.kubernetes.io/name") != "tandem":
        return None
    component = sel["matchLabels"].get("app.kubernetes.io/component")
    return {component} if component else set(pods) | {"admin"}


def admitted(policies, component, labels, pods):
    """[(client, (first, last)), ...] admitted to a pod with `labels`."""
    out = []
    for p in policies:
        if not selects(p["spec"]["podSelector"], labels):
            continue
        for rule in p["spec"].get("ingress", []):
            clients = set()
            for peer in rule.get("from", []):
                found = peer_components(peer, pods)
                clients |= found if found else {f"unknown {peer}"}
            for port in rule.get("ports", []):
                first = port["port"]
                out += [(c, (first, port.get("endPort", first)))
                        for c in clients]
    return out


def check_policies(overlay, objects, fail):
    policies = [o for o in objects if o["kind"] == "NetworkPolicy"]
    pods = {o["metadata"]["name"]: t for o, t in check_k8s.pod_specs(objects)}
    paths = set()
    for component, template in pods.items():
        labels = template["metadata"]["labels"]
        container = template["spec"]["containers"][0]
        listens = listening(container, component)
        if component == "trainer":
            for name in ("store", "weight-data"):
                fail.check(listens.get(name, (0, 0))[0] != 0,
                           f"{overlay}: trainer {name} port is 0 (any free "
                           "port): no policy can name it")
        declared = {p["containerPort"] for p in container.get("ports", [])}
        singles = {r[0] for n, r in listens.items() if n != "pairs"}
        fail.check(declared == singles, f"{overlay}: {component} declares "
                   f"ports {sorted(declared)}, listens on {sorted(singles)}")
        deny = [p for p in policies if selects(p["spec"]["podSelector"],
                                               labels)
                and "Ingress" in p["spec"].get("policyTypes", [])]
        fail.check(deny, f"{overlay}: no policy isolates {component}")
        allowed = admitted(policies, component, labels, pods)
        for name, (first, last) in listens.items():
            fail.check(any(a[0] <= first and last <= a[1]
                           for _, a in allowed),
                       f"{overlay}: {component} listens on {name} "
                       f"{first}-{last}, which no NetworkPolicy admits")
        for client, (first, last) in allowed:
            names = [n for n, r in listens.items() if r == (first, last)]
            if fail.check(names, f"{overlay}: a policy admits {client} to "
                          f"{component} port {first}-{last}, where nothing "
                          "listens"):
                paths.add((client, component, names[0]))
    fail.check(paths == PATHS, f"{overlay}: paths admitted but not used: "
               f"{sorted(paths - PATHS)}; used but not admitted: "
               f"{sorted(PATHS - paths)}")


def secret_certificate(secret, fail, where):
    """What a kubernetes.io/tls Secret's certificate says, as a
    Certificate's spec would: {uris, dnsNames, usages}; checks that it
    chains to the Secret's ca.crt and that tls.key is its key."""
    from cryptography import x509
    from cryptography.hazmat.primitives import serialization
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.x509.oid import ExtendedKeyUsageOID
    data = {k: base64.b64decode(v) for k, v in secret.get("data", {}).items()}
    if not fail.check({"tls.crt", "tls.key", "ca.crt"} <= set(data),
                      f"{where}: keys {sorted(data)}"):
        return {}
    cert = x509.load_pem_x509_certificate(data["tls.crt"])
    ca = x509.load_pem_x509_certificate(data["ca.crt"])
    key = serialization.load_pem_private_key(data["tls.key"], None)
    try:
        ca.public_key().verify(cert.signature, cert.tbs_certificate_bytes,
                               ec.ECDSA(cert.signature_hash_algorithm))
        signed = True
    except Exception:  # InvalidSignature, or a CA key of another type
        signed = False
    fail.check(signed, f"{where}: tls.crt is not signed by ca.crt")
    fail.check(key.public_key().public_numbers() ==
               cert.public_key().public_numbers(),
               f"{where}: tls.key is not the key of tls.crt")
    san = cert.extensions.get_extension_for_class(
        x509.SubjectAlternativeName).value
    eku = cert.extensions.get_extension_for_class(
        x509.ExtendedKeyUsage).value
    usages = {ExtendedKeyUsageOID.SERVER_AUTH: "server auth",
              ExtendedKeyUsageOID.CLIENT_AUTH: "client auth"}
    return {"uris": san.get_values_for_type(
                x509.UniformResourceIdentifier),
            "dnsNames": san.get_values_for_type(x509.DNSName),
            "usages": [usages[u] for u in eku if u in usages]}


def check_tls(overlay, objects, fail, per_pod_roles=()):
    by_kind = {}
    for o in objects:
        by_kind.setdefault(o["kind"], {})[o["metadata"]["name"]] = o
    certificates = by_kind.get("Certificate", {})
    issuers = by_kind.get("Issuer", {})
    # Each Secret a workload may mount, by what issues it: a cert-manager
    # Certificate (its spec) or a Secret in the build (its certificate).
    by_secret = {c["spec"]["secretName"]: c["spec"]
                 for c in certificates.values()}
    for name, secret in by_kind.get("Secret", {}).items():
        if secret.get("type") == "kubernetes.io/tls":
            by_secret[name] = secret_certificate(
                secret, fail, f"{overlay}: Secret {name}")
    for o in list(certificates.values()) + list(issuers.values()):
        e = cert_manager.error(o)
        fail.check(e is None, f"{overlay}: {check_k8s.describe(o)}: {e}")
    ca_secrets = {c["spec"]["secretName"] for c in certificates.values()
                  if c["spec"].get("isCA")}
    fail.check(len(ca_secrets) == (1 if certificates else 0),
               f"{overlay}: CA Certificates {sorted(ca_secrets)}")
    for c in certificates.values():
        ref = c["spec"]["issuerRef"]
        issuer = issuers.get(ref["name"])
        if not fail.check(issuer is not None, f"{overlay}: Certificate "
                          f"{c['metadata']['name']} names missing Issuer "
                          f"{ref['name']}"):
            continue
        if not c["spec"].get("isCA"):
            fail.check(issuer["spec"].get("ca", {}).get("secretName")
                       in ca_secrets, f"{overlay}: Certificate "
                       f"{c['metadata']['name']} is not signed by the CA")
    per_pod = set()
    for component, template in ((o["metadata"]["name"], t)
                                for o, t in check_k8s.pod_specs(objects)):
        pod = template["spec"]
        c = pod["containers"][0]
        env = {e["name"]: e.get("value") for e in c.get("env", [])}
        for var, value in TLS_ENV.items():
            fail.check(env.get(var) == value, f"{overlay}: {component} "
                       f"{var}={env.get(var)}, want {value}")
        mounts = {m["mountPath"]: m for m in c.get("volumeMounts", [])}
        mount = mounts.get(TLS_MOUNT, {})
        fail.check(mount.get("readOnly") is True,
                   f"{overlay}: {component} {TLS_MOUNT} not mounted "
                   "read-only")
        volumes = {v["name"]: v for v in pod.get("volumes", [])}
        secrets = {v["secret"]["secretName"] for v in volumes.values()
                   if "secret" in v}
        fail.check(not secrets & ca_secrets,
                   f"{overlay}: {component} mounts the CA's Secret")
        volume = volumes.get(mount.get("name"), {})
        secret = volume.get("secret", {}).get("secretName")
        if "csi" in volume:
            per_pod.add(component)
        else:
            fail.check(secret == f"tandem-tls-{component}", f"{overlay}: "
                       f"{component} mounts Secret {secret}")
        for probe in ("readinessProbe", "livenessProbe", "startupProbe"):
            p = c.get(probe)
            if p is not None:
                fail.check(p.get("exec", {}).get("command") ==
                           ["tandem-health"] and p.get("timeoutSeconds",
                                                       1) >= 3,
                           f"{overlay}: {component} {probe}: {p}")
        if "csi" in volume:
            cert = csi_certificate(volume, issuers, ca_secrets, fail,
                                   f"{overlay}: {component}")
        else:
            cert = by_secret.get(secret)
        if not fail.check(cert is not None, f"{overlay}: no Certificate "
                          f"issues Secret {secret} ({component})"):
            continue
        roles = {m.group(1) for m in map(SPIFFE.match,
                                         cert.get("uris", [])) if m}
        fail.check(roles == {component}, f"{overlay}: {component}'s "
                   f"certificate names roles {sorted(roles)}")
        fail.check(env.get("TANDEM_TLS_SERVER_NAME") in
                   cert.get("dnsNames", []),
                   f"{overlay}: {component}'s certificate lacks the DNS "
                   f"name its clients check, "
                   f"{env.get('TANDEM_TLS_SERVER_NAME')}")
        fail.check({"server auth", "client auth"} <=
                   set(cert.get("usages", [])),
                   f"{overlay}: {component}'s certificate usages")
    fail.check(per_pod == set(per_pod_roles), f"{overlay}: per-pod "
               f"certificates for {sorted(per_pod)}, want "
               f"{sorted(per_pod_roles)}")
    admin = by_secret.get("tandem-tls-admin")
    fail.check(admin is not None and {"admin"} == {
        m.group(1) for m in map(SPIFFE.match, admin.get("uris", []))
        if m}, f"{overlay}: no admin certificate (Secret tandem-tls-admin)")


CSI_DRIVER = "csi.cert-manager.io"
CSI_FILES = {"certificate-file": "tls.crt", "privatekey-file": "tls.key",
             "ca-file": "ca.crt"}


def csi_certificate(volume, issuers, ca_secrets, fail, where):
    """The certificate a cert-manager csi-driver volume requests for each
    pod (components/per-pod-certs), as a Certificate spec, with a pod's
    name in place of ${POD_NAME}; None when the volume is not one."""
    if not fail.check(volume["csi"].get("driver") == CSI_DRIVER,
                      f"{where}: csi driver {volume['csi'].get('driver')}"):
        return None
    attributes = volume["csi"].get("volumeAttributes", {})

    def attribute(key):
        return attributes.get(f"{CSI_DRIVER}/{key}", "")

    def listed(key):
        return [x.strip() for x in attribute(key).split(",") if x.strip()]
    issuer = issuers.get(attribute("issuer-name"))
    fail.check(attribute("issuer-kind") == "Issuer" and issuer is not None
               and issuer["spec"].get("ca", {}).get("secretName")
               in ca_secrets, f"{where}: the csi volume's issuer "
               f"{attribute('issuer-name')} is not the CA's Issuer")
    for key, name in CSI_FILES.items():
        fail.check(attribute(key) == name,
                   f"{where}: csi {key} {attribute(key)}, want {name}")
    uris = listed("uri-sans")
    fail.check(all("${POD_NAME}" in u for u in uris) and uris,
               f"{where}: csi uri-sans {uris} do not name the pod")
    return {"uris": [u.replace("${POD_NAME}", "pod-5f7c9-x2k4q")
                     for u in uris],
            "dnsNames": listed("dns-names"), "usages": listed("key-usages")}


SELF_TEST_CERTIFICATE = {
    "apiVersion": "cert-manager.io/v1", "kind": "Certificate",
    "metadata": {"name": "t", "namespace": "tandem"},
    "spec": {"secretName": "s", "uris": ["spiffe://tandem/rollout/t"],
             "usages": ["server auth", "client auth"], "duration": "720h",
             "privateKey": {"algorithm": "ECDSA", "size": 256},
             "issuerRef": {"name": "ca", "kind": "Issuer"}}}
SELF_TEST_BROKEN = (
    ("a misspelt field", lambda s: s.update(dnsName=["tandem"])),
    ("no secretName", lambda s: s.pop("secretName")),
    ("an unknown usage", lambda s: s.update(usages=["server"])),
    ("a bad key size", lambda s: s["privateKey"].update(size=2048)),
    ("a duration in days", lambda s: s.update(duration="30d")),
    ("uris of the wrong type", lambda s: s.update(uris="spiffe://x/y/z")),
)


def self_test(objects, fail):
    fail.check(cert_manager.error(SELF_TEST_CERTIFICATE) is None,
               "self-test: the valid Certificate was rejected: "
               f"{cert_manager.error(SELF_TEST_CERTIFICATE)}")
    for what, breaks in SELF_TEST_BROKEN:
        o = copy.deepcopy(SELF_TEST_CERTIFICATE)
        breaks(o["spec"])
        fail.check(cert_manager.error(o) is not None,
                   f"self-test: a Certificate with {what} was accepted")
    # The TLS check fails on a worker given the admin's Secret.
    broken = copy.deepcopy(objects)
    rollout = next(o for o in broken if o["kind"] == "Deployment" and
                   o["metadata"]["name"] == "rollout")
    for v in rollout["spec"]["template"]["spec"]["volumes"]:
        if v.get("secret", {}).get("secretName") == "tandem-tls-rollout":
            v["secret"]["secretName"] = "tandem-tls-admin"
    probe = common.Failures()
    check_tls("self-test", broken, probe)
    if fail.check(probe.messages, "self-test: a rollout worker with the "
                  "admin's Secret passed"):
        print(f"self-test: admin Secret on a worker: {probe.messages[0]}")
    # The policy check fails on a path taken away and on a stray port.
    for what, breaks in (
            ("the store port closed to rollout workers",
             lambda p: p["spec"]["ingress"].__delitem__(1)),
            ("a port nothing listens on",
             lambda p: p["spec"]["ingress"][0]["ports"].append(
                 {"protocol": "TCP", "port": 50099}))):
        broken = copy.deepcopy(objects)
        breaks(next(o for o in broken if o["kind"] == "NetworkPolicy" and
                    o["metadata"]["name"] == "tandem-trainer"))
        probe = common.Failures()
        check_policies("self-test", broken, probe)
        if fail.check(probe.messages, f"self-test: {what} passed"):
            print(f"self-test: {what}: {probe.messages[0]}")


DEV_OVERLAY = """apiVersion: kustomize.config.k8s.io/v1beta1
kind: Kustomization
namespace: tandem
resources:
  - ../../base
components:
  - ../../components/mtls
  - ../../components/dev-certs
  - ../../components/network-policy
"""


PER_POD_OVERLAY = """apiVersion: kustomize.config.k8s.io/v1beta1
kind: Kustomization
namespace: tandem
resources:
  - ../../base
components:
  - ../../components/mtls
  - ../../components/cert-manager
  - ../../components/per-pod-certs
  - ../../components/network-policy
"""


def build_overlay(work, name, text):
    """An overlay `name` of `text` in a copy of deploy/ under `work`,
    built with kubectl kustomize."""
    deploy = os.path.join(work, "deploy")
    if not os.path.isdir(deploy):
        shutil.copytree(os.path.join(common.K8S_DIR),
                        os.path.join(deploy, "k8s"),
                        ignore=shutil.ignore_patterns("certs"))
        shutil.copytree(common.CONFIG_DIR, os.path.join(deploy, "compose",
                                                        "config"))
    overlay = os.path.join(deploy, "k8s", "overlays", name)
    os.makedirs(overlay)
    with open(os.path.join(overlay, "kustomization.yaml"), "w") as f:
        f.write(text)
    out = common.run([common.need("kubectl", "kubectl"), "kustomize",
                      overlay])
    return [o for o in yaml.safe_load_all(out) if o]


def build_dev_certs(work):
    """The alternative without cert-manager, as docs/deployment.md tells
    it: `tandemctl certs init` into components/dev-certs/certs of a copy
    of deploy/, and an overlay of mtls + dev-certs + network-policy."""
    deploy = os.path.join(work, "deploy")
    shutil.copytree(os.path.join(common.K8S_DIR), os.path.join(deploy, "k8s"),
                    ignore=shutil.ignore_patterns("certs"))
    shutil.copytree(common.CONFIG_DIR, os.path.join(deploy, "compose",
                                                    "config"))
    tandemctl = os.path.join(os.environ.get("TANDEM_BIN_DIR", ""),
                             "tandemctl")
    if not os.access(tandemctl, os.X_OK):
        sys.exit(f"{tandemctl} not found (TANDEM_BIN_DIR): build tandemctl "
                 "first")
    subprocess.run([tandemctl, "certs", "init", "--dir", os.path.join(
        deploy, "k8s", "components", "dev-certs", "certs"), "--name", "k8s",
        "--hosts", "tandem,localhost,127.0.0.1"], check=True,
        capture_output=True, timeout=60)
    overlay = os.path.join(deploy, "k8s", "overlays", "dev-certs")
    os.makedirs(overlay)
    with open(os.path.join(overlay, "kustomization.yaml"), "w") as f:
        f.write(DEV_OVERLAY)
    out = common.run([common.need("kubectl", "kubectl"), "kustomize",
                      overlay])
    return [o for o in yaml.safe_load_all(out) if o]


def main():
    fail = common.Failures()
    for overlay in check_k8s.OVERLAYS:
        objects = check_k8s.build(overlay)
        if overlay == check_k8s.OVERLAYS[0]:
            self_test(objects, fail)
        check_tls(overlay, objects, fail)
        check_policies(overlay, objects, fail)
    work = tempfile.mkdtemp(prefix="tandem-k8s-trust-")
    try:
        objects = build_dev_certs(work)
        for o in objects:
            e = check_k8s.schema_error(o)
            fail.check(e is None, f"dev-certs: {check_k8s.describe(o)}: {e}")
        check_tls("dev-certs", objects, fail)
        check_policies("dev-certs", objects, fail)
        # Per-pod identities (components/per-pod-certs): the scaled roles
        # mount a csi-driver certificate of their own, the others their
        # role's Secret; the roles' unused Certificates are gone.
        objects = build_overlay(work, "per-pod", PER_POD_OVERLAY)
        for o in objects:
            e = check_k8s.schema_error(o)
            fail.check(e is None, f"per-pod: {check_k8s.describe(o)}: {e}")
        check_tls("per-pod", objects, fail,
                  per_pod_roles=("rollout", "verifier"))
        check_policies("per-pod", objects, fail)
        names = {o["metadata"]["name"] for o in objects
                 if o["kind"] == "Certificate"}
        fail.check(not names & {"tandem-rollout", "tandem-verifier"},
                   f"per-pod: unused role Certificates {sorted(names)}")
    finally:
        shutil.rmtree(work, ignore_errors=True)
    fail.exit("k8s trust")


if __name__ == "__main__":
    main()
