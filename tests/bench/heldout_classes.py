#!/usr/bin/env python3
"""Where a policy of the built-in task fails: held-out accuracy by class.

The demo's held-out set (`tandem-model task --split heldout`, the trainer's
2048 problems with eval.seed 0) has operands uniform in [0, 1000), so about
one problem in five has an operand of one or two digits ("892+5=",
"15+687="). This script splits the set into those two classes and reports,
for each policy given (a Hugging Face directory: the warm start, a
checkpoint's export, checkpoints/best), loaded with `transformers`:

  - greedy exact match (the trainer's held-out metric);
  - with --samples K: K completions per problem at temperature 1, the
    mean sampled accuracy and the share of problems whose K samples all
    failed (a GRPO group of K carries no signal then) or all passed.

  .venv/bin/python tests/bench/heldout_classes.py --bin-dir build/bin \\
      ~/.cache/tandem/warm-start/arith3-add RUN/checkpoints/best

See docs/demo.md ("What limits the demo") for what it showed.
"""

import argparse
import collections
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import peer_trl  # noqa: E402  (the shared task export and model loader)


def operand_class(problem):
    a, b = problem["prompt"].rstrip("=").split("+")
    return "both operands 3 digits" if len(a) == 3 and len(b) == 3 \
        else "an operand of 1-2 digits"


def completions(model, tokenizer, prompts, samples):
    """Greedy (samples 0) or `samples` sampled completions per prompt, as
    text up to <|eos|> (None when the model did not stop)."""
    import torch
    eos_id = tokenizer.convert_tokens_to_ids(peer_trl.EOS)
    bos_id = tokenizer.convert_tokens_to_ids(peer_trl.BOS)
    pad_id = tokenizer.convert_tokens_to_ids(peer_trl.PAD)
    ids = [[bos_id] + tokenizer(p, add_special_tokens=False)["input_ids"]
           for p in prompts]
    assert len({len(x) for x in ids}) == 1, "one prompt length per call"
    x = torch.tensor(ids)
    reps = max(samples, 1)
    x = x.repeat_interleave(reps, 0)
    with torch.inference_mode():
        kwargs = dict(do_sample=True, temperature=1.0, top_p=None,
                      top_k=None) if samples else dict(do_sample=False)
        out = model.generate(input_ids=x, attention_mask=torch.ones_like(x),
                             max_new_tokens=5, eos_token_id=eos_id,
                             pad_token_id=pad_id, **kwargs)
    texts = []
    for row in out[:, x.shape[1]:].tolist():
        texts.append(tokenizer.decode(row[:row.index(eos_id)])
                     if eos_id in row else None)
    return [texts[i * reps:(i + 1) * reps] for i in range(len(prompts))]


def profile(model_dir, problems, samples, batch=256):
    import torch
    torch.manual_seed(1)
    model, tokenizer = peer_trl.load_hf(model_dir)
    by_length = collections.defaultdict(list)
    for p in problems:
        by_length[len(p["prompt"])].append(p)
    stats = collections.defaultdict(collections.Counter)
    for group in by_length.values():
        for begin in range(0, len(group), batch):
            chunk = group[begin:begin + batch]
            prompts = [p["prompt"] for p in chunk]
            greedy = completions(model, tokenizer, prompts, 0)
            sampled = (completions(model, tokenizer, prompts, samples)
                       if samples else [[]] * len(chunk))
            for p, g, s in zip(chunk, greedy, sampled):
                c = stats[operand_class(p)]
                c["n"] += 1
                c["greedy"] += g[0] == p["answer"]
                if samples:
                    right = sum(t == p["answer"] for t in s)
                    c["sampled"] += right / samples
                    c["all_failed"] += right == 0
                    c["all_passed"] += right == samples
    return stats


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("models", nargs="+", help="Hugging Face directories")
    parser.add_argument("--bin-dir", default="build/bin")
    parser.add_argument("--problems", type=int,
                        default=peer_trl.HELDOUT_PROBLEMS)
    parser.add_argument("--samples", type=int, default=8,
                        help="completions per problem at temperature 1 "
                        "(0: greedy only)")
    parser.add_argument("--work-dir", default="/tmp/heldout-classes")
    args = parser.parse_args()
    os.makedirs(args.work_dir, exist_ok=True)
    problems = peer_trl.export_task(
        args.bin_dir, "heldout", args.problems,
        os.path.join(args.work_dir, "heldout.jsonl"))
    columns = "| policy | class | problems | greedy |"
    rule = "|---|---|---|---|"
    if args.samples:
        columns += (f" sampled (T 1) | all {args.samples} failed |"
                    f" all {args.samples} passed |")
        rule += "---|---|---|"
    print(columns)
    print(rule)
    for model_dir in args.models:
        stats = profile(model_dir, problems, args.samples)
        total = collections.Counter()
        for c in stats.values():
            total.update(c)
        for name, c in sorted(stats.items()) + [("all", total)]:
            n = c["n"]
            row = (f"| {model_dir} | {name} | {n} ({n / len(problems):.0%}) |"
                   f" {c['greedy'] / n:.1%} |")
            if args.samples:
                row += (f" {c['sampled'] / n:.1%} | {c['all_failed'] / n:.1%}"
                        f" | {c['all_passed'] / n:.1%} |")
            print(row, flush=True)


if __name__ == "__main__":
    main()
