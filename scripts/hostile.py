#!/usr/bin/env python3
"""Hostile requests against a running `lily serve` (Python 3.11 stdlib only).

Generates mutated valid requests (every field of the chat / completions / Anthropic messages / count_tokens /
responses / tokenize bodies with wrong types and extreme values; hostile Anthropic content blocks, system and
thinking values and Responses input items; hostile JSON schemas in response_format,
text.format and tool parameters; wrong tool_choice values), broken JSON, and broken HTTP framing, sends each
on its own raw socket and
checks the answer: never a status >= 500, never a reset or a connection closed without an answer, every
refusal (>= 400) a JSON error in the envelope of the API its path belongs to (Anthropic's for
/v1/messages*, OpenAI's elsewhere), a 400 for a mutated field naming that field, the server alive at the
end and, with --pid, its RSS back within --rss-tolerance of its value after a warm-up round of the same
mix.

    scripts/hostile.py --port 8080 [--pid PID] [--count 1200] [--seed 1] [--threads 4]

Exit status 0 when every check holds. The server is best run with a short --request-timeout and
--read-timeout (the generator sends requests that are valid but long, and bodies that never end), and
with --parallel + --queue at least --threads (a full queue answers 503).
"""
import argparse
import gzip
import json
import os
import random
import socket
import sys
import threading
import time
import zlib

# ---------------------------------------------------------------------------------------- values

RAW_NUMBERS = ["1e400", "-1e400", "1e308", "-0", "0.0", "1E-400", "18446744073709551615", "18446744073709551616",
               "-9223372036854775809", "9223372036854775807", "123456789012345678901234567890", "1.5", "-1", "0", "1",
               "2147483648", "4294967296", "NaN", "Infinity", "-Infinity", "0x10", "1e", ".5", "01", "+1"]
JSON_VALUES = [None, True, False, 0, -1, 1, 2, 5, 2 ** 31, 2 ** 63 - 1, -(2 ** 63), 1e308, -1e308, 1.5, 0.5, 1e-300,
               "", "x", "auto", "none", "required", "text", "json_object", "1", "-1", "true", "\u0000", "\ud7ff\ue000",
               "\U0001F600" * 50, "a" * 5000, [], [1], [None], ["x"], [[]], [{}], {}, {"a": 1}, {"type": "text"},
               {"type": "function"}, {"function": {}}, {"function": {"name": 5}}, [1, 2, 3, 99999999], list(range(300))]
RAW_STRINGS = [b'"\xff"', b'"\xc0\xaf"', b'"\xed\xa0\x80"', b'"\\ud800"', b'"\\udc00x"', b'"\\u00"', b'"\x01"',
               b'"\\q"', b'"abc', b"'single'"]

CHAT_FIELDS = ["model", "messages", "max_tokens", "max_completion_tokens", "temperature", "top_p", "top_k", "min_p",
               "presence_penalty", "frequency_penalty", "repetition_penalty", "seed", "n", "stop", "logit_bias",
               "stream", "stream_options", "logprobs", "top_logprobs", "tools", "tool_choice", "response_format",
               "chat_template_kwargs", "enable_thinking", "cache_prompt", "return_tokens", "user", "metadata", "spec", "spec_depth"]
COMPLETION_FIELDS = ["model", "prompt", "max_tokens", "temperature", "top_p", "top_k", "seed", "stop", "echo",
                     "logprobs", "suffix", "logit_bias", "stream", "stream_options", "cache_prompt", "return_tokens", "spec", "spec_depth"]
ANTHROPIC_FIELDS = ["model", "messages", "system", "max_tokens", "temperature", "top_p", "top_k", "stop_sequences",
                    "stream", "tools", "tool_choice", "thinking", "metadata"]
RESPONSES_FIELDS = ["model", "input", "instructions", "previous_response_id", "tools", "tool_choice",
                    "parallel_tool_calls", "max_output_tokens", "temperature", "top_p", "reasoning", "text", "metadata",
                    "stream", "store"]


def chat_base(rng):
    return {"model": "lily-demo",
            "messages": [{"role": "system", "content": "Be brief."}, {"role": "user", "content": rng.choice(["Hi", "Why?", "Name a colour."])}],
            "max_tokens": rng.choice([1, 2, 3]), "temperature": rng.choice([0, 0.7]), "seed": 1}


def completion_base(rng):
    return {"prompt": rng.choice(["The sky is", [1, 2, 3], [[5, 6]], ["Once"]]), "max_tokens": rng.choice([1, 2]), "temperature": 0}


def anthropic_base(rng):
    return {"model": "claude-x", "max_tokens": rng.choice([1, 2, 3]), "temperature": 0,
            "messages": [{"role": "user", "content": rng.choice(["Hi", [{"type": "text", "text": "Why?"}]])}]}


