#!/usr/bin/env python3
"""N concurrent streaming clients against a running lily serve: each sends a token-id prompt of --prompt
tokens to /v1/completions with stream=true and max_tokens --tokens, and times first and last token.
Prints one JSON line per client count: aggregate tok/s (tokens / wall from first request to last token),
per-client tok/s (first-to-last token), p50/p99 time to first token."""
import argparse, http.client, json, random, threading, time


def client(port, prompt, tokens, out, seed):
    c = http.client.HTTPConnection("127.0.0.1", port, timeout=600)
    body = json.dumps({"prompt": prompt, "max_tokens": tokens, "stream": True, "temperature": 0, "seed": seed})
    t0 = time.perf_counter()
    c.request("POST", "/v1/completions", body, {"Content-Type": "application/json"})
    r = c.getresponse()
    first = None
    n = 0
    buf = b""
    while True:
        chunk = r.read1(65536) if hasattr(r, "read1") else r.read(1)
        if not chunk:
            break
        buf += chunk
        while b"\n\n" in buf:
            ev, buf = buf.split(b"\n\n", 1)
            if not ev.startswith(b"data: ") or ev == b"data: [DONE]":
                continue
            d = json.loads(ev[6:])
            if d.get("choices") and d["choices"][0].get("text") is not None:
                if first is None:
                    first = time.perf_counter()
                n += 1
    t1 = time.perf_counter()
    out.append({"t0": t0, "ttft": (first or t1) - t0, "end": t1, "events": n})


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--port", type=int, required=True)
    ap.add_argument("--clients", default="1,16")
    ap.add_argument("--prompt", type=int, default=3000)
    ap.add_argument("--tokens", type=int, default=128)
    ap.add_argument("--vocab", type=int, default=150000)
    a = ap.parse_args()
    rng = random.Random(1)
    for n in [int(x) for x in a.clients.split(",")]:
        res = []
        th = [threading.Thread(target=client, args=(a.port, [rng.randrange(a.vocab) for _ in range(a.prompt)],
                                                     a.tokens, res, i)) for i in range(n)]
        for t in th:
            t.start()
        for t in th:
            t.join()
        start = min(r["t0"] for r in res)
        end = max(r["end"] for r in res)
        ev = sum(r["events"] for r in res)
        ttft = sorted(r["ttft"] for r in res)
        per = [r["events"] / max(1e-9, r["end"] - r["t0"] - r["ttft"]) for r in res]
        print(json.dumps({"clients": n, "events": ev, "wall_s": round(end - start, 3),
                          "aggregate_tok_s": round(ev / (end - start), 1),
                          "per_client_decode_tok_s": round(sum(per) / len(per), 1),
                          "ttft_p50_s": round(ttft[len(ttft) // 2], 3),
                          "ttft_p99_s": round(ttft[min(len(ttft) - 1, int(0.99 * len(ttft)))], 3)}), flush=True)


if __name__ == "__main__":
    main()
