#!/usr/bin/env python3
"""The learning race: Tandem's asynchronous GRPO against TRL's GRPOTrainer.

Both systems start from Tandem's cached supervised warm start (the model
`tandem-local` starts RL from), train on the same 3-digit addition prompts
(exported by `tandem-model task --split train`, in the order Tandem's
coordinator hands them out) with the same exact-match reward and the same
GRPO settings where both have them, each for the same wall-clock budget,
one after the other on the same machine. Every minute each system's policy
is saved (Tandem: a copy of the trainer's latest checkpoint export,
<run>/checkpoints/latest/hf; TRL: save_pretrained from a callback). After
both runs, one evaluator scores every saved policy: greedy exact match on
the held-out problems the trainer's own evaluation uses
(`tandem-model task --split heldout`, services/trainer/heldout_eval.h),
decoded with `transformers` in float32.

Run (from a built checkout; installs nothing, see peer_trl.sh for that):
    python tests/bench/peer_trl.py [--minutes 10] [--bin-dir build/bin]
        [--work-dir /tmp/peer-trl] [--docs-dir docs] [--systems tandem,trl]
        [--try-async]

Prints the load average during each half, each system's throughput
(samples/s, generated tokens/s, optimizer steps), the held-out accuracy of
every saved policy, and the ratios issue 20 names: the time Tandem took to
reach TRL's final accuracy over TRL's time, and whether Tandem was ahead at
every minute. Writes docs/peer-trl.png (accuracy vs wall-clock seconds),
docs/peer-trl.csv (every evaluated policy) and docs/peer-trl-results.md
(the tables). With --try-async it also tries TRL's experimental
AsyncGRPOTrainer without a vLLM server and prints what happened.

Settings both share (Tandem's demo defaults, services/launcher/
embedded_config.cc): group size 8, 16 prompts (128 completions) per
optimizer step, AdamW lr 1e-4 constant (betas 0.9/0.999, no weight decay),
gradient-norm clip 1.0, temperature 1.0 without top-k/top-p, at most 6
completion tokens (Tandem's default for 3-digit problems), no KL penalty
(beta 0), PPO clip 0.2 below and 0.28 above, group-normalised advantages
((r - mean) / std), token-level loss normalisation, float32 weights.
"""

import argparse
import csv
import json
import os
import re
import shutil
import subprocess
import sys
import time

GROUP_SIZE = 8
PROMPTS_PER_STEP = 16
LEARNING_RATE = 1e-4
MAX_COMPLETION_TOKENS = 6  # the coordinator's default for 3 digits: digits + 3
TEMPERATURE = 1.0
KL_BETA = 0.0
CLIP_LOW = 0.2
CLIP_HIGH = 0.28
HELDOUT_PROBLEMS = 2048  # the trainer's eval.problems
TASK_SEED = 0  # dataset.seed and eval.seed of the demo
BOS, EOS, PAD = "<|bos|>", "<|eos|>", "<|pad|>"


def log(message):
    print(f"[{time.strftime('%H:%M:%S')}] {message}", flush=True)


# ---------------------------------------------------------------- the task


def export_task(bin_dir, split, count, path):
    """Writes `tandem-model task` JSONL to `path` and returns its problems."""
    with open(path, "w") as out:
        subprocess.run(
            [os.path.join(bin_dir, "tandem-model"), "task", "--split", split,
             "--count", str(count), "--seed", str(TASK_SEED), "--digits", "3",
             "--subtraction", "false"],
            stdout=out, check=True)
    with open(path) as f:
        return [json.loads(line) for line in f]


def canonical_integer(text):
    """'-?[0-9]+' without leading zeros (and no '-0'), else None."""
    negative = text.startswith("-")
    digits = text[1:] if negative else text
    if not digits or not digits.isdigit():
        return None
    digits = digits.lstrip("0") or "0"
    return ("-" if negative and digits != "0" else "") + digits


def arith_reward(completion_text, answer):
    """The `arith` verifier's rule (services/verifier/scoring/arith_scorer.h):
    cut at the first newline or end marker, trim, compare as integers."""
    end = len(completion_text)
    for marker in ("\n", EOS, "</s>", "<|endoftext|>", "<|im_end|>",
                   "<|eot_id|>", "<eos>", "<|end|>"):
        found = completion_text.find(marker)
        if found != -1:
            end = min(end, found)
    got = canonical_integer(completion_text[:end].strip(" \t\r"))
    return 1.0 if got is not None and got == canonical_integer(answer) else 0.0


