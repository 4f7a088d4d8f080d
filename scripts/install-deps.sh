#!/usr/bin/env bash
# Installs promptcache's dependencies from Debian packages. Safe to run repeatedly; apt runs only
# when a package is missing.
#
#   scripts/install-deps.sh           what building the library and the CLI and running them
#                                     need (scripts/demo.sh), without apt's recommended extras
#   scripts/install-deps.sh --tests   that, plus what the tests add (scripts/test.sh)
#
# The tests add: Catch2; libsentencepiece and its tools (the tokenizer cross-checks); python3
# (the CLI tests' checks); redis-server (the Redis tier's tests); chromium (the playground test
# in tests/server, which also needs node and npm, not installed here); clang-14, its runtime
# libraries (libFuzzer, the sanitizers) and llvm-14 (llvm-symbolizer, for readable reports) for
# CI's fuzz pass (scripts/fuzz.sh ci); pybind11-dev, python3-dev, python3-torch and
# python3-pytest for the Python module and its suite (tests/python, docs/python.md); python3-jinja2,
# the reference `promptcache template` is compared with (tests/jinja/compare_reference.py). Debian's
# python3-torch must be the PyTorch release of libtorch-dev (the module hands tensors to it, and
# both load the same libtorch_cpu.so): checked at the end.
set -euo pipefail
tests=0
case "${1:-}" in
  "") ;;
  --tests) tests=1 ;;
  *) echo "usage: scripts/install-deps.sh [--tests]" >&2; exit 2 ;;
esac
# Building and running: the compiler and CMake, LibTorch with OpenBLAS, the libraries the code
# includes, and the optional parts of the CLI (cpp-httplib: `serve`; hiredis: `--redis`).
build=(build-essential cmake ninja-build pkg-config ccache libtorch-dev libopenblas0-pthread libpugixml-dev
       libfmt-dev nlohmann-json3-dev libcli11-dev libpcre2-dev libutf8proc-dev libxxhash-dev
       libssl-dev libcpp-httplib-dev libhiredis-dev)
test_pkgs=(catch2 libsentencepiece-dev sentencepiece python3 redis-server chromium
           clang-14 libclang-rt-14-dev llvm-14 pybind11-dev python3-dev python3-torch
           python3-pytest python3-venv python3-jinja2)
pkgs=("${build[@]}")
apt_flags=(--no-install-recommends)
if ((tests)); then
  pkgs+=("${test_pkgs[@]}")
  apt_flags=()  # as the test machines have always been set up
fi
missing=()
for p in "${pkgs[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if [ ${#missing[@]} -gt 0 ]; then
  SUDO=""; [ "$(id -u)" -eq 0 ] || SUDO=sudo
  echo "install-deps: installing ${missing[*]}"
  $SUDO apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq "${apt_flags[@]}" "${missing[@]}"
fi
if ((tests)); then
  torch_py=$(dpkg-query -W -f='${Version}' python3-torch)
  torch_c=$(dpkg-query -W -f='${Version}' libtorch-dev)
  if [ "$torch_py" != "$torch_c" ]; then
    echo "install-deps: python3-torch $torch_py is not libtorch-dev's release ($torch_c): the Python" \
         "module would load two PyTorch builds; install matching versions" >&2
    exit 1
  fi
fi
