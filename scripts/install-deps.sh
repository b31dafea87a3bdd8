#!/usr/bin/env bash
# Installs everything megackpt needs to build and test, from Debian's archive only.
#   scripts/install-deps.sh           build + test dependencies
#   scripts/install-deps.sh --peers   also python3-torch (only for the side-by-side benchmarks)
# Safe to run again; needs root (or sudo).
set -euo pipefail

pkgs=(
  build-essential cmake ninja-build pkg-config git ccache
  clang libclang-rt-14-dev            # fuzzers (libFuzzer) and sanitizers
  clang-format-14                    # scripts/check-format.sh (ctest style.clang_format)
  libgtest-dev libgmock-dev libbenchmark-dev
  nlohmann-json3-dev libcli11-dev
  libmicrohttpd-dev libcurl4-openssl-dev   # megahub server, hub client (docs/hub.md)
  libzstd-dev liblz4-dev zlib1g-dev libisal-dev libssl-dev
  libxxhash-dev                      # XXH3-128 block hashes of incremental checkpoint saves
  libsqlite3-dev
  libopenmpi-dev openmpi-bin
  librust-blake3-dev libdlpack-dev
  python3 python3-numpy
  python3-venv python3-dev          # scripts/test-python.sh: venv + pip install . (PyPI packages)
)
if [[ "${1:-}" == "--peers" ]]; then
  pkgs+=(python3-torch)
fi

SUDO=""
if [[ $(id -u) -ne 0 ]]; then SUDO="sudo"; fi

missing=()
for p in "${pkgs[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if ((${#missing[@]})); then
  echo "install-deps: installing ${missing[*]}"
  export DEBIAN_FRONTEND=noninteractive
  $SUDO apt-get update -qq
  $SUDO apt-get install -y -qq --no-install-recommends "${missing[@]}"
else
  echo "install-deps: all packages present"
fi