# ---------------------------------------------------------------- evaluator


def load_hf(model_dir):
    """The policy and tokenizer as `transformers` loads them (float32).
    The tokenizer is PreTrainedTokenizerFast from tokenizer.json and
    tokenizer_config.json: AutoTokenizer would pick Qwen2Tokenizer for
    config.json's model_type qwen2 (transformers 5 forces that class for
    qwen2), which swaps in Qwen's pre-tokenizer and adds <|endoftext|>
    beyond the model's 17-token vocabulary."""
    import torch
    from transformers import AutoModelForCausalLM, PreTrainedTokenizerFast
    tokenizer = PreTrainedTokenizerFast.from_pretrained(model_dir)
    if tokenizer.eos_token != EOS or tokenizer.pad_token != PAD:
        sys.exit(f"{model_dir}: tokenizer_config.json gives eos "
                 f"{tokenizer.eos_token!r} and pad {tokenizer.pad_token!r}, "
                 f"want {EOS!r} and {PAD!r} (rebuild Tandem: its exports "
                 "write tokenizer_config.json)")
    model = AutoModelForCausalLM.from_pretrained(model_dir,
                                                 dtype=torch.float32)
    model.eval()
    return model, tokenizer


def evaluate(model_dir, problems, batch_size=512):
    """Greedy exact match, as services/trainer/tools/sft/sft_eval.cc scores it:
    prompt [<|bos|>] + "a+b=", at most digits + 2 new tokens, correct when
    the model stops with <|eos|> and the tokens before it spell the answer.
    Problems are batched by prompt length, so no padding is involved."""
    import torch
    model, tokenizer = load_hf(model_dir)
    eos_id = tokenizer.convert_tokens_to_ids(EOS)
    bos_id = tokenizer.convert_tokens_to_ids(BOS)
    pad_id = tokenizer.convert_tokens_to_ids(PAD)
    by_length = {}
    for p in problems:
        ids = [bos_id] + tokenizer(p["prompt"], add_special_tokens=False)[
            "input_ids"]
        by_length.setdefault(len(ids), []).append((ids, p["answer"]))
    correct = 0
    with torch.inference_mode():
        for items in by_length.values():
            for begin in range(0, len(items), batch_size):
                chunk = items[begin:begin + batch_size]
                input_ids = torch.tensor([ids for ids, _ in chunk])
                out = model.generate(
                    input_ids=input_ids,
                    attention_mask=torch.ones_like(input_ids),
                    max_new_tokens=3 + 2, do_sample=False,
                    eos_token_id=eos_id, pad_token_id=pad_id)
                for row, (_, answer) in zip(out[:, input_ids.shape[1]:].tolist(),
                                            chunk):
                    if eos_id not in row:
                        continue
                    text = tokenizer.decode(row[:row.index(eos_id)])
                    correct += text == answer
    return correct / len(problems)


# ---------------------------------------------------------------- Tandem


def warm_start(bin_dir, cache_dir):
    """Runs (or finds cached) the demo's warm start, exactly as tandem-local
    does: `tandem-trainer sft --output CACHE/warm-start/arith3-add` with
    sft's defaults. Returns the directory."""
    out = os.path.join(cache_dir, "warm-start", "arith3-add")
    os.makedirs(os.path.dirname(out), exist_ok=True)
    log(f"warm start: {out} (trained now unless cached; ~10 min on 2 cores)")
    subprocess.run([os.path.join(bin_dir, "tandem-trainer"), "sft",
                    "--output", out], check=True, stdout=subprocess.DEVNULL)
    return out


class LoadSampler:
    """Samples the 1-minute load average every few seconds."""

    def __init__(self):
        self.samples = []
        self.next = 0.0

    def poll(self):
        if time.time() >= self.next:
            self.samples.append(os.getloadavg()[0])
            self.next = time.time() + 5

    def summary(self):
        if not self.samples:
            return "n/a"
        s = sorted(self.samples)
        return f"{s[0]:.1f}-{s[-1]:.1f} (median {s[len(s) // 2]:.1f})"


