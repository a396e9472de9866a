"""A tiny tool-calling model for tests of multi-turn episodes
(test_episodes.py), made here: no download.

The model directory has
  * tokenizer.json: a character-level Hugging Face tokenizer (BPE with no
    merges, like the built-in arithmetic model's) over printable ASCII, with
    the added tokens <|im_start|> and <|im_end|> (special; <|im_end|> is the
    end of a turn and the model's EOS) and <tool_call>, </tool_call>;
  * tokenizer_config.json with a ChatML-like chat template (no newlines, so
    every character is in the vocabulary) that Tandem's renderer runs;
  * a Llama decoder (2 layers, hidden 64) made by `transformers` and
    warm-started here with a few hundred AdamW steps on whole episodes of a
    handful of arithmetic tasks: the prompt, then a Hermes-style
    calculator call, the calculator's observation, then the answer. Only
    the model's turns are loss terms. The warm start teaches the call
    format; the calls the model makes at run time are its own samples,
    parsed by the rollout worker and answered by the real calculator.

Run by the project venv's interpreter (torch, transformers)."""

import json
import os

import torch
import transformers

SPECIAL = ["<|im_start|>", "<|im_end|>"]
ADDED = ["<tool_call>", "</tool_call>"]
CHARS = [chr(c) for c in range(32, 127)]

# No newlines anywhere: every character the template writes is in CHARS.
CHAT_TEMPLATE = (
    "{%- for m in messages -%}"
    "{%- if m['role'] == 'tool' -%}<|im_start|>tool:{{ m['content'] }}"
    "<|im_end|>"
    "{%- elif m['role'] == 'assistant' -%}<|im_start|>assistant:"
    "{{ m['content'] }}<|im_end|>"
    "{%- else -%}<|im_start|>user:{{ m['content'] }}<|im_end|>"
    "{%- endif -%}"
    "{%- endfor -%}"
    "{%- if add_generation_prompt -%}<|im_start|>assistant:{%- endif -%}")


def vocab():
    tokens = CHARS + SPECIAL + ADDED
    return {t: i for i, t in enumerate(tokens)}


VOCAB = vocab()
IM_END = VOCAB["<|im_end|>"]


def encode(text):
    """What Tandem's tokenizer gives for this tokenizer.json: added tokens
    first, then one token per character."""
    ids, i = [], 0
    added = SPECIAL + ADDED
    while i < len(text):
        for token in added:
            if text.startswith(token, i):
                ids.append(VOCAB[token])
                i += len(token)
                break
        else:
            ids.append(VOCAB[text[i]])
            i += 1
    return ids


def prompt_text(expression):
    return f"<|im_start|>user:{expression}=?<|im_end|><|im_start|>assistant:"


def call_text(expression):
    arguments = json.dumps({"expression": expression}, separators=(",", ":"))
    return ('<tool_call>{"name":"calculator","arguments":' + arguments +
            "}</tool_call><|im_end|>")


def observation_text(value):
    return f"<|im_start|>tool:{value}<|im_end|><|im_start|>assistant:"


def write_tokenizer(model_dir):
    def added(token, special):
        return {"id": VOCAB[token], "content": token, "single_word": False,
                "lstrip": False, "rstrip": False, "normalized": False,
                "special": special}
    tokenizer = {
        "version": "1.0", "truncation": None, "padding": None,
        "added_tokens": [added(t, True) for t in SPECIAL] +
                        [added(t, False) for t in ADDED],
        "normalizer": None, "pre_tokenizer": None, "post_processor": None,
        "decoder": {"type": "ByteLevel", "add_prefix_space": False,
                    "trim_offsets": False, "use_regex": False},
        "model": {"type": "BPE", "dropout": None, "unk_token": None,
                  "continuing_subword_prefix": None,
                  "end_of_word_suffix": None, "fuse_unk": False,
                  "byte_fallback": False, "ignore_merges": False,
                  "vocab": {t: i for t, i in VOCAB.items()
                            if t not in SPECIAL + ADDED},
                  "merges": []}}
    with open(os.path.join(model_dir, "tokenizer.json"), "w") as f:
        json.dump(tokenizer, f)
    with open(os.path.join(model_dir, "tokenizer_config.json"), "w") as f:
        json.dump({"tokenizer_class": "PreTrainedTokenizerFast",
                   "eos_token": "<|im_end|>", "pad_token": "<|im_end|>",
                   "chat_template": CHAT_TEMPLATE}, f)


def episode(expression, value):
    """(token ids, loss mask) of one whole episode."""
    parts = [(prompt_text(expression), 0), (call_text(expression), 1),
             (observation_text(value), 0), (f"{value}<|im_end|>", 1)]
    ids, mask = [], []
    for text, trained in parts:
        tokens = encode(text)
        ids += tokens
        mask += [trained] * len(tokens)
    return ids, mask


def make_model(model_dir, tasks, steps=400, seed=7, log=None):
    """Writes the warm-started model for `tasks` ([(expression, value)])
    into `model_dir`; returns the final mean loss of the model's tokens."""
    os.makedirs(model_dir, exist_ok=True)
    write_tokenizer(model_dir)
    torch.manual_seed(seed)
    torch.set_num_threads(1)  # a tiny model: threads cost more than they give
    config = transformers.LlamaConfig(
        vocab_size=len(VOCAB), hidden_size=64, intermediate_size=128,
        num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=4,
        max_position_embeddings=256, rms_norm_eps=1e-6,
        tie_word_embeddings=False, bos_token_id=IM_END, eos_token_id=IM_END)
    model = transformers.AutoModelForCausalLM.from_config(
        config, dtype=torch.float32)
    episodes = [episode(e, v) for e, v in tasks]
    length = max(len(ids) for ids, _ in episodes)
    ids = torch.full((len(episodes), length), IM_END, dtype=torch.long)
    mask = torch.zeros((len(episodes), length))
    for i, (tokens, trained) in enumerate(episodes):
        ids[i, :len(tokens)] = torch.tensor(tokens)
        mask[i, :len(trained)] = torch.tensor(trained, dtype=torch.float)
    optimizer = torch.optim.AdamW(model.parameters(), lr=3e-3)
    model.train()
    loss = None
    for step in range(steps):
        logits = model(input_ids=ids).logits[:, :-1]
        target = ids[:, 1:]
        nll = torch.nn.functional.cross_entropy(
            logits.reshape(-1, logits.size(-1)), target.reshape(-1),
            reduction="none").view(target.shape)
        weights = mask[:, 1:]
        loss = (nll * weights).sum() / weights.sum()
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        if log and step % 100 == 0:
            log(f"warm start step {step}: loss {loss.item():.4f}")
    model.save_pretrained(model_dir, safe_serialization=True)
    return loss.item()


if __name__ == "__main__":
    import sys
    import time
    start = time.time()
    final = make_model(sys.argv[1], [("3*4", "12"), ("17+25", "42"),
                                     ("9*9", "81"), ("100-58", "42")],
                       log=print)
    print(f"final loss {final:.5f} in {time.time() - start:.1f} s")
