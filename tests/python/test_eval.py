"""Engine.eval: the CLI eval's rows and resume rules (one implementation, promptcache/eval.hpp),
as an iterator over a JSONL path or an iterable of dicts."""
import _thread
import collections
import json
import sys
import threading
import time

import pytest

import promptcache as pc
from conftest import ROOT, run_cli

EXAMPLE = ROOT / "examples" / "eval"


def lines_of(rows):
    return "".join((r if isinstance(r, str) else json.dumps(r)) + "\n" for r in rows)


def test_malformed_line_is_reported_and_the_rest_run(stories, stories_path, tmp_path, capsys):
    rows = [
        {"id": "a", "prompt": "Lily had a red", "choices": ["ball", "tree"], "answer": 0},
        "this is not json",
        {"id": "b", "modules": ["instruction", "nope"], "prompt": "x", "choices": ["y"]},
        {"id": "c", "prompt": "One day, Lily went to the park and", "max_tokens": 8},
        {"id": "a", "prompt": "again", "choices": ["x"]},
        {"id": "d", "modules": ["home"], "prompt": "Tim went to", "choices": ["bed", "sky"],
         "answer": "bed"},
    ]
    data = tmp_path / "d.jsonl"
    data.write_text(lines_of(rows))
    out = tmp_path / "r.jsonl"
    run = stories.eval(data, schema="stories", out=out, batch=2, progress=False)
    got = list(run)
    assert [r["id"] for r in got] == ["a", "c", "d"]
    err = capsys.readouterr().err
    for expected in ("d.jsonl:2: the line is not valid JSON", "d.jsonl:3: schema 'stories' has no module 'nope'",
                     'd.jsonl:5: id "a" was already used at line 1'):
        assert expected in err
        assert any(expected in e for e in run.errors)
    assert len(run.errors) == 3
    s = run.summary
    assert s["rows"] == 3 and s["failed"] == 3 and s["answered"] == 2
    # The results file holds the same rows as the iterator, and the CLI writes the same.
    assert [json.loads(l) for l in out.read_text().splitlines()] == got
    cli_out = tmp_path / "cli.jsonl"
    run_cli("eval", "--model", stories_path, "--template", "plain", "--weights", "f32", "--schema",
            EXAMPLE / "stories.xml", "--data", data, "--out", cli_out, "--batch", "2")
    cli_rows = [json.loads(l) for l in cli_out.read_text().splitlines()]
    assert [r["id"] for r in cli_rows] == ["a", "c", "d"]
    for p, c in zip(got, cli_rows):
        assert p.get("text") == c.get("text") and p.get("pred") == c.get("pred")
        for x, y in zip(p.get("choices", []), c.get("choices", [])):
            assert abs(x["logprob"] - y["logprob"]) < 1e-5


def test_iterable_of_dicts_equals_the_file(stories, tmp_path):
    data = [json.loads(l) for l in (EXAMPLE / "stories.jsonl").read_text().splitlines() if l.strip()]
    from_dicts = list(stories.eval(data, schema=str(EXAMPLE / "stories.xml"), progress=False))
    from_file = list(stories.eval(EXAMPLE / "stories.jsonl", schema="stories", progress=False))
    assert from_dicts == from_file
    assert len(from_file) == len(data)
    answered = [r for r in from_file if "correct" in r]
    assert sum(r["correct"] for r in answered) / len(answered) >= 0.5
    # limit: the first rows only
    assert [r["id"] for r in stories.eval(iter(data), schema="stories", limit=3, progress=False)] == \
        [d["id"] for d in data[:3]]


def test_progress_without_tqdm_prints_plain_lines(stories, monkeypatch, capsys):
    monkeypatch.setitem(sys.modules, "tqdm", None)  # import tqdm fails
    rows = list(stories.eval(EXAMPLE / "stories.jsonl", schema="stories"))
    assert len(rows) == 10
    assert "eval: 10/10 rows" in capsys.readouterr().err


def interrupt_after(seconds):
    t = threading.Timer(seconds, _thread.interrupt_main)
    t.start()
    return t


def test_interrupted_eval_resumes_each_id_once(models, tmp_path):
    eng = pc.Engine(models("bench-small"))
    eng.add_schema('<schema name="q"><module name="rules">Answer the question about the '
                   'trip.</module></schema>')
    data = tmp_path / "d.jsonl"
    data.write_text(lines_of({"id": i, "prompt": "Q: question %d? A:" % i, "max_tokens": 24}
                             for i in range(24)))
    out = tmp_path / "r.jsonl"
    seen = []
    with pytest.raises(KeyboardInterrupt) as info:
        for row in eng.eval(data, schema="q", out=out, batch=4, progress=False):
            if not seen:  # Ctrl-C while the second batch generates
                interrupt_after(0.2)
            seen.append(row["id"])
        time.sleep(30)  # the run ended before the interrupt: it must not pass silently
    # Raised from inside the engine's batch (its token callback polled the signal), not later.
    assert info.traceback[-1].name == "_step", info.traceback[-1]
    first = [json.loads(l)["id"] for l in out.read_text().splitlines()]
    assert 0 < len(first) < 24 and first[: len(seen)] == seen
    # The engine is still usable, and a second run finishes the rest.
    g = eng.generate('<prompt schema="q"><rules/> Q: ok? A:</prompt>', max_new_tokens=2,
                     ignore_eos=True)
    assert len(g.token_ids) == 2 and g.cached_tokens > 0
    run = eng.eval(data, schema="q", out=out, batch=4, progress=False)
    rest = [r["id"] for r in run]
    assert run.summary["resumed"] == len(first) and run.summary["rows"] == 24 - len(first)
    ids = collections.Counter(json.loads(l)["id"] for l in out.read_text().splitlines())
    assert sorted(ids) == list(range(24)) and max(ids.values()) == 1
    assert sorted(first + rest) == list(range(24))
