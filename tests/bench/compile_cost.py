#!/usr/bin/env python3
"""CPU seconds (user + sys) of compiling translation units in two build trees.

Runs each unit's compile_commands.json entry from the --before tree, then
from the --after tree, unit by unit, so that both see the same machine load
(these machines are shared), and prints the ratio after / before. Object
files go to a temporary folder; the trees are not changed (their
precompiled headers must already be built).

    python3 tests/bench/compile_cost.py --before OLD/build --after build \\
        services/trainer/rl/grpo_trainer.cc engine/torch_engine_model.cc
"""
import argparse
import json
import os
import resource
import shlex
import subprocess
import sys
import tempfile


def entry(build, unit):
    with open(os.path.join(build, "compile_commands.json")) as f:
        for e in json.load(f):
            if e["file"].endswith(unit):
                return e
    sys.exit(f"{unit}: not in {build}/compile_commands.json")


def cpu_seconds(e, out):
    args = shlex.split(e["command"])
    args[args.index("-o") + 1] = out
    # Dependency files would land next to the tree's objects.
    args = [a for a in args if a not in ("-MD", "-MMD")]
    while "-MF" in args:
        i = args.index("-MF")
        del args[i:i + 2]
    while "-MT" in args:
        i = args.index("-MT")
        del args[i:i + 2]
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    r = subprocess.run(args, cwd=e["directory"], capture_output=True, text=True)
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    if r.returncode != 0:
        sys.exit(f"{e['file']}: compile failed:\n{r.stderr[-2000:]}")
    if "not used because" in r.stderr:
        print(f"warning: {e['file']}: precompiled header not used: "
              f"{r.stderr.strip()[-300:]}", file=sys.stderr)
    return (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--before", required=True, help="build dir (baseline)")
    parser.add_argument("--after", required=True, help="build dir (changed)")
    parser.add_argument("units", nargs="+", help="source paths (suffixes)")
    a = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        out = os.path.join(tmp, "unit.o")
        for unit in a.units:
            old = cpu_seconds(entry(a.before, unit), out)
            new = cpu_seconds(entry(a.after, unit), out)
            print(f"{unit:55s} before {old:6.1f} s  after {new:6.1f} s  "
                  f"after/before {new / old:.2f}", flush=True)


if __name__ == "__main__":
    main()