def copy_checkpoint(src, dst):
    """Copies a Hugging Face directory that the trainer may be replacing;
    returns False when it vanished under us (a newer one replaced it)."""
    try:
        real = os.path.realpath(src)
        if os.path.exists(dst):
            shutil.rmtree(dst)
        shutil.copytree(real, dst)
        return True
    except (OSError, shutil.Error):
        return False


def run_tandem(args, seconds, snap_dir):
    """tandem-local for `seconds` of RL; a snapshot of the latest exported
    policy each minute. Returns the snapshots and the run's totals."""
    run_dir = os.path.join(args.work_dir, "tandem-run")
    shutil.rmtree(run_dir, ignore_errors=True)
    env = dict(os.environ)
    # The trainer's own held-out evaluation would take trainer time that TRL
    # does not spend (it has none here); this script evaluates both.
    env["TANDEM_EVAL_EVERY_VERSIONS"] = "0"
    cmd = [os.path.join(args.bin_dir, "tandem-local"), "--run-dir", run_dir,
           "--duration", str(seconds), "--bin-dir", args.bin_dir,
           "--cache-dir", args.cache_dir]
    log("tandem: " + " ".join(cmd))
    t0 = time.time()
    proc = subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True)
    output = []
    stop_seconds = []  # when the launcher said the duration was reached

    def read():
        for line in iter(proc.stdout.readline, ""):
            output.append(line)
            if "stopping the cluster" in line:
                stop_seconds.append(time.time() - t0)

    import threading
    reader = threading.Thread(target=read)
    reader.start()
    load = LoadSampler()
    snaps = []
    latest = os.path.join(run_dir, "checkpoints", "latest")
    minute = 1
    while proc.poll() is None:
        load.poll()
        if time.time() - t0 >= 60 * minute and minute * 60 < seconds:
            dst = os.path.join(snap_dir, f"tandem-m{minute:02d}")
            for _ in range(5):
                hf = os.path.join(latest, "hf")
                step = os.path.basename(os.path.realpath(latest))
                mtime = os.path.getmtime(hf) if os.path.exists(hf) else None
                if mtime and copy_checkpoint(hf, dst):
                    snaps.append({"system": "tandem", "seconds": mtime - t0,
                                  "step": int(step.split("-")[-1]),
                                  "dir": dst})
                    break
                time.sleep(0.5)
            minute += 1
        time.sleep(0.2)
    reader.join()
    text = "".join(output)
    with open(os.path.join(args.work_dir, "tandem-local.log"), "w") as f:
        f.write(text)
    if proc.returncode != 0:
        sys.exit(f"tandem-local failed ({proc.returncode}); see "
                 f"{args.work_dir}/tandem-local.log")
    stats = {"load": load.summary(), "wall_seconds": time.time() - t0}
    m = re.search(r"RL time\s+(\d+) s", text)
    stats["rl_seconds"] = float(m.group(1)) if m else seconds
    m = re.search(r"generated tokens\s+(\d+)", text)
    stats["generated_tokens"] = int(m.group(1)) if m else 0
    m = re.search(r"policy versions\s+(\d+), trained groups (\d+)", text)
    stats["steps"], groups = (int(m.group(1)), int(m.group(2))) if m else (0, 0)
    stats["trained_samples"] = groups * GROUP_SIZE
    m = re.search(r"exported policy\s+(\S+)", text)
    if m and copy_checkpoint(m.group(1), os.path.join(snap_dir, "tandem-end")):
        # Written on stop, from the policy trained until the deadline.
        end = stop_seconds[0] if stop_seconds else float(seconds)
        snaps.append({"system": "tandem", "seconds": end,
                      "step": stats["steps"],
                      "dir": os.path.join(snap_dir, "tandem-end")})
    return snaps, stats


# ---------------------------------------------------------------- TRL


