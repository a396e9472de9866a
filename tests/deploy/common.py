"""Shared helpers of the deployment tests (tests/deploy)."""

import os
import re
import shutil
import subprocess
import sys

REPO = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", ".."))
COMPOSE_DIR = os.path.join(REPO, "deploy", "compose")
CONFIG_DIR = os.path.join(COMPOSE_DIR, "config")
K8S_DIR = os.path.join(REPO, "deploy", "k8s")
PROM_DIR = os.path.join(REPO, "deploy", "prometheus")
GRAFANA_DIR = os.path.join(REPO, "deploy", "grafana")
DOCKER_DIR = os.path.join(REPO, "docker")
DAEMONS = ("coordinator", "rollout", "verifier", "trainer")


class Failures:
    """Collects check failures so that one run reports all of them."""

    def __init__(self):
        self.messages = []

    def check(self, condition, message):
        if not condition:
            self.messages.append(message)
        return condition

    def exit(self, what):
        for m in self.messages:
            print(f"FAIL {m}")
        if self.messages:
            print(f"{what}: {len(self.messages)} failure(s)")
            sys.exit(1)
        print(f"{what}: ok")
        sys.exit(0)


def need(tool, package):
    path = shutil.which(tool)
    if path is None:
        print(f"{tool} not found; install the Debian package '{package}'",
              file=sys.stderr)
        sys.exit(1)
    return path


def run(args, **kwargs):
    result = subprocess.run(args, capture_output=True, text=True, **kwargs)
    if result.returncode != 0:
        print(f"$ {' '.join(args)}\n{result.stdout}{result.stderr}")
        raise SystemExit(f"command failed with exit code {result.returncode}")
    return result.stdout


def config_keys():
    """Every config key the daemons declare, from their ConfigSchema
    registrations in the source (services/, common/), so the check does not
    depend on how recently the binaries were built."""
    keys = set()
    pattern = re.compile(r'\bAdd(?:Int|Double|Bool|String|Enum|Duration|'
                         r'StringList|Uint)\w*\(\s*"([a-z0-9_.]+)"')
    for top in ("services", "common"):
        for root, _, files in os.walk(os.path.join(REPO, top)):
            for name in files:
                if name.endswith(".cc") or name.endswith(".h"):
                    with open(os.path.join(root, name),
                              errors="replace") as f:
                        keys.update(pattern.findall(f.read()))
    return keys


def env_to_key(name, keys):
    """TANDEM_JOURNAL_DIR -> journal.dir when such a key exists (the daemons
    map keys to variables by upper-casing and replacing dots with
    underscores), else None."""
    for key in keys:
        if "TANDEM_" + key.replace(".", "_").upper() == name:
            return key
    return None