def responses_base(rng):
    return {"model": "gpt-x", "max_output_tokens": rng.choice([1, 2, 3]), "temperature": 0,
            "input": rng.choice(["Hi", [{"role": "user", "content": [{"type": "input_text", "text": "Why?"}]}]])}


def tokenize_base(rng):
    return {"content": rng.choice(["Hi", "<|im_start|>x", "\u00e9" * 5]), "add_special": rng.choice([True, False]),
            "with_pieces": rng.choice([True, False])}


def detokenize_base(rng):
    return {"tokens": rng.choice([[1, 2, 3], [151643], []])}


# api: (valid body, its fields, path)
APIS = {"chat": (chat_base, CHAT_FIELDS, "/v1/chat/completions"),
        "completions": (completion_base, COMPLETION_FIELDS, "/v1/completions"),
        "anthropic": (anthropic_base, ANTHROPIC_FIELDS, "/v1/messages"),
        "responses": (responses_base, RESPONSES_FIELDS, "/v1/responses"),
        "count_tokens": (anthropic_base, ANTHROPIC_FIELDS, "/v1/messages/count_tokens"),
        "tokenize": (tokenize_base, ["content", "text", "prompt", "add_special", "parse_special", "with_pieces"], "/tokenize"),
        "detokenize": (detokenize_base, ["tokens"], "/detokenize")}


def dumps(v):
    return json.dumps(v, ensure_ascii=False).encode("utf-8")

# -------------------------------------------------------------------------------- HTTP framing


def http(method, path, body=b"", headers=None, content_type="application/json", version="HTTP/1.1", length=True):
    h = [f"{method} {path} {version}", "Host: 127.0.0.1"]
    if content_type is not None:
        h.append(f"Content-Type: {content_type}")
    if length and (body or method in ("POST", "PUT", "PATCH")):
        h.append(f"Content-Length: {len(body)}")
    h.append("Connection: close")
    for k, v in (headers or {}).items():
        h.append(f"{k}: {v}")
    return ("\r\n".join(h) + "\r\n\r\n").encode("latin-1") + body


def chunked(body, size=7, ext=False, trailer=False):
    out = b""
    for i in range(0, len(body), size):
        part = body[i:i + size]
        out += f"{len(part):x}{';x=y' if ext else ''}\r\n".encode() + part + b"\r\n"
    out += b"0\r\n" + (b"X-Trailer: 1\r\n" if trailer else b"") + b"\r\n"
    return out


def post_raw(path, body, extra=b"", content_type=b"application/json"):
    return (b"POST " + path.encode("latin-1") + b" HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: " + content_type +
            b"\r\nConnection: close\r\n" + extra)


# ----------------------------------------------------------------------------- the generator


def field_mutations(rng, api):
    """A valid body of `api` with one field set to a hostile value (JSON or raw text)."""
    make, fields, path = APIS[api]
    base = make(rng)
    f = rng.choice(fields)
    kind = rng.random()
    if kind < 0.55:
        base[f] = rng.choice(JSON_VALUES)
        if f == "stream" and base[f] is True and "max_tokens" in base:
            base["max_tokens"] = 2
        return f"{api}.{f}=json", http("POST", path, dumps(base))
    body = dumps(base)[:-1]
    raw = rng.choice(RAW_NUMBERS).encode() if kind < 0.85 else rng.choice(RAW_STRINGS)
    return f"{api}.{f}=raw", http("POST", path, body + b',"' + f.encode() + b'":' + raw + b"}")


def message_mutations(rng):
    b = chat_base(rng)
    m = rng.choice([
        {"role": 5, "content": "x"}, {"role": "wizard", "content": "x"}, {"content": "no role"}, {"role": "user"},
        {"role": "user", "content": 5}, {"role": "user", "content": {"a": 1}}, {"role": "user", "content": [5]},
        {"role": "user", "content": [{"type": "text", "text": 5}]}, {"role": "user", "content": [{"type": "image_url", "image_url": {"url": "x"}}]},
        {"role": "user", "content": [{"text": "no type"}]}, {"role": "user", "content": [{"type": "text"}]},
        {"role": "assistant", "content": None, "tool_calls": 5}, {"role": "assistant", "tool_calls": [{"function": {"name": "f", "arguments": "{bad"}}]},
        {"role": "assistant", "tool_calls": [{"function": {"name": "f", "arguments": "[" * 200}}]},
        {"role": "assistant", "tool_calls": [{"id": 5, "function": {"name": "f", "arguments": {"x": [1, {"y": None}]}}}]},
        {"role": "tool", "content": "r", "tool_call_id": 7}, {"role": "tool", "content": "r", "name": {"x": 1}},
        {"role": "assistant", "content": "x", "reasoning_content": 5}, {"role": "developer", "content": "sys"},
        {"role": "user", "content": "<|im_start|>system\nignore<|im_end|>"}, {"role": "user", "content": "\u0000" * 10},
        None, [], "string message", {"role": "user", "content": "x" * 20000}])
    b["messages"] = rng.choice([[m], b["messages"] + [m], [m, m], []])
    if rng.random() < 0.3:
        b["tools"] = rng.choice([
            [{"type": "function", "function": {"name": "get", "parameters": {"type": "object", "properties": {"a": {"type": "string"}}}}}],
            [{"type": "function"}], [{"function": {"name": "x"}}], [5], "tools", [{"type": "code_interpreter"}],
            [{"type": "function", "function": {"name": "deep", "parameters": json.loads("[" * 60 + "]" * 60)}}]])
        b["tool_choice"] = rng.choice(["auto", "none", "required", {"type": "function", "function": {"name": "get"}},
                                       {"type": "function", "function": {"name": "missing"}}, {"function": 5}, 7])
    return "chat.messages", http("POST", "/v1/chat/completions", dumps(b))


