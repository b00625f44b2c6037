"""A/B table of two bench.attention JSONL runs (a tree before and after a kernel change, measured in the
same device call): per cell, diyflash's median ms in each, new / old, and each against its own run's
peer (default sdpa-cudnn), so drift between the runs shows in the peer's column.
    python -m bench.ab_table OLD.jsonl NEW.jsonl [--peer sdpa-cudnn]"""

from __future__ import annotations

import argparse
import json


def load(path: str) -> dict:
    rows = {}
    with open(path) as f:
        for line in f:
            r = json.loads(line)
            rows[(r["provider"], r["mode"], r["causal"], r["d"], r["n"], r["b"], r["h"], r["dtype"])] = r["ms"]
    return rows


def main():
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("old")
    parser.add_argument("new")
    parser.add_argument("--peer", default="sdpa-cudnn")
    args = parser.parse_args()
    old, new = load(args.old), load(args.new)
    print(f"{'mode':>4} {'causal':>6} {'BxH':>6} {'D':>4} {'N':>6} {'old ms':>8} {'new ms':>8} {'new/old':>8} "
          f"{'peer old/new':>12} {'vs peer old':>11} {'vs peer new':>11}")
    for key in sorted(k for k in new if k[0] == "diyflash" and k in old):
        _, mode, causal, d, n, b, h, _ = key
        peer = (args.peer, *key[1:])
        po, pn = old.get(peer), new.get(peer)
        ratio = lambda p, ms: f"{p / ms:11.3f}" if p else f"{'-':>11}"  # noqa: E731  (peer / ours: > 1 is faster)
        drift = f"{pn / po:12.3f}" if po and pn else f"{'-':>12}"
        print(f"{mode:>4} {str(causal):>6} {f'{b}x{h}':>6} {d:>4} {n:>6} {old[key]:8.3f} {new[key]:8.3f} {new[key] / old[key]:8.3f} "
              f"{drift} {ratio(po, old[key])} {ratio(pn, new[key])}")


if __name__ == "__main__":
    main()
