#!/usr/bin/env python3
"""bench_python: the per-call overhead of the Python layer (import promptcache) against the C++
call it wraps, measured in the same process and the same run (docs/benchmarks.md, "Python").

For each model, a schema of about --cached tokens and a prompt selecting all of it plus
--fresh (16) fresh tokens: Engine.generate(max_new_tokens=1) (the time to the first token of a
cached prompt) and Engine.score with one 2-token choice, each timed from Python
(time.perf_counter around the call) and the same request from C++ (Engine::generate_xml /
Engine::score timed inside the module with the GIL released, prompt parsing included in both).
Calls alternate one by one (C++, Python, C++, ...), so drift and the load of other jobs on the
machine hit both alike, and each call follows one of the other kind. The ratio is
median(Python) / median(C++); overhead_us the difference of the medians.

    PYTHONPATH=build/python python3 benchmarks/bench_python.py [--models bench-small,tiny]
        [--cached 1024] [--fresh 16] [--rounds 300] [--calls 1] [--out FILE.json]

Models: make-model shapes (made with the CLI, $PROMPTCACHE_CLI or build/promptcache) or model
folders. One JSON object on stdout (and --out).
"""
import argparse
import json
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import promptcache as pc
from promptcache import _promptcache as native

ROOT = Path(__file__).resolve().parents[1]
WORDS = ("the river runs past the old mill where the baker sells bread every morning and the "
         "children walk to school along the green hill while a small dog follows them").split()


def cpu_name():
    try:
        for line in open("/proc/cpuinfo"):
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor()


def model_dir(spec, tmp):
    if os.path.isdir(spec):
        return spec
    cli = os.environ.get("PROMPTCACHE_CLI", str(ROOT / "build" / "promptcache"))
    out = Path(tmp) / spec
    subprocess.run([cli, "make-model", "--shape", spec, "--out", str(out)], check=True,
                   capture_output=True)
    return str(out)


def text_of(eng, tokens, start=0):
    """Words of WORDS from `start` on, skipping those that would pass `tokens` tokens."""
    words, i, misses = [], start, 0
    while len(eng.tokenize(" ".join(words))) < tokens and misses < len(WORDS):
        candidate = words + [WORDS[i % len(WORDS)]]
        i += 1
        if len(eng.tokenize(" ".join(candidate))) <= tokens:
            words, misses = candidate, 0
        else:
            misses += 1
    return " ".join(words)


def measure(label, py_call, cpp_calls, rounds, calls):
    py_call()
    cpp_calls(2)  # warm both
    py, cpp = [], []
    for _ in range(rounds):
        cpp += cpp_calls(calls)
        for _ in range(calls):
            start = time.perf_counter()
            py_call()
            py.append((time.perf_counter() - start) * 1e3)
    py_med, cpp_med = statistics.median(py), statistics.median(cpp)
    return {"call": label, "calls": len(py), "python_ms": py_med, "cpp_ms": cpp_med,
            "python_min_ms": min(py), "cpp_min_ms": min(cpp), "ratio": py_med / cpp_med,
            "overhead_us": (py_med - cpp_med) * 1e3}


def bench_model(spec, args, tmp):
    eng = pc.Engine(model_dir(spec, tmp), threads=args.threads)
    modules = max(1, args.cached // 256)
    per = args.cached // modules
    body = "".join('<module name="m%d">%s</module>' % (k, text_of(eng, per, 7 * k))
                   for k in range(modules))
    eng.add_schema('<schema name="bench">%s</schema>' % body)
    refs = "".join("<m%d/>" % k for k in range(modules))
    best = None  # the question whose tokens in context are exactly --fresh (else the closest below)
    for target in range(args.fresh + 4, 0, -1):
        xml = '<prompt schema="bench">%s %s</prompt>' % (refs, text_of(eng, target, 3))
        g = eng.generate(xml, max_new_tokens=1)
        if g.fresh_tokens <= args.fresh and (best is None or g.fresh_tokens > best[1].fresh_tokens):
            best = (xml, g)
        if g.fresh_tokens == args.fresh:
            break
    xml, g = best
    params = pc._sampling(1, 0.0, None, 0, 1.0, 1.0, 0)
    rows = [
        measure("generate(max_new_tokens=1)", lambda: eng.generate(xml, max_new_tokens=1),
                lambda n: native._time_cpp_generate(eng._engine, xml, params, n), args.rounds,
                args.calls),
        measure("score(1 choice)", lambda: eng.score(xml, [" the river"]),
                lambda n: native._time_cpp_score(eng._engine, xml, [" the river"], n),
                args.rounds, args.calls),
    ]
    return {"model": spec, "cached_tokens": g.cached_tokens, "fresh_tokens": g.fresh_tokens,
            "results": rows}


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--models", default="bench-small,tiny")
    ap.add_argument("--cached", type=int, default=1024)
    ap.add_argument("--fresh", type=int, default=16)
    ap.add_argument("--rounds", type=int, default=300)
    ap.add_argument("--calls", type=int, default=1)
    ap.add_argument("--threads", type=int, default=0)
    ap.add_argument("--out")
    args = ap.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        models = [bench_model(m, args, tmp) for m in args.models.split(",") if m]
    report = {"bench": "python_overhead", "cpu": cpu_name(), "cores": os.cpu_count(),
              "python": platform.python_version(), "models": models,
              "command": " ".join(["benchmarks/bench_python.py"] + sys.argv[1:])}
    text = json.dumps(report, indent=1)
    print(text)
    if args.out:
        Path(args.out).write_text(text + "\n")
    for m in models:
        for r in m["results"]:
            sys.stderr.write("%-12s %-28s python %8.3f ms  C++ %8.3f ms  ratio %.4f  (+%.1f us)\n"
                             % (m["model"], r["call"], r["python_ms"], r["cpp_ms"], r["ratio"],
                                r["overhead_us"]))


if __name__ == "__main__":
    main()
