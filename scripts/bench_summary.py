#!/usr/bin/env python3
"""One summary table of every benchmark row against its ceiling.

    python3 scripts/bench_summary.py DIR

reads the `--json` outputs scripts/bench-all.sh saved in DIR (format.json,
dcp_w1.json, dcp_w2.json, dcp_mpi2.json, mega_w1.json, mega_w2.json, mega_mpi2.json,
dcp_w1_over.json, mega_w1_over.json, dcp_w2_over.json and mega_w2_over.json
(--over-previous),
reshard.json, torch_w1.json, torch_w2.json, incremental_w2.json, cas.json,
hub.json; missing
files are skipped) and prints, per row: ours (median [min, max]), the ceiling it
is divided by (and the ceiling's winning parallelism), the ratio of the medians,
each save's commit in ms after the last rank's data (no ceiling),
the per-repetition ratios (each repetition against the ceiling round run right
before it; min/median/max, where the bench records them), the goal of issue 15
where there is one, and a flag: "CEILING TOO LOW" when a speed ratio is
above 1.05 (the ceiling is not a limit), "below goal" when a goal is missed,
and "modes: ..." when a row's repetitions (`<row>_by_rep`) or its ceiling's
rounds (`<ceiling>_by_round`) fall into two groups apart (see modes()).
The reshard rows divide verified loads by the unverified ones (no ceiling).
The "over checksummed writers (ref)" rows divide the no-sync saves by plain
writers that compute the same block CRC-32s (bench_util.h kChecksummedWrite):
what the framework costs beyond its checksums; a reference, with no goal.
"""
import json
import os
import statistics
import sys

SLACK = 1.05
# modes(): the widest gap between sorted repetitions must be at least this share
# of their median, and at least MODE_SEPARATION times the spread inside either group.
MODE_GAP = 0.15
MODE_SEPARATION = 2.0


def modes(values):
    """'2 low (4-4.1) / 3 high (5.8-6.1)' when `values` (at least 4) split
    into two groups: the widest gap between neighbours in sorted order is at
    least MODE_GAP of the median and MODE_SEPARATION times the range inside
    either side. A single repetition apart shows as '1 low (...)'. None for a
    row whose spread is one cloud (noisy or steady), or too few values to say."""
    v = sorted(values)
    if len(v) < 4:
        return None
    median = statistics.median(v)
    cut = max(range(len(v) - 1), key=lambda i: v[i + 1] - v[i])
    gap = v[cut + 1] - v[cut]
    low, high = v[:cut + 1], v[cut + 1:]
    inside = max(low[-1] - low[0], high[-1] - high[0])
    if median <= 0 or gap < MODE_GAP * median or gap < MODE_SEPARATION * inside:
        return None

    def group(g, word):
        span = f"{g[0]:.3g}" if g[0] == g[-1] else f"{g[0]:.3g}-{g[-1]:.3g}"
        return f"{len(g)} {word} ({span})"

    return f"{group(low, 'low')} / {group(high, 'high')}"


def json_object(text):
    """The one JSON object in a bench's --json output, or None. mpirun may
    interleave other ranks' lines around it; the object itself is one block."""
    start, end = text.find("{"), text.rfind("}")
    if start < 0:
        return None
    return json.loads(text[start:end + 1])


def load(d, name):
    p = os.path.join(d, name)
    if not os.path.exists(p):
        return None
    with open(p) as f:
        return json_object(f.read())


