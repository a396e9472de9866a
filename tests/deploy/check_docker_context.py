"""The CPU image's build context is enough to configure the build: the
repository minus what docker/Dockerfile.dockerignore excludes is copied to a
temporary directory and configured with the Dockerfile's CMake options
(tests off, CUDA off as in the Debian image, the torch wheel of the venv
that runs this script in place of the image's /opt/tandem/venv); the six executables the
Dockerfile builds must be targets.

    .venv/bin/python check_docker_context.py [CMAKE]"""

import os
import re
import shutil
import subprocess
import sys
import tempfile

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import common  # noqa: E402
from check_dockerfiles import ignored, read_ignore  # noqa: E402

TARGETS = ("tandem-coordinator", "tandem-rollout", "tandem-verifier",
           "tandem-trainer", "tandemctl", "tandem-model", "tandem-local")


def context_files(patterns):
    """Files of the checkout (tracked and untracked, not git-ignored) that
    the build context keeps."""
    r = subprocess.run(["git", "-C", common.REPO, "ls-files", "-co",
                        "--exclude-standard"], capture_output=True, text=True)
    if r.returncode == 0:
        files = r.stdout.split("\n")
    else:  # not a git checkout
        files = []
        for root, dirs, names in os.walk(common.REPO):
            dirs[:] = [d for d in dirs if d not in (".git", "build")]
            files += [os.path.relpath(os.path.join(root, n), common.REPO)
                      for n in names]
    return [f for f in files if f and not ignored(f, patterns) and
            os.path.isfile(os.path.join(common.REPO, f))]


def main():
    cmake = sys.argv[1] if len(sys.argv) > 1 else shutil.which("cmake")
    ninja = shutil.which("ninja")
    fail = common.Failures()
    with open(os.path.join(common.DOCKER_DIR, "Dockerfile")) as f:
        dockerfile = f.read()
    # The targets the Dockerfile builds are the ones checked here.
    built = re.search(r"--target\s*\\?\s*([^&]+)&&", dockerfile)
    fail.check(built and set(built.group(1).replace("\\", " ").split()) ==
               set(TARGETS), "Dockerfile builds other targets than "
               f"{TARGETS}")
    patterns = read_ignore(os.path.join(common.DOCKER_DIR,
                                        "Dockerfile.dockerignore"))
    files = context_files(patterns)
    with tempfile.TemporaryDirectory(prefix="tandem-docker-ctx-") as tmp:
        src = os.path.join(tmp, "src")
        for f in files:
            os.makedirs(os.path.dirname(os.path.join(src, f)), exist_ok=True)
            shutil.copy2(os.path.join(common.REPO, f), os.path.join(src, f))
        print(f"context: {len(files)} files")
        build = os.path.join(tmp, "build")
        r = subprocess.run(
            [cmake, "-S", src, "-B", build, "-G", "Ninja",
             "-DCMAKE_BUILD_TYPE=RelWithDebInfo", "-DTANDEM_BUILD_TESTS=OFF",
             "-DTANDEM_ENABLE_CUDA=OFF", "-DTANDEM_ENABLE_NCCL=OFF",
             # The image makes /opt/tandem/venv with the torch wheel; the
             # project's venv that runs this script stands in for it.
             f"-DTANDEM_PYTHON={sys.executable}"],
            capture_output=True, text=True)
        if not fail.check(r.returncode == 0, "cmake configure of the build "
                          "context failed:\n" + r.stdout[-3000:] +
                          r.stderr[-3000:]):
            fail.exit("docker context")
        targets = subprocess.run([ninja, "-C", build, "-t", "targets", "all"],
                                 capture_output=True, text=True).stdout
        names = {line.split(":")[0] for line in targets.splitlines()}
        for t in TARGETS:
            fail.check(t in names, f"target {t} missing from the context's "
                       "build")
    fail.exit("docker context")


if __name__ == "__main__":
    main()
