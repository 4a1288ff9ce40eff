#!/usr/bin/python3
"""mtp_accept.py - greedy acceptance of the MTP block's draft on held-out text (PyTorch).

At position t the main model's greedy token for t+1 is compared with the MTP block's draft
made at t-1 (from the main model's hidden streams at t-1 and the token at t): speculative
decoding with one draft token accepts exactly when they agree. Teacher-forced on held-out
windows (BOS + ctx-1 tokens).

  scripts/train/mtp_accept.py --ckpt build/train/run/ckpt.pt --data build/train [--windows 16]
"""
import argparse
import os
import sys

import torch

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
import model as M  # noqa: E402
import train as TR  # noqa: E402


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--ckpt", required=True)
    ap.add_argument("--data", required=True)
    ap.add_argument("--windows", type=int, default=16)
    ap.add_argument("--ctx", type=int, default=256)
    a = ap.parse_args()
    torch.set_num_threads(1)
    st = torch.load(a.ckpt)
    m = M.Model(st["cfg"])
    m.load_state_dict(st["model"])
    m.eval()
    held = TR.load_ids(os.path.join(a.data, "heldout.u16"))
    T = a.ctx
    step = (held.numel() - T - 2) // a.windows
    acc = n = hit = 0
    with torch.no_grad():
        for i in range(a.windows):
            w = torch.cat([torch.zeros(1, dtype=torch.int64), held[i * step:i * step + T]])   # T+1 tokens
            ids, nxt = w[None, :-1], w[None, 1:]
            logits, mlog, _ = m(ids, {}, mtp_ids=nxt)
            main = logits[0].argmax(-1)          # main greedy for position t+1, at each t
            draft = mlog[0].argmax(-1)           # draft for t+2, made at t
            acc += (draft[:-1] == main[1:]).sum().item()
            hit += (draft[:-1] == w[2:]).sum().item()
            n += T - 1
    print("mtp: %d positions; draft == main greedy: %.2f%%; draft == actual next-next token: %.2f%% (step %d)" % (
        n, 100.0 * acc / n, 100.0 * hit / n, st["step"]))


if __name__ == "__main__":
    main()
