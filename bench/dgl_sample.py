#!/usr/bin/env python3
"""DGL's CPU neighbour sampler on a fanout dataset directory, measured like `fanout sample-bench`.

Loads the SAME directory (np.memmap of indptr.bin / indices.bin, CSC: row v = in-neighbours),
builds `dgl.graph(('csc', (indptr, indices, [])))`, and samples the training set with
`dgl.dataloading.NeighborSampler` + `DataLoader` (shuffled, num_workers=0: sampling runs in this
process on `--threads` OpenMP/torch threads). Fanouts are given in fanout's hop order from the
seeds and reversed here, because DGL lists them from the input layer outward.

Sampled edges are counted as fanout counts them: the sum of the blocks' edge counts. Input
nodes are the first block's source nodes. Warm-up batches are excluded; each run times
`--batches` batches; the median over `--runs` runs is reported.

Prints one JSON object: seps, batches_per_s, mean_input_nodes, threads and the per-run figures.
"""
import argparse
import json
import os
import statistics
import sys
import time


def parse():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--dataset", required=True)
    p.add_argument("--fanouts", default="15,10,5", help="hop order from the seeds (fanout's order)")
    p.add_argument("--batch-size", type=int, default=8000)
    p.add_argument("--threads", type=int, default=os.cpu_count())
    p.add_argument("--batches", type=int, default=20, help="timed batches per run")
    p.add_argument("--warmup", type=int, default=2)
    p.add_argument("--runs", type=int, default=3)
    p.add_argument("--replace", action="store_true")
    p.add_argument("--seed", type=int, default=0)
    return p.parse_args()


def main():
    a = parse()
    # OpenMP reads this at start-up: set it before DGL/torch are imported.
    os.environ["OMP_NUM_THREADS"] = str(a.threads)
    # Passive waiting: on a shared machine with busy cores, OpenMP's default spin-waiting makes
    # DGL several times slower (0.4 vs 6 M SEPS measured on cnr2000); this is its best setting.
    os.environ.setdefault("OMP_WAIT_POLICY", "passive")
    os.environ.setdefault("DGLBACKEND", "pytorch")
    import numpy as np
    import torch
    import dgl

    torch.set_num_threads(a.threads)
    torch.manual_seed(a.seed)

    meta = {}
    with open(os.path.join(a.dataset, "meta.txt")) as f:
        for line in f:
            parts = line.split()
            if len(parts) == 2 and not line.startswith("#"):
                meta[parts[0]] = parts[1]
    if meta.get("LAYOUT", "csc") != "csc":
        sys.exit("dgl_sample.py: the dataset must be CSC (LAYOUT csc)")
    n, e = int(meta["NUM_NODE"]), int(meta["NUM_EDGE"])
    d = a.dataset
    p64 = os.path.exists(os.path.join(d, "indptr64.bin"))
    i64 = os.path.exists(os.path.join(d, "indices64.bin"))
    indptr = np.memmap(os.path.join(d, "indptr64.bin" if p64 else "indptr.bin"),
                       dtype=np.uint64 if p64 else np.uint32, mode="r", shape=(n + 1,))
    indices = np.memmap(os.path.join(d, "indices64.bin" if i64 else "indices.bin"),
                        dtype=np.uint64 if i64 else np.uint32, mode="r", shape=(e,))
    indptr = torch.from_numpy(indptr.astype(np.int64))
    indices = torch.from_numpy(indices.astype(np.int64))
    g = dgl.graph(("csc", (indptr, indices, torch.tensor([], dtype=torch.int64))), num_nodes=n)
    g = g.formats(["csc"])
    train = torch.from_numpy(np.fromfile(os.path.join(d, "train_set.bin"), dtype=np.uint32).astype(np.int64))

    fanouts = [int(x) for x in a.fanouts.split(",")]
    sampler = dgl.dataloading.NeighborSampler(list(reversed(fanouts)), replace=a.replace)
    loader = dgl.dataloading.DataLoader(
        g, train, sampler, batch_size=a.batch_size, shuffle=True, drop_last=False, num_workers=0
    )

    def batches():
        while True:
            for input_nodes, _output_nodes, blocks in loader:
                yield input_nodes, blocks

    it = batches()
    for _ in range(a.warmup):
        next(it)
    runs = []
    for _ in range(a.runs):
        edges = inputs = 0
        t0 = time.perf_counter()
        for _ in range(a.batches):
            input_nodes, blocks = next(it)
            edges += sum(int(b.num_edges()) for b in blocks)
            inputs += int(input_nodes.shape[0])
        secs = time.perf_counter() - t0
        runs.append({
            "seconds": secs,
            "seps": edges / secs,
            "batches_per_s": a.batches / secs,
            "mean_input_nodes": inputs / a.batches,
            "mean_edges_per_batch": edges / a.batches,
        })
    med = statistics.median(r["seps"] for r in runs)
    best = min(runs, key=lambda r: abs(r["seps"] - med))
    print(json.dumps({
        "peer": f"dgl {dgl.__version__} (torch {torch.__version__})",
        "dataset": a.dataset,
        "fanouts_hop_order": a.fanouts,
        "fanouts_dgl_order": ",".join(str(x) for x in reversed(fanouts)),
        "batch_size": a.batch_size,
        "replace": a.replace,
        "threads": a.threads,
        "batches": a.batches,
        "seps": med,
        "batches_per_s": statistics.median(r["batches_per_s"] for r in runs),
        "mean_input_nodes": best["mean_input_nodes"],
        "mean_edges_per_batch": best["mean_edges_per_batch"],
        "runs": runs,
    }))


if __name__ == "__main__":
    main()
