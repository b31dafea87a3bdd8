#!/usr/bin/env bash
# The whole test suite, from a fresh machine: install dependencies (Debian archive),
# build with tests, run every test with ctest (unit, integration, conformance, mpirun,
# live-server and fuzz-replay tests), then the Python suite (a fresh venv,
# `pip install .`, pytest: scripts/test-python.sh), then the unit tests of the
# parsers, readers and writers again under ASan + UBSan (scripts/run-asan.sh,
# build-asan/), then run each libFuzzer target for a bounded time in a clang
# build. Exits non-zero on any failure.
#   scripts/test.sh            everything
#   FUZZ_SECONDS=0 scripts/test.sh   skip the libFuzzer runs
#   MEGACKPT_PYTHON_TESTS=0 scripts/test.sh   skip the Python suite
#   MEGACKPT_ASAN_TESTS=0 scripts/test.sh   skip the sanitizer build and run
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/install-deps.sh
bash scripts/build.sh -DMEGACKPT_BUILD_TESTS=ON
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
log=build/ctest-summary.log
ctest --test-dir build --output-on-failure -j "${MEGACKPT_TEST_JOBS:-2}" --timeout 900 | tee "$log"
if [[ "${MEGACKPT_PYTHON_TESTS:-1}" != "0" ]]; then
  bash scripts/test-python.sh
fi
if [[ "${MEGACKPT_ASAN_TESTS:-1}" != "0" ]]; then
  bash scripts/run-asan.sh
fi
if [[ "${FUZZ_SECONDS:-20}" != "0" ]]; then
  bash scripts/run-fuzzers.sh "${FUZZ_SECONDS:-20}"
fi
# Repeat ctest's verdict as the closing line (the fuzz output came after it).
# ctest 3 prints "N% tests passed, M tests failed out of T", ctest 4 drops the
# failed count when it is 0; a failing ctest already stopped the script above.
grep -E "[0-9]+% tests passed" "$log" | tail -1 || true
