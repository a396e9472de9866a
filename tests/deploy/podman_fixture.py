"""What the real-container tests (test_compose_stack.py, test_k8s_play.py)
share: rootful Podman prepared by deploy/compose/podman-setup.sh, the image
of this build's binaries (docker/Dockerfile.prebuilt, LibTorch mounted from
the venv the build used, not copied), and small process helpers."""

import os
import re
import shutil
import subprocess
import time

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.abspath(os.path.join(HERE, "..", ".."))
COMPOSE_DIR = os.path.join(REPO, "deploy", "compose")
SOCKET = "/run/podman/podman.sock"
PROGRAMS = ("tandem-coordinator", "tandem-trainer", "tandem-rollout",
            "tandem-verifier", "tandemctl", "tandem-model", "tandem-local")
SKIP = 77
T0 = time.monotonic()


def log(message):
    print(f"[{time.monotonic() - T0:6.1f} s] {message}", flush=True)


def run(*args, timeout=300, check=True, env=None, input=None):
    out = subprocess.run(args, capture_output=True, text=True,
                         timeout=timeout, env=env, input=input)
    if check and out.returncode != 0:
        raise AssertionError(f"{' '.join(args)}: exit {out.returncode}\n"
                             f"{out.stdout[-2000:]}{out.stderr[-3000:]}")
    return out


def wait_for(predicate, timeout, what, interval=1.0):
    deadline = time.monotonic() + timeout
    last_error = None
    while time.monotonic() < deadline:
        try:
            value = predicate()
            if value:
                return value
        except Exception as e:  # noqa: BLE001 - retried until the deadline
            last_error = e
        time.sleep(interval)
    raise AssertionError(f"timed out after {timeout} s waiting for {what}"
                         f"{': ' + str(last_error) if last_error else ''}")


def bin_dir():
    return os.environ.get("TANDEM_BIN_DIR") or os.path.join(REPO, "build", "bin")


def skip_reason(tools):
    """None when running as root with every (tool, Debian package) of
    `tools` on PATH, else the reason to skip."""
    if os.geteuid() != 0:
        return ("rootful Podman needs root (this test runs as uid "
                f"{os.geteuid()})")
    for tool, package in tools:
        if not shutil.which(tool):
            return (f"{tool} is missing (Debian package {package}; "
                    "deploy/local/install-deps.sh installs it)")
    return None


def libtorch_dirs(binary):
    """The directories of the binary's RUNPATH that hold LibTorch and the
    wheel's nvidia libraries: site-packages/torch and site-packages/nvidia
    of the venv the build used (mounted read-only at the same path)."""
    out = run("readelf", "-d", binary).stdout
    m = re.search(r"R(?:UN)?PATH.*\[(.*)\]", out)
    dirs = set()
    for d in (m.group(1).split(":") if m else []):
        parts = d.split("/site-packages/")
        if len(parts) == 2 and os.path.isdir(d):
            top = parts[1].split("/")[0]
            dirs.add(os.path.join(parts[0], "site-packages", top))
    return sorted(dirs)


def setup(socket):
    """podman-setup.sh (containers.conf, the debootstrap base image), with
    --socket the Docker API socket too; returns the pid of the API service
    it started, or None (no socket asked for, or it was already
    answering)."""
    pid_file = "/run/podman/tandem-service.pid"
    already = socket and run("curl", "-sf", "--unix-socket", SOCKET,
                             "http://d/_ping", check=False).returncode == 0
    out = run("bash", os.path.join(COMPOSE_DIR, "podman-setup.sh"),
              *(["--socket"] if socket else []), timeout=600)
    print(out.stdout, end="", flush=True)
    if not socket or already:
        return None
    with open(pid_file) as f:
        return int(f.read())


def build_prebuilt_image(tmp, tag):
    """docker/Dockerfile.prebuilt with the binaries of bin_dir() (stripped
    of debug info), tagged `tag`."""
    stage = os.path.join(tmp, "image")
    os.makedirs(os.path.join(stage, "bin"))
    for p in PROGRAMS:
        src = os.path.join(bin_dir(), p)
        if not os.access(src, os.X_OK):
            raise AssertionError(f"{src} is missing: build it first "
                                 f"(deploy/local/build.sh)")
        run("strip", "--strip-debug", "-o", os.path.join(stage, "bin", p), src)
    for f in ("tandem-health", "tandem-entrypoint"):
        shutil.copy2(os.path.join(REPO, "docker", f), stage)
    t = time.monotonic()
    run("podman", "build", "-q", "-f",
        os.path.join(REPO, "docker", "Dockerfile.prebuilt"), "-t", tag,
        stage, timeout=900)
    size = int(run("podman", "image", "inspect", "--format", "{{.Size}}",
                   tag).stdout)
    log(f"image {tag}: {time.monotonic() - t:.0f} s, {size >> 20} MiB "
        "(LibTorch mounted, not included)")


def run_scenario(body, print_logs, teardown):
    """Runs `body()`; on an exception prints it and the daemons' logs
    (`print_logs()`), and always calls `teardown()`, which returns what it
    could not remove. Returns the test's exit code: 0 when the body passed
    and nothing was left behind, 1 otherwise (every failure printed)."""
    failed = None
    leftovers = []
    try:
        body()
    except Exception as e:  # noqa: BLE001 - reported, then teardown
        failed = e
        try:
            print_logs()
        except Exception:  # noqa: BLE001
            pass
    finally:
        leftovers = teardown()
    if failed:
        print(f"FAIL: {failed}", flush=True)
    for f in leftovers:
        print(f"FAIL: {f}", flush=True)
    log("done" if not failed and not leftovers else "failed")
    return 1 if failed or leftovers else 0
