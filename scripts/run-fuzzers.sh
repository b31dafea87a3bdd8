#!/usr/bin/env bash
# Builds every fuzz/<name>_fuzz.cc as a libFuzzer binary with clang (ASan + UBSan)
# in build-fuzz/ and runs each for SECONDS (default 20) from its seed corpus.
# Exits non-zero when a fuzzer finds a crash, leak or sanitizer error.
#   scripts/run-fuzzers.sh [SECONDS]
set -euo pipefail
cd "$(dirname "$0")/.."
secs=${1:-20}
build_dir=build-fuzz
CC=clang CXX=clang++ cmake -S . -B "$build_dir" -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo \
  -DMEGACKPT_BUILD_FUZZERS=ON -DMEGACKPT_BUILD_TESTS=OFF -DMEGACKPT_BUILD_SERVER=OFF >/dev/null
targets=$(cd fuzz && ls *_fuzz.cc 2>/dev/null | sed 's/\.cc$//')
[[ -n "$targets" ]] || { echo "run-fuzzers: no fuzz targets"; exit 0; }
cmake --build "$build_dir" -j "$(nproc)" --target $targets
failed=0
for t in $targets; do
  corpus=$(mktemp -d)
  [[ -d fuzz/corpus/$t ]] && cp -r fuzz/corpus/$t/. "$corpus"/
  echo "== fuzz $t for ${secs}s"
  if ! "$build_dir/fuzz/$t" -max_total_time="$secs" -rss_limit_mb=4096 -max_len=65536 \
       -print_final_stats=1 "$corpus" > "$build_dir/$t.log" 2>&1; then
    echo "FUZZ FAILURE in $t:"; tail -60 "$build_dir/$t.log"; failed=1
  else
    grep -E "stat::number_of_executed_units|Done" "$build_dir/$t.log" | tail -2
  fi
  rm -rf "$corpus"
done
exit $failed