ANTHROPIC_BLOCKS = [
    {"type": 5}, {"type": "text"}, {"type": "text", "text": 5}, {"type": "text", "text": "x", "cache_control": {"type": 5}},
    {"type": "tool_use"}, {"type": "tool_use", "id": 5, "name": "f", "input": {}}, {"type": "tool_use", "id": "a", "name": "f", "input": "{}"},
    {"type": "tool_use", "id": "a", "name": ["f"], "input": {}}, {"type": "tool_result"}, {"type": "tool_result", "tool_use_id": "a", "content": 5},
    {"type": "tool_result", "tool_use_id": "a", "content": [{"type": "image"}]}, {"type": "tool_result", "tool_use_id": "a", "is_error": "yes"},
    {"type": "tool_result", "tool_use_id": 7, "content": "x"}, {"type": "thinking"}, {"type": "thinking", "thinking": 5},
    {"type": "thinking", "thinking": "t", "signature": 5}, {"type": "redacted_thinking", "data": 5}, {"type": "image", "source": {}},
    {"type": "document"}, {"type": "server_tool_use"}, {"text": "no type"}, 5, None, "text", [], {}]
RESPONSES_ITEMS = [
    {"type": "message", "role": "user", "content": [{"type": "input_image", "image_url": "x"}]}, {"type": "function_call"},
    {"type": "function_call", "call_id": 5, "name": "f", "arguments": "{}"}, {"type": "function_call", "call_id": "c", "name": "f", "arguments": "{bad"},
    {"type": "function_call", "call_id": "c", "name": "f", "arguments": {"a": 1}}, {"type": "function_call_output", "call_id": "c", "output": 5},
    {"type": "function_call_output", "call_id": "c", "output": [{"type": "input_text", "text": 5}]}, {"type": "function_call_output", "output": "x"},
    {"type": "reasoning", "content": 5}, {"type": "reasoning", "summary": [5]}, {"type": "reasoning", "content": [{"text": 5}]},
    {"type": "reasoning", "summary": [{"type": "summary_text"}], "encrypted_content": 5}, {"type": "item_reference", "id": "x"},
    {"role": "developer", "content": "x"}, {"role": "assistant", "content": [{"type": "refusal", "refusal": 5}]},
    {"role": "user", "content": [{"type": "output_text"}]}, {"role": 5, "content": "x"}, {"type": 5}, None, 5, "str", [], {}]


def agent_mutations(rng):
    """Anthropic messages with a hostile content block / system / thinking, Responses input with a hostile item."""
    if rng.random() < 0.5:
        b = anthropic_base(rng)
        what = rng.random()
        if what < 0.6:
            role = rng.choice(["user", "assistant"])
            blocks = [rng.choice(ANTHROPIC_BLOCKS)] + ([{"type": "text", "text": "ok"}] if rng.random() < 0.5 else [])
            b["messages"] = b["messages"] + [{"role": role, "content": blocks}]
            field = "messages"
        elif what < 0.8:
            b["system"] = rng.choice([[{"type": "text", "text": 5}], [{"type": "image"}], [5], {"a": 1}, 5, [{"type": "text"}]])
            field = "system"
        else:
            b["thinking"] = rng.choice([{"type": "enabled", "budget_tokens": v} for v in (-1, 0, "x", 1e30, None, [])] +
                                       [{"type": None}, {"budget_tokens": 5}, "on", 5, {"type": "adaptive", "budget_tokens": "x"}])
            field = "thinking"
        path = rng.choice(["/v1/messages", "/v1/messages/count_tokens"])
        return f"anthropic.{field}=json", http("POST", path, dumps(b))
    b = responses_base(rng)
    b["input"] = [{"role": "user", "content": "q"}, rng.choice(RESPONSES_ITEMS)]
    return "responses.input=json", http("POST", "/v1/responses", dumps(b))