def trl_config(args, output_dir, seconds):
    from trl import GRPOConfig
    return GRPOConfig(
        output_dir=output_dir,
        use_vllm=False,  # TRL's CPU path: transformers' generate
        use_cpu=True,
        bf16=False,  # Tandem trains in float32
        gradient_checkpointing=False,
        per_device_train_batch_size=PROMPTS_PER_STEP * GROUP_SIZE,
        gradient_accumulation_steps=1,
        num_generations=GROUP_SIZE,
        num_iterations=1,
        learning_rate=LEARNING_RATE,
        lr_scheduler_type="constant",
        warmup_steps=0,
        weight_decay=0.0,
        adam_beta1=0.9,
        adam_beta2=0.999,
        max_grad_norm=1.0,
        max_completion_length=MAX_COMPLETION_TOKENS,
        temperature=TEMPERATURE,
        top_p=1.0,
        top_k=0,
        beta=KL_BETA,
        epsilon=CLIP_LOW,
        epsilon_high=CLIP_HIGH,
        scale_rewards="group",
        loss_type="dapo",  # token-level normalisation over the batch
        shuffle_dataset=False,  # Tandem's order: train stream index 0 first
        max_steps=1_000_000,  # the callback stops at the deadline
        logging_steps=10,
        save_strategy="no",
        report_to="none",
        seed=TASK_SEED,
        dataloader_num_workers=0,
        disable_tqdm=True,
    )


def trl_worker(args):
    """Runs in a child process: TRL's GRPOTrainer until the deadline."""
    import torch
    from datasets import Dataset
    from transformers import TrainerCallback
    from trl import GRPOTrainer

    if args.trl_threads > 0:
        torch.set_num_threads(args.trl_threads)
    t0, seconds = args.t0, args.minutes * 60
    with open(os.path.join(args.work_dir, "train.jsonl")) as f:
        train = [json.loads(line) for line in f]
    dataset = Dataset.from_list(
        [{"prompt": BOS + p["prompt"], "answer": p["answer"]} for p in train])
    model, tokenizer = load_hf(args.warm_start_dir)
    totals = {"generated_tokens": 0, "samples": 0, "reward_sum": 0.0}

    def exact_match(prompts, completions, answer, completion_ids, **_):
        rewards = [arith_reward(c, a) for c, a in zip(completions, answer)]
        totals["generated_tokens"] += sum(len(ids) for ids in completion_ids)
        totals["samples"] += len(completions)
        totals["reward_sum"] += sum(rewards)
        return rewards

    snaps = []

    class MinuteSnapshots(TrainerCallback):
        def __init__(self):
            self.minute = 1

        def on_step_end(self, _args, state, control, **kwargs):
            now = time.time() - t0
            if now >= seconds:
                control.should_training_stop = True
                return control
            if now >= 60 * self.minute:
                dst = os.path.join(args.snap_dir, f"trl-m{self.minute:02d}")
                model.save_pretrained(dst)
                tokenizer.save_pretrained(dst)
                snaps.append({"system": "trl", "seconds": now,
                              "step": state.global_step, "dir": dst})
                while 60 * self.minute <= now:
                    self.minute += 1
            return control

    trainer = GRPOTrainer(
        model=model, reward_funcs=exact_match,
        args=trl_config(args, os.path.join(args.work_dir, "trl-out"), seconds),
        train_dataset=dataset, processing_class=tokenizer,
        callbacks=[MinuteSnapshots()])
    trainer.train()
    end = time.time() - t0
    dst = os.path.join(args.snap_dir, "trl-end")
    model.save_pretrained(dst)
    tokenizer.save_pretrained(dst)
    snaps.append({"system": "trl", "seconds": end,
                  "step": trainer.state.global_step, "dir": dst})
    stats = {"steps": trainer.state.global_step, "rl_seconds": end,
             "trained_samples": totals["samples"],
             "generated_tokens": totals["generated_tokens"],
             "train_reward": totals["reward_sum"] / max(1, totals["samples"])}
    with open(os.path.join(args.work_dir, "trl-result.json"), "w") as f:
        json.dump({"snaps": snaps, "stats": stats}, f)


def run_child(args, mode, seconds, extra=()):
    """This script in a child process (`mode`), sampling the load average;
    returns (returncode, load summary, wall seconds)."""
    cmd = [sys.executable, os.path.abspath(__file__), mode,
           "--work-dir", args.work_dir, "--minutes", str(args.minutes),
           "--warm-start-dir", args.warm_start_dir,
           "--snap-dir", args.snap_dir, "--trl-threads",
           str(args.trl_threads), "--t0", repr(time.time()), *extra]
    t0 = time.time()
    proc = subprocess.Popen(cmd)
    load = LoadSampler()
    while proc.poll() is None:
        load.poll()
        time.sleep(0.2)
    return proc.returncode, load.summary(), time.time() - t0


