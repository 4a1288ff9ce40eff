#!/usr/bin/python3
"""dsv4_numpy.py - an independent NumPy implementation of the DeepSeek-V4 forward pass.

Written from ../shared/docs/deepseek-v4.md (sections 2-3, 6, 8) without looking at tide's C code:
its own safetensors reader, its own FP8/E8M0/MXFP4/BF16 decoding, and a different structure from
both tide's fast path and its scalar golden reference (engine/ref/refmodel.c): the whole sequence
is processed at once, layer by layer (dense prefill), vectorised over tokens. It follows vLLM's CPU
quantisation points (doc 6.21): bf16 rounding of every GEMM output, of RMSNorm outputs, of q after
norm+RoPE, of KV after RoPE; fp8_ds_mla tiles for cached keys; fp8 with power-of-two scales for the
indexer; P rounded to bf16 before P.V.

Usage (run with Debian's python3, which has numpy):
  dsv4_numpy.py --model DIR --tokens 0,5,17 --out logits.f32
                [--replay-topk F.json] [--replay-routes F.json] [--dump-topk F.json] [--dump-routes F.json]
Writes float32 logits [T, vocab] little-endian and prints "T vocab". The replay options take
tide's `--dump-topk`/`--dump-routes` JSON and use those discrete decisions instead of computing
them, so continuous numbers can be compared with near-ties held equal (doc section 8).
"""
import argparse
import json
import math
import os
import struct
import sys

import numpy as np

F32 = np.float32


# ---------------------------------------------------------------- number formats
def bf16_round(x):
    """Round float32 values to bf16 precision (nearest even), keep float32 storage."""
    a = np.ascontiguousarray(x, dtype=F32)
    u = a.view(np.uint32).astype(np.uint64)
    nan = (u & 0x7FFFFFFF) > 0x7F800000
    r = ((u + 0x7FFF + ((u >> 16) & 1)) & 0xFFFF0000).astype(np.uint32)
    out = r.view(F32).reshape(a.shape)
    return np.where(nan, a, out).astype(F32)


def _e4m3_table():
    t = np.zeros(256, dtype=F32)
    for b in range(256):
        e, m = (b >> 3) & 15, b & 7
        if e == 15 and m == 7:
            v = float("nan")
        elif e == 0:
            v = m / 8.0 * 2.0 ** -6
        else:
            v = (1 + m / 8.0) * 2.0 ** (e - 7)
        t[b] = -v if b & 0x80 else v
    return t


E4M3 = _e4m3_table()
E2M1 = np.array([0, .5, 1, 1.5, 2, 3, 4, 6, -0.0, -.5, -1, -1.5, -2, -3, -4, -6], dtype=F32)


def e8m0(b):
    b = np.asarray(b).astype(np.int64)
    v = np.ldexp(np.float64(1.0), b - 127)
    return np.where(b == 255, np.nan, v)


def e4m3_round(v):
    """Nearest e4m3fn value of float values already clamped to +-448 (ties to even)."""
    v = np.asarray(v, dtype=np.float64)
    a = np.abs(v)
    with np.errstate(divide="ignore"):
        ex = np.floor(np.log2(np.where(a > 0, a, 1.0)))
    # correct possible log2 rounding at exact powers of two
    ex = np.where(np.ldexp(1.0, ex.astype(np.int64)) > a, ex - 1, ex)
    ex = np.where(np.ldexp(1.0, (ex + 1).astype(np.int64)) <= a, ex + 1, ex)
    ex = np.maximum(ex, -6)
    q = np.ldexp(1.0, (ex - 3).astype(np.int64))
    r = np.rint(a / q) * q
    r = np.minimum(r, 448.0)
    return np.copysign(r, v)


def ceil_log2(x):
    """ceil(log2 x) exactly, from the float's bits (doc section 8)."""
    m, e = np.frexp(np.asarray(x, dtype=np.float64))
    return np.where(m == 0.5, e - 1, e).astype(np.int64)


