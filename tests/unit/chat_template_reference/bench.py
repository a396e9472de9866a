"""Render cost of a chat template: tandem-chat-template against transformers.

What: takes one case from the reference test's cases.jsonl (default: Qwen3
with two tool calls and two tool results, add_generation_prompt), renders it
N times with `tandem-chat-template --batch` (the template is parsed once
per batch; each line parses the case's JSON, builds the context and
renders; one process start is amortised over N), the parse alone N times
(a batch of N distinct copies of the file), and N times with transformers' render_jinja_template (compiled template
cached after the first call).

How to run, after the chat_template_reference ctest has written cases.jsonl:
    python bench.py --binary build/bin/tandem-chat-template \
        --cases build/tests/unit/chat_template_reference/cases.jsonl

Prints microseconds per render for both.
"""

import argparse
import json
import subprocess
import tempfile
import time


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--binary", required=True)
    parser.add_argument("--cases", required=True)
    parser.add_argument("--case", default="qwen3/tool_calls_dict_gen")
    parser.add_argument("-n", type=int, default=2000)
    args = parser.parse_args()
    case = next(c for c in map(json.loads, open(args.cases, encoding="utf-8")) if c["id"] == args.case)
    with tempfile.NamedTemporaryFile("w", suffix=".jsonl", encoding="utf-8") as f:
        for _ in range(args.n):
            f.write(json.dumps(case, ensure_ascii=False) + "\n")
        f.flush()
        start = time.perf_counter()
        subprocess.run([args.binary, "--batch", f.name], capture_output=True, check=True)
        ours = time.perf_counter() - start
    print(f"tandem-chat-template (JSON case + context + render): {ours / args.n * 1e6:.1f} us per render")
    with tempfile.TemporaryDirectory() as tmp, tempfile.NamedTemporaryFile(
            "w", suffix=".jsonl", encoding="utf-8") as f:
        with open(case["template_file"], encoding="utf-8") as src:
            text = src.read()
        parse_n = min(args.n, 500)
        for i in range(parse_n):
            path = f"{tmp}/{i}.jinja"
            with open(path, "w", encoding="utf-8") as out:
                out.write(text)
            f.write(json.dumps({"id": i, "template_file": path, "context": {}}) + "\n")
        f.flush()
        start = time.perf_counter()
        subprocess.run([args.binary, "--batch", f.name], capture_output=True, check=True)
        parse = time.perf_counter() - start
    print(f"tandem-chat-template (read+parse, empty render): {parse / parse_n * 1e6:.1f} us per template")

    from transformers.utils.chat_template_utils import render_jinja_template
    with open(case["template_file"], encoding="utf-8") as f:
        source = f.read()
    inputs = case["inputs"]
    kwargs = {**case.get("special_tokens", {}), **inputs["extra"]}
    messages = [{k: v for k, v in m.items() if v is not None} for m in inputs["messages"]]

    def render():
        render_jinja_template(conversations=[messages], tools=inputs["tools"], chat_template=source,
                              add_generation_prompt=inputs["add_generation_prompt"], **kwargs)

    render()
    start = time.perf_counter()
    for _ in range(args.n):
        render()
    theirs = time.perf_counter() - start
    print(f"transformers render_jinja_template (cached compile): {theirs / args.n * 1e6:.1f} us per render")


if __name__ == "__main__":
    main()
