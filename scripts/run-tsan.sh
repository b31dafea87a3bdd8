#!/usr/bin/env bash
# Builds the layer unit tests with ThreadSanitizer (build-tsan/) and runs them;
# exits non-zero on a test failure or any ThreadSanitizer report. Not part of
# .ci/run (it takes ~10 minutes on 2 cores): run it after changing code that
# threads share (thread pools, readers/planners, the CAS committer, process groups).
#   scripts/run-tsan.sh [gtest binary names...]   (default: core_test dcp_test cas_test dist_test)
set -euo pipefail
cd "$(dirname "$0")/.."
build_dir=${MEGACKPT_TSAN_BUILD_DIR:-build-tsan}
targets=("$@")
[ ${#targets[@]} -gt 0 ] || targets=(core_test dcp_test cas_test dist_test)
export CCACHE_BASEDIR="$PWD" CCACHE_NOHASHDIR=1
cmake -S . -B "$build_dir" -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo -DMEGACKPT_TSAN=ON \
  -DMEGACKPT_BUILD_TESTS=ON >/dev/null
ninja -C "$build_dir" -j "${MEGACKPT_JOBS:-$(nproc)}" "${targets[@]}"
status=0
for t in "${targets[@]}"; do
  bin=$(find "$build_dir/src" "$build_dir/tests" -name "$t" -type f -perm -u+x 2>/dev/null | head -1)
  [ -n "$bin" ] || { echo "run-tsan: $t not built" >&2; exit 2; }
  log="$build_dir/$t.tsan.log"
  echo "== $t (log: $log)"
  if ! TSAN_OPTIONS="halt_on_error=0 ${TSAN_OPTIONS:-}" "$bin" >"$log" 2>&1; then
    echo "run-tsan: $t failed" >&2; status=1
  fi
  reports=$(grep -c "WARNING: ThreadSanitizer" "$log" || true)
  tail -1 "$log"
  if [ "$reports" != 0 ]; then echo "run-tsan: $t: $reports ThreadSanitizer reports" >&2; status=1; fi
done
exit $status
