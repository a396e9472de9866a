"""Micro-benchmark of the padded batch attention op alone, one thread.

B = 8 sequences, GQA 4:2, head_dim 32 (the built-in tiny model's
attention), q/k/v as permuted views of [B, T, heads, D] as
PaddedCausalAttention (common/model/layers.cc) hands them over. Times the
hand-written form (matmul, masked softmax in float32, matmul) against one
torch.nn.functional.scaled_dot_product_attention call with a boolean mask
and enable_gqa, for prefill (n = L = 96) and decode (n = 1, L = 96), fp32
and bf16.

Run: $TANDEM_VENV/bin/python tests/bench/padded_attention_micro.py
Prints one line per dtype and shape: median microseconds per call (7
repeats of 50 calls) of each form and their ratio.
"""
import statistics
import time

import torch
import torch.nn.functional as F

torch.set_num_threads(1)
B, H, KV, D, L = 8, 4, 2, 32, 96
G = H // KV


def hand(q, k, v, hidden):
    n = q.size(2)
    qg = q.reshape(B, KV, G * n, D)
    s = torch.matmul(qg, k.transpose(-1, -2)) * D ** -0.5
    s = s.view(B, KV, G, n, L).masked_fill(hidden, float("-inf"))
    p = torch.softmax(s.view(B, KV, G * n, L), -1, dtype=torch.float32)
    return torch.matmul(p.to(q.dtype), v)


def sdpa(q, k, v, visible):
    return F.scaled_dot_product_attention(q, k, v, visible, scale=D ** -0.5,
                                          enable_gqa=True)


def median_us(fn, *args):
    times = []
    for _ in range(7):
        start = time.perf_counter()
        for _ in range(50):
            fn(*args)
        times.append((time.perf_counter() - start) / 50 * 1e6)
    return statistics.median(times)


for dtype in (torch.float32, torch.bfloat16):
    for name, n in (("prefill", L), ("decode", 1)):
        q = torch.randn(B, n, H, D, dtype=dtype).permute(0, 2, 1, 3)
        k = torch.randn(B, L, KV, D, dtype=dtype).permute(0, 2, 1, 3)
        v = torch.randn(B, L, KV, D, dtype=dtype).permute(0, 2, 1, 3)
        key_pos = torch.arange(L).view(1, -1)
        query_pos = torch.arange(L - n, L).view(-1, 1)
        visible = (key_pos <= query_pos).expand(B, 1, n, L)
        hidden = ~visible.unsqueeze(1)
        with torch.inference_mode():
            t_hand = median_us(hand, q, k, v, hidden)
            t_sdpa = median_us(sdpa, q, k, v, visible)
        print(f"{str(dtype)[6:]} {name}: hand {t_hand:.0f} us, "
              f"sdpa {t_sdpa:.0f} us, sdpa/hand time {t_sdpa / t_hand:.2f}")
