#!/usr/bin/python3
"""export.py - write a training checkpoint's weights as one float32 safetensors file with the
Hugging Face DeepSeek-V4 tensor names (int64 for ffn.gate.tid2eid), plus config.json.
scripts/train/export.lua then writes the quantised (or BF16) checkpoint tide loads.

  scripts/train/export.py --ckpt build/train/run/ckpt.pt --out build/train/f32
"""
import argparse
import json
import os
import struct
import sys

import torch

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
import model as M  # noqa: E402


def write_safetensors(path, tensors):
    names = sorted(tensors)
    hdr, off, blobs = {}, 0, []
    for n in names:
        t = tensors[n].contiguous()
        dt = {torch.float32: "F32", torch.int64: "I64"}[t.dtype]
        b = t.numpy().tobytes()
        hdr[n] = {"dtype": dt, "shape": list(t.shape), "data_offsets": [off, off + len(b)]}
        off += len(b)
        blobs.append(b)
    h = json.dumps(hdr, separators=(",", ":")).encode()
    h += b" " * ((8 - len(h) % 8) % 8)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(h)))
        f.write(h)
        for b in blobs:
            f.write(b)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--ckpt", required=True)
    ap.add_argument("--out", required=True)
    a = ap.parse_args()
    st = torch.load(a.ckpt)
    cfg = st["cfg"]
    model = M.Model(cfg)
    model.load_state_dict(st["model"])
    os.makedirs(a.out, exist_ok=True)
    tensors = M.checkpoint_tensors(model)
    write_safetensors(os.path.join(a.out, "model.f32.safetensors"), tensors)
    with open(os.path.join(a.out, "config.json"), "w") as f:
        json.dump(cfg, f, indent=2)
        f.write("\n")
    print("export: step %d, %d tensors -> %s" % (st["step"], len(tensors), a.out), file=sys.stderr)


if __name__ == "__main__":
    main()
