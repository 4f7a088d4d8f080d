#!/usr/bin/env python3
"""Load benchmark of `promptcache serve`: requests/s and p50/p99 TTFT at several numbers of
concurrent clients, with prompts that pick different documents.

    benchmarks/bench_serve.py --binary build/promptcache [--model DIR] [--clients 1,4,16]
        [--llama-server PATH --gguf FILE]

Starts `promptcache serve` on a free port (on a bench-small model it makes with `make-model`
unless --model is given), posts a schema of --docs documents, then for every client count runs
three modes on the same document choices:

  cached    POST /v1/prompt, the documents as prompt modules (their stored states are reused)
  uncached  POST /v1/prompt with "use_cache": false (the whole prompt is prefilled)
  prefix    POST /v1/completions with the same text and no modules: the server's plain path,
            which reuses only the longest token prefix of the previous request (what vLLM,
            SGLang and llama-server do)
  llama     (with --llama-server and --gguf) the same text to llama-server's OpenAI
            /v1/completions, started here with one slot per client (-np), prompt caching on
            (its default): it reuses a slot's longest common prefix, and continuously batches
            the slots. Its tokenizer is not promptcache's, so the prompt token counts differ
            (the table shows both).

Each client streams its answers and measures TTFT from sending the request to the first token
event. Request i picks documents i % D and (3 i + 1) % D, so consecutive requests differ early
in the prompt. The machine running this is the machine measured: numbers from a shared machine
are noisy; compare the modes of one run with each other.
"""
import argparse
import http.client
import json
import os
import re
import shutil
import statistics
import subprocess
import sys
import tempfile
import threading
import time

CORPUS = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "data", "corpus.txt")


def documents(count, words):
    """`count` different documents of about `words` words, cut from the built-in corpus."""
    text = open(CORPUS, encoding="utf-8").read().split()
    docs = []
    for i in range(count):
        start = (i * 997) % len(text)
        doc = [text[(start + k) % len(text)] for k in range(words)]
        docs.append(f"Document {i}: " + " ".join(doc))
    return docs


def xml_escape(s):
    return s.replace("&", "&amp;").replace("<", "&lt;").replace(">", "&gt;")


QUESTIONS = ["What happened first?", "Who is in the story?", "Where does it take place?",
             "Why did they do it?"]
SYSTEM = "You answer questions using only the documents given to you."


def picks(i, docs):
    a, b = i % docs, (3 * i + 1) % docs
    if a == b:
        b = (b + 1) % docs
    return sorted((a, b))


class Server:
    def __init__(self, binary, model, threads):
        self.log = tempfile.NamedTemporaryFile("w+", suffix=".log", delete=False)
        cmd = [binary, "serve", "--model", model, "--port", "0", "--max-batch", "16"]
        if threads:
            cmd += ["--threads", str(threads)]
        self.proc = subprocess.Popen(cmd, stderr=self.log, stdout=subprocess.DEVNULL)
        for _ in range(6000):
            self.log.seek(0)
            m = re.search(r"listening on http://[^:]+:(\d+)/", self.log.read())
            if m:
                self.port = int(m.group(1))
                return
            if self.proc.poll() is not None:
                break
            time.sleep(0.1)
        self.log.seek(0)
        sys.exit("the server did not start:\n" + self.log.read())

    def stop(self):
        self.proc.terminate()
        self.proc.wait()
        os.unlink(self.log.name)


class LlamaServer:
    """llama-server on a free port with `slots` parallel slots of `slot_context` tokens each."""

    def __init__(self, binary, gguf, threads, slots, slot_context):
        import socket
        with socket.socket() as sock:
            sock.bind(("127.0.0.1", 0))
            self.port = sock.getsockname()[1]
        self.log = tempfile.NamedTemporaryFile("w+", suffix=".log", delete=False)
        cmd = [binary, "-m", gguf, "--host", "127.0.0.1", "--port", str(self.port),
               "-np", str(slots), "-c", str(slots * slot_context), "-t", str(threads or 2)]
        self.proc = subprocess.Popen(cmd, stderr=self.log, stdout=self.log)
        for _ in range(1200):
            try:
                conn = http.client.HTTPConnection("127.0.0.1", self.port, timeout=5)
                conn.request("GET", "/health")
                if conn.getresponse().status == 200:
                    return
            except OSError:
                pass
            if self.proc.poll() is not None:
                break
            time.sleep(0.1)
        self.log.seek(0)
        sys.exit("llama-server did not start:\n" + self.log.read()[-3000:])

    def stop(self):
        self.proc.terminate()
        self.proc.wait()
        os.unlink(self.log.name)


