#!/usr/bin/env python3
"""Fidelity of the prompt logits against HF transformers' float32 reference, on every golden model (issue 19).

For each golden model directory (golden.json prompt_ids, golden_logits.f32 [150, vocab]: HF transformers'
float32 logits, teacher-forced, row t predicts token t+1) it computes, on the same 150 rows:
  - HF transformers run in bf16 on this GPU (the model loaded with dtype=torch.bfloat16), and in float32 on
    this GPU (a check of the stored reference: max |d| / RMS should be ~1e-5);
  - lily on the CUDA backend in the default precision (bf16 prompt GEMM operands) and with --precision high
    (split bf16 hi/lo), through `lily logits --backend cuda`;
each against the stored float32 reference: mean KL(reference || candidate) over the rows (nats), top-1 flips
(rows whose argmax differs from the reference's), median and max |d| / RMS (over every logit, RMS of the
reference's logits), and the perplexity ratio over rows 0..148. The issue's bar for lily's default: mean KL at
most a quarter of HF bf16's, no more flips than HF bf16, perplexity within 0.05%.

Prints a markdown table (the issue's, with both lily modes side by side) and writes JSON (--json FILE).
--bf16-classes 'A;fp16:B' adds a lily run per class list (`--precision bf16 --cuda-opt classes=A`: only those
products in bf16, backend/product_class.h; with the prefix fp16: in fp16) and a table of them against the same bar;
scripts/fidelity_cpu.py measures the same choices on the CPU's emulation.

Usage: python3 scripts/device/fidelity.py --lily .devbin/lily [--models a,b] [--dirs D1:D2] [--json F]
Golden models are looked up in tests/data/golden, .devbin/golden (scripts/device/bundle.sh packs the -r model
there), the folders of $LILY_GOLDEN_EXTRA (colon separated) and ../shared/golden.
"""
import argparse
import json
import math
import os
import subprocess
import sys
import tempfile

try:
    import torch
except ImportError:  # scripts/fidelity_cpu.py reads the golden lookup from here where torch is absent
    torch = None

MODELS = ["qwen3_5_moe_text-a", "qwen3_next-a", "qwen3_5_moe_text-r", "qwen3_5_moe_text-a-mtp",
          "qwen3_next-a-mtp", "qwen3_5_text-a-mtp"]


def search_dirs(extra):
    d = ["tests/data/golden", os.path.join(os.environ.get("DEVBIN", ".devbin"), "golden")]
    for s in (extra, os.environ.get("LILY_GOLDEN_EXTRA", "")):
        d += [p for p in s.split(":") if p]
    d.append("../shared/golden")
    return d


def find(name, dirs):
    for d in dirs:
        p = os.path.join(d, name)
        if os.path.exists(os.path.join(p, "model.safetensors")) and os.path.exists(os.path.join(p, "golden_logits.f32")):
            return p
    return None


