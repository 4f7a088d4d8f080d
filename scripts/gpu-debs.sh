#!/usr/bin/env bash
# Downloads (does not install) the Debian packages a GPU machine without this project's
# dependencies needs, into .gpu-debs/ (ignored by git): scripts/gpu-check.sh unpacks them into a
# private prefix there. The GPU machines lent to this project reach no package registry, so the
# files travel with the working tree (the device tool's `carry: [".gpu-debs"]`).
set -euo pipefail
cd "$(dirname "$0")/.."
# Names as in Debian bookworm (libfmt9: the runtime library of that release's libfmt-dev).
pkgs=(libpugixml-dev libpugixml1v5 libfmt-dev libfmt9 nlohmann-json3-dev catch2 libcli11-dev
      sentencepiece libsentencepiece0 libsentencepiece-dev libpcre2-dev libpcre2-8-0
      libutf8proc-dev libutf8proc2 libxxhash-dev)
mkdir -p .gpu-debs
rm -f .gpu-debs/*.deb
SUDO=""; [ "$(id -u)" -eq 0 ] || SUDO=sudo
$SUDO apt-get update -qq
# As root, apt's download sandbox user could not write here; root downloads directly.
sandbox=(); [ "$(id -u)" -eq 0 ] && sandbox=(-o APT::Sandbox::User=root)
(cd .gpu-debs && apt-get download -qq ${sandbox[@]+"${sandbox[@]}"} "${pkgs[@]}")
ls -l .gpu-debs
du -sh .gpu-debs
