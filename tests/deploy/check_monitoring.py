"""deploy/prometheus and deploy/grafana, statically: `promtool check
config` on the compose Prometheus config and on the Kubernetes one (Debian's
Prometheus is built without Kubernetes service discovery, so its
kubernetes_sd_configs are swapped for an equivalent static target before
the check; the relabelling is checked as written), `promtool check rules`
on the rules, and the Grafana provisioning and dashboard fit together
(datasource uid, unique panel ids, every panel has queries, no metric the
daemons do not export)."""

import json
import os
import re
import subprocess
import sys
import tempfile

import yaml

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import common  # noqa: E402


def promtool_check_config(path, fail):
    promtool = common.need("promtool", "prometheus")
    r = subprocess.run([promtool, "check", "config", path],
                       capture_output=True, text=True)
    print(r.stdout + r.stderr, end="")
    fail.check(r.returncode == 0, f"promtool check config {path}")


def exported_metric_names():
    """Metric names registered in the daemons' source (BuildGauge/Counter/
    Histogram .Name("tandem_...") and helpers taking a "tandem_..." name)."""
    names = set()
    for top in ("services", "common"):
        for root, _, files in os.walk(os.path.join(common.REPO, top)):
            for f in files:
                if f.endswith((".cc", ".h")):
                    with open(os.path.join(root, f), errors="replace") as fh:
                        names.update(re.findall(r'"(tandem_[a-z0-9_]+)"',
                                                fh.read()))
    return names


def main():
    fail = common.Failures()
    promtool = common.need("promtool", "prometheus")
    with tempfile.TemporaryDirectory() as tmp:
        # Compose: rule_files point at /etc/prometheus/rules in the
        # container; check with the repository's rules instead.
        with open(os.path.join(common.PROM_DIR, "prometheus.yml")) as f:
            compose = yaml.safe_load(f)
        fail.check(compose["rule_files"] == ["/etc/prometheus/rules/*.yml"],
                   "compose prometheus.yml: rule_files")
        compose["rule_files"] = [os.path.join(common.PROM_DIR, "rules",
                                              "*.yml")]
        path = os.path.join(tmp, "compose.yml")
        with open(path, "w") as f:
            yaml.safe_dump(compose, f)
        promtool_check_config(path, fail)

        with open(os.path.join(common.PROM_DIR,
                               "prometheus-kubernetes.yml")) as f:
            k8s = yaml.safe_load(f)
        k8s["rule_files"] = compose["rule_files"]
        for job in k8s["scrape_configs"]:
            sd = job.pop("kubernetes_sd_configs", None)
            fail.check(sd and sd[0]["role"] == "pod" and
                       sd[0]["namespaces"]["names"] == ["tandem"],
                       "kubernetes config: pod discovery in namespace tandem")
            job["static_configs"] = [{"targets": ["127.0.0.1:9400"]}]
            targets = {r.get("target_label") for r in job["relabel_configs"]}
            fail.check({"job", "namespace", "pod", "__address__"} <= targets,
                       "kubernetes config: relabelling must set job, "
                       "namespace, pod and __address__")
        path = os.path.join(tmp, "kubernetes.yml")
        with open(path, "w") as f:
            yaml.safe_dump(k8s, f)
        promtool_check_config(path, fail)

    rules = sorted(os.path.join(common.PROM_DIR, "rules", f)
                   for f in os.listdir(os.path.join(common.PROM_DIR, "rules")))
    r = subprocess.run([promtool, "check", "rules", *rules],
                       capture_output=True, text=True)
    print(r.stdout + r.stderr, end="")
    fail.check(r.returncode == 0, "promtool check rules")

    # Grafana provisioning and dashboard.
    with open(os.path.join(common.GRAFANA_DIR, "provisioning", "datasources",
                           "tandem.yaml")) as f:
        datasources = yaml.safe_load(f)["datasources"]
    uids = {d["uid"] for d in datasources if d["type"] == "prometheus"}
    with open(os.path.join(common.GRAFANA_DIR, "provisioning", "dashboards",
                           "tandem.yaml")) as f:
        providers = yaml.safe_load(f)["providers"]
    fail.check(providers[0]["options"]["path"] == "/var/lib/grafana/dashboards",
               "dashboard provider path")
    known = exported_metric_names()
    recorded = set()
    for p in rules:
        with open(p) as f:
            for g in yaml.safe_load(f)["groups"]:
                recorded.update(r["record"] for r in g["rules"]
                                if "record" in r)
    for p in rules:
        with open(p) as f:
            for g in yaml.safe_load(f)["groups"]:
                for r in g["rules"]:
                    for metric in re.findall(r"\b(tandem_[a-z0-9_]+)",
                                             r["expr"]):
                        base = re.sub(r"_(bucket|sum|count)$", "", metric)
                        fail.check(metric in known or base in known,
                                   f"rule {r.get('record') or r['alert']} "
                                   f"uses {metric}, which no daemon exports")
    dashboards = os.listdir(os.path.join(common.GRAFANA_DIR, "dashboards"))
    fail.check(dashboards == ["tandem.json"], f"dashboards: {dashboards}")
    for name in dashboards:
        with open(os.path.join(common.GRAFANA_DIR, "dashboards", name)) as f:
            d = json.load(f)
        variables = {v["name"]: v for v in d["templating"]["list"]}
        ds = variables.get("datasource", {})
        fail.check(ds.get("current", {}).get("value") in uids,
                   f"{name}: default datasource is not the provisioned one")
        ids = [p["id"] for p in d["panels"]]
        fail.check(len(ids) == len(set(ids)), f"{name}: duplicate panel ids")
        for p in d["panels"]:
            if p["type"] == "row":
                continue
            fail.check(p.get("targets"), f"{name}: panel '{p['title']}' "
                       "has no query")
            for t in p.get("targets", []):
                fail.check(t.get("datasource", {}).get("uid") ==
                           "${datasource}",
                           f"{name}: '{p['title']}' datasource")
                for metric in re.findall(r"\b(tandem_[a-z0-9_]+)", t["expr"]):
                    base = re.sub(r"_(bucket|sum|count)$", "", metric)
                    fail.check(metric in known or base in known,
                               f"{name}: '{p['title']}' uses {metric}, "
                               "which no daemon exports")
                for metric in re.findall(r"\b(tandem:[a-z0-9_:]+)",
                                         t["expr"]):
                    fail.check(metric in recorded,
                               f"{name}: '{p['title']}' uses {metric}, "
                               "which no recording rule defines")
    fail.exit("monitoring")


if __name__ == "__main__":
    main()
