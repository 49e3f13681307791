#!/usr/bin/env python3
"""Summarise an `ncu --csv --metrics gpu__time_duration.sum` log of `lily bench` into per-step tables.

Steps are split at each embed kernel (its grid x = the step's rows T). For the last step of each T seen,
kernels are grouped by (name, grid) and listed with their summed time, so the table reads as "where one
prefill chunk / one decode step spends its time". Usage: ncu_summary.py LOG.csv [--top 40]
"""
import csv
import sys
from collections import OrderedDict, defaultdict


def short(name):
    for pre in ("void ", "lily::cuda::", "(anonymous namespace)::", "<unnamed>::", "unnamed>::"):
        name = name.replace(pre, "")
    return name.split("(")[0]


def main():
    path = sys.argv[1]
    top = int(sys.argv[sys.argv.index("--top") + 1]) if "--top" in sys.argv else 40
    rows = []
    with open(path, newline="") as f:
        lines = [l for l in f if l.startswith('"')]
    for r in csv.DictReader(lines):
        if r.get("Metric Name") != "gpu__time_duration.sum":
            continue
        unit = r.get("Metric Unit", "nsecond")
        v = float(r["Metric Value"].replace(",", ""))
        us = v / 1e3 if unit.startswith("n") else v * 1e3 if unit.startswith("m") else v
        rows.append((short(r["Kernel Name"]), r.get("Grid Size", ""), r.get("Block Size", ""), us))
    steps, cur = [], None
    for k in rows:
        if k[0].startswith("embed_kernel"):
            cur = {"T": int(k[1].strip("()").split(",")[0]), "k": []}
            steps.append(cur)
        if cur is not None:
            cur["k"].append(k)
    last = OrderedDict()
    for s in steps:
        last[s["T"]] = s
    print(f"{len(rows)} kernels, {len(steps)} steps; T of steps: {[s['T'] for s in steps]}")
    for T, s in last.items():
        tot = sum(k[3] for k in s["k"])
        g = defaultdict(lambda: [0, 0.0])
        byname = defaultdict(float)
        for n, grid, blk, us in s["k"]:
            g[(n, grid, blk)][0] += 1
            g[(n, grid, blk)][1] += us
            byname[n] += us
        print(f"\n## step T={T}: {len(s['k'])} kernels, {tot:.1f} us of kernel time ({T / tot * 1e6:.0f} tok/s if back to back)")
        print("| kernel | total us | % |")
        print("|---|---:|---:|")
        for n, us in sorted(byname.items(), key=lambda x: -x[1]):
            print(f"| {n} | {us:.1f} | {100 * us / tot:.1f} |")
        print("\n| kernel | grid | block | launches | total us | us each |")
        print("|---|---|---|---:|---:|---:|")
        for (n, grid, blk), (c, us) in sorted(g.items(), key=lambda x: -x[1][1])[:top]:
            print(f"| {n} | {grid} | {blk} | {c} | {us:.1f} | {us / c:.2f} |")


if __name__ == "__main__":
    main()
