#!/usr/bin/env python3
"""Few-shot evaluation with promptcache from Python, on stories260K (docs/python.md).

The instruction and the worked examples are prompt modules: their attention states are computed
once, when the schema is added, and every question runs only its own tokens after them. Each
row scores its answer choices; the accuracy is printed, and the same rows without the cache
show what the cache saves.

    PYTHONPATH=build/python python3 examples/python/fewshot_eval.py [MODEL_DIR]
"""
import pathlib
import sys
import time

import promptcache as pc

HERE = pathlib.Path(__file__).resolve().parent
MODEL = pathlib.Path(sys.argv[1]) if len(sys.argv) > 1 else HERE.parents[1] / "models" / "stories260K"

SCHEMA = """
<schema name="fewshot">
  <module name="instruction">Here are short stories. Each one ends with the word that fits.</module>
  <module name="examples">Once upon a time, there was a little girl named Lily. She loved to play
    outside in the park. One day, she saw a big red ball. She ran to the ball and kicked it.
    Lily was very happy. Once upon a time, there was a little boy named Tim. Every night, his mom
    read him a story before bed. Then he went to sleep.</module>
</schema>
"""

ROWS = [
    ("Lily had a red", ["ball", "tree", "sky"], 0),
    ("Tom and Sue went to play in the", ["park", "spoon", "happy"], 0),
    ("The dog got a new toy. The dog was very", ["happy", "door", "car"], 0),
    ("It was late at night. Tim was tired, so he went to", ["sleep", "apple", "blue"], 0),
    ("Every night, his mom read him a", ["story", "car", "green"], 0),
    ("She ran to the ball and", ["kicked", "sky", "table"], 0),
]


def evaluate(eng, no_cache):
    correct, start = 0, time.perf_counter()
    for question, choices, answer in ROWS:
        prompt = pc.Prompt(schema="fewshot", modules=["instruction", "examples"], text=question)
        s = eng.score(prompt, choices, no_cache=no_cache)
        correct += s.pred == answer
        print("  %-55s -> %-7s (%s)" % (question, choices[s.pred],
                                        "right" if s.pred == answer else "wrong"))
    return correct / len(ROWS), time.perf_counter() - start


def main():
    eng = pc.Engine(MODEL, weights="f32", template="plain")  # stories260K has no chat format
    name = eng.add_schema(SCHEMA)
    print("schema %s: %s" % (name, ", ".join("%s [%d, %d)" % (m["name"], m["begin"], m["end"])
                                              for m in eng.layout(name))))
    print("with the cache:")
    acc, cached_s = evaluate(eng, no_cache=False)
    print("without the cache:")
    acc_plain, plain_s = evaluate(eng, no_cache=True)
    print("accuracy %.3f (%d rows); without the cache %.3f" % (acc, len(ROWS), acc_plain))
    print("time %.1f ms with the cache, %.1f ms without" % (cached_s * 1e3, plain_s * 1e3))
    return 0 if acc == acc_plain else 1  # a prefix of the schema: the cache changes nothing


if __name__ == "__main__":
    sys.exit(main())
