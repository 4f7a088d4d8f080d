"""The correctness contracts through Python: prefix-exact (cached equals no-cache within 1e-4 in
f32), position-exact (the module gives the C++ engine's result, checked against the CLI on the
same prompts), batch-exact (generate_batch rows equal single calls)."""
import json

import pytest

import promptcache as pc
from conftest import FAMILIES, ROOT, run_cli

PREFIX_SCHEMA = """<schema name="quiz">
  <module name="rules">Answer the question about the trip in a few words.</module>
  <module name="shots">Q: Where is the hotel? A: near the sea. Q: When do we leave? A: at noon.</module>
  <module name="more">Q: Who drives? A: Anna does. Q: What do we eat? A: fish and rice.</module>
</schema>"""

# Unions, a parameter, a module left out before a later one: nothing here is a prefix.
MIXED_SCHEMA = """<schema name="mixed"><module name="rules">Answer the question.</module>
<union scaffold="a"><module name="a">Q: Where is the hotel? A: near the sea.</module>
<module name="b">Q: When do we leave? A: at noon, after lunch, with the bus.</module></union>
<module name="note">Note <parameter name="who" length="4" scaffold="someone"/> is coming.</module>
<module name="tail">The trip ends on Sunday evening at the station.</module>
</schema>"""


def close(a, b, tol):
    assert len(a) == len(b)
    return all(abs(x - y) <= tol for x, y in zip(a, b))


def check_prefix_exact(eng, prompt, choices):
    cached = eng.score(prompt, choices)
    plain = eng.score(prompt, choices, no_cache=True)
    assert cached.cached_tokens > 0 and plain.cached_tokens == 0
    assert cached.tokens == plain.tokens
    for c, p in zip(cached.logprob_per_token, plain.logprob_per_token):
        assert close(c, p, 1e-4), (c, p)
    assert close(cached.logprobs, plain.logprobs, 1e-4)
    assert cached.pred == plain.pred
    a = eng.next_token_logits(prompt)
    b = eng.next_token_logits(prompt, no_cache=True)
    assert float((a - b).abs().max()) <= 1e-4
    g = eng.generate(prompt, max_new_tokens=12)
    h = eng.generate(prompt, max_new_tokens=12, no_cache=True)
    assert g.token_ids == h.token_ids and g.text == h.text
    assert g.cached_tokens > 0 and h.cached_tokens == 0


def test_prefix_exact_stories260k(stories):
    for modules in ("<instruction/>", "<instruction/><park/>", "<instruction/><park/><home/>"):
        prompt = '<prompt schema="stories">%s Lily had a red</prompt>' % modules
        check_prefix_exact(stories, prompt, ["ball", "tree", "big red car"])


@pytest.mark.parametrize("family", FAMILIES)
def test_prefix_exact_random_models(models, family):
    eng = pc.Engine(models(family), weights="f32")
    assert eng.add_schema(PREFIX_SCHEMA) == "quiz"
    for modules in ("<rules/>", "<rules/><shots/>", "<rules/><shots/><more/>"):
        prompt = '<prompt schema="quiz">%s Q: Where do we sleep? A:</prompt>' % modules
        check_prefix_exact(eng, prompt, [" at the hotel", " near the sea", " no"])


def cli_eval(model, schema_path, rows, tmp_path, *extra):
    data = tmp_path / "cli.jsonl"
    data.write_text("".join(json.dumps(r) + "\n" for r in rows))
    out = tmp_path / "cli-out.jsonl"
    run_cli("eval", "--model", model, "--schema", schema_path, "--data", data, "--out", out,
            "--weights", "f32", "--batch", "1", *extra)
    return {r["id"]: r for r in map(json.loads, out.read_text().splitlines())}