def post(port, path, body):
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=3600)
    conn.request("POST", path, body=body, headers={"Content-Type": "application/json"})
    return conn, conn.getresponse()


def post_schema(port, name, docs):
    modules = "".join(f'<module name="d{i}">{xml_escape(d)}</module>' for i, d in enumerate(docs))
    xml = f'<schema name="{name}"><system>{SYSTEM}</system>{modules}</schema>'
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=3600)
    conn.request("POST", "/v1/schemas?stream=false", body=xml.encode(),
                 headers={"Content-Type": "application/xml"})
    r = conn.getresponse()
    body = r.read()
    if r.status != 200:
        sys.exit(f"schema refused: {body[:500]}")
    return json.loads(body)


def request(port, mode, i, docs, max_tokens):
    """Sends request i in `mode`; returns (ttft seconds, total seconds, cached tokens, prompt
    tokens)."""
    chosen = picks(i, len(docs))
    question = QUESTIONS[i % len(QUESTIONS)]
    if mode in ("prefix", "llama"):
        text = SYSTEM + " " + " ".join(docs[d] for d in chosen) + " " + question
        path = "/v1/completions"
        body = {"prompt": text, "max_tokens": max_tokens, "stream": True,
                "stream_options": {"include_usage": True}}
        if mode == "llama":  # every request decodes max_tokens, as promptcache's do
            body.update({"ignore_eos": True, "cache_prompt": True})
    else:
        refs = "".join(f"<d{d}/>" for d in chosen)
        path = "/v1/prompt"
        body = {"prompt": f'<prompt schema="bench">{refs}<user>{question}</user></prompt>',
                "max_new_tokens": max_tokens, "stream": True, "use_cache": mode == "cached"}
    start = time.perf_counter()
    conn, r = post(port, path, json.dumps(body).encode())
    if r.status != 200:
        sys.exit(f"{mode} request failed: {r.status} {r.read()[:500]}")
    ttft, cached, prompt, ran = None, 0, 0, 0
    for raw in r:
        line = raw.decode("utf-8", "replace").strip()
        if not line.startswith("data: ") or line == "data: [DONE]":
            continue
        ev = json.loads(line[6:])
        # llama-server holds back a token's text until it is whole UTF-8: its first chunk with a
        # choice is the first token.
        choice = ev.get("choices") and ev["choices"][0]
        is_token = ev.get("type") == "token" or (
            mode == "prefix" and choice and choice.get("text")) or (
            mode == "llama" and choice and not choice.get("finish_reason"))
        if is_token and ttft is None:
            ttft = time.perf_counter() - start
        if ev.get("type") == "done":
            cached = ev["tokens"]["cached"]
            prompt = ev["tokens"]["cached"] + ev["tokens"]["fresh"]
        if mode == "prefix" and ev.get("usage"):
            cached = ev["usage"]["prompt_tokens_details"]["cached_tokens"]
            prompt = ev["usage"]["prompt_tokens"]
        if mode == "llama" and ev.get("usage"):
            prompt = ev["usage"]["prompt_tokens"]
        if mode == "llama" and ev.get("timings"):  # prompt_n: the tokens it ran, reuse apart
            ran = ev["timings"].get("prompt_n", 0)
    if mode == "llama":
        cached = max(0, prompt - ran) if prompt else 0
    conn.close()
    total = time.perf_counter() - start
    return (ttft if ttft is not None else total), total, cached, prompt


