#!/usr/bin/env bash
# Installs every build and test dependency of promptcache from Debian packages.
# Safe to run repeatedly; skips apt when everything is already present. chromium is only for the
# playground test (tests/server), which also needs node and npm (not installed here). clang-14,
# its runtime libraries (libFuzzer, the sanitizers) and llvm-14 (llvm-symbolizer, for readable
# reports) are for CI's fuzz pass (scripts/fuzz.sh ci).
set -euo pipefail
pkgs=(build-essential cmake pkg-config ccache libtorch-dev libopenblas0-pthread libpugixml-dev
      libfmt-dev catch2 libsentencepiece-dev sentencepiece nlohmann-json3-dev libcli11-dev python3
      libpcre2-dev libutf8proc-dev libxxhash-dev libcpp-httplib-dev libhiredis-dev libssl-dev
      redis-server chromium)
missing=()
# CI's fuzz pass (scripts/fuzz.sh ci): clang, libFuzzer, sanitizer runtimes, llvm-symbolizer.
pkgs+=(clang-14 libclang-rt-14-dev llvm-14)
for p in "${pkgs[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if [ ${#missing[@]} -gt 0 ]; then
  SUDO=""; [ "$(id -u)" -eq 0 ] || SUDO=sudo
  echo "install-deps: installing ${missing[*]}"
  $SUDO apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq "${missing[@]}"
fi
