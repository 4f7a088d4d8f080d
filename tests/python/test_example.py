"""examples/python/fewshot_eval.py runs in CI: a few-shot evaluation on stories260K."""
import os
import subprocess
import sys

import promptcache
from conftest import ROOT


def test_fewshot_example(stories_path):
    env = dict(os.environ)
    # The package this suite imports (build tree or installed).
    env["PYTHONPATH"] = os.pathsep.join(
        [os.path.dirname(os.path.dirname(promptcache.__file__)), env.get("PYTHONPATH", "")])
    r = subprocess.run([sys.executable, str(ROOT / "examples/python/fewshot_eval.py"),
                        str(stories_path)], capture_output=True, text=True, env=env, timeout=300)
    assert r.returncode == 0, r.stdout + r.stderr
    lines = r.stdout.splitlines()
    acc = [line for line in lines if line.startswith("accuracy ")]
    assert len(acc) == 1, r.stdout
    assert float(acc[0].split()[1]) >= 0.5, acc  # the real model knows how these stories end
    assert sum("-> " in line for line in lines) == 12
