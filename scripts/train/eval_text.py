#!/usr/bin/python3
"""eval_text.py - the evaluation text of measure.sh: the first ~26 KB of the held-out KJV
chapters and the first ~14 KB of the held-out fortunes (about the held-out set's mix), cut
at line ends.   eval_text.py HELDOUT.txt OUT.txt"""
import sys

t = open(sys.argv[1], encoding="utf-8").read()
# corpus.py writes the KJV chapters first, then the fortunes; the last chapter is Revelation's
# or an earlier book's: find the first document that does not start with "<Book> <n>\n\n"
import re  # noqa: E402
docs = t.split("\n\n")
pos, split = 0, None
i = 0
while i < len(docs):
    if re.match(r"^(\d )?[A-Z][A-Za-z ]+ \d+$", docs[i]):
        pos += len(docs[i]) + 2 + len(docs[i + 1]) + 2
        i += 2
        continue
    split = pos
    break


def cut(s, n):
    s = s[:n]
    return s[:s.rfind("\n") + 1]


out = cut(t[:split], 26000) + "\n" + cut(t[split:], 14000)
open(sys.argv[2], "w", encoding="utf-8").write(out)
print("eval_text: %d bytes (%d of KJV, then fortunes from byte %d of the held-out set)" % (
    len(out.encode()), len(cut(t[:split], 26000).encode()), split), file=sys.stderr)
