#!/usr/bin/env python3
"""Writes the seed corpus for safetensors_fuzz into corpus/safetensors/.

Each seed is a small safetensors file, valid or broken in one way; the
names say which. Rerun after changing the list; the files are checked in.
"""

import json
import os
import struct

OUT = os.path.join(os.path.dirname(os.path.abspath(__file__)),
                   "corpus", "safetensors")

SIZES = {"BOOL": 1, "U8": 1, "I8": 1, "F8_E4M3": 1, "F8_E5M2": 1,
         "U16": 2, "I16": 2, "F16": 2, "BF16": 2,
         "U32": 4, "I32": 4, "F32": 4, "F64": 8, "U64": 8, "I64": 8}


def raw(header_text, data=b"", declared=None):
    header = header_text.encode("utf-8") if isinstance(header_text, str) \
        else header_text
    length = len(header) if declared is None else declared
    return struct.pack("<Q", length) + header + data


def valid(tensors, metadata=None):
    """tensors: list of (name, dtype, shape); data is a byte pattern."""
    header = {}
    if metadata:
        header["__metadata__"] = metadata
    offset = 0
    for name, dtype, shape in tensors:
        n = SIZES[dtype]
        for d in shape:
            n *= d
        header[name] = {"dtype": dtype, "shape": shape,
                        "data_offsets": [offset, offset + n]}
        offset += n
    text = json.dumps(header, separators=(",", ":"))
    text += " " * ((-(8 + len(text))) % 8)
    return raw(text, bytes(i % 251 for i in range(offset)))


def entry(dtype, shape, begin, end):
    return {"dtype": dtype, "shape": shape, "data_offsets": [begin, end]}


SEEDS = {
    "valid_two_tensors": valid([("wte.weight", "F32", [2, 3]),
                                ("lm_head.bias", "BF16", [3])],
                               {"format": "pt"}),
    "valid_all_dtypes": valid([("t_" + d, d, [2]) for d in SIZES]),
    "valid_empty_header": raw("{}"),
    "valid_scalar_and_empty": valid([("s", "F64", []), ("e", "I32", [0, 5])]),
    "invalid_short": b"\x02\x00\x00",
    "invalid_header_len_zero": raw("", b"\0" * 8),
    "invalid_header_len_past_end": raw("{}", declared=64),
    "invalid_not_json": raw("{\"a\":"),
    "invalid_not_object": raw("[1,2,3]"),
    "invalid_unknown_dtype": raw(json.dumps({"w": entry("F33", [1], 0, 1)}),
                                 b"\0"),
    "invalid_negative_dim": raw(json.dumps({"w": entry("U8", [-1], 0, 0)})),
    "invalid_size_mismatch": raw(json.dumps({"w": entry("F32", [5, 6], 0,
                                                        100)}), b"\0" * 100),
    "invalid_overlap": raw(json.dumps({"a": entry("U8", [4], 0, 4),
                                       "b": entry("U8", [4], 2, 6)}),
                           b"\0" * 6),
    "invalid_hole": raw(json.dumps({"a": entry("U8", [2], 0, 2),
                                    "b": entry("U8", [2], 4, 6)}), b"\0" * 6),
    "invalid_duplicate_name": raw('{"a":{"dtype":"U8","shape":[1],'
                                  '"data_offsets":[0,1]},"a":{"dtype":"U8",'
                                  '"shape":[1],"data_offsets":[1,2]}}',
                                  b"\0\0"),
    "invalid_overflow_shape": raw(json.dumps(
        {"w": entry("U8", [4294967296, 4294967296], 0, 0)})),
}


def main():
    os.makedirs(OUT, exist_ok=True)
    for name, data in SEEDS.items():
        with open(os.path.join(OUT, name + ".safetensors"), "wb") as f:
            f.write(data)


if __name__ == "__main__":
    main()
