"""Tandem's forward pass against Hugging Face transformers, both ways.

For tiny random Qwen2 (q/k/v biases), Qwen3 (q/k RMSNorm, explicit head_dim)
and Llama models (Llama-3 rope scaling; tied embeddings; GQA), transformers
itself creates the model (config object + AutoModelForCausalLM.from_config,
fixed seed, fp32, no download) and writes it with save_pretrained
(safetensors), next to a small byte-level BPE tokenizer.json trained with the
`tokenizers` library. Then:

  forward  `tandemctl logprobs` on that directory gives the per-token
           log-probs that transformers gives (log_softmax of the logits,
           next token gathered);
  reverse  `tandemctl export` (Tandem's checkpoint writer, SaveHfModel) of
           that directory, and of the built-in model, loads in transformers
           (AutoModelForCausalLM.from_pretrained) with the log-probs that
           Tandem computes;
  tokens   `tandemctl tokenize` gives the ids of the `tokenizers` library.

Tolerance: max |diff| of log-probs <= 1e-4. Both sides compute in float32
with different kernels and summation orders (a packed forward with its own
attention in Tandem, SDPA/eager in transformers); over a vocabulary of a few
hundred and a couple of layers their rounding differs by a few 1e-6.
A real modelling error (a wrong rope theta or scaling, a missing bias or
norm, a transposed or untied weight) moves log-probs by 1e-2 or more with
these weights (std 0.02 would hide too much, so the weights are widened, see
WIDEN_WEIGHTS), so 1e-4 separates the two by orders of magnitude. Before any
real comparison the script checks that the comparison itself fails: on a
perturbed log-prob and on a checkpoint with one weight changed.

Runs with TANDEM_PYTHON (the project venv: torch, transformers, tokenizers),
tandemctl from TANDEM_BIN_DIR. Prints the max diff per family.
"""

import json
import os
import shutil
import subprocess
import sys
import tempfile

os.environ["HF_HUB_OFFLINE"] = "1"
os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

import torch  # noqa: E402
import transformers  # noqa: E402
from safetensors.torch import load_file, save_file  # noqa: E402
from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers  # noqa: E402

BIN_DIR = os.environ.get("TANDEM_BIN_DIR", os.path.join(
    os.path.dirname(__file__), "..", "..", "build", "bin"))
TOLERANCE = 1e-4
VOCAB_SIZE = 320
SEED = 1234
# transformers initialises weights with std 0.02 (initializer_range); with
# such small weights every layer is close to the identity and errors hide.
# The models here use std 0.2 for matrices and 1 +- 0.2 for norm weights.
WIDEN_WEIGHTS = 0.2

CORPUS = [
    "The quick brown fox jumps over the lazy dog.",
    "Tandem trains a policy while rollout workers generate samples.",
    "12 + 34 = 46; 7 * 8 = 56; 100 - 1 = 99.",
    "def forward(self, x):\n    return self.norm(x + self.attn(x))\n",
    "Grüße aus Zürich — naïve café, 東京, ☃.",
]
TEXTS = [
    "The lazy fox generates samples.",
    "forward(x) = 46 + 99",
    "Zürich café ☃",
]

TANDEMCTL = os.path.join(BIN_DIR, "tandemctl")


def tandemctl(*args, stdin=None):
    result = subprocess.run([TANDEMCTL, *args], input=stdin,
                            capture_output=True, text=True, timeout=300)
    if result.returncode != 0:
        raise AssertionError(f"tandemctl {' '.join(args)} exited "
                             f"{result.returncode}: {result.stderr}")
    return result.stdout


def write_tokenizer(path):
    """A byte-level BPE tokenizer.json of VOCAB_SIZE ids, trained here."""
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=VOCAB_SIZE, special_tokens=["<|endoftext|>"],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False)
    tok.train_from_iterator(CORPUS * 4, trainer=trainer)
    tok.save(path)
    return tok


# The families: name -> (config class, kwargs). Shared sizes keep it fast.
COMMON = dict(vocab_size=VOCAB_SIZE, hidden_size=64, intermediate_size=96,
              num_hidden_layers=2, max_position_embeddings=256,
              rms_norm_eps=1e-6, bos_token_id=0, eos_token_id=0)
