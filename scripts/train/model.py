"""model.py - DeepSeek-V4 in PyTorch for training (dense prefill form, float32).

Follows ../shared/docs/deepseek-v4.md section 2 (and tests/ref/dsv4_numpy.py, the NumPy
forward of the same architecture) without the inference-time bf16/fp8 rounding: mHC with
Sinkhorn, MQA attention with head_dim 512 (rope on the last 64 dims, GPT-J pairs), sliding
window, attention sink, the ratio-4 compressor with overlap plus the lightning indexer's
top-k, the ratio-128 compressor, hash-routed and bias-routed sqrt-softplus MoE with a shared
expert, and the MTP block. Parameter names are the checkpoint's (section 1.6) with '.'
replaced by '__' inside modules, so export is a rename.
"""
import math

import torch
import torch.nn.functional as F

D, R, DI = 512, 64, 128
NOPE = D - R


def rope_freqs(cfg, compressed):
    theta = cfg["compress_rope_theta"] if compressed else cfg["rope_theta"]
    f = 1.0 / theta ** (torch.arange(32, dtype=torch.float64) * 2 / 64)
    rs = cfg.get("rope_scaling") or {}
    if compressed and rs and rs.get("type", rs.get("rope_type")) == "yarn":
        L0, s = rs["original_max_position_embeddings"], rs["factor"]
        bf, bs = rs.get("beta_fast", 32), rs.get("beta_slow", 1)

        def c(nrot):
            return 64 * math.log(L0 / (2 * math.pi * nrot)) / (2 * math.log(theta))
        lo, hi = max(math.floor(c(bf)), 0), min(math.ceil(c(bs)), 63)
        if lo == hi:
            hi += 0.001
        ramp = torch.clamp((torch.arange(32, dtype=torch.float64) - lo) / (hi - lo), 0, 1)
        f = f * (1 - ramp) + f / s * ramp
    return f.float()


def rope_table(freqs, pos):
    ang = pos.float()[:, None] * freqs[None, :]
    return torch.cos(ang), torch.sin(ang)          # [T, 32] each


def rope(x, cs, inverse=False):
    """Rotate interleaved pairs of the last axis (64 dims); cs = (cos, sin) [T, 32] broadcast on
    x [..., T, (heads,) 64] via the caller's reshape."""
    c, s = cs
    e, o = x[..., 0::2], x[..., 1::2]
    if inverse:
        e2, o2 = e * c + o * s, o * c - e * s
    else:
        e2, o2 = e * c - o * s, e * s + o * c
    return torch.stack((e2, o2), dim=-1).flatten(-2)


def rmsnorm(x, w, eps):
    y = x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps)
    return y * w if w is not None else y


def lin(x, w):
    return x @ w.t()


class HC(torch.nn.Module):
    """mHC pre/post parameters of one sub-layer (fn [24, 4d], base [24], scale [3])."""

    def __init__(self, d, hc, gen):
        super().__init__()
        mix = (2 + hc) * hc
        self.fn = torch.nn.Parameter(torch.randn(mix, hc * d, generator=gen) * (0.1 / math.sqrt(hc * d)))
        base = torch.zeros(mix)
        base[2 * hc:] = (torch.eye(hc) * 2.0).flatten()     # comb starts near the identity
        self.base = torch.nn.Parameter(base)
        self.scale = torch.nn.Parameter(torch.ones(3))


def hc_pre(X, p, hc, iters, eps, hc_eps):
    B, T = X.shape[:2]
    z = X.reshape(B, T, -1)
    rho = torch.rsqrt(z.pow(2).mean(-1, keepdim=True) + eps)
    m = lin(z, p.fn) * rho
    s, base = p.scale, p.base
    pre = torch.sigmoid(s[0] * m[..., :hc] + base[:hc]) + hc_eps
    post = 2.0 * torch.sigmoid(s[1] * m[..., hc:2 * hc] + base[hc:2 * hc])
    C = (s[2] * m[..., 2 * hc:] + base[2 * hc:]).reshape(B, T, hc, hc)
    C = torch.softmax(C, dim=-1) + hc_eps
    C = C / (C.sum(-2, keepdim=True) + hc_eps)
    for _ in range(iters - 1):
        C = C / (C.sum(-1, keepdim=True) + hc_eps)
        C = C / (C.sum(-2, keepdim=True) + hc_eps)
    x = torch.einsum("bti,btid->btd", pre, X)
    return x, post, C


