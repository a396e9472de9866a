"""docs/config-reference.md and docs/metrics-reference.md are up to date:
regenerates both with docs/gen_reference.py from the built binaries
($TANDEM_BIN_DIR, default build/bin) into a temporary directory and fails
with a diff and the command that regenerates them when either differs from
the committed file."""

import difflib
import os
import shutil
import subprocess
import sys
import tempfile

REPO = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", ".."))
GENERATOR = os.path.join(REPO, "docs", "gen_reference.py")
FILES = ("config-reference.md", "metrics-reference.md")
REGENERATE = "/usr/bin/python3 docs/gen_reference.py --bin build/bin"


def main():
    bin_dir = os.environ.get("TANDEM_BIN_DIR",
                             os.path.join(REPO, "build", "bin"))
    out = tempfile.mkdtemp(prefix="tandem-docs-check-")
    try:
        run = subprocess.run([sys.executable, GENERATOR, "--bin", bin_dir,
                              "--out", out], capture_output=True, text=True,
                             timeout=600)
        if run.returncode != 0:
            print(run.stdout + run.stderr)
            print(f"FAIL docs/gen_reference.py exited {run.returncode}")
            return 1
        stale = []
        for name in FILES:
            committed_path = os.path.join(REPO, "docs", name)
            try:
                with open(committed_path) as f:
                    committed = f.read()
            except OSError:
                committed = ""
            with open(os.path.join(out, name)) as f:
                generated = f.read()
            if committed != generated:
                stale.append(name)
                sys.stdout.writelines(difflib.unified_diff(
                    committed.splitlines(keepends=True),
                    generated.splitlines(keepends=True),
                    f"docs/{name} (committed)", f"docs/{name} (generated)"))
        if stale:
            print(f"FAIL out of date: {', '.join('docs/' + n for n in stale)}"
                  f"\nRegenerate from the repository root after building:\n"
                  f"  {REGENERATE}")
            return 1
        print("docs references: ok")
        return 0
    finally:
        shutil.rmtree(out, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main())
