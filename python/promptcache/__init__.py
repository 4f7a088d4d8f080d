"""promptcache: Prompt Cache (Gim et al., MLSys 2024) for Python.

Reusable prompt modules are declared in a PML schema; their attention states are computed once,
at the positions the schema reserves, and every prompt that names them runs only its own tokens.

    import promptcache as pc
    eng = pc.Engine("models/stories260K", template="plain")
    eng.add_schema("examples/eval/stories.xml")
    g = eng.generate('<prompt schema="stories"><instruction/><park/> Lily went to</prompt>')
    print(g.text, g.cached_tokens, g.ttft_ms)

See docs/python.md.
"""

import json as _json
import os as _os
import sys as _sys
import time as _time

from ._promptcache import (  # noqa: F401  (re-exported)
    Error,
    Generation,
    ModelError,
    Prompt,
    SchemaError,
    Score,
    count_rows as _count_rows,
    _Engine,
    _Evaluation,
    _Sampling,
)

__all__ = ["Engine", "Prompt", "Generation", "Score", "EvalRun", "Error", "SchemaError", "ModelError"]
__version__ = "0.1.0"


def _sampling(max_new_tokens, temperature, stop, top_k, top_p, repetition_penalty, seed,
              ignore_eos=False):
    return _Sampling(int(max_new_tokens), float(temperature), stop, int(top_k), float(top_p),
                     float(repetition_penalty), int(seed), bool(ignore_eos))


