#!/usr/bin/env python3
"""Soak a running `lily serve`: N concurrent clients streaming chat completions with mixed sampling
parameters for a fixed time, some hanging up mid-stream, some sending hostile requests (scripts/hostile.py).
Prints errors, 5xx, p50/p99 time to first token, aggregate tokens/s and the server's RSS at start and end.
RSS is judged net of the prompt cache (its bytes from /metrics; the cache grows by design up to its
--cache-mem cap, 2 GiB by default, and is reported beside it), by its peak over the second half of the
run after a warm-up against its peak over the first half.
Python 3.11 stdlib only; scripts/soak.sh starts a server and runs this.

    scripts/soak.py --port 8080 --pid PID [--clients 64] [--seconds 600]
"""
import argparse
import json
import os
import random
import socket
import sys
import threading
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import hostile  # noqa: E402

PROMPTS = ["Tell me a story about a lighthouse.", "List five rivers.", "Explain recursion briefly.", "Write a haiku.",
           "What is 17 times 23?", "Describe the colour blue to someone who cannot see.", "Summarise the plot of Hamlet."]


def stream_once(port, rng, model, hang_up, timeout=300):
    """One streamed chat request. Returns (status, ttft_s or None, tokens, error or None)."""
    body = {"model": model, "messages": [{"role": "user", "content": rng.choice(PROMPTS)}], "stream": True,
            "stream_options": {"include_usage": True}, "max_tokens": rng.choice([16, 32, 64, 128]),
            "temperature": rng.choice([0, 0.7, 1.0]), "seed": rng.randrange(1 << 30)}
    if rng.random() < 0.5:
        body["top_k"] = rng.choice([20, 40])
    if rng.random() < 0.5:
        body["top_p"] = rng.choice([0.9, 0.95])
    if rng.random() < 0.2:
        body["min_p"] = 0.05
    if rng.random() < 0.2:
        body["presence_penalty"] = 0.5
    if rng.random() < 0.1:
        body["stop"] = ["\n\n", "The"]
    if rng.random() < 0.1:
        body["logprobs"] = True
        body["top_logprobs"] = 2
    if rng.random() < 0.1:
        body["cache_prompt"] = False
    data = json.dumps(body).encode()
    req = (b"POST /v1/chat/completions HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
           b"Connection: close\r\nContent-Length: %d\r\n\r\n" % len(data)) + data
    t0 = time.monotonic()
    s = socket.create_connection(("127.0.0.1", port), timeout=timeout)
    try:
        s.sendall(req)
        buf = b""
        while b"\r\n\r\n" not in buf:
            c = s.recv(65536)
            if not c:
                return 0, None, 0, "closed before the status line"
            buf += c
        head, _, rest = buf.partition(b"\r\n\r\n")
        status = int(head.split(b" ", 2)[1])
        if status != 200:
            return status, None, 0, f"status {status}"
        ttft, tokens, done, events = None, 0, False, 0
        dechunk = Dechunker()
        text = dechunk.feed(rest)
        hang_after = rng.randrange(1, 8) if hang_up else None
        while not done:
            while b"\n\n" in text:
                ev, _, text = text.partition(b"\n\n")
                for line in ev.split(b"\n"):
                    if not line.startswith(b"data: "):
                        continue
                    payload = line[6:]
                    if payload == b"[DONE]":
                        done = True
                        break
                    j = json.loads(payload)
                    if "error" in j:
                        return status, ttft, tokens, f"error event: {j['error'].get('message', '')[:100]}"
                    if j.get("usage"):
                        tokens = j["usage"]["completion_tokens"]
                    elif j.get("choices"):
                        d = j["choices"][0].get("delta", {})
                        if (d.get("content") or d.get("reasoning_content")) and ttft is None:
                            ttft = time.monotonic() - t0
                        events += 1
                        if hang_after is not None and events >= hang_after:
                            return status, ttft, 0, None  # left on purpose
            if done:
                break
            c = s.recv(65536)
            if not c:
                return status, ttft, tokens, "stream ended without [DONE]"
            text += dechunk.feed(c)
        return status, ttft, tokens, None
    except (ConnectionResetError, BrokenPipeError) as e:
        return 0, None, 0, f"connection: {e}"
    except socket.timeout:
        return 0, None, 0, "timeout"
    finally:
        s.close()


