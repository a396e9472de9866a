"""docker/: both Dockerfiles pass dockerfile-utils' linter; files they COPY
from the build context exist and are not excluded by the .dockerignore
files; the builder installs every library package of
deploy/local/install-deps.sh; every Debian package the CPU runtime stage
installs exists in Debian 12 (apt-cache, when package lists are present);
the runtime runs as a non-root user; the entrypoint resolves auto:PORT.

    /usr/bin/python3 check_dockerfiles.py NODE_MODULES_PARENT"""

import fnmatch
import os
import re
import shutil
import subprocess
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import common  # noqa: E402

HERE = os.path.dirname(os.path.abspath(__file__))
DOCKERFILES = ("Dockerfile", "Dockerfile.cuda")


def instructions(text):
    """(stage, keyword, arguments) with continuation lines joined."""
    text = re.sub(r"\\\n", " ", text)
    stage = None
    for line in text.splitlines():
        line = line.strip()
        if not line or line.startswith("#"):
            continue
        keyword, _, args = line.partition(" ")
        keyword = keyword.upper()
        if keyword == "FROM":
            m = re.search(r"\bAS\s+(\S+)", args, re.I)
            stage = m.group(1) if m else None
        yield stage, keyword, args.strip()


def apt_packages(args):
    """Package names of `apt-get install` commands in a RUN line."""
    names = []
    for command in re.split(r"&&|;", args):
        words = command.split()
        if "apt-get" in words and "install" in words:
            for w in words[words.index("install") + 1:]:
                if not w.startswith("-"):
                    names.append(w)
    return names


def ignored(path, patterns):
    """Whether a .dockerignore excludes path (relative to the context): a
    pattern matches the path or one of its parent directories; "**/"
    matches any number of directories; the last matching pattern wins."""
    parts = path.split("/")
    prefixes = ["/".join(parts[:i]) for i in range(1, len(parts) + 1)]
    excluded = False
    for p in patterns:
        negate = p.startswith("!")
        p = p.lstrip("!").rstrip("/")
        variants = {p}
        if p.startswith("**/"):
            variants.add(p[3:])
            variants.add("*/" + p[3:])
        hit = any(fnmatch.fnmatch(prefix, v) or
                  (v.startswith("*/") and fnmatch.fnmatch(prefix, "*" + v))
                  for prefix in prefixes for v in variants)
        if hit:
            excluded = not negate
    return excluded


def read_ignore(path):
    with open(path) as f:
        return [line.strip() for line in f
                if line.strip() and not line.startswith("#")]


def install_deps_libraries():
    with open(os.path.join(common.REPO, "deploy", "local",
                           "install-deps.sh")) as f:
        text = f.read()
    block = re.search(r"#\s*libraries\n(.*?)\n\s*#", text, re.S)
    return block.group(1).split() if block else []


def check_runtime_libraries(fail, apt_cache):
    """Every shared library the built binaries ($TANDEM_BIN_DIR) load comes
    from a package the CPU runtime stage installs, or from one of their
    dependencies (or from the base image's essential packages)."""
    bin_dir = os.environ.get("TANDEM_BIN_DIR", "")
    binaries = [os.path.join(bin_dir, b) for b in
                ("tandem-coordinator", "tandem-rollout", "tandem-verifier",
                 "tandem-trainer", "tandemctl", "tandem-local")]
    if not apt_cache or not shutil.which("dpkg") or \
            not all(os.access(b, os.X_OK) for b in binaries):
        print("runtime libraries: skipped (no binaries in TANDEM_BIN_DIR "
              "or no dpkg/apt-cache)")
        return
    libraries = set()
    for b in binaries:
        out = subprocess.run(["ldd", b], capture_output=True,
                             text=True).stdout
        libraries.update(os.path.realpath(m) for m in
                         re.findall(r"=> (/\S+)", out))
    owners = {}
    # With merged /usr, dpkg may know a library under /lib instead.
    candidates = sorted(libraries | {lib[len("/usr"):] for lib in libraries
                                     if lib.startswith("/usr/")})
    r = subprocess.run(["dpkg", "-S", *candidates],
                       capture_output=True, text=True)
    for line in r.stdout.splitlines():
        package, _, path = line.partition(": ")
        owners[path] = package.split(":")[0]
        owners["/usr" + path] = owners.get("/usr" + path, owners[path])
    with open(os.path.join(common.DOCKER_DIR, "Dockerfile")) as f:
        stages = {}
        for stage, keyword, args in instructions(f.read()):
            if keyword == "RUN":
                stages.setdefault(stage, []).extend(apt_packages(args))
    runtime = stages.get("runtime", [])
    r = subprocess.run(
        [apt_cache, "depends", "--recurse", "--no-recommends",
         "--no-suggests", "--no-conflicts", "--no-breaks", "--no-replaces",
         "--no-enhances", *runtime], capture_output=True, text=True)
    closure = {line.strip() for line in r.stdout.splitlines()
               if not line.startswith(" ")}
    # Essential packages of every Debian image.
    closure.update({"libc6", "libgcc-s1", "libstdc++6", "zlib1g"})
    for lib in sorted(libraries):
        package = owners.get(lib)
        if package is None:
            # Not from a Debian package (e.g. /usr/local/cuda): the CUDA
            # image handles those.
            print(f"runtime libraries: {lib} is not from a package")
            continue
        fail.check(package in closure,
                   f"Dockerfile: runtime stage lacks {package} ({lib})")
    print(f"runtime libraries: {len(libraries)} libraries of the binaries "
          "checked against the runtime stage")