def quant_mla(vec, flush):
    """fp8_ds_mla round trip of [..., 512] bf16-valued vectors: dims 0..447 as 7 tiles of 64 fp8 with
    UE8M0 scales (CPU rule: s = max(amax/448, 1e-4), e = ceil(log2 s)), dims 448..511 bf16.
    `flush`: the SWA insert flushes scaled magnitudes below 2^-6 to zero before rounding."""
    v = np.asarray(vec, dtype=np.float64)
    out = np.empty_like(v)
    for t in range(7):
        tile = v[..., 64 * t:64 * t + 64]
        a = np.max(np.abs(tile), axis=-1, keepdims=True).astype(F32)
        s = np.maximum(a / F32(448.0), F32(1e-4))
        e = ceil_log2(s)
        x = np.clip(tile * np.ldexp(1.0, -e), -448.0, 448.0)
        if flush:
            x = np.where(np.abs(x) < 2.0 ** -6, 0.0, x)
        out[..., 64 * t:64 * t + 64] = e4m3_round(x) * np.ldexp(1.0, e)
    out[..., 448:] = bf16_round(v[..., 448:].astype(F32))
    return out.astype(F32)


def quant_pow2(vec):
    """Indexer fp8: one power-of-two scale per 128-vector (amax floored at 1e-4). Returns (q8 values, scale)."""
    v = np.asarray(vec, dtype=np.float64)
    a = np.maximum(np.max(np.abs(v), axis=-1, keepdims=True).astype(F32), F32(1e-4))
    e = ceil_log2(a / F32(448.0))
    q = e4m3_round(np.clip(v * np.ldexp(1.0, -e), -448.0, 448.0))
    return q, np.ldexp(1.0, e)[..., 0]


# ---------------------------------------------------------------- checkpoint
ST_DTYPES = {"F32": np.float32, "BF16": np.uint16, "F16": np.float16, "F8_E4M3": np.uint8, "F8_E8M0": np.uint8,
             "I8": np.uint8, "U8": np.uint8, "I32": np.int32, "I64": np.int64}


class Checkpoint:
    def __init__(self, path):
        self.dir = path if os.path.isdir(path) else os.path.dirname(path)
        with open(os.path.join(self.dir, "config.json")) as f:
            self.config = json.load(f)
        self.index = {}
        idx = os.path.join(self.dir, "model.safetensors.index.json")
        files = []
        if os.path.exists(idx):
            with open(idx) as f:
                files = sorted(set(json.load(f)["weight_map"].values()))
        else:
            files = ["model.safetensors"]
        for fn in files:
            full = os.path.join(self.dir, fn)
            with open(full, "rb") as f:
                n = struct.unpack("<Q", f.read(8))[0]
                hdr = json.loads(f.read(n))
            data = np.memmap(full, dtype=np.uint8, mode="r")
            base = 8 + n
            for name, info in hdr.items():
                if name == "__metadata__":
                    continue
                self.index[name] = (data, base + info["data_offsets"][0], base + info["data_offsets"][1],
                                    info["dtype"], info["shape"])

    def has(self, name):
        return name in self.index

    def raw(self, name):
        data, b, e, dt, shape = self.index[name]
        return np.frombuffer(data[b:e].tobytes(), dtype=ST_DTYPES[dt]).reshape(shape), dt

    def vec(self, name):
        a, dt = self.raw(name)
        if dt == "BF16":
            return (a.astype(np.uint32) << 16).view(F32).reshape(a.shape)
        return a.astype(F32)

    def matrix(self, name):
        """A weight as a float64 matrix [out, in], decoded from any checkpoint format."""
        a, dt = self.raw(name)
        if dt == "BF16":
            return ((a.astype(np.uint32) << 16).view(F32)).astype(np.float64)
        if dt in ("F32", "F16"):
            return a.astype(np.float64)
        sname = name[:-len(".weight")] + ".scale" if name.endswith(".weight") else name + ".scale"
        s, _ = self.raw(sname)
        if dt == "F8_E4M3":
            n, k = a.shape
            sc = e8m0(s)
            full = np.repeat(np.repeat(sc, 128, axis=0), 128, axis=1)[:n, :k]
            return E4M3[a].astype(np.float64) * full
        if dt in ("I8", "U8"):
            n, kh = a.shape
            lo, hi = E2M1[a & 15], E2M1[a >> 4]
            w = np.empty((n, kh * 2), dtype=np.float64)
            w[:, 0::2], w[:, 1::2] = lo, hi
            return w * np.repeat(e8m0(s), 32, axis=1)
        raise ValueError("unsupported dtype %s for %s" % (dt, name))


