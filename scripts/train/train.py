#!/usr/bin/python3
"""train.py - train the small DeepSeek-V4 model on the encoded corpus (one torch thread).

  scripts/train/train.py --data build/train --out build/train/run [--minutes 60] [--bench]

Reads DATA/train.u16 and DATA/heldout.u16 (token ids from tokenizer.py) and the model config
from scripts/train/config.json. Every window is BOS + (ctx - 1) tokens of the token stream at
a random offset (seeded), the same framing `tide perplexity` uses. Loss = next-token
cross-entropy + 0.3 * MTP next-next-token cross-entropy + the indexer's KL towards the main
attention over compressed entries (the indexer sees detached inputs, so that loss trains only
the indexer). The first --dense-steps steps attend to every compressed entry while the
indexer learns; then the indexer's top-k selects. Resumes from OUT/ckpt.pt; stops after
--minutes of wall time or --steps steps, whichever comes first, saving every --save-every
seconds.
"""
import argparse
import array
import json
import math
import os
import sys
import time

import torch
import torch.nn.functional as F

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
import model as M  # noqa: E402


def load_ids(path):
    a = array.array("H")
    with open(path, "rb") as f:
        a.frombytes(f.read())
    return torch.tensor(a, dtype=torch.int64)


def batch(stream, B, T, gen):
    """B windows of BOS + T tokens (T+1 tokens after BOS, for the MTP's next-next target)."""
    off = torch.randint(0, stream.numel() - T - 2, (B,), generator=gen)
    rows = torch.stack([stream[o:o + T + 1] for o in off.tolist()])
    return torch.cat([torch.zeros(B, 1, dtype=torch.int64), rows], 1)   # [B, T+2]


def losses(model, x, opts):
    ids, nxt, nxt2 = x[:, :-2], x[:, 1:-1], x[:, 2:]
    logits, mlog, aux = model(ids, opts, mtp_ids=nxt)
    V = logits.shape[-1]
    ce = F.cross_entropy(logits.reshape(-1, V), nxt.reshape(-1))
    mce = F.cross_entropy(mlog.reshape(-1, V), nxt2.reshape(-1))
    kl = torch.stack(aux["indexer_kl"]).mean() if aux["indexer_kl"] else torch.zeros(())
    return ce, mce, kl