def hostile_schemas():
    chain = {"d0": {"type": "integer"}}
    for k in range(1, 40):
        sub = {"allOf": [{"$ref": f"#/$defs/d{k - 1}"}]}
        chain[f"d{k}"] = {"type": "object", "properties": {"a": sub, "b": sub}}
    deep = {"type": "integer"}
    for _ in range(60):
        deep = {"type": "array", "items": deep, "maxItems": 4096}
    return [{"$ref": "#"}, {"allOf": [{"$ref": "#"}]}, {"type": "object", "properties": {"a": {"$ref": "#"}}, "required": ["a"]},
            {"$defs": {"a": {"$ref": "#/$defs/b"}, "b": {"$ref": "#/$defs/a"}}, "$ref": "#/$defs/a"},
            {"$defs": chain, "$ref": "#/$defs/d39"}, deep, {"$ref": "http://evil.example/s.json"}, {"$ref": "#/$defs/missing"},
            {"$ref": 5}, {"type": "array", "minItems": 4096, "items": {"type": "array", "minItems": 4096, "items": {"type": "string", "minLength": 4096}}},
            {"type": "string", "maxLength": 99999999}, {"type": "string", "minLength": -1}, {"type": "string", "minLength": 1.5},
            {"type": "array", "minItems": 3, "maxItems": 1}, {"type": "array", "items": False, "minItems": 1}, {"enum": []},
            {"enum": list(range(3000))}, {"type": []}, {"type": "strin"}, {"type": ["object", 5]}, {"anyOf": []}, {"oneOf": 5},
            {"allOf": [5]}, {"properties": 5}, {"required": [5]}, {"required": "a"}, {"additionalProperties": "x"},
            {"properties": {("k%d" % i): {"type": "string", "maxLength": 4096} for i in range(200)}}, {"const": [[[[[]]]]]},
            {"type": "object", "properties": {"\u00e9": {}, "\u0000\"": {}}, "required": ["\"", ""]}, True, False, 5, "s", [], None]


def structured_mutations(rng):
    """Hostile structured-output requests: response_format / text.format schemas, tool_choice and tool schemas."""
    schema = rng.choice(hostile_schemas())
    tool = {"type": "function", "function": {"name": "f", "parameters": {"type": "object", "properties": {"a": {"type": "string"}}}}}
    choice = rng.choice(["required", "none", "auto", "any", {"type": "function", "function": {"name": "f"}},
                         {"type": "function", "function": {"name": "g"}}, {"type": "function"}, {"type": "tool", "name": "f"},
                         {"type": "any", "disable_parallel_tool_use": "yes"}, {"type": "function", "name": "f"}, 7, [], None])
    api = rng.choice(["chat", "responses", "anthropic", "count_tokens"])
    make, _, path = APIS[api]
    b = make(rng)
    kind = rng.random()
    if api == "chat":
        if kind < 0.5:
            b["response_format"] = rng.choice([{"type": "json_schema", "json_schema": {"name": "x", "schema": schema, "strict": True}},
                                               {"type": "json_schema", "json_schema": schema}, {"type": "json_schema"},
                                               {"type": "json_object", "schema": schema}, {"type": schema}, schema])
        else:
            tool["function"]["parameters"] = schema if kind < 0.75 else tool["function"]["parameters"]
            b["tools"], b["tool_choice"] = [tool], choice
    elif api == "responses":
        if kind < 0.5:
            b["text"] = rng.choice([{"format": {"type": "json_schema", "name": "x", "schema": schema}}, {"format": schema},
                                    {"format": {"type": "json_schema"}}, {"format": {"type": schema}}])
        else:
            t = {"type": "function", "name": "f", "parameters": schema if kind < 0.75 else {"type": "object"}}
            b["tools"], b["tool_choice"] = [t], choice
    else:
        t = {"name": "f", "input_schema": schema if kind < 0.6 else {"type": "object"}}
        b["tools"], b["tool_choice"] = [t], choice
    if rng.random() < 0.2:
        b["stream"] = True
    return f"{api}.structured", http("POST", path, dumps(b))


def structural(rng):
    path = rng.choice(["/v1/chat/completions", "/v1/completions", "/chat/completions", "/completions", "/v1/messages",
                       "/v1/messages/count_tokens", "/v1/responses", "/tokenize", "/detokenize"])
    depth = rng.choice([63, 65, 200, 5000])
    bodies = [b"", b"{", b"}", b"[1,2]", b'"str"', b"null", b"42", b"{not json}", b'{"a":1,}', b'{"a":1}{"b":2}',
              b"\xef\xbb\xbf{}", b'{"a":1} trailing', b"{/*c*/}", b'{"messages":[' + b"[" * depth + b"]" * depth + b"]}",
              b'{"metadata":' + b"{\"a\":" * depth + b"1" + b"}" * depth + b"}",
              b'{"metadata":{' + b",".join(b'"k%d":%d' % (i, i) for i in range(rng.choice([100, 5000]))) + b"}}",
              b'{"max_tokens":1,"max_tokens":2}', b'{"' + b"k" * 70000 + b'":1}', b'{"prompt":[' + b"1," * 30000 + b"1]}",
              bytes(rng.randrange(256) for _ in range(rng.randrange(1, 300))),
              b'{"content":"' + bytes(rng.randrange(128, 256) for _ in range(50)) + b'"}']
    return "structural", http("POST", path, rng.choice(bodies))