# ---------------------------------------------------------------- model pieces
def rmsnorm(x, w, eps):
    x = np.asarray(x, dtype=np.float64)
    r = 1.0 / np.sqrt(np.mean(x * x, axis=-1, keepdims=True) + eps)
    y = x * r
    if w is not None:
        y = y * w
    return y.astype(F32)


def mm(x, w):
    """GEMM in float64 (exact enough to stand for any accumulation order), rounded to bf16."""
    return bf16_round((np.asarray(x, dtype=np.float64) @ w.T).astype(F32))


def rope_freqs(cfg, compressed):
    theta = cfg["compress_rope_theta"] if compressed else cfg["rope_theta"]
    f = 1.0 / theta ** (np.arange(32, dtype=np.float64) * 2 / 64)
    rs = cfg.get("rope_scaling") or {}
    if compressed and rs and rs.get("type", rs.get("rope_type")) == "yarn":
        L0, s = rs["original_max_position_embeddings"], rs["factor"]
        bf, bs = rs.get("beta_fast", 32), rs.get("beta_slow", 1)

        def c(nrot):
            return 64 * math.log(L0 / (2 * math.pi * nrot)) / (2 * math.log(theta))
        lo, hi = max(math.floor(c(bf)), 0), min(math.ceil(c(bs)), 63)
        if lo == hi:
            hi += 0.001
        ramp = np.clip((np.arange(32) - lo) / (hi - lo), 0, 1)
        f = f * (1 - ramp) + f / s * ramp
    return f.astype(F32)


def rope(x, freqs, pos, inverse=False):
    """GPT-J interleaved rotation of the last axis (64 dims) at positions pos (broadcast over rows)."""
    ang = np.asarray(pos, dtype=F32)[..., None] * freqs
    c = np.cos(ang.astype(np.float64)).astype(F32)
    s = np.sin(ang.astype(np.float64)).astype(F32)
    while c.ndim < x.ndim:
        c, s = c[..., None, :], s[..., None, :]
    e, o = x[..., 0::2].astype(np.float64), x[..., 1::2].astype(np.float64)
    out = np.empty(x.shape, dtype=np.float64)
    if inverse:
        out[..., 0::2], out[..., 1::2] = e * c + o * s, o * c - e * s
    else:
        out[..., 0::2], out[..., 1::2] = e * c - o * s, e * s + o * c
    return out.astype(F32)


def sigmoid(x):
    return 1.0 / (1.0 + np.exp(-x))


def hc_pre(X, fn, scale, base, hc, iters, eps, hc_eps):
    T = X.shape[0]
    z = X.reshape(T, -1).astype(np.float64)
    rho = 1.0 / np.sqrt(np.mean(z * z, axis=1, keepdims=True) + eps)
    m = (z @ fn.astype(np.float64).T) * rho
    pre = sigmoid(scale[0] * m[:, :hc] + base[:hc]) + hc_eps
    post = 2.0 * sigmoid(scale[1] * m[:, hc:2 * hc] + base[hc:2 * hc])
    C = (scale[2] * m[:, 2 * hc:] + base[2 * hc:]).reshape(T, hc, hc)
    C = np.exp(C - C.max(axis=2, keepdims=True))
    C = C / C.sum(axis=2, keepdims=True) + hc_eps
    C = C / (C.sum(axis=1, keepdims=True) + hc_eps)
    for _ in range(iters - 1):
        C = C / (C.sum(axis=2, keepdims=True) + hc_eps)
        C = C / (C.sum(axis=1, keepdims=True) + hc_eps)
    x = bf16_round(np.einsum("ti,tid->td", pre, X.astype(np.float64)).astype(F32))
    return x, post, C


