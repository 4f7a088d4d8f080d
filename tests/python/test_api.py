"""The rest of the Python API: Prompt built in code, tokenize, layout, next_token_logits as a
torch.Tensor (one LibTorch in the process), Ctrl-C in generate, docstrings and the .pyi stub."""
import _thread
import ast
import inspect
import pathlib
import threading
import time

import pytest
import torch

import promptcache as pc


def test_prompt_in_code_equals_pml_text(stories):
    xml = '<prompt schema="stories"><instruction/><home/> Tim was tired, so he went to</prompt>'
    built = pc.Prompt(schema="stories", modules=["instruction", "home"],
                      text=" Tim was tired, so he went to")
    assert built.schema == "stories" and built.modules == ["instruction", "home"]
    a, b = stories.generate(xml, max_new_tokens=12), stories.generate(built, max_new_tokens=12)
    assert (a.token_ids, a.cached_tokens, a.prompt_tokens) == (b.token_ids, b.cached_tokens,
                                                               b.prompt_tokens)
    assert stories.score(xml, ["bed"]).logprobs == stories.score(built, ["bed"]).logprobs


def test_prompt_arguments_and_nesting(models):
    eng = pc.Engine(models("tiny"), weights="f32")
    eng.add_schema('<schema name="t"><module name="guide">Your guide is <parameter name="name" '
                   'length="4" scaffold="Tom"/>.<module name="inner">Inner text.</module>'
                   '</module></schema>')
    xml = '<prompt schema="t"><guide name="Anna"><inner/></guide> Hello</prompt>'
    built = pc.Prompt(schema="t", modules=[("guide", {"name": "Anna"}, ["inner"])], text="Hello")
    assert eng.score(xml, [" yes"]).logprobs == eng.score(built, [" yes"]).logprobs
    with pytest.raises(TypeError):
        pc.Prompt(schema="t", modules=[42])
    with pytest.raises(pc.SchemaError):  # an argument longer than its 4 positions
        eng.generate(pc.Prompt(schema="t", modules=[("guide", {"name": "a b c d e f g h i"})]),
                     max_new_tokens=1)


def test_tokenize_and_layout(stories):
    ids = stories.tokenize("Lily had a red ball")
    assert ids and all(isinstance(i, int) for i in ids)
    assert stories.detokenize(ids).strip() == "Lily had a red ball"
    assert stories.tokenize("x", bos=True)[0] == 1 and stories.tokenize("x")[0] != 1
    layout = stories.layout("stories")
    assert [m["name"] for m in layout] == ["instruction", "park", "home"]
    for a, b in zip(layout, layout[1:]):
        assert a["end"] == b["begin"] and a["length"] == a["end"] - a["begin"] > 0
    g = stories.generate('<prompt schema="stories"><instruction/><park/> x</prompt>',
                         max_new_tokens=1)
    # position 0 holds the BOS token, the schema root's own (cached) span
    assert layout[0]["begin"] == 1 and g.cached_tokens == layout[1]["end"]


def test_next_token_logits_is_a_torch_tensor_without_a_second_libtorch(stories):
    p = '<prompt schema="stories"><instruction/><park/> Lily had a red</prompt>'
    t = stories.next_token_logits(p)
    assert isinstance(t, torch.Tensor) and t.dtype == torch.float32 and t.dim() == 1
    assert t.shape[0] == 512
    g = stories.generate(p, max_new_tokens=1)
    assert int(t.argmax()) == g.token_ids[0]
    s = stories.score(p, ["ball"])
    first = s.tokens[0][0]
    assert abs(float(torch.log_softmax(t.double(), 0)[first]) - s.logprob_per_token[0][0]) < 1e-5
    maps = pathlib.Path("/proc/self/maps")
    if maps.exists():
        libs = {line.split()[-1] for line in maps.read_text().splitlines()
                if "libtorch_cpu.so" in line}
        assert len({pathlib.Path(p).resolve() for p in libs}) == 1, libs


def test_ctrl_c_in_generate_is_prompt_and_leaves_the_engine_usable(models):
    eng = pc.Engine(models("bench-small"))
    eng.add_schema('<schema name="s"><module name="a">Hello there, a module.</module></schema>')
    p = '<prompt schema="s"><a/> Go on</prompt>'
    before = eng.generate(p, max_new_tokens=8, ignore_eos=True)
    timer = threading.Timer(0.5, _thread.interrupt_main)
    start = time.monotonic()
    timer.start()
    with pytest.raises(KeyboardInterrupt) as info:
        eng.generate(p, max_new_tokens=1500, ignore_eos=True)
        time.sleep(30)  # the generation ended before the interrupt: fail, not pass
    assert info.traceback[-1].name == "generate"  # from inside the call, between tokens
    assert time.monotonic() - start < 2.0
    after = eng.generate(p, max_new_tokens=8, ignore_eos=True)
    assert after.token_ids == before.token_ids


