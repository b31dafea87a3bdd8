#!/usr/bin/env bash
# The main job, from a fresh machine: install dependencies (Debian archive), build,
# then save a sharded synthetic checkpoint from 2 ranks and reload it resharded
# onto 3 ranks, verifying every byte, on the embedded default storage.
#   scripts/demo.sh [extra `megackpt demo` flags...]
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/install-deps.sh
bash scripts/build.sh
out=$(mktemp -d "${TMPDIR:-/tmp}/megackpt-demo-XXXXXX")
trap 'rm -rf "$out"' EXIT
echo "== megackpt demo: filesystem storage, save at world size 2, load at world size 3"
./build/tools/megackpt demo --out "$out/fs" --storage fs --world-size 2 --load-world-size 3 "$@"
if ./build/tools/megackpt demo --help 2>/dev/null | grep -q -- "--storage"; then
  echo "== megackpt demo: MEGA storage (.mega shards + model.mega.index.json)"
  ./build/tools/megackpt demo --out "$out/mega" --storage mega --world-size 2 --load-world-size 3 "$@"
fi