def hc_post(a, X, post, C):
    return post[..., None] * a[:, :, None, :] + torch.einsum("btij,btid->btjd", C, X)


def hc_head(X, fn, scale, base, eps, hc_eps):
    B, T = X.shape[:2]
    z = X.reshape(B, T, -1)
    rho = torch.rsqrt(z.pow(2).mean(-1, keepdim=True) + eps)
    g = torch.sigmoid(scale[0] * rho * lin(z, fn) + base) + hc_eps
    return torch.einsum("bti,btid->btd", g, X)


def compress(a, b, r, dc):
    """Softmax-gated pooling (doc 2.2.4) of all complete blocks: a, b [B, T, c*dc] (b includes ape)
    -> [B, T//r, dc]."""
    B, T, _ = a.shape
    n = T // r
    a, b = a[:, :n * r], b[:, :n * r]
    if r == 4:
        a1 = a[..., :dc].reshape(B, n, r, dc)
        b1 = b[..., :dc].reshape(B, n, r, dc)
        a2 = a[..., dc:].reshape(B, n, r, dc)
        b2 = b[..., dc:].reshape(B, n, r, dc)
        a1 = torch.cat([torch.zeros_like(a1[:, :1]), a1[:, :-1]], 1)
        b1 = torch.cat([torch.full_like(b1[:, :1], -1e9), b1[:, :-1]], 1)
        A, Bs = torch.cat([a1, a2], 2), torch.cat([b1, b2], 2)
    else:
        A, Bs = a[..., :dc].reshape(B, n, r, dc), b[..., :dc].reshape(B, n, r, dc)
    w = torch.softmax(Bs, dim=2)
    return (w * A).sum(2)


def randn(gen, *shape, std):
    return torch.nn.Parameter(torch.randn(*shape, generator=gen) * std)