@torch.no_grad()
def evaluate(model, held, T, nwin, opts):
    """Mean next-token loss (nats) over nwin fixed held-out windows (not the MTP)."""
    model.eval()
    tot, n = 0.0, 0
    step = max(1, (held.numel() - T - 2) // nwin)
    for i in range(nwin):
        o = i * step
        x = torch.cat([torch.zeros(1, dtype=torch.int64), held[o:o + T - 1]])[None]
        logits, _, _ = model(x, opts)
        tot += F.cross_entropy(logits[0, :-1], held[o:o + T - 1], reduction="sum").item()
        n += T - 1
    model.train()
    return tot / n


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--data", required=True)
    ap.add_argument("--out", required=True)
    ap.add_argument("--config", default=os.path.join(HERE, "config.json"))
    ap.add_argument("--minutes", type=float, default=50)
    ap.add_argument("--steps", type=int, default=420)
    ap.add_argument("--batch", type=int, default=4)
    ap.add_argument("--ctx", type=int, default=256)
    ap.add_argument("--lr", type=float, default=3e-3)
    ap.add_argument("--warmup", type=int, default=30)
    ap.add_argument("--decay-steps", type=int, default=650, help="cosine decay length (to 10%%)")
    ap.add_argument("--dense-steps", type=int, default=50)
    ap.add_argument("--save-every", type=float, default=120)
    ap.add_argument("--eval-every", type=int, default=50)
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--bigram-steps", type=int, default=80, help="warm-start steps of embed/head as a bigram")
    ap.add_argument("--bigram-batch", type=int, default=4096)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--bench", action="store_true", help="time 5 steps and exit")
    a = ap.parse_args()
    torch.set_num_threads(a.threads)
    torch.manual_seed(a.seed)
    with open(a.config) as f:
        cfg = json.load(f)
    train = load_ids(os.path.join(a.data, "train.u16"))
    held = load_ids(os.path.join(a.data, "heldout.u16"))
    model = M.Model(cfg, seed=a.seed)
    nparam = sum(p.numel() for p in model.parameters())
    decay = [p for n, p in model.named_parameters() if p.dim() >= 2 and "hc_" not in n]
    other = [p for n, p in model.named_parameters() if not (p.dim() >= 2 and "hc_" not in n)]
    opt = torch.optim.AdamW([{"params": decay, "weight_decay": 0.01}, {"params": other, "weight_decay": 0.0}],
                            lr=a.lr, betas=(0.9, 0.95), eps=1e-8)
    gen = torch.Generator().manual_seed(a.seed + 1000)
    step, log = 0, []
    os.makedirs(a.out, exist_ok=True)
    ck = os.path.join(a.out, "ckpt.pt")
    if os.path.exists(ck):
        st = torch.load(ck)
        model.load_state_dict(st["model"])
        opt.load_state_dict(st["opt"])
        gen.set_state(st["gen"])
        step, log = st["step"], st["log"]
        print("train: resumed at step %d" % step, file=sys.stderr)

    def save():
        tmp = ck + ".tmp"
        torch.save({"model": model.state_dict(), "opt": opt.state_dict(), "gen": gen.get_state(), "step": step,
                    "log": log, "cfg": cfg, "args": vars(a)}, tmp)
        os.replace(tmp, ck)

    if step == 0 and a.bigram_steps > 0:
        # warm start: embed, head and norm as a bigram model (every block starts near the
        # identity, so the full model starts from this; the MTP block's e_proj starts at the identity)
        bopt = torch.optim.Adam([model.embed, model.head, model.norm], lr=1e-2)
        for i in range(a.bigram_steps):
            off = torch.randint(0, train.numel() - 1, (a.bigram_batch,), generator=gen)
            bl = F.cross_entropy(model.bigram_logits(train[off]), train[off + 1])
            bopt.zero_grad(set_to_none=True)
            bl.backward()
            bopt.step()
            if (i + 1) % 25 == 0:
                print(json.dumps({"bigram_step": i + 1, "ce": round(bl.item(), 4)}), file=sys.stderr, flush=True)
        log.append({"bigram_steps": a.bigram_steps, "ce": round(bl.item(), 4)})
        del bopt

    print("train: %d parameters, %d train tokens, %d held-out tokens" % (nparam, train.numel(), held.numel()),
          file=sys.stderr)
    t_start = time.time()
    t_save = t_start
    tok_per_step = a.batch * a.ctx
    while step < a.steps:
        if time.time() - t_start > a.minutes * 60:
            break
        lr = a.lr * min(1.0, (step + 1) / a.warmup)
        prog = min(1.0, step / a.decay_steps)
        lr *= 0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * prog))
        for g in opt.param_groups:
            g["lr"] = lr
        t0 = time.time()
        x = batch(train, a.batch, a.ctx, gen)
        opts = {"train_indexer": True, "index_mode": "dense" if step < a.dense_steps else "topk"}
        ce, mce, kl = losses(model, x, opts)
        loss = ce + 0.3 * mce + kl
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        model.balance(1e-3)
        step += 1
        dt = time.time() - t0
        rec = {"step": step, "ce": round(ce.item(), 4), "mtp": round(mce.item(), 4), "kl": round(kl.item(), 4),
               "lr": round(lr, 6), "tok_s": round(tok_per_step / dt, 1), "t": round(time.time() - t_start, 1)}
        if step % a.eval_every == 0:
            ev = evaluate(model, held, a.ctx, 16, {"index_mode": "topk"})
            rec["held_ce"] = round(ev, 4)
        log.append(rec)
        print(json.dumps(rec), file=sys.stderr, flush=True)
        if a.bench and step >= 5:
            return
        if time.time() - t_save > a.save_every:
            save()
            t_save = time.time()
    save()
    print("train: stopped at step %d" % step, file=sys.stderr)


if __name__ == "__main__":
    main()
