#!/usr/bin/env bash
# The Python test suite from a fresh venv: `pip install .` (scikit-build-core runs
# the project's CMake: the extension plus the megackpt / megahub tools), the test
# requirements (tests/python/requirements.txt), then pytest. Exits non-zero on any
# failure. Run by scripts/test.sh; on its own: bash scripts/test-python.sh
#   PYTHON=python3.11   interpreter to test (default python3)
#   MEGACKPT_VENV=DIR   venv folder (default build/venv-test; recreated each run)
set -euo pipefail
cd "$(dirname "$0")/.."
py=${PYTHON:-python3}
venv=${MEGACKPT_VENV:-build/venv-test}
rm -rf "$venv"
"$py" -m venv "$venv"
# ccache (when installed) shares objects with the CMake build of scripts/build.sh.
export CCACHE_BASEDIR="$PWD" CCACHE_NOHASHDIR=1
export CMAKE_BUILD_PARALLEL_LEVEL=${MEGACKPT_JOBS:-$(nproc)}
"$venv/bin/python" -m pip install -q --upgrade pip >/dev/null
"$venv/bin/python" -m pip install -q -r tests/python/requirements.txt
"$venv/bin/python" -m pip install -q .
"$venv/bin/python" -c "import megackpt; print('megackpt', megackpt.__version__, 'installed')"
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
"$venv/bin/python" -m pytest tests/python -q -p no:cacheprovider -W ignore::UserWarning
