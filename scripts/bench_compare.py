#!/usr/bin/env python3
"""Before/after table: the same benchmarks through two builds of the CLI, interleaved.

    python3 scripts/bench_compare.py OLD_CLI NEW_CLI [--size 2GiB] [--reps 3] [--rounds 2]
                                     [--only dcp_w1,mega_w2,...] [--json]

OLD_CLI and NEW_CLI are two `megackpt` binaries (e.g. a worktree of the
revision before a change, built with `ninja megackpt_cli`, and build/tools/megackpt).
For every bench below, each round runs OLD then NEW (the next round NEW then OLD,
so neither side always runs first on a warmer or colder machine), each with
`--size SIZE --reps REPS --json`:

    dcp_w1, dcp_w2     bench dcp --world-size 1|2 (threads): fs storage
    mega_w1, mega_w2   bench mega --world-size 1|2: MEGA storage
    hub                bench hub: mega:// save/load, embedded and megahub on loopback

Absolute speeds are compared (GB/s, or seconds where lower is better), not
ratios to ceilings: the two builds may measure their ceilings differently. Per
row it prints OLD and NEW as median [min, max] of the per-run medians over the
rounds, and NEW/OLD of the medians (for seconds, OLD/NEW: above 1 is always
better). A row whose NEW/OLD is below 0.95 is flagged `regressed > 5%`.
A key only one build reports (e.g. `load_unverified_gbps`, added after the old
build) is printed for that side alone. Run on a quiet machine: the two builds
take turns, but a build or test running beside them moves both.

Builds from before 2026-12-04 do not prime fresh writes (bench/bench_util.h,
PrimeFreeMemory), which changes the saves on a VM with free page reporting far
more than most code changes; the JSON says `fresh_writes_primed` (missing:
not primed). When the two sides differ the script says so on stderr: run it
with MEGACKPT_BENCH_NO_PRIME=1 in the environment to compare like with like.
"""
import argparse
import json
import statistics
import subprocess
import sys
import time

from bench_summary import json_object  # scripts/ is this script's sys.path[0]

BENCHES = {
    "dcp_w1": ["bench", "dcp", "--world-size", "1"],
    "dcp_w2": ["bench", "dcp", "--world-size", "2"],
    "mega_w1": ["bench", "mega", "--world-size", "1"],
    "mega_w2": ["bench", "mega", "--world-size", "2"],
    "hub": ["bench", "hub"],
}
# (json key, row label, lower is better)
SAVE_LOAD_KEYS = [
    ("save_gbps", "save (durable), GB/s", False),
    ("save_nosync_gbps", "save --no-sync, GB/s", False),
    ("load_gbps", "load (default), GB/s", False),
    ("load_unverified_gbps", "load (unverified), GB/s", False),
    ("async_blocked_seconds", "async save, caller blocked, s", True),
]


def run_json(cmd):
    j = json_object(subprocess.run(cmd, check=True, capture_output=True, text=True).stdout)
    if j is None:
        raise RuntimeError(f"no JSON object in the output of {' '.join(cmd)}")
    return j


def rows_of(name, j):
    """{label: (value, lower_is_better)} of one bench run."""
    if name == "hub":
        return {r["name"] + ", GB/s": (r["median_gbps"], False)
                for r in j.get("rows", []) if "(limit)" not in r["name"]}
    return {label: (j[key], lower) for key, label, lower in SAVE_LOAD_KEYS if key in j}


def spread(values):
    return (statistics.median(values), min(values), max(values)) if values else None


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("old_cli")
    ap.add_argument("new_cli")
    ap.add_argument("--size", default="2GiB")
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--only", default=",".join(BENCHES), help="comma-separated subset of " + ",".join(BENCHES))
    ap.add_argument("--json", action="store_true", help="print one JSON object instead of the table")
    a = ap.parse_args()
    names = [n for n in a.only.split(",") if n]
    unknown = [n for n in names if n not in BENCHES]
    if unknown:
        ap.error(f"unknown bench {unknown[0]!r}; choose from {', '.join(BENCHES)}")
    clis = {"old": a.old_cli, "new": a.new_cli}
    # samples[bench][label][side] = per-run medians; lower[bench][label] = lower is better
    samples, lower = {}, {}
    primed = {"old": set(), "new": set()}  # fresh_writes_primed values seen per side
    for name in names:
        samples[name], lower[name] = {}, {}
        for rnd in range(a.rounds):
            order = ("old", "new") if rnd % 2 == 0 else ("new", "old")
            for side in order:
                cmd = [clis[side], *BENCHES[name], "--size", a.size, "--reps", str(a.reps), "--json"]
                print(f"[{time.strftime('%H:%M:%S')}] {name} round {rnd + 1}/{a.rounds}: {side}", file=sys.stderr,
                      flush=True)
                j = run_json(cmd)
                if name != "hub":
                    primed[side].add(bool(j.get("fresh_writes_primed", False)))
                for label, (value, low) in rows_of(name, j).items():
                    samples[name].setdefault(label, {"old": [], "new": []})[side].append(value)
                    lower[name][label] = low
    if primed["old"] and primed["new"] and primed["old"] != primed["new"]:
        print("bench_compare: the two builds prepare fresh writes differently (fresh_writes_primed: "
              f"old {sorted(primed['old'])}, new {sorted(primed['new'])}); set MEGACKPT_BENCH_NO_PRIME=1 "
              "to compare like with like", file=sys.stderr)
    result = []
    for name in names:
        for label, sides in samples[name].items():
            old, new = spread(sides["old"]), spread(sides["new"])
            ratio = None
            if old and new and old[0] > 0 and new[0] > 0:
                ratio = old[0] / new[0] if lower[name][label] else new[0] / old[0]
            result.append({"bench": name, "row": label, "old": old, "new": new, "new_vs_old": ratio,
                           "regressed": ratio is not None and ratio < 0.95})
    if a.json:
        print(json.dumps({"size": a.size, "reps": a.reps, "rounds": a.rounds, "old_cli": a.old_cli,
                          "new_cli": a.new_cli, "rows": result}, indent=1))
        return 0
    fmt = lambda t: f"{t[0]:7.3f} [{t[1]:6.3f},{t[2]:6.3f}]" if t else "-"  # noqa: E731
    head = f"{'bench':<8} {'row':<40} {'old median [min, max]':>24} {'new median [min, max]':>24} {'new/old':>8}  flag"
    print(head)
    print("-" * len(head))
    for r in result:
        ratio = f"{r['new_vs_old']:8.2f}" if r["new_vs_old"] is not None else "       -"
        print(f"{r['bench']:<8} {r['row']:<40} {fmt(r['old']):>24} {fmt(r['new']):>24} {ratio}  "
              f"{'regressed > 5%' if r['regressed'] else ''}")
    print(f"({a.rounds} rounds x {a.reps} reps, {a.size}; values are the per-run medians; "
          "new/old above 1 is better, seconds inverted)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