class Table:
    def __init__(self):
        self.rows = []

    def add(self, bench, row, ours, ceiling=None, par=None, goal=None, lower_better=False, unit="GB/s",
            is_ceiling=True, note="", paired=None):
        """ours/ceiling: (median, min, max) or None; is_ceiling=False for a budget (no too-low check);
        note: printed in the flag column; paired: per-repetition ratios (median, min, max) or None."""
        self.rows.append((bench, row, ours, ceiling, par, goal, lower_better, unit, is_ceiling, note, paired))

    def print(self):
        head = f"{'bench':<14} {'row':<34} {'ours median [min, max]':>27} {'ceiling (thr, io)':>24} {'ratio':>6} {'per rep [min med max]':>21} {'goal':>7}  flag"
        print(head)
        print("-" * len(head))
        for bench, row, ours, ceil, par, goal, lower, unit, is_ceiling, note, paired in self.rows:
            o = f"{ours[0]:8.3f} [{ours[1]:7.3f},{ours[2]:7.3f}]" if ours else "-"
            c = "-"
            ratio = None
            if ceil and ceil[0] > 0 and ours:
                c = f"{ceil[0]:8.3f}" + (f" ({par})" if par else "")
                ratio = ours[0] / ceil[0]
            r = f"{ratio:6.2f}" if ratio is not None else "     -"
            pr = f"[{paired[1]:.2f} {paired[0]:.2f} {paired[2]:.2f}]" if paired else "-"
            g = "-"
            flag = ""
            if goal is not None:
                g = ("<= " if lower else ">= ") + f"{goal:g}"
            if ratio is not None and is_ceiling:
                if not lower and ratio > SLACK:
                    flag = "CEILING TOO LOW"
                if lower and ratio < 1 / SLACK:
                    flag = "CEILING TOO LOW"
            if ratio is not None:
                if goal is not None and ((lower and ratio > goal) or (not lower and ratio < goal)):
                    flag = (flag + "; " if flag else "") + "below goal"
            if note:
                flag = (flag + "; " if flag else "") + note
            print(f"{bench:<14} {row:<34} {o:>27} {c:>24} {r} {pr:>21} {g:>7}  {flag}  ({unit})")


def triple(j, key):
    if j is None or key not in j:
        return None
    return (j[key], j.get(key + "_min", j[key]), j.get(key + "_max", j[key]))


IO_KEYS = ("pread_bytes", "pwrite_bytes", "writeback_bytes")


def config_text(p, io):
    """'2 thr' or '2 thr, 4M': a ceiling's winning parallelism and I/O size."""
    if p is None:
        return None
    return f"{p} thr" + (f", {io >> 20}M" if io else "")


def par(j, stem):
    """The winning configuration of ceiling `stem` (bench_util.h PutCeiling)."""
    if not j or stem + "_parallelism" not in j:
        return None
    io = next((j[stem + "_" + k] for k in IO_KEYS if stem + "_" + k in j), None)
    text = config_text(j[stem + "_parallelism"], io)
    return text + ", O_DIRECT" if j.get(stem + "_direct") else text


def commit_row(t, name, j, key, label):
    """The commit of a save row, in ms after the last rank's data (no ceiling)."""
    s = triple(j, key)
    if s:
        t.add(name, label, tuple(x * 1e3 for x in s), unit="ms", is_ceiling=False)


def modes_note(j, row_key, ceiling_key=None):
    """The modes() of a row's repetitions (row_key None: not shown) and of its
    ceiling's rounds, as a flag."""
    notes = []
    m = modes(j.get(row_key + "_by_rep", [])) if row_key else None
    if m:
        notes.append("modes: " + m)
    if ceiling_key:
        m = modes(j.get(ceiling_key + "_by_round", []))
        if m:
            notes.append("ceiling modes (GB/s): " + m)
    return "; ".join(notes)


def save_load_rows(t, name, j):
    t.add(name, "save (durable)", triple(j, "save_gbps"), triple(j, "durable_write_gbps"),
          par(j, "durable_write"), 0.9, paired=triple(j, "save_vs_durable_write_paired"),
          note=modes_note(j, "save_gbps", "durable_write_gbps"))
    commit_row(t, name, j, "save_commit_seconds", "  its commit")
    t.add(name, "save --no-sync", triple(j, "save_nosync_gbps"), triple(j, "pagecache_write_gbps"),
          par(j, "pagecache_write"), 0.85, paired=triple(j, "save_nosync_vs_pagecache_write_paired"),
          note=modes_note(j, "save_nosync_gbps", "pagecache_write_gbps"))
    commit_row(t, name, j, "save_nosync_commit_seconds", "  its commit")
    if "checksummed_write_gbps" in j:
        # A reference, not a goal: plain writers computing the same block CRCs.
        t.add(name, "  over checksummed writers (ref)", triple(j, "save_nosync_gbps"),
              triple(j, "checksummed_write_gbps"), par(j, "checksummed_write"),
              paired=triple(j, "save_nosync_vs_checksummed_write_paired"),
              note=modes_note(j, None, "checksummed_write_gbps"))
    t.add(name, "load (verified)", triple(j, "load_gbps"), triple(j, "pagecache_read_gbps"),
          par(j, "pagecache_read"), 0.7, paired=triple(j, "load_vs_pagecache_read_paired"),
          note=modes_note(j, "load_gbps", "pagecache_read_gbps"))
    if "load_unverified_gbps" in j:
        t.add(name, "load (unverified)", triple(j, "load_unverified_gbps"),
              triple(j, "pagecache_read_gbps"), par(j, "pagecache_read"), 0.85,
              paired=triple(j, "load_unverified_vs_pagecache_read_paired"),
              note=modes_note(j, "load_unverified_gbps"))
    if "peak_extra_rss_bytes" in j:
        mib = j["peak_extra_rss_bytes"] / 2**20
        # Below 1 MiB the peak never rose above the RSS before the save: not a measured zero.
        t.add(name, "peak extra RSS, MiB (<= 256)", (mib, mib, mib), (256, 256, 256), None, 1.0,
              lower_better=True, unit="MiB", is_ceiling=False,
              note="< 1 MiB (not above the baseline)" if mib < 1 else "")