def main():
    fixture = sys.argv[1] if len(sys.argv) > 1 else None
    fail = common.Failures()
    node = common.need("node", "nodejs")
    paths = [os.path.join(common.DOCKER_DIR, d) for d in DOCKERFILES]
    if fail.check(fixture is not None, "no npm fixture: lint not run"):
        result = subprocess.run(
            [node, os.path.join(HERE, "lint_dockerfiles.mjs"),
             os.path.join(fixture, "node_modules"), *paths],
            capture_output=True, text=True)
        print(result.stdout + result.stderr, end="")
        fail.check(result.returncode == 0, "dockerfile-utils lint")

    libraries = install_deps_libraries()
    fail.check(libraries, "could not read the library list of install-deps.sh")
    apt_cache = shutil.which("apt-cache")
    for name, path in zip(DOCKERFILES, paths):
        with open(path) as f:
            text = f.read()
        ignore = read_ignore(os.path.join(common.DOCKER_DIR,
                                          name + ".dockerignore"))
        stages = {}
        for stage, keyword, args in instructions(text):
            stages.setdefault(stage, []).append((keyword, args))
            if keyword in ("COPY", "ADD") and "--from=" not in args:
                sources = [a for a in args.split()[:-1]
                           if not a.startswith("--")]
                for s in sources:
                    if "://" in s or "$" in s:
                        continue
                    if s == ".":
                        continue
                    fail.check(os.path.exists(os.path.join(common.REPO, s)),
                               f"{name}: COPY source {s} does not exist")
                    fail.check(not ignored(s, ignore),
                               f"{name}: COPY source {s} is excluded by "
                               f"{name}.dockerignore")
        fail.check({"builder", "runtime"} <= set(stages),
                   f"{name}: stages {sorted(s for s in stages if s)}")
        runtime = stages.get("runtime", [])
        users = [a for k, a in runtime if k == "USER"]
        fail.check(users and users[-1].split(":")[0] not in ("0", "root"),
                   f"{name}: runtime stage does not switch to a non-root user")
        fail.check(not any("-dev" in p for k, a in runtime if k == "RUN"
                           for p in apt_packages(a)),
                   f"{name}: runtime stage installs -dev packages")
        fail.check(any(k == "HEALTHCHECK" for k, _ in runtime) or
                   "tandem-health" in text,
                   f"{name}: no health probe in the image")
        builder_packages = [p for k, a in stages.get("builder", [])
                            if k == "RUN" for p in apt_packages(a)]
        for lib in libraries:
            if name == "Dockerfile.cuda" and lib == "libtorch-dev":
                continue  # the official CUDA LibTorch replaces it
            fail.check(lib in builder_packages,
                       f"{name}: builder lacks {lib} (install-deps.sh)")
        if name == "Dockerfile" and apt_cache:
            wanted = [p for stage in ("builder", "runtime")
                      for k, a in stages.get(stage, []) if k == "RUN"
                      for p in apt_packages(a)]
            # One apt-cache call; it prints the records of the packages it
            # knows (and an error naming the others).
            r = subprocess.run([apt_cache, "show", "--no-all-versions",
                                *wanted], capture_output=True, text=True)
            known = set(re.findall(r"^Package: (\S+)$", r.stdout, re.M))
            for p in wanted:
                fail.check(p in known, f"{name}: Debian package {p} unknown "
                           "to apt-cache")

    check_runtime_libraries(fail, apt_cache)

    # The entrypoint resolves auto:PORT to a routable address.
    env = dict(os.environ, TANDEM_GRPC_ADDRESS="auto:50052")
    out = subprocess.run(
        ["sh", os.path.join(common.DOCKER_DIR, "tandem-entrypoint"), "sh",
         "-c", 'echo "$TANDEM_GRPC_ADDRESS"'],
        env=env, capture_output=True, text=True).stdout.strip()
    fail.check(re.fullmatch(r"(\d+\.\d+\.\d+\.\d+|\[[0-9a-fA-F:]+\]):50052",
                            out) is not None,
               f"tandem-entrypoint: auto:50052 became '{out}'")
    env["TANDEM_GRPC_ADDRESS"] = "0.0.0.0:1"
    out = subprocess.run(
        ["sh", os.path.join(common.DOCKER_DIR, "tandem-entrypoint"), "sh",
         "-c", 'echo "$TANDEM_GRPC_ADDRESS"'],
        env=env, capture_output=True, text=True).stdout.strip()
    fail.check(out == "0.0.0.0:1", f"tandem-entrypoint changed '{out}'")
    fail.exit("dockerfiles")


if __name__ == "__main__":
    main()
