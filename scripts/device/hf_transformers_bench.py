#!/usr/bin/env python3
"""HF transformers (eager) on the same architecture and size as `lily bench --synth qwen3.5-35b-a3b`.

The comparison row issue 6 asks for: Qwen3.5-35B-A3B shape in bf16, transformers' own random init made
directly in GPU memory, attn_implementation="eager". Prefill = one forward over P random ids (fresh
cache); decode at context C = greedy steps with the cache after a C-token prefill. Timed with CUDA events,
median of the repeats after one warm-up. Prints one JSON object (same keys as `lily bench --json` where
they overlap) and a markdown table.

Usage: python3 hf_transformers_bench.py [--prefill 512,4096] [--decode-context 256,4096]
                                       [--decode-tokens 8] [--repeats 2] [--preset qwen3.5-35b-a3b|tiny]
"""
import argparse
import json
import statistics
import sys
import time

import torch
import transformers
from transformers import AutoConfig, AutoModelForCausalLM

# Qwen3.5-35B-A3B text model (the values of lily's synth preset, src/tools/synth.cpp).
PRESETS = {
    "qwen3.5-35b-a3b": dict(hidden_size=2048, num_hidden_layers=40, vocab_size=248320, num_attention_heads=16,
                            num_key_value_heads=2, head_dim=256, linear_num_key_heads=16,
                            linear_num_value_heads=32, linear_key_head_dim=128, linear_value_head_dim=128,
                            num_experts=256, num_experts_per_tok=8, moe_intermediate_size=512,
                            shared_expert_intermediate_size=512, rope_theta=1e7),
    "tiny": dict(hidden_size=256, num_hidden_layers=4, vocab_size=1024, num_attention_heads=4,
                 num_key_value_heads=2, head_dim=64, linear_num_key_heads=2, linear_num_value_heads=4,
                 linear_key_head_dim=64, linear_value_head_dim=64, num_experts=8, num_experts_per_tok=2,
                 moe_intermediate_size=128, shared_expert_intermediate_size=128, rope_theta=1e7),
}


def make_config(preset):
    p = dict(PRESETS[preset])
    layers = p["num_hidden_layers"]
    rope_theta = p.pop("rope_theta")
    cfg = AutoConfig.for_model(
        "qwen3_5_moe_text",
        **p,
        layer_types=["full_attention" if (i + 1) % 4 == 0 else "linear_attention" for i in range(layers)],
        linear_conv_kernel_dim=4, partial_rotary_factor=0.25, rms_norm_eps=1e-6, norm_topk_prob=True,
        rope_parameters={"rope_type": "default", "rope_theta": rope_theta, "partial_rotary_factor": 0.25},
        max_position_embeddings=65536, tie_word_embeddings=False, dtype="bfloat16")
    cfg._attn_implementation = "eager"
    return cfg


def timed(fn):
    a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    a.record()
    out = fn()
    b.record()
    torch.cuda.synchronize()
    return a.elapsed_time(b) / 1e3, out


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--preset", default="qwen3.5-35b-a3b", choices=sorted(PRESETS))
    ap.add_argument("--prefill", default="512,4096")
    ap.add_argument("--decode-context", default="256,4096")
    ap.add_argument("--decode-tokens", type=int, default=8)
    ap.add_argument("--repeats", type=int, default=2)
    args = ap.parse_args()
    prefill = [int(x) for x in args.prefill.split(",") if x]
    contexts = [int(x) for x in args.decode_context.split(",") if x]
    torch.manual_seed(0)
    cfg = make_config(args.preset)
    t0 = time.time()
    with torch.device("cuda"):
        model = AutoModelForCausalLM.from_config(cfg, dtype=torch.bfloat16, attn_implementation="eager")
    model.eval()
    torch.cuda.synchronize()
    init_s = time.time() - t0
    n_params = sum(p.numel() for p in model.parameters())
    print(f"hf: {type(model).__name__}, {n_params / 1e9:.2f} B parameters, init on GPU {init_s:.1f} s, "
          f"transformers {transformers.__version__}, torch {torch.__version__}", file=sys.stderr)
    V = cfg.vocab_size
    res = {"engine": "transformers", "version": transformers.__version__, "attn": "eager",
           "parameters": n_params, "device": torch.cuda.get_device_name(), "prefill": [], "decode": []}
    with torch.inference_mode():
        for P in prefill:
            ids = torch.randint(0, V, (1, P), device="cuda")
            runs = []
            for r in range(args.repeats + 1):
                dt, _ = timed(lambda: model(input_ids=ids, use_cache=True, logits_to_keep=1))
                print(f"hf: prefill {P}: {'run' if r else 'warm-up'} {P / dt:.1f} tok/s", file=sys.stderr)
                if r:
                    runs.append(P / dt)
            res["prefill"].append({"tokens": P, "tok_s": statistics.median(runs), "runs": runs})
        for C in contexts:
            ids = torch.randint(0, V, (1, C), device="cuda")
            out = model(input_ids=ids, use_cache=True, logits_to_keep=1)
            cache = out.past_key_values
            tok = out.logits[:, -1:].argmax(-1)
            runs = []
            for r in range(args.repeats + 1):
                def steps():
                    nonlocal cache, tok
                    for _ in range(args.decode_tokens):
                        o = model(input_ids=tok, past_key_values=cache, use_cache=True)
                        cache = o.past_key_values
                        tok = o.logits[:, -1:].argmax(-1)
                dt, _ = timed(steps)
                print(f"hf: decode @{C}: {'run' if r else 'warm-up'} {args.decode_tokens / dt:.2f} tok/s", file=sys.stderr)
                if r:
                    runs.append(args.decode_tokens / dt)
            res["decode"].append({"context": C, "tok_s": statistics.median(runs), "runs": runs})
            del cache, out
            torch.cuda.empty_cache()
    res["peak_memory_bytes"] = torch.cuda.max_memory_allocated()
    print(json.dumps(res))
    print("| figure | HF transformers eager, bf16 |", file=sys.stderr)
    print("|---|---:|", file=sys.stderr)
    for p in res["prefill"]:
        print(f"| prefill {p['tokens']} | {p['tok_s']:.0f} tok/s |", file=sys.stderr)
    for d in res["decode"]:
        print(f"| decode @{d['context']} | {d['tok_s']:.2f} tok/s |", file=sys.stderr)
    print(f"| peak memory | {res['peak_memory_bytes'] / 2**30:.1f} GiB |", file=sys.stderr)


if __name__ == "__main__":
    main()
