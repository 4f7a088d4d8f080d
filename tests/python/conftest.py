"""Fixtures of the Python suite (docs/python.md, "Tests").

Run from the repository root after building: PYTHONPATH=build/python python3 -m pytest tests/python
(scripts/test.sh does, after CTest). PROMPTCACHE_CLI names the CLI binary (default
build/promptcache): the suite makes its tiny random models with `promptcache make-model` and
compares the module against the CLI's results.
"""
import os
import pathlib
import signal
import subprocess

import pytest

# The suite simulates Ctrl-C with _thread.interrupt_main, which does nothing while SIGINT is
# ignored, as it is for a run that a non-interactive shell started in the background (`cmd &`,
# some CI runners). The interpreter's own handler is put back, so the simulated Ctrl-C arrives
# as a user's does at a terminal.
signal.signal(signal.SIGINT, signal.default_int_handler)

ROOT = pathlib.Path(__file__).resolve().parents[2]
STORIES = ROOT / "models" / "stories260K"
FAMILIES = ["tiny", "qwen2-tiny", "qwen3-tiny", "llama3-tiny", "mistral-tiny"]


def cli_path():
    path = pathlib.Path(os.environ.get("PROMPTCACHE_CLI", ROOT / "build" / "promptcache"))
    if not path.exists():
        pytest.fail("the promptcache CLI is not at %s: build it (scripts/build.sh) or set "
                    "PROMPTCACHE_CLI" % path)
    return path


def run_cli(*args):
    r = subprocess.run([str(cli_path()), *map(str, args)], capture_output=True, text=True)
    if r.returncode != 0:
        raise AssertionError("promptcache %s: exit %d\n%s" % (" ".join(map(str, args)), r.returncode,
                                                            r.stderr))
    return r


@pytest.fixture(scope="session")
def models(tmp_path_factory):
    """A folder of tiny random checkpoints, one per family, made on first use."""
    base = tmp_path_factory.mktemp("models")
    made = {}

    def get(shape):
        if shape not in made:
            run_cli("make-model", "--shape", shape, "--out", base / shape, "--seed", "7")
            made[shape] = base / shape
        return made[shape]

    return get


@pytest.fixture(scope="session")
def stories_path():
    if not (STORIES / "config.json").exists():
        pytest.skip("models/stories260K is not in this checkout")
    return STORIES


@pytest.fixture(scope="session")
def stories(stories_path):
    """stories260K in f32 (exact comparisons), with the examples/eval schema loaded."""
    import promptcache as pc

    eng = pc.Engine(stories_path, weights="f32", template="plain")
    eng.add_schema(ROOT / "examples" / "eval" / "stories.xml")
    return eng