class Engine:
    """A model with its loaded schemas; the application-facing API of promptcache.

    Engine(model, device="cpu", weights=None, threads=0, cache_dir=None, redis=None, *,
           dtype=None, kv_dtype=None, template=None, encoding="scaffold", cache_secret=None)

    model: a HuggingFace checkpoint folder (config.json, *.safetensors, tokenizer.json or
        tokenizer.model), or a file inside it.
    device: "cpu" or "cuda[:N]" (a CUDA build of LibTorch).
    weights: the dtype the weight matrices are kept in: "f32", "bf16", "f16" or "q8"; None
        follows the checkpoint. weights="f32" on an f32 checkpoint computes and stores states in
        f32 (exact comparisons).
    threads: CPU threads (0: all cores). Process-wide, as LibTorch's own setting is.
    cache_dir: a folder where compiled module states are kept between runs.
    redis: "redis://HOST:PORT", a span store shared by several processes (needs cache_secret
        or $PROMPTCACHE_CACHE_SECRET).
    dtype, kv_dtype: the compute dtype and the KV/state dtype (None: chosen for the checkpoint).
    template: the chat format ("llama-2", "llama-3", "mistral", "chatml", "plain"); None: the
        model's family.

    Every method may be called from several threads at once: the GIL is released while the
    model works. Errors are promptcache.Error (SchemaError, ModelError).
    """

    def __init__(self, model, device="cpu", weights=None, threads=0, cache_dir=None, redis=None,
                 *, dtype=None, kv_dtype=None, template=None, encoding="scaffold",
                 cache_secret=None):
        model = _os.fspath(model)
        if cache_dir is not None:
            cache_dir = _os.fspath(cache_dir)
        self._engine = _Engine(model, device, weights, int(threads), cache_dir, redis, dtype,
                               kv_dtype, template, encoding, cache_secret)
        self.model = model

    def add_schema(self, schema):
        """Parses, lays out and compiles a schema; returns its name.

        schema: a path to a schema file (its module src files are read inside its folder), or
        the XML text itself (no src files). A schema of the same name is replaced. With
        cache_dir, the states are loaded from there when they match, else compiled and saved.
        Raises SchemaError (with .file, .line, .column, .element) for PML problems.
        """
        if not isinstance(schema, str):
            schema = _os.fspath(schema)
        return self._engine.add_schema(schema)

    def generate(self, prompt, max_new_tokens=32, temperature=0.0, stop=None, no_cache=False, *,
                 top_k=0, top_p=1.0, repetition_penalty=1.0, seed=0, ignore_eos=False):
        """Generates after a prompt; returns a Generation.

        prompt: PML text ('<prompt schema="s"><inst/> Question ...</prompt>') or a Prompt.
        The modules it names come from the store and only its own tokens run; no_cache=True runs
        the same tokens as one ordinary prefill (the baseline). temperature 0 is greedy. stop: a
        string or a list of strings that end the text (left out of it). Ctrl-C stops it between
        tokens with KeyboardInterrupt; the engine stays usable. top_k, top_p,
        repetition_penalty and seed as in `promptcache run`; ignore_eos=True generates past the
        model's end-of-sequence tokens (benchmarks).
        """
        params = _sampling(max_new_tokens, temperature, stop, top_k, top_p, repetition_penalty,
                           seed, ignore_eos)
        return self._engine.generate(prompt, params, bool(no_cache))

    def generate_batch(self, prompts, max_new_tokens=32, temperature=0.0, stop=None,
                       no_cache=False, *, top_k=0, top_p=1.0, repetition_penalty=1.0, seed=0,
                       ignore_eos=False):
        """Several prompts (any schemas and module selections) as one batch; a list of
        Generation, entry i what generate(prompts[i], ...) gives alone."""
        params = _sampling(max_new_tokens, temperature, stop, top_k, top_p, repetition_penalty,
                           seed, ignore_eos)
        return self._engine.generate_batch(list(prompts), params, bool(no_cache))

    def score(self, prompt, choices, no_cache=False):
        """Scores continuations of a prompt; returns a Score.

        Each choice is tokenized as a text span of its own (docs/eval.md, "Scoring choices");
        Score.logprobs[k] is the sum over its tokens of log p(token | prompt, earlier tokens),
        Score.pred the likeliest choice. The prompt runs once, all choices in one forward after it.
        """
        if isinstance(choices, str):
            raise TypeError("choices is a list of strings, not one string")
        return self._engine.score(prompt, list(choices), bool(no_cache))

    def next_token_logits(self, prompt, no_cache=False):
        """The logits after the prompt's last token: a float32 torch.Tensor of shape [vocab].

        The tensor shares the engine's memory (handed over through DLPack, no copy); needs
        python3-torch. With no_cache=True, the baseline's (one ordinary prefill).
        """
        import torch.utils.dlpack

        return torch.utils.dlpack.from_dlpack(self._engine.next_token_logits(prompt,
                                                                             bool(no_cache)))

    def tokenize(self, text, bos=False):
        """The token ids of a text (bos=True: with the model's BOS id first, when it has one)."""
        return self._engine.tokenize(text, bool(bos))

    def detokenize(self, ids):
        """The text of token ids."""
        return self._engine.detokenize(list(ids))

    def layout(self, schema):
        """The loaded schema's modules, in schema order, as dicts: name, path ("doc/intro" for
        nested ones), begin and end (the reserved positions [begin, end)), length, cached (False
        for cache="false"), in_union, parameters (how many)."""
        return self._engine.layout(schema)

    def eval(self, data, schema, out=None, *, no_cache=False, batch=8, limit=0, strict=False,
             max_new_tokens=32, temperature=0.0, stop=None, top_k=0, top_p=1.0,
             repetition_penalty=1.0, seed=0, progress=True):
        """Evaluates rows over a schema's cached modules; an EvalRun iterator of result rows.

        The rows, results and resume rules of `promptcache eval` (docs/eval.md), one
        implementation: data is a JSONL path or an iterable of dicts ({"id", "prompt",
        "modules", "messages", "choices", "answer", "max_tokens", ...}). schema: a loaded
        schema's name, a schema file or its XML text (added first). out: a results file,
        appended a line per row; rows whose id is already there are skipped (resume).
        Each item is a row's result as a dict ({"id", "choices", "pred", "correct", ...} or
        {"id", "text", ...}). A bad row is reported on stderr ("promptcache: error:
        D.jsonl:3: ...") and in EvalRun.errors, and the others run (strict=True stops there).
        progress: a tqdm bar when tqdm is importable, plain lines on stderr otherwise; False
        for none. Ctrl-C raises KeyboardInterrupt; the batch in flight is not written, so a
        rerun with the same out finishes the rest.
        """
        if not isinstance(schema, str):
            schema = _os.fspath(schema)
        name = schema if self._has_schema(schema) else self.add_schema(schema)
        params = _sampling(max_new_tokens, temperature, stop, top_k, top_p, repetition_penalty,
                           seed)
        if out is not None:
            out = _os.fspath(out)
        return EvalRun(self, data, name, out, no_cache, batch, limit, strict, params, progress)

    def _has_schema(self, name):
        if name.lstrip().startswith("<") or _os.path.exists(name):
            return False
        try:
            self._engine.layout(name)
            return True
        except SchemaError:
            return False