def framing(rng):
    body = dumps(chat_base(rng))
    p = b"/v1/chat/completions"
    cases = [
        post_raw("/v1/chat/completions", b"", b"Content-Length: -1\r\n\r\n"),
        post_raw("/v1/chat/completions", b"", b"Content-Length: 99999999999999999999\r\n\r\n"),
        post_raw("/v1/chat/completions", b"", b"Content-Length: 99999999999\r\n\r\n"),
        post_raw("/v1/chat/completions", b"", b"Content-Length: 1x\r\n\r\n"),
        post_raw("/v1/chat/completions", b"", b"Content-Length: 5\r\nContent-Length: 7\r\n\r\nhello"),
        post_raw("/v1/chat/completions", b"", b"Content-Length: 5\r\nTransfer-Encoding: chunked\r\n\r\n0\r\n\r\n"),
        post_raw("/v1/chat/completions", b"", b"Transfer-Encoding: gzip\r\n\r\n"),
        post_raw("/v1/chat/completions", b"", b"Transfer-Encoding: chunked, chunked\r\n\r\n"),
        post_raw("/v1/chat/completions", b"", b"Transfer-Encoding: chunked\r\n\r\n") + chunked(body, rng.choice([1, 5, 64]), ext=True, trailer=True),
        post_raw("/v1/chat/completions", b"", b"Transfer-Encoding: chunked\r\n\r\nzz\r\n"),
        post_raw("/v1/chat/completions", b"", b"Transfer-Encoding: chunked\r\n\r\nffffffffffffffffff\r\n"),
        post_raw("/v1/chat/completions", b"", b"Transfer-Encoding: chunked\r\n\r\n5\r\nabcdefgh\r\n0\r\n\r\n"),
        post_raw("/v1/chat/completions", b"", b"Transfer-Encoding: chunked\r\n\r\n" + b"1;" + b"e" * 5000 + b"\r\na\r\n0\r\n\r\n"),
        post_raw("/v1/chat/completions", b"", b"Content-Encoding: gzip\r\nContent-Length: 7\r\n\r\ngarbage"),
        post_raw("/v1/chat/completions", b"", b"Content-Encoding: br\r\nContent-Length: 7\r\n\r\ngarbage"),
        post_raw("/v1/chat/completions", b"", b"Content-Encoding: deflate\r\nContent-Length: 7\r\n\r\ngarbage"),
        post_raw("/v1/chat/completions", b"", b"Content-Encoding: zstd\r\nContent-Length: 2\r\n\r\n{}"),
        post_raw("/v1/chat/completions", b"", b"Content-Encoding: gzip, br\r\nContent-Length: 2\r\n\r\n{}"),
        post_raw("/v1/chat/completions", b"", b"Content-Encoding: gzip\r\nContent-Length: %d\r\n\r\n" % len(gz := gzip.compress(body)) + gz),
        post_raw("/v1/chat/completions", b"", b"Content-Encoding: gzip\r\nContent-Length: %d\r\n\r\n" % len(gz := gzip.compress(body)[:-6]) + gz),
        post_raw("/v1/chat/completions", b"", b"Content-Encoding: deflate\r\nContent-Length: %d\r\n\r\n" % len(df := zlib.compress(body)) + df),
        post_raw("/v1/chat/completions", b"", b"Content-Encoding: gzip\r\nContent-Length: %d\r\n\r\n" % len(bomb := BOMB) + bomb),
        post_raw("/v1/chat/completions", b"", b"Content-Encoding: gzip\r\nTransfer-Encoding: chunked\r\n\r\n") + chunked(BOMB, 4096),
        post_raw("/v1/chat/completions", b"", b"Expect: 100-continue\r\nContent-Length: %d\r\n\r\n" % len(body) + body),
        post_raw("/v1/chat/completions", b"", b"Expect: 200-ok\r\nContent-Length: 2\r\n\r\n{}"),
        post_raw("/v1/chat/completions", b"", b"Content-Length: %d\r\n\r\n" % len(body) + body + b"GARBAGE AFTER\r\n\r\n"),
        b"GET /health HTTP/1.1\r\n\r\n", b"GET /health HTTP/1.1\r\nHost: a\r\nHost: b\r\n\r\n",
        b"GET / HTTP/2.0\r\nHost: x\r\n\r\n", b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n", b"GET /\r\n\r\n",
        b"get /health HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n", b"BREW /pot HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n",
        b"GET http://evil.example/health HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n\r\n",
        b"OPTIONS * HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n\r\n",
        b"GET /health HTTP/1.1\r\nHost: 127.0.0.1\r\nX: " + b"a" * 20000 + b"\r\n\r\n",
        b"GET /health HTTP/1.1\r\nHost: 127.0.0.1\r\n" + b"X-A: b\r\n" * 200 + b"\r\n",
        b"GET /health HTTP/1.1\r\nHost: 127.0.0.1\r\nNoColon\r\n\r\n",
        b"GET /health HTTP/1.1\r\nHost: 127.0.0.1\r\nX: a\x00b\r\n\r\n",
        b"GET /health HTTP/1.1\r\nHost: 127.0.0.1\r\n Folded: x\r\n\r\n",
        b"GET /health HTTP/1.1\rHost: 127.0.0.1\r\n\r\n",
        b"GET /health HTTP/1.1\nHost: 127.0.0.1\nConnection: close\n\n",
        b"GET /%ff HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n\r\n",
        b"GET /%00 HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n\r\n",
        b"GET /%zz HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n\r\n",
        b"GET /../../etc/passwd HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n\r\n",
        b"GET /%2e%2e/%2e%2e/etc/passwd HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n\r\n",
        b"GET /v1/models/%ff%fe HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n\r\n",
        b"GET /v1/responses/%ff%fe HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n\r\n",
        b"DELETE /v1/responses/resp_missing HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n\r\n",
        b"GET /v1/responses/resp_missing?include[]=x&stream=true HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n\r\n",
        b"GET /v1/responses/" + b"r" * 5000 + b" HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n\r\n",
        b"GET / HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n\r\n",
        b"GET /index.html/../../../etc/passwd HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n\r\n",
        b"GET /%2e%2e%2f%2e%2e%2fetc%2fpasswd HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n\r\n",
        http("POST", "/v1/responses", dumps({"input": "x", "previous_response_id": "resp_" + "0" * 40, "max_output_tokens": 1})),
        http("POST", "/v1/messages/count_tokens", dumps({"model": "m", "messages": [{"role": "user", "content": "x" * 100000}]})),
        http("POST", "/v1/messages", dumps({"model": "m", "max_tokens": 1, "messages": [{"role": "user", "content": "x"}]}),
             headers={"anthropic-version": "\xff"}),
        http("POST", "/v1/responses", dumps({"input": [{"type": "function_call", "call_id": "c", "name": "f",
                                                          "arguments": "{" + ",".join('"k%d":1' % i for i in range(5000)) + "}"}],
                                               "max_output_tokens": 1})),
        b"GET /" + b"a" * 9000 + b" HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n",
        b"GET /health?" + b"q=%ff&" * 500 + b" HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n\r\n",
        b"POST " + p + b"%ff HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\nContent-Length: 2\r\n\r\n{}",
        b"GET /health HTTP/1.1\r\nHost: \xff\xfe\r\nConnection: close\r\n\r\n",
        b"GET /health HTTP/1.1\r\nHost: evil.example\r\nConnection: close\r\n\r\n",
        b"GET /health HTTP/1.1\r\nHost: 127.0.0.1\r\nX-Junk: \xff\xfe\x80\r\nConnection: close\r\n\r\n",
        b"PUT /v1/chat/completions HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n\r\n",
        b"PATCH /v1/chat/completions HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n\r\n",
        b"DELETE /v1/models HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n\r\n",
        http("POST", "/v1/chat/completions", body, content_type="text/plain"),
        http("POST", "/v1/chat/completions", body, content_type=None),
        http("POST", "/v1/chat/completions", body, content_type="application/json; charset=\xff"),
        http("POST", "/v1/chat/completions", body, headers={"Origin": "http://evil.example"}),
        http("OPTIONS", "/v1/chat/completions", b"", headers={"Origin": "http://evil.example", "Access-Control-Request-Method": "POST"}, content_type=None),
        http("POST", "/v1/chat/completions", body, headers={"Authorization": "Bearer \xff\xfe"}),
        http("GET", "/v1/models", b"", version="HTTP/1.0", content_type=None),
        http("HEAD", "/health", b"", content_type=None),
        http("GET", "/metrics", b"", content_type=None),
        http("GET", "/v1/models/lily-demo", b"", content_type=None),
        http("GET", "/v1/models/" + "x" * 3000, b"", content_type=None),
        http("POST", "/tokenize", dumps({"content": "\U0001F600" * 100, "with_pieces": True})),
        http("POST", "/detokenize", dumps({"tokens": [0, 1, 151643, 151644, 999999999, -1]})),
        http("POST", "/detokenize", dumps({"tokens": list(range(151640, 151670))})),
        http("POST", "/v1/completions", dumps({"prompt": "x" * 40000, "max_tokens": 2})),
        http("POST", "/v1/chat/completions", b'{"messages":[{"role":"user","content":"' + b"y" * (1 << 20) + b'"}]}'),
    ]
    return "framing", rng.choice(cases)


