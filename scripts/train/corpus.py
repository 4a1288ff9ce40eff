#!/usr/bin/python3
"""corpus.py - build the English training corpus from Debian packages.

Sources (installed by name with apt-get when missing, see README.md here):
  bible-kjv, bible-kjv-text  the King James Bible (public domain), one document per chapter
  fortunes, fortunes-min     the BSD fortune(6) collections, one document per fortune

Writes OUT/train.txt and OUT/heldout.txt (documents separated by a blank line + "\n")
and OUT/stats.json. The split is by document and deterministic: a document goes to the
held-out set when crc32 of its id is 0 mod 25 (about 4%).

  scripts/train/corpus.py --out build/train/corpus [--root /]
--root reads the packages' files under another prefix (an extracted .deb tree).
"""
import argparse
import json
import os
import re
import subprocess
import sys
import zlib

PACKAGES = ["bible-kjv", "bible-kjv-text", "fortunes", "fortunes-min"]
SKIP_FORTUNES = {"ascii-art", "translate-me"}   # pictures, and non-English text


def ensure_packages(root):
    if root != "/":
        return
    need = [p for p in PACKAGES
            if subprocess.run(["dpkg", "-s", p], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL).returncode]
    if need:
        print("corpus: installing " + " ".join(need), file=sys.stderr)
        env = dict(os.environ, DEBIAN_FRONTEND="noninteractive")
        subprocess.run(["apt-get", "install", "-y", "-o", "DPkg::Lock::Timeout=600", "--no-install-recommends"] + need,
                       check=True, env=env, stdout=subprocess.DEVNULL)


def clean(text):
    text = text.replace("\r", "").replace("\t", "    ")
    text = "".join(ch for ch in text if ch == "\n" or ch >= " ")
    lines = [ln.rstrip() for ln in text.split("\n")]
    text = "\n".join(lines).strip("\n")
    return re.sub(r"\n{3,}", "\n\n", text)


def bible_docs(root):
    exe = os.path.join(root, "usr/bin/bible")
    data = os.path.join(root, "usr/lib")
    out = subprocess.run([exe, "-p", data, "Gen1:1-Rev22:21"], check=True, stdout=subprocess.PIPE,
                         env=dict(os.environ, COLUMNS="100000")).stdout.decode("utf-8", "replace")
    docs, title, verses, cur = [], None, [], None

    def flush():
        if title and verses:
            docs.append(("kjv:" + title, title + "\n\n" + "\n".join(verses)))
    for line in out.split("\n"):
        m = re.match(r"^\s+(\d+) (.*)$", line)
        if m and title:
            cur = m.group(2).strip()
            verses.append(cur)
        elif line.strip() == "":
            continue
        elif re.match(r"^\S.* \d+$", line) and not line.startswith(" "):
            flush()
            title, verses = line.strip(), []
        elif verses:       # a wrapped continuation (should not happen with a wide COLUMNS)
            verses[-1] += " " + line.strip()
    flush()
    return docs


def fortune_docs(root):
    d = os.path.join(root, "usr/share/games/fortunes")
    docs = []
    for name in sorted(os.listdir(d)):
        p = os.path.join(d, name)
        if "." in name or name in SKIP_FORTUNES or not os.path.isfile(p) or os.path.islink(p):
            continue
        with open(p, "rb") as f:
            text = f.read().decode("utf-8", "replace")
        for i, part in enumerate(re.split(r"\n%\n", "\n" + text + "\n")):
            part = clean(part)
            if len(part) >= 20:
                docs.append(("fortune:%s:%d" % (name, i), part))
    return docs


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--out", required=True)
    ap.add_argument("--root", default="/")
    a = ap.parse_args()
    ensure_packages(a.root)
    srcs = {"bible-kjv-text": bible_docs(a.root), "fortunes": fortune_docs(a.root)}
    os.makedirs(a.out, exist_ok=True)
    parts = {"train": [], "heldout": []}
    stats = {}
    for src, docs in srcs.items():
        st = {"documents": len(docs), "bytes": 0, "heldout_documents": 0, "heldout_bytes": 0}
        for did, text in docs:
            text = clean(text)
            b = len(text.encode("utf-8")) + 2
            held = zlib.crc32(did.encode()) % 25 == 0
            parts["heldout" if held else "train"].append(text)
            st["bytes"] += b
            if held:
                st["heldout_documents"] += 1
                st["heldout_bytes"] += b
        stats[src] = st
    for k, docs in parts.items():
        with open(os.path.join(a.out, k + ".txt"), "w", encoding="utf-8") as f:
            f.write("\n\n".join(docs) + "\n")
    with open(os.path.join(a.out, "stats.json"), "w") as f:
        json.dump(stats, f, indent=1, sort_keys=True)
    for src, st in stats.items():
        print("corpus: %-15s %6d docs %9d bytes (held out %d docs, %d bytes)" % (
            src, st["documents"], st["bytes"], st["heldout_documents"], st["heldout_bytes"]), file=sys.stderr)


if __name__ == "__main__":
    main()
