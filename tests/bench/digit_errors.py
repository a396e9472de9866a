#!/usr/bin/env python3
"""Which digits of 3-digit sums a model gets wrong (docs/sft.md).

Greedy-completes N random problems "a+b=" (a, b uniform in [0, 1000),
seed 1) with `tandemctl generate` and counts, per digit position of the
true sum (0 = units), the answers whose digit there is wrong or missing.

  tests/bench/digit_errors.py MODEL_DIR [--n 300] [--bin build/bin]
"""

import argparse
import collections
import json
import os
import random
import subprocess


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("model")
    parser.add_argument("--n", type=int, default=300)
    parser.add_argument("--bin", default="build/bin")
    args = parser.parse_args()
    tandemctl = os.path.join(args.bin, "tandemctl")
    rng = random.Random(1)
    exact = 0
    wrong = collections.Counter()
    for _ in range(args.n):
        a, b = rng.randrange(1000), rng.randrange(1000)
        out = subprocess.run(
            [tandemctl, "generate", "--model", args.model,
             "--prompt", f"<|bos|>{a}+{b}=", "--max-tokens", "6"],
            capture_output=True, text=True, check=True).stdout
        got = json.loads(out)["text"]
        want = str(a + b)
        exact += got == want
        for k in range(len(want)):
            if k >= len(got) or want[::-1][k] != got[::-1][k]:
                wrong[k] += 1
    names = ["units", "tens", "hundreds", "thousands"]
    print(f"exact {exact}/{args.n} ({100 * exact / args.n:.1f}%)")
    for k in sorted(wrong):
        print(f"{names[k]} digit wrong in {wrong[k]} of {args.n}")


if __name__ == "__main__":
    main()
