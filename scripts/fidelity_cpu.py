#!/usr/bin/env python3
"""Fidelity of the CPU backend's bf16 / fp16 operand emulation (--cpu-opt emulate_bf16|emulate_fp16=CLASSES) against
HF's float32 logits.

The CPU-side twin of scripts/device/fidelity.py (issue 19), in plain Python (no torch / numpy): for every golden
model (golden.json prompt_ids, golden_logits.f32 [150, vocab]: HF transformers' float32 logits, teacher-forced,
row t predicts token t+1) and every class mask asked for, it runs
    lily logits --backend cpu [--cpu-opt emulate_bf16=CLASSES] [--cpu-opt emulate_fp16=CLASSES]
and computes, exactly as fidelity.py does: mean KL(reference || candidate) over the rows (nats, float64 log
softmax, each row's KL clamped at 0), top-1 flips (argmax differs; first index on ties), median (the lower
middle value, as torch.median) and max |d| / RMS (over every logit, RMS of the reference's logits), and the
perplexity ratio over rows 0..T-2. The bar of issue 19 for a reduced-operand mode: mean KL at most a quarter of HF bf16's,
no more flips than HF bf16, perplexity within 0.05%. HF bf16's own figures were measured on the H200
(bench/RESULTS.md, round 1 of "Prompt GEMMs on bf16 operands"); models without them get no verdict.

Usage: python3 scripts/fidelity_cpu.py --lily build/lily [--masks 'none;gpu_bf16;experts'] [--models a,b]
       [--json F]. Masks: ';'-separated class lists (backend/product_class.h names, e.g. experts,shared), each
       in bf16, or in fp16 with the prefix fp16: ('fp16:all'); '+' joins both ('fp16:experts+bf16:attn_out').
"""
import argparse
import json
import math
import os
import subprocess
import sys
import tempfile
from array import array

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "device"))
from fidelity import BAR_HEADER, MODELS, bar_row, find, meets_bar, search_dirs  # noqa: E402 (the device script's)

# HF transformers in bf16 against the stored float32 reference, H200, 2026-12-01: (mean KL, flips).
HF_BF16 = {"qwen3_5_moe_text-a": (6.02e-3, 7), "qwen3_next-a": (3.12e-2, 20),
           "qwen3_5_moe_text-a-mtp": (1.16e-2, 14), "qwen3_next-a-mtp": (2.15e-2, 19)}


def read_f32(path, rows):
    a = array("f")
    with open(path, "rb") as f:
        a.frombytes(f.read())
    if sys.byteorder != "little":
        a.byteswap()
    V = len(a) // rows
    if V * rows != len(a):
        raise ValueError("%s: %d floats are not %d rows" % (path, len(a), rows))
    return [a[r * V:(r + 1) * V].tolist() for r in range(rows)]


def log_softmax(row):
    m = max(row)
    s = math.log(sum(math.exp(v - m) for v in row))
    return [v - m - s for v in row]


def argmax(row):
    b = 0
    for i, v in enumerate(row):
        if v > row[b]:
            b = i
    return b


def metrics(cand, ref, ids):
    kls, flips, diffs, sq, nll_c, nll_r = [], 0, [], 0.0, 0.0, 0.0
    for t, (c, r) in enumerate(zip(cand, ref)):
        lc, lr = log_softmax(c), log_softmax(r)
        kls.append(max(0.0, sum(math.exp(a) * (a - b) for a, b in zip(lr, lc))))
        flips += argmax(r) != argmax(c)
        sq += sum(v * v for v in r)
        diffs.extend(abs(a - b) for a, b in zip(c, r))
        if t + 1 < len(ids):
            nll_c -= lc[ids[t + 1]]
            nll_r -= lr[ids[t + 1]]
    n = len(diffs)
    rms = math.sqrt(sq / n)
    diffs.sort()
    rows = len(ids) - 1
    return {"kl_mean": sum(kls) / len(kls), "kl_max": max(kls), "flips": flips, "rows": len(ref),
            "median_rel": diffs[(n - 1) // 2] / rms, "max_rel": diffs[-1] / rms,
            "ppl_ratio": math.exp(nll_c / rows) / math.exp(nll_r / rows)}


def lily_logits(lily, path, ids, mask):
    fd, out = tempfile.mkstemp(suffix=".f32")
    os.close(fd)
    cmd = [lily, "logits", "--model", path, "--tokens", ",".join(map(str, ids)), "--out", out, "--backend", "cpu"]
    for part in mask.split("+"):
        kind, _, classes = part.rpartition(":")
        if kind not in ("", "bf16", "fp16"):
            raise ValueError("mask %r: operand type %r is not bf16 or fp16" % (mask, kind))
        if classes and classes != "none":
            cmd += ["--cpu-opt", "emulate_%s=%s" % (kind or "bf16", classes)]
    r = subprocess.run(cmd, capture_output=True, text=True)
    try:
        if r.returncode != 0:
            raise RuntimeError(" ".join(cmd[:2]) + ": " + ((r.stderr or r.stdout).strip().splitlines() or ["exit %d" % r.returncode])[-1])
        return read_f32(out, len(ids))
    finally:
        os.unlink(out)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--lily", default="build/lily")
    ap.add_argument("--models", default=",".join(MODELS))
    ap.add_argument("--dirs", default="", help="more golden folders, colon separated (as fidelity.py)")
    ap.add_argument("--masks", default="none;all;gpu_bf16;experts")
    ap.add_argument("--json", default="")
    a = ap.parse_args()
    dirs = search_dirs(a.dirs)
    masks = [m.strip() for m in a.masks.split(";") if m.strip()]
    results = {}
    for name in a.models.split(","):
        path = find(name, dirs)
        if not path:
            print("%s: not found in %s" % (name, ":".join(dirs)), file=sys.stderr)
            continue
        ids = json.load(open(os.path.join(path, "golden.json")))["prompt_ids"]
        ref = read_f32(os.path.join(path, "golden_logits.f32"), len(ids))
        results[name] = {}
        for mask in masks:
            m = metrics(lily_logits(a.lily, path, ids, mask), ref, ids)
            m["pass"] = meets_bar(m, HF_BF16.get(name))
            results[name][mask] = m
    print(BAR_HEADER % "mask")
    for mask in masks:
        for name, r in results.items():
            print(bar_row(mask, name, r[mask], HF_BF16.get(name)))
    if a.json:
        with open(a.json, "w") as f:
            json.dump(results, f, indent=2)
    return 0


if __name__ == "__main__":
    sys.exit(main())
