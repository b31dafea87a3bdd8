#!/usr/bin/env bash
# Configures and builds megackpt (Release) into build/ (or $MEGACKPT_BUILD_DIR).
#   scripts/build.sh [extra cmake args...]
set -euo pipefail
cd "$(dirname "$0")/.."
build_dir=${MEGACKPT_BUILD_DIR:-build}
# ccache (when installed) shares compiled objects between checkouts in different folders.
export CCACHE_BASEDIR="$PWD" CCACHE_NOHASHDIR=1
jobs=${MEGACKPT_JOBS:-$(nproc)}
cmake -S . -B "$build_dir" -G Ninja -DCMAKE_BUILD_TYPE=Release "$@"
cmake --build "$build_dir" -j "$jobs"
