"""The full multi-stage docker/Dockerfile built for real with rootful Podman
(issue 24 item 1), then the compose stack run on it.

    TANDEM_FULL_IMAGE_BUILD=1 python3 tests/deploy/test_image_full.py   # root
    TANDEM_FULL_IMAGE_BUILD=1 ctest -R deploy_image_full --output-on-failure

1. deploy/compose/podman-setup.sh: containers.conf, the debootstrap base
   image tagged debian:bookworm-slim (once).
2. `podman build -f docker/Dockerfile -t tandem:cpu .` from the repository
   root: the builder stage installs the -dev packages and the torch wheel
   (from PyPI) and compiles the daemons; the runtime stage's smoke test runs
   every binary. Prints the build's wall time and the image's size.
3. tests/deploy/test_compose_stack.py with TANDEM_COMPOSE_IMAGE=tandem:cpu:
   the same stack, scaling, kill, Prometheus and counts on the image a user
   would run, with nothing mounted from the host.

The image stays in Podman's store (a second run reuses its layers); remove
it with `podman rmi tandem:cpu`. Not in the default test run: without
TANDEM_FULL_IMAGE_BUILD=1 it skips (exit 77), as it does without root or
podman. Exit 0 on success, 1 on a failure."""

import os
import shutil
import subprocess
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.abspath(os.path.join(HERE, "..", ".."))
IMAGE = "tandem:cpu"
SKIP = 77
MIN_FREE_GIB = 15


def host_pip_cert_volumes():
    """`podman build` volumes that give the builder's pip this host's CA
    bundle when the host's pip is told to use one (PIP_CERT, as where PyPI
    is reached through a TLS-inspecting proxy): the bundle at a path of its
    own and a pip.conf naming it, present during RUN steps only, never in
    the image. Nothing on a host that needs none."""
    cert = os.environ.get("PIP_CERT", "")
    if not cert or not os.path.isfile(cert):
        return []
    conf = os.path.join(REPO, "build", "tandem-image-pip.conf")
    os.makedirs(os.path.dirname(conf), exist_ok=True)
    with open(conf, "w") as f:
        f.write("[global]\ncert = /etc/tandem-host-ca.crt\n")
    return ["--volume", f"{os.path.realpath(cert)}:/etc/tandem-host-ca.crt:ro",
            "--volume", f"{conf}:/etc/pip.conf:ro"]


def main():
    if os.environ.get("TANDEM_FULL_IMAGE_BUILD") != "1":
        print("SKIP: the full image build compiles everything (~12 min on 2 "
              "cores); set TANDEM_FULL_IMAGE_BUILD=1 to run it")
        return SKIP
    if os.geteuid() != 0:
        print(f"SKIP: rootful Podman needs root (uid {os.geteuid()})")
        return SKIP
    if not shutil.which("podman"):
        print("SKIP: podman is missing (deploy/local/install-deps.sh)")
        return SKIP
    # The builder stage holds the torch wheel with its CUDA libraries
    # (5.1 GB installed, as the project venv), the runtime stage a copy,
    # and committing a layer stages it under /var/tmp first.
    for path in ("/var/lib/containers", "/var/tmp"):
        st = os.statvfs(path)
        free = st.f_bavail * st.f_frsize / 2**30
        if free < MIN_FREE_GIB:
            print(f"SKIP: {path} has {free:.1f} GiB free; the full image build "
                  f"needs about {MIN_FREE_GIB} GiB")
            return SKIP
    subprocess.run(["bash", os.path.join(REPO, "deploy", "compose",
                                         "podman-setup.sh")], check=True)
    jobs = os.environ.get("TANDEM_IMAGE_BUILD_JOBS", str(os.cpu_count() or 2))
    started = time.monotonic()
    build = subprocess.run(
        ["podman", "build", "-f", "docker/Dockerfile", "-t", IMAGE,
         "--build-arg", f"BUILD_JOBS={jobs}", *host_pip_cert_volumes(), "."],
        cwd=REPO)
    took = time.monotonic() - started
    if build.returncode != 0:
        print(f"FAIL: podman build -f docker/Dockerfile exited "
              f"{build.returncode} after {took:.0f} s")
        return 1
    size = int(subprocess.run(
        ["podman", "image", "inspect", "--format", "{{.Size}}", IMAGE],
        capture_output=True, text=True, check=True).stdout)
    print(f"image {IMAGE}: built in {took:.0f} s, {size / 2**30:.2f} GiB",
          flush=True)
    stack = subprocess.run(
        [sys.executable, os.path.join(HERE, "test_compose_stack.py")],
        env=dict(os.environ, TANDEM_COMPOSE_IMAGE=IMAGE))
    return 0 if stack.returncode == 0 else 1


if __name__ == "__main__":
    sys.exit(main())