def public_names():
    return [n for n in pc.__all__]


def test_every_public_name_has_a_docstring():
    for name in public_names():
        obj = getattr(pc, name)
        assert obj.__doc__ and len(obj.__doc__.strip()) > 20, name
        if inspect.isclass(obj):
            for attr, value in vars(obj).items():
                if attr.startswith("_"):
                    continue
                assert getattr(value, "__doc__", None), "%s.%s" % (name, attr)


def test_stub_names_the_public_api():
    stub = pathlib.Path(pc.__file__).with_name("__init__.pyi")
    tree = ast.parse(stub.read_text())
    classes = {n.name: {m.name for m in n.body if isinstance(m, ast.FunctionDef)}
               for n in tree.body if isinstance(n, ast.ClassDef)}
    for name in public_names():
        assert name in classes, name
    for method in ("add_schema", "generate", "generate_batch", "score", "next_token_logits",
                   "tokenize", "layout", "eval"):
        assert method in classes["Engine"] and callable(getattr(pc.Engine, method))
    assert (pathlib.Path(pc.__file__).with_name("py.typed")).exists()


def test_cache_dir_keeps_compiled_states(models, tmp_path):
    schema = ('<schema name="c"><module name="a">The river runs past the old mill where the '
              'baker sells bread.</module></schema>')
    prompt = '<prompt schema="c"><a/> Where is the mill?</prompt>'
    first = pc.Engine(models("tiny"), weights="f32", cache_dir=tmp_path / "states")
    first.add_schema(schema)
    files = list((tmp_path / "states").iterdir())
    assert len(files) == 1 and files[0].stat().st_size > 0
    mtime = files[0].stat().st_mtime_ns
    second = pc.Engine(models("tiny"), weights="f32", cache_dir=tmp_path / "states")
    second.add_schema(schema)  # loaded from the file, not compiled and saved again
    assert files[0].stat().st_mtime_ns == mtime
    assert first.score(prompt, [" by the river"]).logprobs == \
        second.score(prompt, [" by the river"]).logprobs


def test_ctrl_c_in_a_long_compile(models):
    eng = pc.Engine(models("bench-small"))
    words = "the river runs past the old mill where the baker sells bread every morning "
    schema = '<schema name="long"><module name="doc">%s</module></schema>' % (words * 150)
    timer = threading.Timer(0.3, _thread.interrupt_main)
    start = time.monotonic()
    timer.start()
    with pytest.raises(KeyboardInterrupt) as info:
        eng.add_schema(schema)
        time.sleep(30)  # the compile ended before the interrupt: fail, not pass
    assert info.traceback[-1].name == "add_schema"  # from inside the compile
    assert time.monotonic() - start < 5.0
    with pytest.raises(pc.SchemaError):  # left as it was: the schema is not loaded
        eng.layout("long")
    eng.add_schema('<schema name="short"><module name="a">Hello.</module></schema>')
    assert eng.layout("short")[0]["name"] == "a"


def test_ctrl_c_when_imported_from_another_thread(models):
    """Signals are Python's main thread's, whichever thread imported the module."""
    import os
    import subprocess
    import sys

    code = (
        "import _thread, signal, threading, sys\n"
        "signal.signal(signal.SIGINT, signal.default_int_handler)  # as conftest.py does\n"
        "t = threading.Thread(target=lambda: __import__('promptcache')); t.start(); t.join()\n"
        "import promptcache as pc\n"
        "eng = pc.Engine(sys.argv[1])\n"
        "eng.add_schema('<schema name=\"s\"><module name=\"a\">Hi.</module></schema>')\n"
        "threading.Timer(0.3, _thread.interrupt_main).start()\n"
        "try:\n"
        "    eng.generate('<prompt schema=\"s\"><a/> x</prompt>', max_new_tokens=1500,\n"
        "                 ignore_eos=True)\n"
        "except KeyboardInterrupt:\n"
        "    print('interrupted')\n")
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(
        [os.path.dirname(os.path.dirname(pc.__file__)), env.get("PYTHONPATH", "")])
    r = subprocess.run([sys.executable, "-c", code, str(models("bench-small"))],
                       capture_output=True, text=True, env=env, timeout=300)
    assert r.stdout.strip() == "interrupted", r.stdout + r.stderr
