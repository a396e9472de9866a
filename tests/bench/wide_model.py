#!/usr/bin/python3
"""Writes a wider variant of the built-in model as a Hugging Face directory,
for benchmarks that need weights large enough to see in a process's memory
(docs/benchmarks.md, "In-place weight updates").

It starts from `tandem-trainer export --builtin` (config.json, tokenizer.json:
the arithmetic task's character tokenizer), widens config.json, and writes
model.safetensors with random float32 weights (N(0, 0.02), norms 1) for
every tensor the Qwen2 layout of that config needs. Pure Python (no numpy):
about 20 s per 25 M parameters.

    tests/bench/wide_model.py --bin build/bin --out /tmp/wide \
        --hidden 512 --intermediate 1536 --layers 8
"""

import argparse
import array
import json
import os
import random
import struct
import subprocess


def tensors(config):
    """(name, shape) of every tensor, as ExpectedTensors (Qwen2, tied
    embeddings, q/k/v bias)."""
    h = config["hidden_size"]
    heads = config["num_attention_heads"]
    kv = config["num_key_value_heads"]
    hd = config.get("head_dim") or h // heads
    inter = config["intermediate_size"]
    out = [("model.embed_tokens.weight", [config["vocab_size"], h])]
    for i in range(config["num_hidden_layers"]):
        p = f"model.layers.{i}."
        out += [
            (p + "input_layernorm.weight", [h]),
            (p + "self_attn.q_proj.weight", [heads * hd, h]),
            (p + "self_attn.k_proj.weight", [kv * hd, h]),
            (p + "self_attn.v_proj.weight", [kv * hd, h]),
            (p + "self_attn.q_proj.bias", [heads * hd]),
            (p + "self_attn.k_proj.bias", [kv * hd]),
            (p + "self_attn.v_proj.bias", [kv * hd]),
            (p + "self_attn.o_proj.weight", [h, heads * hd]),
            (p + "post_attention_layernorm.weight", [h]),
            (p + "mlp.gate_proj.weight", [inter, h]),
            (p + "mlp.up_proj.weight", [inter, h]),
            (p + "mlp.down_proj.weight", [h, inter]),
        ]
    out.append(("model.norm.weight", [h]))
    if not config.get("tie_word_embeddings", False):
        out.append(("lm_head.weight", [config["vocab_size"], h]))
    return out


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--bin", default="build/bin")
    parser.add_argument("--out", required=True)
    parser.add_argument("--hidden", type=int, default=512)
    parser.add_argument("--intermediate", type=int, default=1536)
    parser.add_argument("--layers", type=int, default=8)
    parser.add_argument("--heads", type=int, default=8)
    parser.add_argument("--kv-heads", type=int, default=2)
    parser.add_argument("--seed", type=int, default=1)
    args = parser.parse_args()

    subprocess.run([os.path.join(args.bin, "tandem-trainer"), "export",
                    "--builtin", "--output", args.out], check=True,
                   stdout=subprocess.DEVNULL)
    with open(os.path.join(args.out, "config.json")) as f:
        config = json.load(f)
    config.update(hidden_size=args.hidden,
                  intermediate_size=args.intermediate,
                  num_hidden_layers=args.layers,
                  num_attention_heads=args.heads,
                  num_key_value_heads=args.kv_heads,
                  head_dim=args.hidden // args.heads,
                  torch_dtype="float32")
    with open(os.path.join(args.out, "config.json"), "w") as f:
        json.dump(config, f, indent=2)

    rng = random.Random(args.seed)
    header, blobs, offset = {}, [], 0
    for name, shape in tensors(config):
        n = 1
        for d in shape:
            n *= d
        if name.endswith("norm.weight"):
            values = array.array("f", [1.0]) * n
        else:
            values = array.array("f", (rng.gauss(0.0, 0.02)
                                       for _ in range(n)))
        data = values.tobytes()
        header[name] = {"dtype": "F32", "shape": shape,
                        "data_offsets": [offset, offset + len(data)]}
        blobs.append(data)
        offset += len(data)
    header["__metadata__"] = {"format": "pt"}
    encoded = json.dumps(header, separators=(",", ":")).encode()
    encoded += b" " * (-len(encoded) % 8)
    with open(os.path.join(args.out, "model.safetensors"), "wb") as f:
        f.write(struct.pack("<Q", len(encoded)))
        f.write(encoded)
        for blob in blobs:
            f.write(blob)
    params = offset // 4
    print(f"{args.out}: {params / 1e6:.1f} M parameters, "
          f"{offset / 2**20:.1f} MiB float32")


if __name__ == "__main__":
    main()