FAMILIES = {
    # Qwen2: q/k/v biases (always), GQA (4 query heads over 2 kv heads),
    # a non-default theta.
    "qwen2": (transformers.Qwen2Config, dict(
        num_attention_heads=4, num_key_value_heads=2, rope_theta=1e6,
        tie_word_embeddings=False)),
    # Qwen3: per-head q/k RMSNorm, head_dim (24) != hidden / heads (16),
    # GQA, tied embeddings.
    "qwen3": (transformers.Qwen3Config, dict(
        num_attention_heads=4, num_key_value_heads=2, head_dim=24,
        rope_theta=1e6, tie_word_embeddings=True)),
    # Llama with Llama-3 rope scaling (original context 32 < the sequences'
    # positions, so all three frequency bands are exercised), GQA.
    "llama3": (transformers.LlamaConfig, dict(
        num_attention_heads=4, num_key_value_heads=1, rope_theta=500000.0,
        rope_scaling=dict(rope_type="llama3", factor=8.0,
                          low_freq_factor=1.0, high_freq_factor=4.0,
                          original_max_position_embeddings=32),
        tie_word_embeddings=False)),
    # Llama with tied embeddings and plain multi-head attention.
    "llama_tied": (transformers.LlamaConfig, dict(
        num_attention_heads=4, num_key_value_heads=4,
        tie_word_embeddings=True)),
}


def make_model(family, out_dir):
    config_class, kwargs = FAMILIES[family]
    config = config_class(**COMMON, **kwargs)
    torch.manual_seed(SEED)
    model = transformers.AutoModelForCausalLM.from_config(
        config, dtype=torch.float32)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if name.endswith("norm.weight"):
                p.copy_(1 + WIDEN_WEIGHTS * torch.randn_like(p))
            else:
                p.copy_(WIDEN_WEIGHTS * torch.randn_like(p))
    model.save_pretrained(out_dir, safe_serialization=True)
    return model


def load_hf(model_dir):
    return transformers.AutoModelForCausalLM.from_pretrained(
        model_dir, dtype=torch.float32).eval()


def hf_logprobs(model, sequences):
    out = []
    with torch.no_grad():
        for seq in sequences:
            ids = torch.tensor([seq], dtype=torch.long)
            logits = model(input_ids=ids).logits[0].float()
            lp = torch.log_softmax(logits, dim=-1)
            out.append(lp[:-1].gather(1, ids[0, 1:, None])[:, 0].tolist())
    return out


def tandem_logprobs(model_dir, sequences, work):
    path = os.path.join(work, "tokens.jsonl")
    with open(path, "w") as f:
        for seq in sequences:
            f.write(json.dumps({"tokens": seq}) + "\n")
    lines = tandemctl("logprobs", "--model", model_dir, "--input", path)
    return [json.loads(line)["logprobs"] for line in lines.splitlines()]


def max_diff(a, b):
    """Max |a - b| over all tokens; inf if the shapes disagree."""
    if len(a) != len(b) or any(len(x) != len(y) for x, y in zip(a, b)):
        return float("inf")
    return max((abs(x - y) for xs, ys in zip(a, b) for x, y in zip(xs, ys)),
               default=0.0)


def compare(what, reference, tandem):
    """Returns None when within TOLERANCE, else a message naming the worst."""
    diff = max_diff(reference, tandem)
    if diff <= TOLERANCE:
        return None
    return f"{what}: max |log-prob diff| {diff:.3g} > {TOLERANCE}"


def sequences_for(tok, vocab_size):
    """Token sequences: tokenized text, random ids over the whole vocabulary
    (long enough to pass Llama-3's original context), and a short one."""
    gen = torch.Generator().manual_seed(SEED)
    seqs = [tok.encode(text).ids for text in TEXTS]
    seqs.append(torch.randint(0, vocab_size, (96,), generator=gen).tolist())
    seqs.append(torch.randint(0, vocab_size, (40,), generator=gen).tolist())
    seqs.append([5, 7])
    return seqs


