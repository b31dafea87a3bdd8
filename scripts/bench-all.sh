#!/usr/bin/env bash
# Runs every benchmark at the issues' sizes, one after another, saves each one's
# --json under $BENCH_OUT (default build/bench-results/TIMESTAMP), prints its
# ratios, and ends with one summary table of every row against its ceiling
# (scripts/bench_summary.py). Run it on a quiet machine: nothing else should be
# building or testing.
#   scripts/bench-all.sh [SIZE] [REPS]      (default 2GiB, 5; quick: 256MiB 3)
# Needs a build (scripts/build.sh). The torch peer rows need python3-torch
# (scripts/install-deps.sh --peers); they are skipped when torch is missing.
# Each bench removes its temporary files; set TMPDIR to put them elsewhere.
set -euo pipefail
cd "$(dirname "$0")/.."
size=${1:-2GiB}
reps=${2:-5}
cli=${MEGACKPT_BUILD_DIR:-build}/tools/megackpt
[ -x "$cli" ] || { echo "bench-all: $cli not found; run scripts/build.sh first" >&2; exit 2; }
mpi_flags=(--oversubscribe --bind-to none --mca pml ob1 --mca btl self,vader
           --mca btl_vader_single_copy_mechanism none --mca oob_tcp_if_include lo)
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1

step() { echo; echo "=== $* ($(date -u +%H:%M:%S), load $(cut -d' ' -f1-3 /proc/loadavg))"; }

# Free page reporting makes page-cache writes bimodal (docs/benchmarks.md).
for f in /sys/bus/virtio/drivers/virtio_balloon/virtio*/features; do
  [ -r "$f" ] || continue
  if [ "$(cut -c6 "$f")" = 1 ]; then
    echo "note: virtio_balloon free page reporting is on (docs/benchmarks.md): read min/max too"
  fi
done
# Every bench writes its --json to $out; the summary at the end is built from them.
out=${BENCH_OUT:-${MEGACKPT_BUILD_DIR:-build}/bench-results/$(date -u +%Y%m%dT%H%M%S)}
mkdir -p "$out"
echo "JSON results: $out"
# run NAME CMD...: runs one bench with --json into $out/NAME.json, prints its ratios.
run() {
  local name=$1; shift
  "$@" --json > "$out/$name.json"
  python3 - "$out/$name.json" <<'PY'
import json, sys
t = open(sys.argv[1]).read(); j = json.loads(t[t.find("{"):t.rfind("}") + 1])
for k, v in sorted(j.items()):
    if isinstance(v, (int, float)) and (k.endswith("_vs_pagecache_write") or k.endswith("_vs_pagecache_read")
                                        or k.endswith("_vs_durable_write") or k.endswith("_vs_checksummed_write") or k.endswith("_ratio")
                                        or k.endswith("_vs_memcpy")):
        print(f"  {k:<44} {v:6.3f}{'  !! ceiling too low' if j.get(k + '_ceiling_too_low') else ''}")
PY
}
step "bench format --size $size"
run format "$cli" bench format --size "$size" --reps "$reps"
for w in 1 2; do
  step "bench dcp --world-size $w (threads)"
  run "dcp_w$w" "$cli" bench dcp --size "$size" --reps "$reps" --world-size "$w"
done
step "bench dcp, mpirun -np 2"
run dcp_mpi2 mpirun "${mpi_flags[@]}" -np 2 "$cli" bench dcp --backend mpi --size "$size" --reps "$reps"
for w in 1 2; do
  step "bench mega --world-size $w (threads)"
  run "mega_w$w" "$cli" bench mega --size "$size" --reps "$reps" --world-size "$w"
done
step "bench mega, mpirun -np 2"
run mega_mpi2 mpirun "${mpi_flags[@]}" -np 2 "$cli" bench mega --backend mpi --size "$size" --reps "$reps"
for b in dcp mega; do
  step "bench $b --world-size 1 --over-previous (every save over the previous one)"
  run "${b}_w1_over" "$cli" bench "$b" --size "$size" --reps "$reps" --world-size 1 --over-previous
done
step "bench reshard (save at 2, load at 2 and 3; fs and MEGA)"
run reshard "$cli" bench reshard --size "$size" --reps "$reps"
step "bench incremental --world-size 2"
run incremental_w2 "$cli" bench incremental --size "$size" --reps "$reps" --world-size 2
if /usr/bin/python3 -c 'import torch' 2>/dev/null; then
  for w in 1 2; do
    step "torch peer --world-size $w"
    /usr/bin/python3 bench/torch_peer.py --size "$size" --reps "$reps" --world-size "$w" --json > "$out/torch_w$w.json"
  done
else
  step "torch peer skipped: python3-torch is not installed (scripts/install-deps.sh --peers)"
fi
step "bench cas --size $size"
run cas "$cli" bench cas --size "$size" --reps "$reps"
step "bench hub --size $size"
run hub "$cli" bench hub --size "$size" --reps "$reps"
py=${PYTHON:-python3}
if "$py" -c 'import huggingface_hub, hf_xet' 2>/dev/null; then
  step "hub clients (hf_xet vs megackpt push/pull), 1GiB"
  PATH="$(dirname "$cli"):$PATH" "$py" bench/python/bench_hub_clients.py --size 1GiB --reps "$reps"
else
  step "hub clients skipped: $py cannot import huggingface_hub and hf_xet (pip install -r tests/python/requirements.txt)"
fi
step "summary: every row against its ceiling (ratio = ours / ceiling, medians; goals: issue 15)"
python3 scripts/bench_summary.py "$out"