def run_trl(args, seconds):
    log(f"trl: GRPOTrainer for {seconds} s (use_vllm=False)")
    rc, load, wall = run_child(args, "--trl-worker", seconds)
    if rc != 0:
        sys.exit(f"the TRL run failed ({rc})")
    with open(os.path.join(args.work_dir, "trl-result.json")) as f:
        result = json.load(f)
    result["stats"]["load"] = load
    result["stats"]["wall_seconds"] = wall
    return result["snaps"], result["stats"]


def try_async_worker(args):
    """Tries TRL's experimental AsyncGRPOTrainer with no vLLM server."""
    from datasets import Dataset
    from trl.experimental.async_grpo import AsyncGRPOConfig, AsyncGRPOTrainer
    _, tokenizer = load_hf(args.warm_start_dir)
    dataset = Dataset.from_list([{"prompt": BOS + "1+2=", "answer": "3"}] * 64)
    config = AsyncGRPOConfig(output_dir=os.path.join(args.work_dir, "async"),
                             use_cpu=True, bf16=False, max_steps=2,
                             report_to="none", vllm_server_timeout=10)
    trainer = AsyncGRPOTrainer(
        model=args.warm_start_dir, args=config, train_dataset=dataset,
        processing_class=tokenizer,
        reward_funcs=lambda completions, answer, **_: [
            arith_reward(c, a) for c, a in zip(completions, answer)])
    trainer.train()


def try_async(args):
    log("trl async: AsyncGRPOTrainer without a vLLM server (90 s at most)")
    cmd = [sys.executable, os.path.abspath(__file__), "--try-async-worker",
           "--work-dir", args.work_dir, "--warm-start-dir", args.warm_start_dir]
    try:
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=90)
        lines = (proc.stdout + proc.stderr).strip().splitlines()
        # The innermost TRL frame and the error it led to.
        where = [l.strip() for l in lines if "/trl/" in l and "File " in l]
        where = re.sub(r'File ".*/site-packages/(.*)", line (\d+), in (\S+)',
                       r"\3 (\1:\2)", where[-1]) if where else ""
        error = lines[-1].split(". ")[0] if lines else ""
        verdict = (f"fails in {where}: {error}"
                   if proc.returncode else "ran 2 steps")
    except subprocess.TimeoutExpired:
        verdict = "no step within 90 s (killed)"
    log("trl async: " + verdict)
    return verdict


# ---------------------------------------------------------------- report


def first_time_at_or_above(points, accuracy):
    for seconds, acc in points:
        if acc >= accuracy:
            return seconds
    return None