class _PlainProgress:
    """A line on stderr every 10 s (when tqdm is not there)."""

    def __init__(self, total):
        self.total, self.n, self.start, self.last = total, 0, _time.monotonic(), _time.monotonic()

    def update(self, n):
        self.n += n
        now = _time.monotonic()
        if now - self.last >= 10:
            self.last = now
            self._print(now)

    def _print(self, now):
        rate = self.n / (now - self.start) if now > self.start else 0.0
        total = "?" if self.total is None else self.total
        _sys.stderr.write("eval: %d/%s rows, %.1f rows/s\n" % (self.n, total, rate))

    def close(self):
        self._print(_time.monotonic())


def _progress_bar(total, enabled):
    if not enabled:
        return None
    try:
        from tqdm import tqdm
    except ImportError:
        return _PlainProgress(total)
    return tqdm(total=total, unit="row", desc="eval", file=_sys.stderr)


class EvalRun:
    """The iterator Engine.eval returns: each answered row's result as a dict.

    errors: the bad rows' messages so far ("D.jsonl:3: the line is not valid JSON").
    summary: once the run has ended, the summary of docs/eval.md (rows, resumed, failed,
        answered, correct, accuracy, prompt_tokens, cached_tokens, ...); before that, the
        totals so far.
    """

    def __init__(self, engine, data, schema, out, no_cache, batch, limit, strict, params,
                 progress):
        self.errors = []
        self._done = False
        self._queue = []
        if isinstance(data, (str, bytes, _os.PathLike)):
            path = _os.fspath(data)
            total = _count_rows(path, int(limit))
            self._rows = None
            name = path
        else:
            path = None
            try:
                total = len(data) if not limit else min(len(data), int(limit))
            except TypeError:
                total = int(limit) or None
            self._rows = iter(data)
            name = "<data>"
        self._limit = int(limit)
        self._run = _Evaluation(engine._engine, schema, path, name, out, bool(no_cache),
                                int(batch), int(limit), bool(strict), params)
        self._bar = _progress_bar(total, progress)
        self._read = 0

    def __iter__(self):
        return self

    def __next__(self):
        while not self._queue:
            if self._done:
                raise StopIteration
            before = self._run.rows_read
            events = self._step()
            if self._bar is not None and self._run.rows_read != before:
                self._bar.update(self._run.rows_read - before)
            for kind, _line, payload in events:
                if kind == "row":
                    self._queue.append(_json.loads(payload))
                else:
                    self.errors.append(payload)
                    _sys.stderr.write("promptcache: error: %s\n" % payload)
        return self._queue.pop(0)

    def _step(self):
        if self._rows is None:
            events = self._run.next_events()
            if not events:
                self._end()
            return events
        if self._run.stopped or (self._limit and self._run.rows_read >= self._limit):
            events = self._run.finish()
            self._end()
            return events
        try:
            row = next(self._rows)
        except StopIteration:
            events = self._run.finish()
            self._end()
            return events
        if isinstance(row, dict):
            text = _json.dumps(row, ensure_ascii=False)
        elif isinstance(row, str):
            text = row
        else:
            raise TypeError("eval rows are dicts (or JSON text), not %s" % type(row).__name__)
        return self._run.add(text)

    def _end(self):
        self._done = True
        if self._bar is not None:
            self._bar.close()
            self._bar = None

    @property
    def summary(self):
        """The summary of docs/eval.md (rows, resumed, failed, answered, correct, accuracy,
        prompt_tokens, cached_tokens, ...): final once the iterator is exhausted."""
        return _json.loads(self._run.summary())

    def __repr__(self):
        return "<promptcache.EvalRun %s>" % ("done" if self._done else "running")