def read_f32(path, rows):
    t = torch.from_file(path, shared=False, size=os.path.getsize(path) // 4, dtype=torch.float32)
    return t.view(rows, -1).double()


def metrics(cand, ref, ids):
    """cand, ref: float64 [T, V] on the CPU."""
    lr, lc = torch.log_softmax(ref, -1), torch.log_softmax(cand, -1)
    kl = (lr.exp() * (lr - lc)).sum(-1).clamp_min(0)
    flips = int((ref.argmax(-1) != cand.argmax(-1)).sum())
    rms = float(ref.pow(2).mean().sqrt())
    d = (cand - ref).abs().flatten()
    nxt = torch.tensor(ids[1:], dtype=torch.long)
    rows = torch.arange(len(ids) - 1)
    ppl_c = math.exp(float(-lc[rows, nxt].mean()))
    ppl_r = math.exp(float(-lr[rows, nxt].mean()))
    return {"kl_mean": float(kl.mean()), "kl_max": float(kl.max()), "flips": flips, "rows": int(ref.shape[0]),
            "median_rel": float(d.median()) / rms, "max_rel": float(d.max()) / rms, "ppl_ratio": ppl_c / ppl_r}


def hf_logits(path, ids, dtype, attn):
    from transformers import AutoModelForCausalLM
    kw = {"dtype": dtype}
    if attn:
        kw["attn_implementation"] = attn
    m = AutoModelForCausalLM.from_pretrained(path, **kw).cuda().eval()
    with torch.no_grad():
        out = m(torch.tensor([ids], device="cuda")).logits[0].float().cpu().double()
    del m
    torch.cuda.empty_cache()
    return out


def lily_logits(lily, path, ids, extra, rows):
    with tempfile.NamedTemporaryFile(suffix=".f32", delete=False) as f:
        out = f.name
    cmd = [lily, "logits", "--model", path, "--tokens", ",".join(map(str, ids)), "--out", out, "--backend", "cuda"] + extra
    r = subprocess.run(cmd, capture_output=True, text=True)
    if r.returncode != 0:
        os.unlink(out)
        return None, (r.stderr or r.stdout).strip().splitlines()[-1:] or ["exit %d" % r.returncode]
    t = read_f32(out, rows)
    os.unlink(out)
    return t, None


BAR_HEADER = ("| %s | golden | KL (bar: HF bf16 / 4) | flips (HF bf16) | median \\|Δ\\|/RMS | max \\|Δ\\|/RMS | ppl ratio | bar |\n"
              "|---|---|---|---|---|---|---|---|")


def meets_bar(m, hf):
    """The issue's bar for a bf16 choice; hf = (HF bf16 mean KL, flips), None where unknown."""
    if hf is None:
        return None
    return bool(m["kl_mean"] <= hf[0] / 4 and m["flips"] <= hf[1] and abs(m["ppl_ratio"] - 1) < 5e-4)


def bar_row(label, name, m, hf):
    """A markdown row of a per-choice table (BAR_HEADER)."""
    ok = meets_bar(m, hf)
    return "| %s | %s | %.2e (%s) | %d (%s) | %.1e | %.1e | %.5f | %s |" % (
        label, name, m["kl_mean"], "%.2e" % (hf[0] / 4) if hf else "—", m["flips"], hf[1] if hf else "—",
        m["median_rel"], m["max_rel"], m["ppl_ratio"], "—" if ok is None else ("yes" if ok else "**no**"))


def fmt_row(m):
    if m is None:
        return "—"
    return "%.2e, %d" % (m["kl_mean"], m["flips"])


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--lily", default=os.path.join(os.environ.get("DEVBIN", ".devbin"), "lily"))
    ap.add_argument("--models", default=",".join(MODELS))
    ap.add_argument("--dirs", default="", help="more golden folders, colon separated")
    ap.add_argument("--attn", default="", help="HF attn_implementation (default: transformers' own choice)")
    ap.add_argument("--json", default="")
    ap.add_argument("--extra", default="", help="more lily options for every run, e.g. '--cuda-opt gemm_wgmma=0'")
    ap.add_argument("--bf16-classes", default="", help="';'-separated class lists, one bf16 run each ('fp16:LIST': fp16)")
    a = ap.parse_args()
    import transformers
    dirs = search_dirs(a.dirs)
    print("torch %s, transformers %s, %s" % (torch.__version__, transformers.__version__, torch.cuda.get_device_name(0)))
    results = {}
    for name in a.models.split(","):
        path = find(name, dirs)
        if not path:
            print("%s: not found in %s" % (name, ":".join(dirs)))
            continue
        g = json.load(open(os.path.join(path, "golden.json")))
        ids = g["prompt_ids"]
        T = len(ids)
        ref = read_f32(os.path.join(path, "golden_logits.f32"), T)
        res = {"path": path}
        for key, dtype in (("hf_f32", torch.float32), ("hf_bf16", torch.bfloat16)):
            try:
                res[key] = metrics(hf_logits(path, ids, dtype, a.attn), ref, ids)
            except Exception as e:  # noqa: BLE001 (a model HF cannot load is reported, not fatal)
                res[key] = None
                res[key + "_error"] = "%s: %s" % (type(e).__name__, str(e).splitlines()[0] if str(e) else "")
        runs = [("lily_default", []), ("lily_high", ["--precision", "high"])]
        classes = [c.strip() for c in a.bf16_classes.split(";") if c.strip()]
        for c in classes:  # 'LIST' in bf16, 'fp16:LIST' in fp16
            prec, _, cl = c.rpartition(":")
            runs.append(("lily_bf16:" + c, ["--precision", prec or "bf16", "--cuda-opt", "classes=" + cl]))
        for key, extra in runs:
            t, err = lily_logits(a.lily, path, ids, extra + a.extra.split(), T)
            res[key] = metrics(t, ref, ids) if t is not None else None
            if err:
                res[key + "_error"] = err[0]
        hb, ld = res.get("hf_bf16"), res.get("lily_default")
        if hb and ld:
            res["bar_kl"] = hb["kl_mean"] / 4
            res["pass"] = bool(ld["kl_mean"] <= hb["kl_mean"] / 4 and ld["flips"] <= hb["flips"] and
                               abs(ld["ppl_ratio"] - 1) < 5e-4)
        results[name] = res
        print("%s: %s" % (name, json.dumps({k: v for k, v in res.items() if k.endswith("_error")})))

    print()
    print("| golden | HF bf16 KL | HF bf16 top-1 flips | HF bf16 median \\|Δ\\|/RMS | lily CUDA default (bf16) KL, flips"
          " | median \\|Δ\\|/RMS, ppl ratio | lily CUDA high KL, flips | bar (HF KL / 4) | default meets the bar |")
    print("|---|---|---|---|---|---|---|---|---|")
    for name, r in results.items():
        hb, ld, lh = r.get("hf_bf16"), r.get("lily_default"), r.get("lily_high")
        print("| %s | %s | %s | %s | %s | %s | %s | %s | %s |" % (
            name,
            "%.2e" % hb["kl_mean"] if hb else "—",
            "%d / %d" % (hb["flips"], hb["rows"]) if hb else "—",
            "%.2e" % hb["median_rel"] if hb else "—",
            fmt_row(ld),
            "%.2e, %.6f" % (ld["median_rel"], ld["ppl_ratio"]) if ld else "—",
            fmt_row(lh),
            "%.2e" % r["bar_kl"] if "bar_kl" in r else "—",
            ("yes" if r["pass"] else "**no**") if "pass" in r else "—"))
    print()
    print("| golden | HF f32 on this GPU vs stored reference: max \\|Δ\\|/RMS | lily high max \\|Δ\\|/RMS | lily default max \\|Δ\\|/RMS |")
    print("|---|---|---|---|")
    for name, r in results.items():
        cell = lambda m: "%.2e" % m["max_rel"] if m else "—"  # noqa: E731
        print("| %s | %s | %s | %s |" % (name, cell(r.get("hf_f32")), cell(r.get("lily_high")), cell(r.get("lily_default"))))
    if classes:
        print()
        print(BAR_HEADER % "bf16 classes")
        for c in classes:
            for name, r in results.items():
                m, hb = r.get("lily_bf16:" + c), r.get("hf_bf16")
                if not m:
                    print("| %s | %s | — | — | — | — | — | — |" % (c, name))
                    continue
                print(bar_row(c, name, m, (hb["kl_mean"], hb["flips"]) if hb else None))
    if a.json:
        with open(a.json, "w") as f:
            json.dump(results, f, indent=2)
    return 0


if __name__ == "__main__":
    sys.exit(main())