def write_report(args, rows, stats, start_accuracy, async_verdict):
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    os.makedirs(args.docs_dir, exist_ok=True)
    with open(os.path.join(args.docs_dir, "peer-trl.csv"), "w",
              newline="") as f:
        w = csv.writer(f)
        w.writerow(["system", "seconds", "optimizer_step", "heldout_accuracy"])
        for r in rows:
            w.writerow([r["system"], f"{r['seconds']:.1f}", r["step"],
                        f"{r['accuracy']:.4f}"])

    curves = {}
    for name in ("tandem", "trl"):
        pts = [(0.0, start_accuracy)] + sorted(
            (r["seconds"], r["accuracy"]) for r in rows if r["system"] == name)
        curves[name] = pts
    fig, ax = plt.subplots(figsize=(7, 4.2))
    for name, label in (("tandem", "Tandem (async GRPO)"),
                        ("trl", "TRL GRPOTrainer (use_vllm=False)")):
        if len(curves[name]) > 1:
            xs, ys = zip(*curves[name])
            ax.plot(xs, [100 * y for y in ys], marker="o", label=label)
    ax.set_xlabel("wall-clock seconds since start (same 2-core machine)")
    ax.set_ylabel(f"held-out greedy exact match (%), {HELDOUT_PROBLEMS} problems")
    ax.set_title("3-digit addition from Tandem's warm start")
    ax.grid(alpha=0.3)
    ax.legend()
    fig.tight_layout()
    fig.savefig(os.path.join(args.docs_dir, "peer-trl.png"), dpi=110)

    lines = [f"Measured {time.strftime('%Y-%m-%d %H:%M')} UTC with "
             f"`{' '.join(sys.argv)}`, {args.minutes} min each, "
             f"{os.cpu_count()} CPU cores; warm start "
             f"{100 * start_accuracy:.1f}% held-out.", "",
             "| system | load average during its run | optimizer steps | "
             "trained samples/s | generated tokens/s | final held-out |",
             "|---|---|---|---|---|---|"]
    final = {}
    for name in ("tandem", "trl"):
        s = stats.get(name)
        if not s:
            continue
        sec = max(s["rl_seconds"], 1e-9)
        final[name] = curves[name][-1][1]
        lines.append(
            f"| {name} | {s['load']} | {s['steps']} | "
            f"{s['trained_samples'] / sec:.1f} | "
            f"{s['generated_tokens'] / sec:.0f} | {100 * final[name]:.1f}% |")
    lines += ["", "| minute | Tandem held-out (at s, step) | "
              "TRL held-out (at s, step) |", "|---|---|---|"]
    by = {name: [r for r in rows if r["system"] == name]
          for name in ("tandem", "trl")}
    for name in by:
        by[name].sort(key=lambda r: r["seconds"])
    n = max(len(by["tandem"]), len(by["trl"]))

    def cell(name, i):
        if i >= len(by[name]):
            return "-"
        r = by[name][i]
        return (f"{100 * r['accuracy']:.1f}% ({r['seconds']:.0f} s, "
                f"step {r['step']})")

    for i in range(n):
        label = "end" if i == n - 1 else str(i + 1)
        lines.append(f"| {label} | {cell('tandem', i)} | {cell('trl', i)} |")

    ratio_lines = []
    if "tandem" in final and "trl" in final:
        trl_final = final["trl"]
        trl_time = by["trl"][-1]["seconds"]
        t = first_time_at_or_above(curves["tandem"], trl_final)
        if t is None:
            ratio_lines.append(
                f"- Tandem never reached TRL's final {100 * trl_final:.1f}% "
                f"(target: within 1/3 of TRL's {trl_time:.0f} s).")
        else:
            ratio_lines.append(
                f"- Time for Tandem to reach TRL's final "
                f"{100 * trl_final:.1f}%: at most {t:.0f} s (its first "
                f"policy saved at or above it; policies are saved once a "
                f"minute) / TRL's {trl_time:.0f} s = at most "
                f"{t / trl_time:.2f} (target <= 0.33).")
        pairs = list(zip(by["tandem"], by["trl"]))
        ahead = [a["accuracy"] > b["accuracy"] for a, b in pairs]
        ratio_lines.append(
            f"- Tandem ahead at {sum(ahead)} of {len(pairs)} minute marks "
            f"({'every one' if all(ahead) else 'not every one'}; target: "
            "every minute).")
        ratio_lines.append(
            f"- Generated tokens/s Tandem / TRL: "
            f"{(stats['tandem']['generated_tokens'] / stats['tandem']['rl_seconds']) / max(1e-9, stats['trl']['generated_tokens'] / stats['trl']['rl_seconds']):.1f}x; "
            f"optimizer steps Tandem / TRL: "
            f"{stats['tandem']['steps'] / max(1, stats['trl']['steps']):.1f}x.")
    if async_verdict:
        ratio_lines.append(f"- TRL AsyncGRPOTrainer without vLLM: "
                           f"{async_verdict}")
    lines += [""] + ratio_lines
    text = "\n".join(lines) + "\n"
    with open(os.path.join(args.docs_dir, "peer-trl-results.md"), "w") as f:
        f.write(text)
    print(text, flush=True)


# ---------------------------------------------------------------- main