def hc_post(a, X, post, C):
    # out_j = post_j * a + sum_i C_ij X_i
    out = post[:, :, None] * a[:, None, :].astype(np.float64) + np.einsum("tij,tid->tjd", C, X.astype(np.float64))
    return bf16_round(out.astype(F32))


def hc_head(X, fn, scale, base, eps, hc_eps):
    T = X.shape[0]
    z = X.reshape(T, -1).astype(np.float64)
    rho = 1.0 / np.sqrt(np.mean(z * z, axis=1, keepdims=True) + eps)
    g = sigmoid(scale[0] * rho * (z @ fn.astype(np.float64).T) + base) + hc_eps
    return bf16_round(np.einsum("ti,tid->td", g, X.astype(np.float64)).astype(F32))


def pool(rows_a, rows_b, r, overlap, dc, j):
    """Softmax-gated pooling per channel for compressed entry j (doc 2.2.4).
    rows_a/rows_b: [T, c*dc] (b already includes ape)."""
    parts = []
    if overlap and j > 0:
        sl = slice((j - 1) * r, j * r)
        parts.append((rows_a[sl, :dc], rows_b[sl, :dc]))
    sl = slice(j * r, (j + 1) * r)
    off = dc if overlap else 0
    parts.append((rows_a[sl, off:off + dc], rows_b[sl, off:off + dc]))
    a = np.concatenate([p[0] for p in parts]).astype(np.float64)
    b = np.concatenate([p[1] for p in parts]).astype(np.float64)
    w = np.exp(b - b.max(axis=0, keepdims=True))
    w = w / w.sum(axis=0, keepdims=True)
    return (w * a).sum(axis=0).astype(F32)


