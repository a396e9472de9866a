#!/usr/bin/env python3
"""Where a trainer's CPU samples go, from a DWARF call-graph perf record.

LibTorch has no frame pointers, so `perf record -g` cannot say which of
Tandem's calls a LibTorch kernel ran for; `--call-graph dwarf` can, but
`perf report` on it is slow. This reads `perf script` output instead and
prints (1) the share of samples by leaf kernel, (2) by phase of the
trainer's step (forward, the backward's nodes, AdamW, publishing), and
(3) for the copy, add and fill kernels, the LibTorch op or autograd node
that ran them and the innermost Tandem function above it.

    perf record -F 99 --call-graph dwarf,16384 -p <tandem-trainer pid> \\
        -o trainer.data -- sleep 8
    perf script -i trainer.data --no-inline -F tid,comm,ip,sym > trainer.txt
    python3 tests/bench/perf_phases.py trainer.txt

(docs/peer-trl.md, "The trainer's step rate".) MKL's kernels do not
unwind, so their samples are counted as MKL without a caller.
"""

import collections
import re
import sys

LEAVES = ["direct_copy_kernel", "add_kernel", "fill_kernel", "mul_kernel",
          "mkl_blas", "softmax", "malloc", "free", "memmove", "sha256"]

PHASES = [
    # (phase, a regex any frame of the sample matches), first match wins.
    ("MKL sgemm (kernel + packing; caller not unwound)", None),
    ("backward: CopySlices (in-place copies into views)", r"CopySlices"),
    ("backward: SliceBackward0 (narrow/slice views)",
     r"slice_backward|SliceBackward"),
    ("backward: gradient accumulation (InputBuffer::add)",
     r"InputBuffer::add"),
    ("backward: other nodes", r"autograd::Engine::"),
    ("AdamW step", r"AdamW::step"),
    ("clip_grad_norm_", r"clip_grad_norm"),
    ("publish (weights check, flatten, sha256, store)",
     r"StoreVersion|SnapshotWeights|CheckedMasterWeights|Publish"),
    ("checkpoint", r"Checkpoint"),
    ("forward (model)", r"ForwardPackedHidden"),
    ("forward (log-probs, loss)", r"ComputeTokenLogProbs|ComputeGrpoLoss"),
    ("GrpoTrainer::Step, other", r"GrpoTrainer::Step"),
]


def read_samples(path):
    samples, frames = [], None
    with open(path, errors="replace") as f:
        for line in f:
            if not line.strip():
                if frames:
                    samples.append(frames)
                frames = None
            elif not line[0].isspace():
                frames = []
            elif frames is not None:
                parts = line.strip().split(" ", 1)
                frames.append(parts[1] if len(parts) > 1 else "?")
    if frames:
        samples.append(frames)
    return samples


def leaf(frames):
    for name in LEAVES:
        if name in frames[0]:
            return name
    return "other"


def phase(frames):
    if "mkl_blas" in frames[0]:
        return PHASES[0][0]
    joined = " ".join(frames)
    for name, pattern in PHASES[1:]:
        if re.search(pattern, joined):
            return name
    return "other"


def short(frame):
    return re.sub(r"\(.*", "", re.sub(r"<.*", "", frame))[:70]


def op_and_caller(frames):
    """The outermost LibTorch op or autograd node below Tandem's frames,
    and the innermost Tandem function."""
    op = "-"
    for frame in frames:
        if "tandem::" in frame:
            return op, short(frame)
        m = re.search(r"at::_ops::(\w+)::call", frame)
        if m:
            op = "op " + m.group(1)
        m = re.search(r"torch::autograd::(generated::\w+|CopySlices)::apply",
                      frame)
        if m:
            op = "node " + m.group(1).replace("generated::", "")
        m = re.search(r"torch::autograd::InputBuffer::add", frame)
        if m:
            op = "InputBuffer::add"
    return op, "-"


def table(title, counter, total, limit=25):
    print(f"\n{title}")
    for key, count in counter.most_common(limit):
        print(f"  {100.0 * count / total:5.1f}%  {key}")


def main():
    if len(sys.argv) != 2:
        sys.exit(__doc__)
    samples = [s for s in read_samples(sys.argv[1]) if s]
    total = len(samples)
    if total == 0:
        sys.exit("no samples")
    print(f"{total} samples")
    table("by leaf kernel", collections.Counter(leaf(s) for s in samples),
          total)
    table("by phase of the step",
          collections.Counter(phase(s) for s in samples), total)
    for name in ["direct_copy_kernel", "add_kernel", "fill_kernel"]:
        counter = collections.Counter()
        for s in samples:
            if name in s[0]:
                op, caller = op_and_caller(s)
                counter[f"{op:38s} <- {caller}"] += 1
        table(f"{name}: op or autograd node <- Tandem function", counter,
              total, 8)


if __name__ == "__main__":
    main()