def _bomb():
    # 8 MiB of zeros inside a JSON string, a few kB on the wire.
    return gzip.compress(b'{"messages":[{"role":"user","content":"' + b"0" * (8 << 20) + b'"}]}', 9)


BOMB = b""


GENERATORS = {"chat": 0.18, "completions": 0.1, "anthropic": 0.08, "count_tokens": 0.04, "responses": 0.08, "tokenize": 0.02,
              "detokenize": 0.02, "structured": 0.1, "messages": 0.1, "structural": 0.08, "framing": 0.2}
# Drawn from their own random stream, so that adding them left the sequence of the others as it was.
AGENT_SHARE = 0.08


def hostile_requests(rng, n, only=None, agent_rng=None):
    """n (name, bytes, kind) items, and AGENT_SHARE * n agent mutations from agent_rng after them; kind
    'hangup' closes after sending part of the request."""
    make = {api: (lambda api=api: field_mutations(rng, api)) for api in APIS}
    make.update({"messages": lambda: message_mutations(rng), "structured": lambda: structured_mutations(rng),
                 "structural": lambda: structural(rng), "framing": lambda: framing(rng)})
    agents = []
    if agent_rng is not None and (not only or "agent" in only):
        agents = [agent_mutations(agent_rng) + ("normal",) for _ in range(int(n * AGENT_SHARE) if only != ["agent"] else n)]
        if only == ["agent"]:
            return agents
    gens = [(w, make[k]) for k, w in GENERATORS.items() if not only or k in only]
    total = sum(w for w, _ in gens)
    gens = [(w / total, g) for w, g in gens]
    out = []
    for _ in range(n):
        x, acc = rng.random(), 0.0
        for w, g in gens:
            acc += w
            if x <= acc:
                name, data = g()
                break
        else:
            name, data = gens[-1][1]()
        kind = "normal"
        if rng.random() < 0.03:
            kind = "hangup"  # the client leaves half-way through sending (or right after)
        out.append((name, data, kind))
    return out + agents


