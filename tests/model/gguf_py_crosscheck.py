#!/usr/bin/env python3
"""Cross-check of GGML's block formats against llama.cpp's gguf-py (pure numpy).

Run by tests/model/test_ggml_quant_gguf_py.cpp, which writes into DIR: x.f32 (rows of K float32
values, K a multiple of 256) and, per type T in Q4_0 Q5_0 Q5_1 Q8_0 Q4_K Q5_K Q6_K, ours_T.bin (our
quantize() of x) and random_T.bin (random valid blocks). This script writes, with gguf-py:
  ours_T.deq.f32    gguf-py's dequantization of ours_T.bin
  random_T.deq.f32  gguf-py's dequantization of random_T.bin
  theirs_T.bin      gguf-py's quantization of x, for the types gguf-py can quantize
  theirs_T.deq.f32  gguf-py's dequantization of theirs_T.bin
and prints the types it quantized. Usage: gguf_py_crosscheck.py GGUF_PY_DIR DIR K
"""
import os
import sys

gguf_py, work, k = sys.argv[1], sys.argv[2], int(sys.argv[3])
import types  # noqa: E402

import numpy as np  # noqa: E402

# The gguf package without its __init__ (which imports the vocab module and so sentencepiece):
# only gguf.quants and what it imports (constants, lazy) are needed.
package = types.ModuleType("gguf")
package.__path__ = [os.path.join(gguf_py, "gguf")]
sys.modules["gguf"] = package
from gguf import quants  # noqa: E402
from gguf.constants import GGMLQuantizationType  # noqa: E402

x = np.fromfile(os.path.join(work, "x.f32"), dtype=np.float32).reshape(-1, k)
done = []
for name in ["Q4_0", "Q5_0", "Q5_1", "Q8_0", "Q4_K", "Q5_K", "Q6_K"]:
    qtype = GGMLQuantizationType[name]
    block, size = quants.GGML_QUANT_SIZES[qtype]
    for stem in ["ours", "random"]:
        raw = np.fromfile(os.path.join(work, f"{stem}_{name}.bin"), dtype=np.uint8)
        rows = raw.size // (k // block * size)
        deq = quants.dequantize(raw.reshape(rows, k // block * size), qtype)
        deq.astype(np.float32).tofile(os.path.join(work, f"{stem}_{name}.deq.f32"))
    try:
        theirs = quants.quantize(x, qtype)
    except NotImplementedError:
        continue
    theirs.astype(np.uint8).tofile(os.path.join(work, f"theirs_{name}.bin"))
    deq = quants.dequantize(theirs, qtype)
    deq.astype(np.float32).tofile(os.path.join(work, f"theirs_{name}.deq.f32"))
    done.append(name)
print("gguf-py quantized:", " ".join(done))