def run_level(port, mode, clients, per_client, docs, max_tokens, offset):
    results, lock = [], threading.Lock()

    def client(c):
        for k in range(per_client):
            out = request(port, mode, offset + c * per_client + k, docs, max_tokens)
            with lock:
                results.append(out)

    threads = [threading.Thread(target=client, args=(c,)) for c in range(clients)]
    start = time.perf_counter()
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    wall = time.perf_counter() - start
    ttfts = sorted(r[0] for r in results)

    def pct(p):
        return ttfts[min(len(ttfts) - 1, int(round(p / 100 * (len(ttfts) - 1))))]

    return {"mode": mode, "clients": clients, "requests": len(results),
            "requests_per_s": len(results) / wall, "ttft_p50_ms": 1e3 * statistics.median(ttfts),
            "ttft_p99_ms": 1e3 * pct(99),
            "cached_tokens_mean": statistics.mean(r[2] for r in results),
            "prompt_tokens_mean": statistics.mean(r[3] for r in results)}


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--binary", default="build/promptcache")
    ap.add_argument("--model", help="model folder (default: a bench-small model made here)")
    ap.add_argument("--clients", default="1,4,16")
    ap.add_argument("--modes", default="cached,uncached,prefix")
    ap.add_argument("--docs", type=int, default=8)
    ap.add_argument("--doc-words", type=int, default=150)
    ap.add_argument("--requests", type=int, default=16,
                    help="requests per mode and client count (at least one per client)")
    ap.add_argument("--max-tokens", type=int, default=8)
    ap.add_argument("--threads", type=int, default=0)
    ap.add_argument("--json", help="also write the results to this file")
    ap.add_argument("--llama-server", help="llama-server binary: adds the llama mode")
    ap.add_argument("--gguf", help="the GGUF llama-server loads (bench-small's shape)")
    ap.add_argument("--llama-slot-context", type=int, default=2048,
                    help="context of each llama-server slot (one slot per client)")
    args = ap.parse_args()

    tmp = None
    model = args.model
    if not model:
        tmp = tempfile.mkdtemp(prefix="bench-serve-")
        model = os.path.join(tmp, "bench-small")
        subprocess.run([args.binary, "make-model", "--shape", "bench-small", "--seed", "1",
                        "--out", model], check=True, stdout=subprocess.DEVNULL)
    docs = documents(args.docs, args.doc_words)
    levels = [int(c) for c in args.clients.split(",")]
    modes = args.modes.split(",")
    if args.llama_server:
        if not args.gguf:
            sys.exit("--llama-server needs --gguf")
        if "llama" not in modes:
            modes.append("llama")
    elif "llama" in modes:
        sys.exit("the llama mode needs --llama-server and --gguf")
    server = Server(args.binary, model, args.threads)
    llama = None
    rows = []
    try:
        if args.llama_server:
            llama = LlamaServer(args.llama_server, args.gguf, args.threads, max(levels),
                                args.llama_slot_context)
        schema = post_schema(server.port, "bench", docs)
        print(f"schema: {len(docs)} documents, {schema['total_length']} positions, compiled in "
              f"{schema['compile']['ms']:.0f} ms", file=sys.stderr)
        offset = 0
        for clients in levels:
            per_client = max(1, args.requests // clients)
            for mode in modes:
                port = llama.port if mode == "llama" else server.port
                request(port, mode, 10_000 + clients, docs, args.max_tokens)  # warm-up
                row = run_level(port, mode, clients, per_client, docs, args.max_tokens, offset)
                rows.append(row)
                print(json.dumps(row), file=sys.stderr)
            offset += 1000
    finally:
        server.stop()
        if llama:
            llama.stop()
        if tmp:
            shutil.rmtree(tmp)

    print("| clients | mode | requests | requests/s | TTFT p50 ms | TTFT p99 ms | "
          "prompt tokens/request | cached tokens/request |")
    print("| --- | --- | --- | --- | --- | --- | --- | --- |")
    for r in rows:
        print(f"| {r['clients']} | {r['mode']} | {r['requests']} | {r['requests_per_s']:.2f} | "
              f"{r['ttft_p50_ms']:.0f} | {r['ttft_p99_ms']:.0f} | {r['prompt_tokens_mean']:.0f} | "
              f"{r['cached_tokens_mean']:.0f} |")
    if args.json:
        with open(args.json, "w") as f:
            json.dump(rows, f, indent=1)


if __name__ == "__main__":
    main()
