#!/usr/bin/env bash
# LibTorch 2.x check without a GPU: builds promptcache against Debian trixie's LibTorch 2.6 (CPU)
# inside a debootstrap chroot and runs the whole test suite there, so the code paths guarded by
# TORCH_VERSION_MAJOR >= 2 (scaled_dot_product_attention, f16 on the CPU, Catch2 v3) are
# compiled and tested on a bookworm machine whose own LibTorch is 1.13.
#
#   scripts/torch2-check.sh [--bench]      (as root; needs deb.debian.org)
#
# The chroot is made once in $TORCH2_ROOT (default /var/tmp/promptcache-trixie, about 3 GB) and
# reused. The repository and ../shared are bind-mounted at their own paths, the build goes to
# build-torch2/. --bench also runs bench_ttft at 2048 + 16 with each attention implementation.
set -euo pipefail
cd "$(dirname "$0")/.."
repo=$(pwd)
shared=$(cd .. && pwd)/shared
root=${TORCH2_ROOT:-/var/tmp/promptcache-trixie}
bench=0
for arg in "$@"; do
  case "$arg" in
    --bench) bench=1 ;;
    *) echo "torch2-check: unknown argument '$arg' (usage: scripts/torch2-check.sh [--bench])" >&2; exit 2 ;;
  esac
done
[ "$(id -u)" -eq 0 ] || { echo "torch2-check: needs root (debootstrap, mount, chroot)" >&2; exit 2; }

# The same packages as scripts/install-deps.sh, from trixie.
packages=build-essential,cmake,ninja-build,pkg-config,ccache,libtorch-dev,libopenblas0-pthread,libpugixml-dev,libfmt-dev,catch2,libsentencepiece-dev,sentencepiece,nlohmann-json3-dev,libcli11-dev,python3,libpcre2-dev,libutf8proc-dev,libxxhash-dev,libssl-dev,libcpp-httplib-dev,libhiredis-dev,redis-server,python3-jinja2
if [ ! -x "$root/usr/bin/cmake" ] || [ ! -f "$root/usr/lib/x86_64-linux-gnu/cmake/Torch/TorchConfig.cmake" ]; then
  command -v debootstrap >/dev/null || { apt-get update -qq && apt-get install -y -qq debootstrap; }
  echo "torch2-check: making a Debian trixie chroot with LibTorch 2.x in $root (a few minutes)"
  debootstrap --variant=minbase --include="$packages" \
    trixie "$root" http://deb.debian.org/debian >"$root.debootstrap.log" 2>&1 ||
    { echo "torch2-check: debootstrap failed (see $root.debootstrap.log)" >&2; exit 1; }
fi
# A chroot made before a dependency was added gets it now.
missing=$(for p in ${packages//,/ }; do
  chroot "$root" dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || echo "$p"
done)
if [ -n "$missing" ]; then
  echo "torch2-check: installing into the chroot:" $missing
  chroot "$root" /usr/bin/env -i PATH=/usr/sbin:/usr/bin:/sbin:/bin DEBIAN_FRONTEND=noninteractive \
    bash -c "apt-get update -qq && apt-get install -y -qq $(echo $missing)" >"$root.apt.log" 2>&1 ||
    { echo "torch2-check: apt-get in the chroot failed (see $root.apt.log)" >&2; exit 1; }
fi

mounts=()
# The repository, ../shared and /dev are bind-mounted into the chroot: if one stayed mounted,
# deleting the chroot would delete them too, so a mount that will not go is said loudly.
cleanup() {
  local i m
  for ((i = ${#mounts[@]} - 1; i >= 0; i--)); do
    m=${mounts[$i]}
    umount "$m" 2>/dev/null || umount -l "$m" 2>/dev/null || true
    if mountpoint -q "$m"; then
      echo "torch2-check: WARNING: $m is still mounted; unmount it (umount -l '$m') before" \
        "deleting $root (check with: findmnt -R '$root')" >&2
    fi
  done
}
trap cleanup EXIT
bind() {  # bind <host path> (mounted at the same path inside the chroot)
  mkdir -p "$root$1"
  mountpoint -q "$root$1" || { mount --bind "$1" "$root$1"; mounts+=("$root$1"); }
}
bind "$repo"
[ -d "$shared" ] && bind "$shared"
mountpoint -q "$root/proc" || { mount -t proc proc "$root/proc"; mounts+=("$root/proc"); }
bind /dev

in_root() { chroot "$root" /usr/bin/env -i PATH=/usr/sbin:/usr/bin:/sbin:/bin HOME=/root \
  LANG=C.UTF-8 bash -c "cd '$repo' && $1"; }
version=$(in_root "grep -hE 'define TORCH_VERSION_(MAJOR|MINOR|PATCH) ' \
  /usr/include/torch/csrc/api/include/torch/version.h | cut -d' ' -f3 | paste -sd.")
echo "torch2-check: $(in_root "g++ --version | head -1"); LibTorch $version"
in_root "cmake -S . -B build-torch2 -DCMAKE_BUILD_TYPE=Release -DCMAKE_CXX_COMPILER_LAUNCHER=ccache \
  >/tmp/torch2-configure.log 2>&1 && cmake --build build-torch2 -j\$(nproc)" ||
  { echo "torch2-check: build FAILED" >&2; exit 1; }
in_root "ctest --test-dir build-torch2 --output-on-failure -j\$(nproc)"
if [ "$bench" -eq 1 ]; then
  for impl in blocked sdpa; do
    echo "torch2-check: bench_ttft 2048 + 16, PROMPTCACHE_ATTENTION=$impl"
    in_root "PROMPTCACHE_ATTENTION=$impl build-torch2/benchmarks/bench_ttft --schema 2048 --fresh 16 --repeats 3"
  done
fi
echo "torch2-check: LibTorch 2.x build and tests passed"