class Block(torch.nn.Module):
    def __init__(self, cfg, L, ratio, hash_layer, gen, mtp=False):
        super().__init__()
        d, H, ql, ol, G = cfg["hidden_size"], cfg["num_attention_heads"], cfg["q_lora_rank"], cfg["o_lora_rank"], cfg["o_groups"]
        E, inter, hc = cfg["n_routed_experts"], cfg["moe_intermediate_size"], cfg["hc_mult"]
        nI = cfg["index_n_heads"]
        self.cfg, self.L, self.r, self.hash, self.mtp = cfg, L, ratio, hash_layer, mtp
        self.hc_attn, self.hc_ffn = HC(d, hc, gen), HC(d, hc, gen)
        self.attn_norm = torch.nn.Parameter(torch.ones(d))
        self.ffn_norm = torch.nn.Parameter(torch.ones(d))
        self.wq_a = randn(gen, ql, d, std=d ** -0.5)
        self.q_norm = torch.nn.Parameter(torch.ones(ql))
        self.wq_b = randn(gen, H * D, ql, std=ql ** -0.5)
        self.wkv = randn(gen, D, d, std=d ** -0.5)
        self.kv_norm = torch.nn.Parameter(torch.ones(D))
        self.wo_a = randn(gen, G * ol, (H // G) * D, std=((H // G) * D) ** -0.5)
        self.wo_b = randn(gen, d, G * ol, std=0.1 * (G * ol) ** -0.5)   # blocks start near the identity
        self.attn_sink = torch.nn.Parameter(torch.zeros(H))
        if ratio > 1:
            cw = (2 if ratio == 4 else 1) * D
            self.c_wkv = randn(gen, cw, d, std=d ** -0.5)
            self.c_wgate = randn(gen, cw, d, std=d ** -0.5)
            self.c_ape = torch.nn.Parameter(torch.zeros(ratio, cw))
            self.c_norm = torch.nn.Parameter(torch.ones(D))
        if ratio == 4:
            self.i_wq_b = randn(gen, nI * DI, ql, std=ql ** -0.5)
            self.i_weights_proj = randn(gen, nI, d, std=d ** -0.5)
            self.i_c_wkv = randn(gen, 2 * DI, d, std=d ** -0.5)
            self.i_c_wgate = randn(gen, 2 * DI, d, std=d ** -0.5)
            self.i_c_ape = torch.nn.Parameter(torch.zeros(4, 2 * DI))
            self.i_c_norm = torch.nn.Parameter(torch.ones(DI))
        self.gate = randn(gen, E, d, std=d ** -0.5)
        if hash_layer:
            k = cfg["num_experts_per_tok"]
            perm = torch.argsort(torch.rand(cfg["vocab_size"], E, generator=gen), dim=1)[:, :k]
            self.register_buffer("tid2eid", perm.to(torch.int64))
        else:
            self.register_buffer("gate_bias", torch.zeros(E))
        self.w1 = randn(gen, E, inter, d, std=d ** -0.5)
        self.w3 = randn(gen, E, inter, d, std=d ** -0.5)
        self.w2 = randn(gen, E, d, inter, std=0.1 * inter ** -0.5)
        sh = cfg["n_shared_experts"] * inter
        self.s_w1 = randn(gen, sh, d, std=d ** -0.5)
        self.s_w3 = randn(gen, sh, d, std=d ** -0.5)
        self.s_w2 = randn(gen, d, sh, std=0.1 * sh ** -0.5)
        self.load = None

    # ---- attention (dense prefill over one batch of sequences starting at position 0)
    def attention(self, x, tabs, opts, aux):
        cfg, eps = self.cfg, self.cfg["rms_norm_eps"]
        B, T, _ = x.shape
        H, r, W = cfg["num_attention_heads"], self.r, cfg["sliding_window"]
        cs = tabs["comp"] if r > 1 else tabs["plain"]
        qr = rmsnorm(lin(x, self.wq_a), self.q_norm, eps)
        kv = rmsnorm(lin(x, self.wkv), self.kv_norm, eps)
        q = lin(qr, self.wq_b).reshape(B, T, H, D)
        q = rmsnorm(q, None, eps)
        csh = (cs[0][:, None, :], cs[1][:, None, :])
        q = torch.cat([q[..., :NOPE], rope(q[..., NOPE:], csh)], -1)
        kv = torch.cat([kv[..., :NOPE], rope(kv[..., NOPE:], cs)], -1)
        pos = tabs["pos"]
        scale = D ** -0.5
        qh = q.permute(0, 2, 1, 3)                                        # [B, H, T, D]
        s_win = torch.matmul(qh, kv.transpose(1, 2)[:, None]) * scale    # [B, H, T, T]
        win = (pos[None, :] <= pos[:, None]) & (pos[None, :] > pos[:, None] - W)
        s_win = s_win.masked_fill(~win, float("-inf"))
        parts, vals = [s_win], [kv]
        if r > 1:
            n = T // r
            a = lin(x, self.c_wkv)
            b = lin(x, self.c_wgate) + self.c_ape[pos % r]
            ent = compress(a, b, r, D)
            ent = rmsnorm(ent, self.c_norm, eps)
            ecs = (tabs["comp"][0][0:n * r:r], tabs["comp"][1][0:n * r:r])
            ent = torch.cat([ent[..., :NOPE], rope(ent[..., NOPE:], ecs)], -1)    # [B, n, D]
            s_c = torch.matmul(qh, ent.transpose(1, 2)[:, None]) * scale          # [B, H, T, n]
            vis = torch.arange(n)[None, :] < ((pos + 1) // r)[:, None]             # [T, n]
            mask = vis[None].expand(B, T, n)
            if r == 4 and n > 0:
                iscore = self.indexer(x.detach(), qr.detach(), tabs, n)            # [B, T, n]
                K = cfg["index_topk"]
                mode = opts.get("index_mode", "topk")
                if mode == "topk" and n > K:
                    sel = torch.zeros(B, T, n, dtype=torch.bool)
                    sel.scatter_(2, iscore.detach().masked_fill(~vis[None], float("-inf")).topk(K, dim=2).indices, True)
                    mask = mask & sel
                elif mode == "random" and n > K:
                    g = torch.rand(B, T, n, generator=opts["gen"]).masked_fill(~vis[None], -1.0)
                    sel = torch.zeros(B, T, n, dtype=torch.bool)
                    sel.scatter_(2, g.topk(K, dim=2).indices, True)
                    mask = mask & sel
                if opts.get("train_indexer", False):
                    # target: the main attention's distribution over the visible compressed entries,
                    # averaged over heads (detached); the indexer learns it by KL
                    with torch.no_grad():
                        tgt = torch.softmax(s_c.detach().masked_fill(~vis[None, None], -1e9), -1).mean(1)
                    logq = torch.log_softmax(iscore.masked_fill(~vis[None], -1e9), -1)
                    rows = vis.any(1)[None].expand(B, T)
                    kl = (tgt * (torch.log(tgt.clamp_min(1e-12)) - logq)).masked_fill(~vis[None], 0).sum(-1)
                    aux["indexer_kl"].append(kl[rows].mean())
            s_c = s_c.masked_fill(~mask[:, None], float("-inf"))
            parts.append(s_c)
            vals.append(ent)
        sink = self.attn_sink[None, :, None, None].expand(B, H, T, 1)
        P = torch.softmax(torch.cat(parts + [sink], -1), -1)
        o = torch.matmul(P[..., :T], kv[:, None])
        if r > 1:
            o = o + torch.matmul(P[..., T:-1], vals[1][:, None])
        o = o.permute(0, 2, 1, 3)                                         # [B, T, H, D]
        o = torch.cat([o[..., :NOPE], rope(o[..., NOPE:], csh, inverse=True)], -1)
        G, ol = cfg["o_groups"], cfg["o_lora_rank"]
        og = o.reshape(B, T, G, (H // G) * D)
        wa = self.wo_a.reshape(G, ol, (H // G) * D)
        z = torch.einsum("btgk,gok->btgo", og, wa).reshape(B, T, G * ol)
        return lin(z, self.wo_b)

    def indexer(self, x, qr, tabs, n):
        cfg, eps = self.cfg, self.cfg["rms_norm_eps"]
        B, T, _ = x.shape
        nI = cfg["index_n_heads"]
        pos = tabs["pos"]
        cs = tabs["comp"]
        qi = lin(qr, self.i_wq_b).reshape(B, T, nI, DI)
        qi = torch.cat([qi[..., :64], rope(qi[..., 64:], (cs[0][:, None, :], cs[1][:, None, :]))], -1)
        a = lin(x, self.i_c_wkv)
        b = lin(x, self.i_c_wgate) + self.i_c_ape[pos % 4]
        k = rmsnorm(compress(a, b, 4, DI), self.i_c_norm, eps)
        kcs = (cs[0][0:n * 4:4], cs[1][0:n * 4:4])
        k = torch.cat([k[..., :64], rope(k[..., 64:], kcs)], -1)             # [B, n, 128]
        w = lin(x, self.i_weights_proj) * (DI ** -0.5) * (nI ** -0.5)    # [B, T, nI]
        dots = torch.relu(torch.einsum("bthd,bjd->bthj", qi, k))
        return torch.einsum("bth,bthj->btj", w, dots)

    # ---- MoE
    def moe(self, x, ids):
        cfg = self.cfg
        B, T, d = x.shape
        xf = x.reshape(-1, d)
        lim = cfg["swiglu_limit"]
        logits = lin(xf, self.gate)
        sc = torch.sqrt(F.softplus(logits))
        k = cfg["num_experts_per_tok"]
        if self.hash:
            sel = self.tid2eid[ids.reshape(-1)]
        else:
            sel = (sc.detach() + self.gate_bias).topk(k, dim=1).indices
            self.load = torch.bincount(sel.reshape(-1), minlength=cfg["n_routed_experts"]).float()
        w = sc.gather(1, sel)
        w = w / w.sum(1, keepdim=True) * cfg["routed_scaling_factor"]

        def ffn(xs, w1, w3, w2):
            g = torch.clamp(lin(xs, w1), max=lim)
            u = torch.clamp(lin(xs, w3), -lim, lim)
            return lin(F.silu(g) * u, w2)
        out = ffn(xf, self.s_w1, self.s_w3, self.s_w2)
        for e in range(cfg["n_routed_experts"]):
            rows, slots = torch.nonzero(sel == e, as_tuple=True)
            if rows.numel() == 0:
                continue
            y = ffn(xf[rows], self.w1[e], self.w3[e], self.w2[e])
            out = out.index_add(0, rows, y * w[rows, slots][:, None])
        return out.reshape(B, T, d)

    def forward(self, X, ids, tabs, opts, aux):
        cfg = self.cfg
        hc, it, eps, he = cfg["hc_mult"], cfg["hc_sinkhorn_iters"], cfg["rms_norm_eps"], cfg["hc_eps"]
        x, post, C = hc_pre(X, self.hc_attn, hc, it, eps, he)
        x = rmsnorm(x, self.attn_norm, eps)
        X = hc_post(self.attention(x, tabs, opts, aux), X, post, C)
        x, post, C = hc_pre(X, self.hc_ffn, hc, it, eps, he)
        x = rmsnorm(x, self.ffn_norm, eps)
        return hc_post(self.moe(x, ids), X, post, C)


class Model(torch.nn.Module):
    def __init__(self, cfg, seed=1):
        super().__init__()
        gen = torch.Generator().manual_seed(seed)
        self.cfg = cfg
        V, d, hc = cfg["vocab_size"], cfg["hidden_size"], cfg["hc_mult"]
        nL = cfg["num_hidden_layers"]
        self.embed = randn(gen, V, d, std=1.0)
        self.head = randn(gen, V, d, std=d ** -0.5)
        self.norm = torch.nn.Parameter(torch.ones(d))
        self.hc_head_fn = randn(gen, hc, hc * d, std=0.1 / math.sqrt(hc * d))
        self.hc_head_base = torch.nn.Parameter(torch.zeros(hc))
        self.hc_head_scale = torch.nn.Parameter(torch.ones(1))
        ratios = [max(1, r) for r in cfg["compress_ratios"][:nL]]
        self.layers = torch.nn.ModuleList(
            [Block(cfg, L, ratios[L], L < cfg["num_hash_layers"], gen) for L in range(nL)])
        # MTP block (num_nextn_predict_layers = 1): SWA-only, bias-routed
        self.mtp = Block(cfg, nL, 1, False, gen, mtp=True)
        self.mtp_e_proj = torch.nn.Parameter(torch.eye(d) + torch.randn(d, d, generator=gen) * (0.1 * d ** -0.5))
        self.mtp_h_proj = randn(gen, d, d, std=0.1 * d ** -0.5)
        self.mtp_enorm = torch.nn.Parameter(torch.ones(d))
        self.mtp_hnorm = torch.nn.Parameter(torch.ones(d))
        self.mtp_norm = torch.nn.Parameter(torch.ones(d))
        self.mtp_hc_head_fn = randn(gen, hc, hc * d, std=0.1 / math.sqrt(hc * d))
        self.mtp_hc_head_base = torch.nn.Parameter(torch.zeros(hc))
        self.mtp_hc_head_scale = torch.nn.Parameter(torch.ones(1))
        self.fr_plain = rope_freqs(cfg, False)
        self.fr_comp = rope_freqs(cfg, True)

    def bigram_logits(self, ids):
        """The model with every block skipped: head . norm(embed) (the warm start's objective)."""
        eps = self.cfg["rms_norm_eps"]
        return lin(rmsnorm(self.embed[ids], self.norm, eps), self.head)

    def tables(self, T):
        pos = torch.arange(T)
        return {"pos": pos, "plain": rope_table(self.fr_plain, pos), "comp": rope_table(self.fr_comp, pos)}

    def forward(self, ids, opts=None, mtp_ids=None):
        """ids [B, T] -> (logits [B, T, V], mtp logits [B, T, V] or None, aux). mtp_ids [B, T] are the
        next tokens (ids shifted by one) fed to the MTP block."""
        opts = opts or {}
        cfg = self.cfg
        eps, he, hc = cfg["rms_norm_eps"], cfg["hc_eps"], cfg["hc_mult"]
        B, T = ids.shape
        tabs = self.tables(T)
        aux = {"indexer_kl": []}
        X = self.embed[ids][:, :, None, :].expand(B, T, hc, cfg["hidden_size"]).contiguous()
        for blk in self.layers:
            X = blk(X, ids, tabs, opts, aux)
        y = rmsnorm(hc_head(X, self.hc_head_fn, self.hc_head_scale, self.hc_head_base, eps, he), self.norm, eps)
        logits = lin(y, self.head)
        mlog = None
        if mtp_ids is not None:
            e = rmsnorm(self.embed[mtp_ids], self.mtp_enorm, eps)
            h = rmsnorm(X, self.mtp_hnorm, eps)
            X2 = lin(e, self.mtp_e_proj)[:, :, None, :] + lin(h, self.mtp_h_proj)
            X2 = self.mtp(X2, mtp_ids, tabs, opts, aux)
            y2 = rmsnorm(hc_head(X2, self.mtp_hc_head_fn, self.mtp_hc_head_scale, self.mtp_hc_head_base, eps, he),
                         self.mtp_norm, eps)
            mlog = lin(y2, self.head)
        return logits, mlog, aux

    def balance(self, rate):
        """Auxiliary-loss-free balancing: move each biased layer's expert bias against its load."""
        for blk in list(self.layers) + [self.mtp]:
            if not blk.hash and blk.load is not None:
                blk.gate_bias -= rate * torch.sign(blk.load - blk.load.mean())
                blk.load = None


# ---- names in the checkpoint (doc section 1.6)
BLOCK_NAMES = {
    "hc_attn.fn": "hc_attn_fn", "hc_attn.base": "hc_attn_base", "hc_attn.scale": "hc_attn_scale",
    "hc_ffn.fn": "hc_ffn_fn", "hc_ffn.base": "hc_ffn_base", "hc_ffn.scale": "hc_ffn_scale",
    "attn_norm": "attn_norm.weight", "ffn_norm": "ffn_norm.weight",
    "wq_a": "attn.wq_a.weight", "q_norm": "attn.q_norm.weight", "wq_b": "attn.wq_b.weight",
    "wkv": "attn.wkv.weight", "kv_norm": "attn.kv_norm.weight", "wo_a": "attn.wo_a.weight",
    "wo_b": "attn.wo_b.weight", "attn_sink": "attn.attn_sink",
    "c_wkv": "attn.compressor.wkv.weight", "c_wgate": "attn.compressor.wgate.weight",
    "c_ape": "attn.compressor.ape", "c_norm": "attn.compressor.norm.weight",
    "i_wq_b": "attn.indexer.wq_b.weight", "i_weights_proj": "attn.indexer.weights_proj.weight",
    "i_c_wkv": "attn.indexer.compressor.wkv.weight", "i_c_wgate": "attn.indexer.compressor.wgate.weight",
    "i_c_ape": "attn.indexer.compressor.ape", "i_c_norm": "attn.indexer.compressor.norm.weight",
    "gate": "ffn.gate.weight", "tid2eid": "ffn.gate.tid2eid", "gate_bias": "ffn.gate.bias",
    "s_w1": "ffn.shared_experts.w1.weight", "s_w2": "ffn.shared_experts.w2.weight",
    "s_w3": "ffn.shared_experts.w3.weight",
}
TOP_NAMES = {"embed": "embed.weight", "head": "head.weight", "norm": "norm.weight", "hc_head_fn": "hc_head_fn",
             "hc_head_base": "hc_head_base", "hc_head_scale": "hc_head_scale",
             "mtp_e_proj": "e_proj.weight", "mtp_h_proj": "h_proj.weight", "mtp_enorm": "enorm.weight",
             "mtp_hnorm": "hnorm.weight", "mtp_norm": "norm.weight", "mtp_hc_head_fn": "hc_head_fn",
             "mtp_hc_head_base": "hc_head_base", "mtp_hc_head_scale": "hc_head_scale"}


def checkpoint_tensors(model):
    """{checkpoint name: float32 or int64 tensor} in the HF layout."""
    out = {}
    nL = model.cfg["num_hidden_layers"]
    sd = model.state_dict()
    for k, v in sd.items():
        parts = k.split(".")
        if parts[0] == "layers" or parts[0] == "mtp":
            pre = ("layers.%s." % parts[1]) if parts[0] == "layers" else "mtp.0."
            rest = ".".join(parts[2:] if parts[0] == "layers" else parts[1:])
            if rest in ("w1", "w2", "w3"):
                for e in range(v.shape[0]):
                    out[pre + "ffn.experts.%d.%s.weight" % (e, rest)] = v[e].clone()
                continue
            out[pre + BLOCK_NAMES[rest]] = v.clone()
        else:
            name = TOP_NAMES[k]
            out[("mtp.0." + name) if k.startswith("mtp_") else name] = v.clone()
    del nL
    return out