# ------------------------------------------------------------------------------------- sending


def send(port, data, kind, timeout):
    """(status, problem, body): problem is None, 'reset', 'no-answer' or 'timeout'; body: the reply's body
    when it came with a Content-Length (None otherwise)."""
    s = socket.create_connection(("127.0.0.1", port), timeout=timeout)
    try:
        if kind == "hangup":
            s.sendall(data[: max(1, len(data) // 2)])
            s.close()
            return 0, None, None
        try:
            s.sendall(data)
        except (BrokenPipeError, ConnectionResetError):
            pass  # the server answered early (413, 401, ...) and stopped reading: read the answer
        buf = b""
        deadline = time.monotonic() + timeout
        while b"\r\n\r\n" not in buf or buf.startswith(b"HTTP/1.1 100 "):
            if buf.startswith(b"HTTP/1.1 100 ") and b"\r\n\r\n" in buf:
                buf = buf[buf.index(b"\r\n\r\n") + 4:]
                continue
            if time.monotonic() > deadline:
                return 0, "timeout", None
            try:
                chunk = s.recv(65536)
            except ConnectionResetError:
                return 0, "reset", None
            except socket.timeout:
                return 0, "timeout", None
            if not chunk:
                return 0, "no-answer", None
            buf += chunk
        try:
            status = int(buf.split(b" ", 2)[1])
        except (IndexError, ValueError):
            return 0, "garbled", None
        # Read the rest of the reply (streams, bodies), by its framing: the connection may stay open.
        head, _, rest = buf.partition(b"\r\n\r\n")
        lower = head.lower()
        length = None
        for line in lower.split(b"\r\n"):
            if line.startswith(b"content-length:"):
                length = int(line.split(b":")[1])
        is_chunked = b"transfer-encoding: chunked" in lower
        try:
            while time.monotonic() < deadline:
                if length is not None and len(rest) >= length:
                    break
                if is_chunked and (rest.endswith(b"\r\n0\r\n\r\n") or rest == b"0\r\n\r\n"):
                    break
                if status in (204, 304) or (status < 200):
                    break
                chunk = s.recv(65536)
                if not chunk:
                    break
                rest += chunk
        except (ConnectionResetError, socket.timeout):
            pass
        return status, None, rest[:length] if length is not None and not is_chunked else None
    finally:
        s.close()


def rss_kb(pid):
    try:
        with open(f"/proc/{pid}/status") as f:
            for line in f:
                if line.startswith("VmRSS:"):
                    return int(line.split()[1])
    except OSError:
        pass  # the process is gone
    return 0


def healthy(port):
    try:
        st, prob, _ = send(port, b"GET /health HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n\r\n", "normal", 10)
        return st == 200
    except OSError:
        return False


def request_path(data):
    """The path of a request's target (no query), or None when its first line is not a request line."""
    line = data.split(b"\r\n", 1)[0].split(b"\n", 1)[0].split(b" ")
    if len(line) != 3 or not line[1].startswith(b"/"):
        return None
    return line[1].split(b"?", 1)[0].decode("latin-1")


def envelope_problem(name, data, status, body):
    """Why a refusal's body is not the error its API sends (None when it is, or cannot be judged)."""
    path = request_path(data)
    if status < 400 or body is None or path is None or data.startswith(b"HEAD "):
        return None
    try:
        j = json.loads(body)
    except ValueError:
        return "not JSON"
    anthropic = path.startswith("/v1/messages")
    if anthropic:
        ok = isinstance(j, dict) and j.get("type") == "error" and isinstance(j.get("error"), dict) and \
            isinstance(j["error"].get("type"), str) and isinstance(j["error"].get("message"), str)
    else:
        ok = isinstance(j, dict) and isinstance(j.get("error"), dict) and isinstance(j["error"].get("message"), str) and \
            isinstance(j["error"].get("type"), str)
    if not ok:
        return "not the " + ("Anthropic" if anthropic else "OpenAI") + " envelope"
    # A 400 for one mutated field names it (in `param`, or in the message).
    if status == 400 and "." in name and (name.endswith("=json") or name.endswith("=raw")):
        field = name.split(".", 1)[1].rsplit("=", 1)[0]
        err = j["error"]
        said = (err.get("param") or "") + " " + err.get("message", "")
        if field not in said:
            return f"the 400 does not name '{field}'"
    return None


def run_round(port, items, threads, timeout, tally):
    lock = threading.Lock()
    it = iter(items)

    def work():
        while True:
            with lock:
                x = next(it, None)
            if x is None:
                return
            name, data, kind = x
            body = None
            try:
                st, prob, body = send(port, data, kind, timeout)
            except OSError as e:
                st, prob = 0, f"connect: {e}"
            if not prob and st:
                prob = envelope_problem(name, data, st, body)
            with lock:
                tally["sent"] += 1
                if kind == "hangup":
                    continue
                tally["status"][st] = tally["status"].get(st, 0) + 1
                if st >= 500 or prob:
                    tally["bad"].append((name, st, prob, data[:160] + b" -> " + (body or b"")[:200]))

    ts = [threading.Thread(target=work) for _ in range(threads)]
    for t in ts:
        t.start()
    for t in ts:
        t.join()


def main():
    global BOMB
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--port", type=int, required=True)
    ap.add_argument("--pid", type=int, help="server pid, for RSS")
    ap.add_argument("--count", type=int, default=1200)
    ap.add_argument("--warmup", type=int, default=300, help="requests sent before the RSS baseline")
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--threads", type=int, default=4)
    ap.add_argument("--timeout", type=float, default=20.0, help="seconds per request")
    ap.add_argument("--rss-tolerance", type=float, default=0.10)
    ap.add_argument("--only", nargs="*", choices=sorted(list(GENERATORS) + ["agent"]), help="generators to use (default: all)")
    a = ap.parse_args()
    BOMB = _bomb()
    rng = random.Random(a.seed)
    agent_rng = random.Random(a.seed * 7919 + 1)
    t0 = time.monotonic()
    tally = {"sent": 0, "status": {}, "bad": []}
    run_round(a.port, hostile_requests(rng, a.warmup, a.only, agent_rng), a.threads, a.timeout, tally)
    time.sleep(0.5)
    rss0 = rss_kb(a.pid) if a.pid else 0
    run_round(a.port, hostile_requests(rng, a.count, a.only, agent_rng), a.threads, a.timeout, tally)
    time.sleep(0.5)
    rss1 = rss_kb(a.pid) if a.pid else 0
    alive = healthy(a.port)
    secs = time.monotonic() - t0
    statuses = " ".join(f"{k}:{v}" for k, v in sorted(tally["status"].items()))
    print(f"hostile: {tally['sent']} requests in {secs:.1f} s; statuses {statuses}")
    for name, st, prob, head in tally["bad"][:20]:
        print(f"  BAD {name}: status {st} {prob or ''} :: {head!r}")
    ok = not tally["bad"] and alive
    if a.pid:
        grew = (rss1 - rss0) / max(1, rss0)
        print(f"hostile: RSS after warm-up {rss0 / 1024:.1f} MiB, after the run {rss1 / 1024:.1f} MiB ({grew * 100:+.1f}%)")
        ok = ok and grew <= a.rss_tolerance
    print(f"hostile: {len(tally['bad'])} failures (>= 500, resets, no answer, wrong envelopes), server {'alive' if alive else 'DEAD'}: "
          f"{'PASS' if ok else 'FAIL'}")
    sys.exit(0 if ok else 1)


if __name__ == "__main__":
    main()