def parse_args():
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--minutes", type=float, default=10)
    p.add_argument("--bin-dir", default=os.environ.get("TANDEM_BIN_DIR",
                                                       "build/bin"))
    p.add_argument("--work-dir", default="/tmp/peer-trl")
    p.add_argument("--docs-dir", default="docs")
    p.add_argument("--cache-dir", default=None,
                   help="warm-start cache root (tandem-local's default: "
                        "$TANDEM_CACHE_DIR, $XDG_CACHE_HOME/tandem, "
                        "~/.cache/tandem)")
    p.add_argument("--systems", default="tandem,trl")
    p.add_argument("--train-prompts", type=int, default=200000)
    p.add_argument("--trl-threads", type=int, default=1,
                   help="torch threads of the TRL process (0: torch's "
                        "default, one per core). 1 is TRL's fastest here: "
                        "0.39 s per step against 2.3-3.3 s with 2 threads "
                        "on the shared 2-core machine (docs/peer-trl.md)")
    p.add_argument("--try-async", action="store_true")
    # Internal: the child processes.
    p.add_argument("--trl-worker", action="store_true", help=argparse.SUPPRESS)
    p.add_argument("--try-async-worker", action="store_true",
                   help=argparse.SUPPRESS)
    p.add_argument("--warm-start-dir", help=argparse.SUPPRESS)
    p.add_argument("--snap-dir", help=argparse.SUPPRESS)
    p.add_argument("--t0", type=float, help=argparse.SUPPRESS)
    return p.parse_args()


def default_cache_dir():
    if os.environ.get("TANDEM_CACHE_DIR"):
        return os.environ["TANDEM_CACHE_DIR"]
    if os.environ.get("XDG_CACHE_HOME"):
        return os.path.join(os.environ["XDG_CACHE_HOME"], "tandem")
    if os.environ.get("HOME"):
        return os.path.join(os.environ["HOME"], ".cache", "tandem")
    return os.path.join(".cache", "tandem")


def main():
    args = parse_args()
    if args.trl_worker:
        return trl_worker(args)
    if args.try_async_worker:
        return try_async_worker(args)
    args.bin_dir = os.path.abspath(args.bin_dir)
    args.cache_dir = os.path.abspath(args.cache_dir or default_cache_dir())
    os.makedirs(args.work_dir, exist_ok=True)
    args.snap_dir = os.path.join(args.work_dir, "snapshots")
    shutil.rmtree(args.snap_dir, ignore_errors=True)
    os.makedirs(args.snap_dir)
    seconds = int(round(args.minutes * 60))
    systems = args.systems.split(",")

    train = export_task(args.bin_dir, "train", args.train_prompts,
                        os.path.join(args.work_dir, "train.jsonl"))
    heldout = export_task(args.bin_dir, "heldout", HELDOUT_PROBLEMS,
                          os.path.join(args.work_dir, "heldout.jsonl"))
    log(f"task: {len(train)} train prompts, {len(heldout)} held-out problems "
        "(tandem-model task)")
    args.warm_start_dir = warm_start(args.bin_dir, args.cache_dir)
    _, tokenizer = load_hf(args.warm_start_dir)
    log(f"warm start loads in transformers (PreTrainedTokenizerFast = "
        f"{type(tokenizer).__name__}, "
        f"eos {tokenizer.eos_token!r}, pad {tokenizer.pad_token!r}, "
        f"{len(tokenizer)} tokens)")

    snaps, stats = [], {}
    if "tandem" in systems:
        s, stats["tandem"] = run_tandem(args, seconds, args.snap_dir)
        snaps += s
        log(f"tandem: done, load average {stats['tandem']['load']}")
    if "trl" in systems:
        s, stats["trl"] = run_trl(args, seconds)
        snaps += s
        log(f"trl: done, load average {stats['trl']['load']}")
    async_verdict = try_async(args) if args.try_async else None

    log(f"evaluating {len(snaps) + 1} policies on {len(heldout)} held-out "
        "problems (after both runs)")
    start_accuracy = evaluate(args.warm_start_dir, heldout)
    log(f"warm start: {100 * start_accuracy:.1f}%")
    rows = []
    for snap in snaps:
        acc = evaluate(snap["dir"], heldout)
        rows.append(dict(snap, accuracy=acc))
        log(f"{snap['system']} at {snap['seconds']:.0f} s (step "
            f"{snap['step']}): {100 * acc:.1f}%")
    with open(os.path.join(args.work_dir, "results.json"), "w") as f:
        json.dump({"rows": rows, "stats": stats,
                   "start_accuracy": start_accuracy}, f, indent=1)
    write_report(args, rows, stats, start_accuracy, async_verdict)


if __name__ == "__main__":
    main()
