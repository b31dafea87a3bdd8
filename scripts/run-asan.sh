#!/usr/bin/env bash
# Builds test binaries with AddressSanitizer + UndefinedBehaviorSanitizer
# (build-asan/, -DMEGACKPT_SANITIZE=ON) and runs them; exits non-zero on a test
# failure or any sanitizer report (heap/stack overflow, use after free, leak,
# undefined behaviour). Part of scripts/test.sh (so of .ci/run); on its own:
#   scripts/run-asan.sh [gtest binary names...]
# The default set is the parsers, readers and writers that take hostile input
# (formats, the MEGA and fs storage, the corruption sweeps) and the core they
# share. MEGACKPT_ASAN_BUILD_DIR overrides the build folder.
set -euo pipefail
cd "$(dirname "$0")/.."
build_dir=${MEGACKPT_ASAN_BUILD_DIR:-build-asan}
targets=("$@")
[ ${#targets[@]} -gt 0 ] ||
  targets=(core_test format_test fs_test dcp_test mega_storage_integrity_test checkpoint_integrity_test)
export CCACHE_BASEDIR="$PWD" CCACHE_NOHASHDIR=1
cmake -S . -B "$build_dir" -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo -DMEGACKPT_SANITIZE=ON \
  -DMEGACKPT_BUILD_TESTS=ON >/dev/null
ninja -C "$build_dir" -j "${MEGACKPT_JOBS:-$(nproc)}" "${targets[@]}"
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
export ASAN_OPTIONS="detect_leaks=1:abort_on_error=0:${ASAN_OPTIONS:-}"
export UBSAN_OPTIONS="print_stacktrace=1:halt_on_error=1:${UBSAN_OPTIONS:-}"
status=0
for t in "${targets[@]}"; do
  bin=$(find "$build_dir/src" "$build_dir/tests" -name "$t" -type f -perm -u+x 2>/dev/null | head -1)
  [ -n "$bin" ] || { echo "run-asan: $t not built" >&2; exit 2; }
  log="$build_dir/$t.asan.log"
  echo "== $t (log: $log)"
  if ! "$bin" >"$log" 2>&1; then
    echo "run-asan: $t failed" >&2
    grep -E "ERROR: (Address|Leak)Sanitizer|runtime error:|\[  FAILED  \]" "$log" | head -20 >&2 || true
    status=1
  fi
  reports=$(grep -cE "ERROR: (Address|Leak)Sanitizer|runtime error:" "$log" || true)
  tail -1 "$log"
  if [ "$reports" != 0 ]; then echo "run-asan: $t: $reports sanitizer reports" >&2; status=1; fi
done
exit $status