class Dechunker:
    """HTTP/1.1 chunked transfer decoding, incrementally."""

    def __init__(self):
        self.raw, self.left = b"", 0

    def feed(self, data):
        self.raw += data
        out = b""
        while True:
            if self.left > 0:
                n = min(self.left, len(self.raw))
                out, self.raw, self.left = out + self.raw[:n], self.raw[n:], self.left - n
                if self.left:
                    return out
                self.left = -2  # the CRLF after the data
            if self.left < 0:
                if len(self.raw) < 2:
                    return out
                self.raw, self.left = self.raw[2:], 0
            nl = self.raw.find(b"\r\n")
            if nl < 0:
                return out
            line, self.raw = self.raw[:nl], self.raw[nl + 2:]
            if not line:
                continue  # the blank line that ends the body
            size = int(line.split(b";")[0], 16)
            if size == 0:
                return out
            self.left = size


def prompt_cache_bytes(port):
    """lily_prompt_cache_bytes from /metrics (0 when unavailable)."""
    try:
        s = socket.create_connection(("127.0.0.1", port), timeout=10)
        s.sendall(b"GET /metrics HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n\r\n")
        buf = b""
        while c := s.recv(65536):
            buf += c
        s.close()
    except OSError:
        return 0
    for line in buf.decode(errors="replace").splitlines():
        if line.startswith("lily_prompt_cache_bytes "):
            return int(float(line.split()[1]))
    return 0


