"""The include layering of Tandem's sources (docs/architecture.md, "Layout"):

    kernels -> common/base <- common/* <- engine <- services/<daemon>

A file may include our headers from its own layer or a lower one, and no
daemon's folder includes another daemon's:

    kernels/           kernels/
    common/base/       kernels/, common/base/
    common/<x>/        kernels/, common/
    engine/            kernels/, common/, engine/
    services/<d>/      kernels/, common/, engine/, services/<d>/

Headers that are not ours (absl/, torch, generated tandem/v1/ protos, ...)
are not checked. Exit 0 when the tree keeps the rule, 1 with every offending
line (file:line: include) otherwise.

    python3 check_layering.py ROOT     check the tree at ROOT
    python3 check_layering.py --self-test
        check that the checker refuses each kind of crossing in a made-up tree
"""

import os
import re
import sys
import tempfile

OURS = ("kernels/", "common/", "engine/", "services/")
SOURCE_DIRS = ("kernels", "common", "engine", "services")
SUFFIXES = (".h", ".cc", ".cu", ".cuh")
INCLUDE = re.compile(r'^\s*#\s*include\s+"([^"]+)"')


def allowed_prefixes(path):
    """The include prefixes that `path` (relative to the root) may use."""
    parts = path.split("/")
    if parts[0] == "kernels":
        return ("kernels/",)
    if parts[0] == "common":
        if len(parts) > 2 and parts[1] == "base":
            return ("kernels/", "common/base/")
        return ("kernels/", "common/")
    if parts[0] == "engine":
        return ("kernels/", "common/", "engine/")
    if parts[0] == "services" and len(parts) > 2:
        return ("kernels/", "common/", "engine/", f"services/{parts[1]}/")
    return ("kernels/", "common/", "engine/")


def violations(root):
    found = []
    for top in SOURCE_DIRS:
        for dirpath, _, names in os.walk(os.path.join(root, top)):
            for name in sorted(names):
                if not name.endswith(SUFFIXES):
                    continue
                full = os.path.join(dirpath, name)
                rel = os.path.relpath(full, root).replace(os.sep, "/")
                allowed = allowed_prefixes(rel)
                with open(full, encoding="utf-8", errors="replace") as f:
                    for number, line in enumerate(f, 1):
                        m = INCLUDE.match(line)
                        if not m:
                            continue
                        target = m.group(1)
                        if target.startswith(OURS) and \
                                not target.startswith(allowed):
                            found.append(f"{rel}:{number}: includes "
                                         f"\"{target}\"")
    return found


def self_test():
    crossings = {
        "services/trainer/a.cc": "services/rollout/b.h",
        "services/tandemctl/a.cc": "services/launcher/b.h",
        "engine/a.cc": "services/rollout/b.h",
        "common/model/a.cc": "engine/b.h",
        "common/base/a.h": "common/model/b.h",
        "kernels/a.cc": "common/base/b.h",
    }
    fine = {
        "services/trainer/ok.cc": ["services/trainer/x.h", "engine/e.h",
                                   "common/model/m.h", "kernels/k.h",
                                   "tandem/v1/trainer.pb.h"],
        "engine/ok.cc": ["engine/e.h", "common/model/m.h"],
        "common/model/ok.cc": ["common/task/t.h", "common/base/b.h"],
        "common/base/ok.cc": ["kernels/k.h"],
    }
    failures = []
    with tempfile.TemporaryDirectory() as root:
        def write(rel, includes):
            path = os.path.join(root, rel)
            os.makedirs(os.path.dirname(path), exist_ok=True)
            with open(path, "w") as f:
                f.writelines(f'#include "{i}"\n' for i in includes)
        for rel, includes in fine.items():
            write(rel, includes)
        if violations(root):
            failures.append(f"allowed includes refused: {violations(root)}")
        for rel, target in crossings.items():
            write(rel, [target])
            found = violations(root)
            if not any(v.startswith(rel + ":") for v in found):
                failures.append(f"{rel} including {target} not refused")
            os.remove(os.path.join(root, rel))
    for f in failures:
        print("self-test:", f)
    print(f"self-test: {len(crossings)} crossings refused"
          if not failures else "self-test FAILED")
    return 1 if failures else 0


def main(argv):
    if len(argv) == 2 and argv[1] == "--self-test":
        return self_test()
    if len(argv) != 2:
        print(__doc__)
        return 2
    found = violations(argv[1])
    for v in found:
        print(v)
    if found:
        print(f"{len(found)} includes cross the layering "
              "(tests/layering/check_layering.py says which may)")
        return 1
    print("layering: no include crosses a layer or another daemon's folder")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