def main(argv):
    if len(argv) != 2:
        print(__doc__, file=sys.stderr)
        return 2
    d = argv[1]
    t = Table()
    f = load(d, "format.json")
    if f:
        for k in sorted(f):
            if not k.endswith("_ratio"):
                continue
            stem = k[: -len("_ratio")]
            limit = "pagecache_write" if "write" in stem else "pagecache_read"
            t.add("format", stem, triple(f, stem + "_gbps"), triple(f, limit + "_gbps"), par(f, limit))
    # *_over: the same bench with --over-previous (every save over the previous one).
    for name in ("dcp_w1", "dcp_w2", "dcp_mpi2", "dcp_w1_over", "dcp_w2_over"):
        j = load(d, name + ".json")
        if j:
            save_load_rows(t, name, j)
    for name in ("mega_w1", "mega_w2", "mega_mpi2", "mega_w1_over", "mega_w2_over"):
        j = load(d, name + ".json")
        if j:
            save_load_rows(t, name, j)
            t.add(name, "async save: caller blocked, s", triple(j, "async_blocked_seconds"),
                  (j["memcpy_state_seconds"],) * 3, par(j, "memcpy"), 1.5, lower_better=True, unit="s",
                  paired=triple(j, "async_blocked_vs_memcpy_paired"),
                  note=modes_note(j, "async_blocked_seconds", "memcpy_gbps"))
    for w in (1, 2):
        j = load(d, f"torch_w{w}.json")
        ref = load(d, f"dcp_w{w}.json")
        if j and ref:
            t.add(f"torch_w{w}", "torch DCP save (sync_files)", triple(j, "torch_dcp_save_gbps"),
                  triple(ref, "durable_write_gbps"), par(ref, "durable_write"))
            t.add(f"torch_w{w}", "torch DCP save (no sync)", triple(j, "torch_dcp_save_nosync_gbps"),
                  triple(ref, "pagecache_write_gbps"), par(ref, "pagecache_write"))
            t.add(f"torch_w{w}", "torch DCP load", triple(j, "torch_dcp_load_gbps"),
                  triple(ref, "pagecache_read_gbps"), par(ref, "pagecache_read"))
    j = load(d, "reshard.json")
    if j:
        # No ceiling of its own: verified vs unverified, and bytes read / state.
        for st in ("fs", "mega"):
            for kind in ("load", "reshard_load"):
                k = f"{st}_{kind}_gbps"
                if k in j:
                    t.add("reshard", f"{st} {kind.replace('_', ' ')} (verified)", triple(j, k),
                          triple(j, f"{st}_{kind}_unverified_gbps"), None, is_ceiling=False)
    j = load(d, "incremental_w2.json")
    if j:
        full = j["full_save_gbps"]
        t.add("incremental_w2", "full save (durable, hashed)", (full, full, full),
              triple(j, "durable_write_gbps"), par(j, "durable_write"))
    j = load(d, "cas.json")
    if j:
        for key, _ in sorted(j.get("ratios", {}).items()):
            ours, ref = key.split("/")
            det = j["details"]
            if ours in det and ref in det:
                t.add("cas", ours, (det[ours]["median"], det[ours]["min"], det[ours]["max"]),
                      (det[ref]["median"], det[ref]["min"], det[ref]["max"]), "1 thr")
    j = load(d, "hub.json")
    if j:
        for r in j.get("rows", []):
            ratio = r.get("ratio_to_limit", 0)
            ours = (r["median_gbps"], r["min_gbps"], r["max_gbps"])
            ceil = (r["median_gbps"] / ratio,) * 3 if ratio > 0 else None
            io = next((r["limit_" + k] for k in IO_KEYS if "limit_" + k in r), None)
            t.add("hub", r["name"][:34], ours, ceil, config_text(r.get("limit_parallelism", 1), io) if ceil else None)
    t.print()
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