def pct(xs, p):
    if not xs:
        return float("nan")
    xs = sorted(xs)
    return xs[min(len(xs) - 1, int(p / 100 * len(xs)))]


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--port", type=int, required=True)
    ap.add_argument("--pid", type=int)
    ap.add_argument("--clients", type=int, default=64)
    ap.add_argument("--seconds", type=float, default=600)
    ap.add_argument("--model", default="lily-demo")
    ap.add_argument("--hangup", type=float, default=0.1, help="share of streams the client leaves early")
    ap.add_argument("--hostile", type=float, default=0.05, help="share of requests from the hostile generator")
    ap.add_argument("--seed", type=int, default=7)
    ap.add_argument("--rss-tolerance", type=float, default=0.10,
                    help="growth allowed of the peak RSS net of the prompt cache (second half vs first half after the warm-up)")
    ap.add_argument("--warmup", type=float, default=180,
                    help="seconds before the RSS baseline: each of 64 slots (its worker's malloc arena, its buffers) "
                         "serves only ~2 requests in the first minute")
    ap.add_argument("--hostile-timeout", type=float, default=90,
                    help="seconds a hostile request may take (valid ones generate until soak.sh's --request-timeout 60)")
    a = ap.parse_args()
    hostile.BOMB = hostile._bomb()
    lock = threading.Lock()
    st = {"streams": 0, "hangups": 0, "hostile": 0, "tokens": 0, "ttft": [], "errors": [], "5xx": 0, "status": {}}
    rss0 = hostile.rss_kb(a.pid) if a.pid else 0
    t_end = time.monotonic() + a.seconds
    t0 = time.monotonic()

    def client(i):
        rng = random.Random(a.seed * 1000 + i)
        while time.monotonic() < t_end:
            r = rng.random()
            if r < a.hostile:
                name, data, kind = hostile.hostile_requests(rng, 1)[0]
                try:
                    code, prob = hostile.send(a.port, data, kind, a.hostile_timeout)
                except OSError as e:
                    code, prob = 0, str(e)
                with lock:
                    st["hostile"] += 1
                    st["status"][code] = st["status"].get(code, 0) + 1
                    if code >= 500:
                        st["5xx"] += 1
                    if (code >= 500 or prob) and kind != "hangup":
                        st["errors"].append(f"hostile {name}: {code} {prob}")
                continue
            hang = r < a.hostile + a.hangup
            try:
                code, ttft, toks, err = stream_once(a.port, rng, a.model, hang)
            except OSError as e:
                code, ttft, toks, err = 0, None, 0, f"connect: {e}"
            with lock:
                st["streams"] += 1
                st["hangups"] += hang
                st["status"][code] = st["status"].get(code, 0) + 1
                if code >= 500:
                    st["5xx"] += 1
                if err:
                    st["errors"].append(err)
                if ttft is not None:
                    st["ttft"].append(ttft)
                st["tokens"] += toks

    ts = [threading.Thread(target=client, args=(i,)) for i in range(a.clients)]
    for t in ts:
        t.start()
    last = time.monotonic()
    samples = []  # (seconds, RSS, prompt cache) in KiB once a minute
    while any(t.is_alive() for t in ts):
        time.sleep(1)
        if time.monotonic() - last >= 60:
            last = time.monotonic()
            rss = hostile.rss_kb(a.pid) if a.pid else 0
            cache = prompt_cache_bytes(a.port) // 1024
            if time.monotonic() < t_end:
                samples.append((last - t0, rss, cache))
            with lock:
                print(f"soak: {last - t0:.0f} s, {st['streams']} streams, {st['tokens']} tokens, {len(st['errors'])} errors, "
                      f"RSS {rss / 1024:.0f} MiB (prompt cache {cache / 1024:.0f} MiB, net {(rss - cache) / 1024:.0f} MiB)",
                      flush=True)
    for t in ts:
        t.join()
    secs = time.monotonic() - t0
    time.sleep(1)
    rss1 = hostile.rss_kb(a.pid) if a.pid else 0
    cache1 = prompt_cache_bytes(a.port) // 1024
    alive = hostile.healthy(a.port)
    statuses = " ".join(f"{k}:{v}" for k, v in sorted(st["status"].items()))
    print(f"soak: {a.clients} clients for {secs:.0f} s: {st['streams']} streams ({st['hangups']} hung up on purpose), "
          f"{st['hostile']} hostile requests; statuses {statuses}")
    print(f"soak: errors {len(st['errors'])}, 5xx {st['5xx']}, TTFT p50 {pct(st['ttft'], 50) * 1e3:.0f} ms "
          f"p99 {pct(st['ttft'], 99) * 1e3:.0f} ms, {st['tokens']} completion tokens = {st['tokens'] / secs:.1f} tok/s aggregate")
    rss_ok = True
    if a.pid:
        print(f"soak: RSS start {rss0 / 1024:.1f} MiB, end {rss1 / 1024:.1f} MiB ({(rss1 - rss0) / max(1, rss0) * 100:+.1f}%); "
              f"prompt cache at the end {cache1 / 1024:.1f} MiB")
        if samples:
            # Leak check: the peak of RSS net of the prompt cache over the second half of the run after the
            # warm-up against the peak over the first half (single samples swing with the requests in flight).
            after = [r - c for t, r, c in samples if t >= a.warmup] + [rss1 - cache1]
            if len(after) >= 2:
                first, second = after[:len(after) // 2], after[len(after) // 2:]
                grow = max(second) / max(1, max(first)) - 1
                rss_ok = grow <= a.rss_tolerance
                print(f"soak: RSS net of the prompt cache after the {a.warmup:.0f} s warm-up: {min(after) / 1024:.1f} to "
                      f"{max(after) / 1024:.1f} MiB; peak of the second half {max(second) / 1024:.1f} MiB vs the first "
                      f"{max(first) / 1024:.1f} MiB: {grow * 100:+.1f}% ({'flat' if rss_ok else 'GROWS'}, tolerance "
                      f"{a.rss_tolerance * 100:.0f}%)")
    print(f"soak: server {'alive' if alive else 'DEAD'}")
    for e in st["errors"][:15]:
        print("  error:", e)
    sys.exit(0 if alive and rss_ok and not st["errors"] and not st["5xx"] else 1)


if __name__ == "__main__":
    main()