def self_check(family_dir, tok, work):
    """The comparison must fail when two sets of log-probs differ: checked
    on Tandem's own log-probs (so it holds whether or not Tandem agrees with
    transformers) with one log-prob moved, and on a copy of the checkpoint
    with one weight changed."""
    seqs = sequences_for(tok, VOCAB_SIZE)
    ours = tandem_logprobs(family_dir, seqs, work)
    assert compare("self-check (identical)", ours, ours) is None

    perturbed = [list(x) for x in ours]
    perturbed[1][2] += 10 * TOLERANCE
    message = compare("self-check (one log-prob + 1e-3)", ours, perturbed)
    assert message is not None, "a perturbed log-prob went unnoticed"
    print(f"self-check: perturbed log-prob detected: {message}")

    changed = os.path.join(work, "perturbed")
    shutil.copytree(family_dir, changed)
    weights_path = os.path.join(changed, "model.safetensors")
    tensors = load_file(weights_path)
    name = "model.layers.1.mlp.down_proj.weight"
    tensors[name][3, 5] += 1.0
    save_file(tensors, weights_path, metadata={"format": "pt"})
    message = compare("self-check (one weight + 1.0)", ours,
                      tandem_logprobs(changed, seqs, work))
    assert message is not None, "a changed weight went unnoticed"
    print(f"self-check: perturbed weight {name}[3,5] detected: {message}")
    shutil.rmtree(changed)


def main():
    if not os.access(TANDEMCTL, os.X_OK):
        raise RuntimeError(f"{TANDEMCTL} not found; build tandemctl first")
    torch.set_num_threads(1)
    transformers.utils.logging.disable_progress_bar()
    print(f"transformers {transformers.__version__}, torch {torch.__version__}"
          f", tolerance {TOLERANCE}")
    work = tempfile.mkdtemp(prefix="tandem_hf_reference_")
    failures = []
    try:
        tok_path = os.path.join(work, "tokenizer.json")
        tok = write_tokenizer(tok_path)
        assert tok.get_vocab_size() == VOCAB_SIZE, tok.get_vocab_size()

        dirs = {}
        for family in FAMILIES:
            dirs[family] = os.path.join(work, family)
            make_model(family, dirs[family])
            shutil.copy(tok_path, dirs[family])

        self_check(dirs["llama3"], tok, work)

        # Tandem's tokenizer gives the ids of `tokenizers`.
        ids = tandemctl("tokenize", "--model", dirs["qwen2"],
                        stdin="\n".join(TEXTS) + "\n").splitlines()
        for text, line in zip(TEXTS, ids):
            if json.loads(line) != tok.encode(text).ids:
                failures.append(f"tokenize {text!r}: {line} != "
                                f"{tok.encode(text).ids}")

        seqs = sequences_for(tok, VOCAB_SIZE)
        for family, model_dir in dirs.items():
            reference = hf_logprobs(load_hf(model_dir), seqs)
            ours = tandem_logprobs(model_dir, seqs, work)
            forward = max_diff(reference, ours)
            failures.append(compare(f"{family} forward", reference, ours))

            exported = os.path.join(work, family + "-export")
            tandemctl("export", "--model", model_dir, "--output", exported)
            back = hf_logprobs(load_hf(exported), seqs)
            reverse = max_diff(back, ours)
            failures.append(compare(f"{family} export", back, ours))
            print(f"{family}: forward max diff {forward:.3g}, "
                  f"exported max diff {reverse:.3g}")

        # The built-in model (random init, arithmetic tokenizer) exported.
        exported = os.path.join(work, "builtin-export")
        tandemctl("export", "--output", exported)
        vocab = json.load(open(os.path.join(exported, "config.json")))[
            "vocab_size"]
        gen = torch.Generator().manual_seed(SEED + 1)
        builtin_seqs = [torch.randint(0, vocab, (n,), generator=gen).tolist()
                        for n in (8, 40, 64)]
        ours = tandem_logprobs("", builtin_seqs, work)
        back = hf_logprobs(load_hf(exported), builtin_seqs)
        failures.append(compare("builtin export", back, ours))
        print(f"builtin: exported max diff {max_diff(back, ours):.3g}")
    finally:
        shutil.rmtree(work, ignore_errors=True)
    failures = [f for f in failures if f]
    for failure in failures:
        print("FAIL", failure)
    if failures:
        sys.exit(1)
    print("OK")


if __name__ == "__main__":
    main()