class Model:
    def __init__(self, ck):
        self.ck = ck
        c = ck.config
        self.c = c
        self.L = c["num_hidden_layers"]
        self.ratios = [max(1, r) for r in c["compress_ratios"][:self.L]]
        self.eps = c.get("rms_norm_eps", 1e-6)
        self.hc = c.get("hc_mult", 4)
        self.fr_plain = rope_freqs(c, False)
        self.fr_comp = rope_freqs(c, True)
        self._cache = {}

    def m(self, name):
        if name not in self._cache:
            self._cache[name] = self.ck.matrix(name)
        return self._cache[name]

    def v(self, name):
        return self.ck.vec(name)

    # ---- attention of layer L over the whole sequence
    def attention(self, L, x, pos, replay_topk=None, dump=None, pre=None):
        c, P = self.c, (pre or "layers.%d." % L) + "attn."
        T, H, D = x.shape[0], c["num_attention_heads"], 512
        r = self.ratios[L] if pre is None else max(1, (c["compress_ratios"] + [0] * (L + 1))[L])
        fr = self.fr_comp if r > 1 else self.fr_plain
        qr = mm(x, self.m(P + "wq_a.weight"))
        kv = mm(x, self.m(P + "wkv.weight"))
        qr = bf16_round(rmsnorm(qr, self.v(P + "q_norm.weight"), self.eps))
        kv = bf16_round(rmsnorm(kv, self.v(P + "kv_norm.weight"), self.eps))
        q = mm(qr, self.m(P + "wq_b.weight")).reshape(T, H, D)
        q = rmsnorm(q, None, self.eps)
        q[..., 448:] = rope(q[..., 448:], fr, pos)
        q = bf16_round(q)
        kv = kv.copy()
        kv[:, 448:] = rope(kv[:, 448:], fr, pos)
        kv = bf16_round(kv)
        kwin = quant_mla(kv, flush=True)                  # [T, 512], position-indexed
        ent = np.zeros((0, D), dtype=F32)
        sel = [np.zeros(0, dtype=np.int64)] * T
        if r > 1:
            cw = (2 if r == 4 else 1) * D
            wkv, wg = self.m(P + "compressor.wkv.weight"), self.m(P + "compressor.wgate.weight")
            ra, rb = mm(x, wkv), mm(x, wg)
            ape = self.v(P + "compressor.ape").reshape(r, cw)
            rb = rb + ape[np.asarray(pos) % r]
            nent = T // r
            ents = []
            for j in range(nent):
                e = pool(ra, rb, r, r == 4, D, j)
                e = rmsnorm(e, self.v(P + "compressor.norm.weight"), self.eps)
                e[:448] = bf16_round(e[:448])
                e[448:] = rope(e[448:][None], fr, [j * r])[0]
                ents.append(quant_mla(e, flush=False))
            ent = np.array(ents, dtype=F32).reshape(nent, D)
            nvis = (np.asarray(pos) + 1) // r
            if r == 128:
                sel = [np.arange(n) for n in nvis]
            else:
                K = c.get("index_topk", 512)
                nI = c["index_n_heads"]
                ika, ikb = mm(x, self.m(P + "indexer.compressor.wkv.weight")), mm(x, self.m(P + "indexer.compressor.wgate.weight"))
                ikb = ikb + self.v(P + "indexer.compressor.ape").reshape(4, 256)[np.asarray(pos) % 4]
                ik8 = np.zeros((nent, 128))
                iks = np.zeros(nent)
                for j in range(nent):
                    k = pool(ika, ikb, 4, True, 128, j)
                    k = rmsnorm(k, self.v(P + "indexer.compressor.norm.weight"), self.eps)
                    k[64:] = rope(k[64:][None], fr, [j * 4])[0]
                    ik8[j], iks[j] = quant_pow2(bf16_round(k))
                need = [t for t in range(T) if nvis[t] > K]
                if need:
                    qi = mm(qr, self.m(P + "indexer.wq_b.weight")).reshape(T, nI, 128)
                    qi[..., 64:] = bf16_round(rope(qi[..., 64:], fr, pos))
                    q8, sq = quant_pow2(qi)                   # [T, nI, 128], [T, nI]
                    wr = mm(x, self.m(P + "indexer.weights_proj.weight"))   # [T, nI]
                    w = wr * sq * (128 ** -0.5) * (nI ** -0.5)
                for t in range(T):
                    n = int(nvis[t])
                    if replay_topk is not None and t < len(replay_topk) and nvis[t] > 0:
                        sel[t] = np.asarray(replay_topk[t], dtype=np.int64)
                    elif n <= K:
                        sel[t] = np.arange(n)
                    else:
                        dots = np.maximum(q8[t] @ ik8[:n].T, 0.0)          # [nI, n]
                        score = (w[t][:, None] * dots).sum(axis=0) * iks[:n]
                        score = score.astype(F32)
                        order = np.lexsort((np.arange(n), -score.astype(np.float64)))
                        sel[t] = np.sort(order[:K])
                if dump is not None:
                    dump[str(L)] = [sorted(int(i) for i in s) for s in sel]
        sink = self.v(P + "attn_sink")
        out = np.zeros((T, H, D), dtype=F32)
        W = c.get("sliding_window", 128)
        for t in range(T):
            p = int(pos[t])
            keys = np.concatenate([kwin[max(0, p - W + 1):p + 1], ent[sel[t]]]).astype(np.float64)
            s = (q[t].astype(np.float64) @ keys.T) / math.sqrt(D)      # [H, nk]
            s = s.astype(F32).astype(np.float64)
            mx = s.max(axis=1, keepdims=True)
            e = np.exp((s - mx).astype(F32)).astype(F32)
            Z = e.astype(np.float64).sum(axis=1)
            o = (bf16_round(e).astype(np.float64) @ keys) / (Z + np.exp(sink.astype(np.float64) - mx[:, 0]))[:, None]
            out[t] = bf16_round(o.astype(F32))
        out[..., 448:] = bf16_round(rope(out[..., 448:], fr, pos, inverse=True))
        G, ol = c["o_groups"], c["o_lora_rank"]
        hpg = H // G
        wo_a = self.m(P + "wo_a.weight")
        og = out.reshape(T, G, hpg * D)
        z = np.concatenate([mm(og[:, g], wo_a[g * ol:(g + 1) * ol]) for g in range(G)], axis=1)
        return mm(z, self.m(P + "wo_b.weight"))

    # ---- MoE of layer L
    def moe(self, L, x, ids, replay=None, dump=None, pre=None):
        c, P = self.c, (pre or "layers.%d." % L) + "ffn."
        T = x.shape[0]
        E, k = c["n_routed_experts"], c["num_experts_per_tok"]
        lim = c.get("swiglu_limit", 10.0)
        logits = (x.astype(np.float64) @ self.m(P + "gate.weight").T).astype(F32).astype(np.float64)
        fn = c.get("scoring_func", "sqrtsoftplus")
        if fn == "sqrtsoftplus":
            sc = np.sqrt(np.where(logits > 20, logits, np.log1p(np.exp(np.minimum(logits, 20)))))
        elif fn == "sigmoid":
            sc = sigmoid(logits)
        else:
            sc = np.exp(logits - logits.max(axis=1, keepdims=True))
            sc = sc / sc.sum(axis=1, keepdims=True)
        if replay is not None:
            sel = np.asarray(replay[:T], dtype=np.int64)
        elif pre is None and L < c.get("num_hash_layers", 0):
            tab, _ = self.ck.raw(P + "gate.tid2eid")
            sel = tab[np.asarray(ids)].astype(np.int64)
        else:
            biased = (sc + self.v(P + "gate.bias")).astype(F32).astype(np.float64)
            sel = np.stack([np.lexsort((np.arange(E), -biased[t]))[:k] for t in range(T)])
        if dump is not None:
            dump[str(L)] = [sorted(int(e) for e in row) for row in sel]
        wsel = np.take_along_axis(sc, sel, axis=1)
        if c.get("norm_topk_prob", True):
            wsel = wsel / wsel.sum(axis=1, keepdims=True)
        wsel = wsel * c.get("routed_scaling_factor", 1.0)

        def expert(xs, pre):
            g = mm(xs, self.m(pre + "w1.weight")).astype(np.float64)
            u = mm(xs, self.m(pre + "w3.weight")).astype(np.float64)
            if lim > 0:   # swiglu_limit <= 0: no clamp
                g = np.minimum(g, lim)
                u = np.clip(u, -lim, lim)
            h = bf16_round((g / (1.0 + np.exp(-g)) * u).astype(F32))
            return mm(h, self.m(pre + "w2.weight")).astype(np.float64)
        acc = np.zeros((T, x.shape[1]))
        for e in np.unique(sel):
            rows, slots = np.nonzero(sel == e)
            y = expert(x[rows], P + "experts.%d." % e)
            acc[rows] += wsel[rows, slots][:, None] * y
        if c.get("n_shared_experts", 0) > 0:
            acc += expert(x, P + "shared_experts.")
        return bf16_round(acc.astype(F32))

    def forward(self, ids, replay_topk=None, replay_routes=None, dump_topk=None, dump_routes=None):
        c = self.c
        T, d, hc = len(ids), c["hidden_size"], self.hc
        pos = np.arange(T)
        emb, dt = self.ck.raw("embed.weight")
        emb = (emb.astype(np.uint32) << 16).view(F32) if dt == "BF16" else emb.astype(F32)
        x0 = emb[np.asarray(ids)]
        X = np.repeat(x0[:, None, :], hc, axis=1).astype(F32)
        iters, hc_eps = c.get("hc_sinkhorn_iters", 20), c.get("hc_eps", 1e-6)
        for L in range(self.L):
            P = "layers.%d." % L
            x, post, C = hc_pre(X, self.v(P + "hc_attn_fn"), self.v(P + "hc_attn_scale"), self.v(P + "hc_attn_base"),
                                hc, iters, self.eps, hc_eps)
            x = bf16_round(rmsnorm(x, self.v(P + "attn_norm.weight"), self.eps))
            rt = replay_topk.get(str(L)) if replay_topk else None
            a = self.attention(L, x, pos, rt, dump_topk)
            X = hc_post(a, X, post, C)
            x, post, C = hc_pre(X, self.v(P + "hc_ffn_fn"), self.v(P + "hc_ffn_scale"), self.v(P + "hc_ffn_base"),
                                hc, iters, self.eps, hc_eps)
            x = bf16_round(rmsnorm(x, self.v(P + "ffn_norm.weight"), self.eps))
            rr = replay_routes.get(str(L)) if replay_routes else None
            f = self.moe(L, x, ids, rr, dump_routes)
            X = hc_post(f, X, post, C)
        self.X = X
        y = hc_head(X, self.v("hc_head_fn"), self.v("hc_head_scale"), self.v("hc_head_base"), self.eps, hc_eps)
        y = bf16_round(rmsnorm(y, self.v("norm.weight"), self.eps))
        return (y.astype(np.float64) @ self.m("head.weight").T).astype(F32)

    def mtp(self, ids, X, replay_routes=None):
        """The MTP block (doc 2.4) at positions 0..T-2: the main streams X [T, hc, d] of forward()
        with the next tokens ids[1..]; logits [T-1, vocab] (each predicts the token after next)."""
        c, hc, P, L = self.c, self.hc, "mtp.0.", self.L
        T, d = len(ids) - 1, c["hidden_size"]
        iters, hc_eps = c.get("hc_sinkhorn_iters", 20), c.get("hc_eps", 1e-6)
        nxt = list(ids[1:])
        emb, dt = self.ck.raw("embed.weight")
        emb = (emb.astype(np.uint32) << 16).view(F32) if dt == "BF16" else emb.astype(F32)
        e = bf16_round(rmsnorm(emb[np.asarray(nxt)], self.v(P + "enorm.weight"), self.eps))
        E = mm(e, self.m(P + "e_proj.weight"))
        h = bf16_round(rmsnorm(X[:T].reshape(T * hc, d), self.v(P + "hnorm.weight"), self.eps))
        Hp = mm(h, self.m(P + "h_proj.weight")).reshape(T, hc, d)
        X = bf16_round((E[:, None, :].astype(np.float64) + Hp).astype(F32))
        x, post, C = hc_pre(X, self.v(P + "hc_attn_fn"), self.v(P + "hc_attn_scale"), self.v(P + "hc_attn_base"),
                            hc, iters, self.eps, hc_eps)
        x = bf16_round(rmsnorm(x, self.v(P + "attn_norm.weight"), self.eps))
        X = hc_post(self.attention(L, x, np.arange(T), None, None, P), X, post, C)
        x, post, C = hc_pre(X, self.v(P + "hc_ffn_fn"), self.v(P + "hc_ffn_scale"), self.v(P + "hc_ffn_base"),
                            hc, iters, self.eps, hc_eps)
        x = bf16_round(rmsnorm(x, self.v(P + "ffn_norm.weight"), self.eps))
        X = hc_post(self.moe(L, x, nxt, replay_routes, None, P), X, post, C)
        y = hc_head(X, self.v(P + "hc_head_fn"), self.v(P + "hc_head_scale"), self.v(P + "hc_head_base"), self.eps,
                    hc_eps)
        y = bf16_round(rmsnorm(y, self.v(P + "norm.weight"), self.eps))
        return (y.astype(np.float64) @ self.m("head.weight").T).astype(F32)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--model", required=True)
    ap.add_argument("--tokens", required=True)
    ap.add_argument("--out", required=True)
    ap.add_argument("--replay-topk")
    ap.add_argument("--replay-routes")
    ap.add_argument("--dump-topk")
    ap.add_argument("--dump-routes")
    ap.add_argument("--mtp", action="store_true", help="write the MTP block's logits [T-1, vocab] instead")
    a = ap.parse_args()
    ids = [int(t) for t in a.tokens.replace(" ", ",").split(",") if t != ""]

    def load(p):
        if not p:
            return None
        with open(p) as f:
            return json.load(f)["layers"]
    dt, dr = ({} if a.dump_topk else None), ({} if a.dump_routes else None)
    m = Model(Checkpoint(a.model))
    logits = m.forward(ids, load(a.replay_topk), load(a.replay_routes), dt, dr)
    if a.mtp:
        logits = m.mtp(ids, m.X)
    logits.astype("<f4").tofile(a.out)
    for p, d in ((a.dump_topk, dt), (a.dump_routes, dr)):
        if p:
            with open(p, "w") as f:
                json.dump({"layers": d}, f)
    print(logits.shape[0], logits.shape[1])


if __name__ == "__main__":
    sys.exit(main())
