#!/usr/bin/env python3
"""Markdown tables of docs/caching.md from the JSON lines bench/cache_sim.sh writes.

Usage: bench/cache_table.py OUT_DIR   (reads A, B, A1, B1, C, D .jsonl; any missing is skipped)
"""
import json
import os
import sys
from collections import defaultdict

TITLES = {
    "A": "A. GNNLab's GCN setting: fanouts 15,10,5, batch 8000 (10 evaluated epochs)",
    "B": "B. Batches per epoch as on the real datasets (10 evaluated epochs)",
    "A1": "A1. As A, one evaluated epoch against its own oracle",
    "B1": "B1. As B, one evaluated epoch against its own oracle",
    "C": "C. GraphSAGE fanouts 10,25 (10 evaluated epochs)",
    "D": "D. Weighted k-hop, GNNLab's newer-neighbour weights, fanouts 15,10,5 (10 evaluated epochs)",
}
POLICIES = ["random", "degree", "presc1", "presc2", "optimal"]


def pct(x):
    return f"{100 * x:.1f}%"


def table(rows):
    cells = defaultdict(dict)  # (name, batch, ratio) -> policy -> row
    order = []
    for r in rows:
        key = (r["name"], r["batch_size"], r["ratio"])
        if key not in cells:
            order.append(key)
        cells[key][r["policy"]] = r
    present = [p for p in POLICIES if any(p in c for c in cells.values())]
    head = ["dataset", "fanouts", "batch (batches/epoch)", "alpha"] + present
    if "presc1" in present:
        head += ["presc1 % of opt"]
    if "presc2" in present:
        head += ["presc2 % of opt"]
    head += ["presc1 / degree", "host MB/epoch presc1"]
    mr = any(r.get("mr_saved_bytes_per_epoch") is not None for r in rows)
    if mr:
        head += ["+MR saved MB/epoch"]
    out = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for key in order:
        c = cells[key]
        any_row = next(iter(c.values()))
        per_epoch = any_row["batches"]  # cache-sim reports batches per epoch
        line = [key[0], any_row["fanouts_hop_order"], f"{key[1]} ({per_epoch})", str(key[2])]
        line += [pct(c[p]["hit_rate"]) if p in c else "" for p in present]
        for p in ("presc1", "presc2"):
            if p in present:
                line.append(pct(c[p]["share_of_optimal"]) if p in c else "")
        p1, dg = c.get("presc1"), c.get("degree")
        line.append(f"{p1['hit_rate'] / dg['hit_rate']:.2f}x" if p1 and dg and dg["hit_rate"] else "")
        line.append(f"{p1['bytes_per_epoch'] / 1e6:.1f}" if p1 else "")
        if mr:
            s = p1.get("mr_saved_bytes_per_epoch") if p1 else None
            line.append(f"{s / 1e6:.1f}" if s is not None else "")
        out.append("| " + " | ".join(line) + " |")
    return "\n".join(out)


def similarity(rows):
    seen, out = set(), []
    for r in rows:
        s = r.get("similarity")
        key = (r["name"], r["batch_size"])
        if not s or key in seen:
            continue
        seen.add(key)
        m = s["matching"]
        out.append(
            f"- {key[0]} batch {key[1]}: footprint similarity {pct(s['footprint_similarity'])}, "
            f"avg M {pct(m['avg_m'])} (delta M {pct(m['delta_m'])}; adjacent {pct(m['avg_adjacent_m'])} "
            f"sampled, {pct(m['avg_adjacent_m_reordered'])} reordered; {m['batches']} batches)"
        )
    return "\n".join(out)


def main():
    d = sys.argv[1]
    for name, title in TITLES.items():
        path = os.path.join(d, f"{name}.jsonl")
        if not os.path.exists(path):
            continue
        rows = [json.loads(l) for l in open(path) if l.strip()]
        print(f"### {title}\n\n{table(rows)}\n")
        s = similarity(rows)
        if s:
            print(f"Similarity and match degrees (`--similarity`, epochs 0 -> 1):\n\n{s}\n")


if __name__ == "__main__":
    main()