def check_against_cli(eng, schema_name, model, schema_path, rows, tmp_path, *extra):
    expected = cli_eval(model, schema_path, rows, tmp_path, *extra)
    assert sorted(expected) == sorted(r["id"] for r in rows)
    for row in rows:
        modules = [m if isinstance(m, str) else (m["name"], m.get("arguments", {}))
                   for m in row["modules"]]
        prompt = pc.Prompt(schema=schema_name, modules=modules, text=row["prompt"])
        want = expected[row["id"]]
        if "choices" in row:
            s = eng.score(prompt, row["choices"])
            assert s.cached_tokens == want["cached_tokens"] and s.prompt_tokens == want["prompt_tokens"]
            for got, c in zip(s.logprob_per_token, want["choices"]):
                assert close(got, c["logprob_per_token"], 1e-5), (got, c)
            assert s.tokens == [c["tokens"] for c in want["choices"]]
            assert s.pred == want["pred"]
        else:
            g = eng.generate(prompt, max_new_tokens=row["max_tokens"])
            assert g.text == want["text"] and g.cached_tokens == want["cached_tokens"]


def test_position_exact_stories260k_matches_cli(stories, stories_path, tmp_path):
    # "home" without "park" before it, and "park" alone after a gap: not prefixes.
    rows = [
        {"id": "home", "modules": ["instruction", "home"], "prompt": "Tim was tired, so he went to",
         "choices": ["sleep", "apple", "blue"]},
        {"id": "park", "modules": ["park"], "prompt": "Lily had a red", "choices": ["ball", "sky"]},
        {"id": "gen", "modules": ["home"], "prompt": "One day, Tim", "max_tokens": 16},
    ]
    check_against_cli(stories, "stories", stories_path, ROOT / "examples/eval/stories.xml", rows,
                      tmp_path, "--template", "plain")
    # The cache does move these numbers (Prompt Cache's approximation): the comparison above is
    # against the engine's own result, not against no_cache.
    s = stories.score(pc.Prompt(schema="stories", modules=["home"], text="One day, Tim"), ["ran"])
    assert s.cached_tokens > 0


@pytest.mark.parametrize("family", ["tiny", "qwen3-tiny"])
def test_position_exact_unions_parameters_match_cli(models, family, tmp_path):
    schema = tmp_path / "mixed.xml"
    schema.write_text(MIXED_SCHEMA)
    eng = pc.Engine(models(family), weights="f32")
    eng.add_schema(schema)
    rows = [
        {"id": "b", "modules": ["rules", "b", "tail"], "prompt": "Q: When? A:",
         "choices": [" at noon", " never"]},
        {"id": "note", "modules": [{"name": "note", "arguments": {"who": "Tom"}}],
         "prompt": "Who is coming?", "choices": [" Tom", " nobody at all"]},
        {"id": "tail", "modules": ["tail"], "prompt": "When does it end?", "max_tokens": 8},
    ]
    check_against_cli(eng, "mixed", models(family), schema, rows, tmp_path)


def test_generate_batch_equals_single_calls(stories):
    prompts = [
        '<prompt schema="stories"><instruction/><park/> Lily had a red</prompt>',
        pc.Prompt(schema="stories", modules=["home"], text="Tim was tired, so he went to"),
        '<prompt schema="stories"><instruction/><home/> One day</prompt>',
        '<prompt schema="stories"><park/> The sun</prompt>',
    ]
    batch = stories.generate_batch(prompts, max_new_tokens=16)
    assert len(batch) == len(prompts)
    for p, b in zip(prompts, batch):
        one = stories.generate(p, max_new_tokens=16)
        assert (b.text, b.token_ids, b.cached_tokens, b.prompt_tokens) == \
            (one.text, one.token_ids, one.cached_tokens, one.prompt_tokens)


def test_generate_batch_random_model(models):
    eng = pc.Engine(models("mistral-tiny"), weights="f32")
    eng.add_schema(MIXED_SCHEMA)
    prompts = ['<prompt schema="mixed"><rules/><b/> Q: When? A:</prompt>',
               '<prompt schema="mixed"><note who="Ann"/> Who?</prompt>',
               '<prompt schema="mixed"><a/><tail/> Where?</prompt>']
    batch = eng.generate_batch(prompts, max_new_tokens=10, no_cache=False)
    assert [b.token_ids for b in batch] == [eng.generate(p, max_new_tokens=10).token_ids
                                            for p in prompts]
