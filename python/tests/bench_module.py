"""How long `vramlab.plan_module` takes for a ~100 M-parameter model on this machine.

    python python/tests/bench_module.py [--reps N]

A GPT-2-shaped transformers model (12 layers, 768 wide, 124.4 M parameters, random init,
SDPA), `{"input_ids", "labels"}` of 512 tokens, planned at batch 8, amp-bf16, AdamW: the
capture on fake tensors (three batch sizes, two steps each) and the plan. Prints each run's
seconds and the capture's share. Not collected by pytest (a timing, not a check); needs torch
and transformers.
"""

from __future__ import annotations

import argparse
import time

import torch
import transformers

import vramlab


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--reps", type=int, default=3)
    a = ap.parse_args()
    cfg = transformers.GPT2Config(n_layer=12, n_embd=768, n_head=12, vocab_size=50257)
    cfg._attn_implementation = "sdpa"
    model = transformers.GPT2LMHeadModel(cfg)
    n = sum(p.numel() for p in model.parameters())
    ids = torch.zeros(1, 512, dtype=torch.long)
    for i in range(a.reps):
        t = time.perf_counter()
        p = vramlab.plan_module(model, {"input_ids": ids, "labels": ids}, batch=8, gpu="a100-40gb")
        secs = time.perf_counter() - t
        print(f"run {i + 1}: {n / 1e6:.1f} M parameters, {secs:.2f} s ({torch.get_num_threads()} "
              f"threads): {p!r}")


if __name__ == "__main__":
    main()
