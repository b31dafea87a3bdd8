"""bench/python/bench_dcp.py --report: the tables of a --json file are the ones the
run printed, and a file with fewer rounds (a run stopped early) still gives its
tables. A real (small) run of two systems: megackpt's native API and safetensors.
"""
import json
import os
import subprocess
import sys

BENCH = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "bench", "python",
                     "bench_dcp.py")


def bench(*args, check=True):
    env = dict(os.environ, MEGACKPT_BENCH_NO_PRIME="1")  # speed: no priming writes
    return subprocess.run([sys.executable, BENCH, *args], capture_output=True, text=True,
                          env=env, check=check, timeout=600)


def tables(out):
    """The output from the first table on (a run prints its set-up before)."""
    return out[out.index("median [min, max]"):]


def test_report_reprints_a_runs_tables(tmp_path):
    results = str(tmp_path / "rounds.json")
    run = bench("--size", "32MiB", "--rounds", "2", "--worlds", "1", "--systems",
                "native,safetensors", "--dir", str(tmp_path), "--json", results)
    assert "round 2/2, world 1 done" in run.stdout
    report = bench("--report", results)
    assert report.stdout.startswith(f"{results}: 2 round(s)")
    assert tables(report.stdout) == tables(run.stdout)
    rows = {line.split()[0]: line.split() for line in tables(report.stdout).splitlines()
            if line.split()[:2] in (["native", "1"], ["safetensors", "1"])}
    assert set(rows) == {"native", "safetensors"}
    # The durable save column: median [min, max] of two rounds, in GB/s.
    with open(results) as f:
        data = json.load(f)
    durable = sorted(r["save_gbps"] for r in data["native/w1"])
    assert rows["native"][2:5] == [f"{(durable[0] + durable[1]) / 2:.2f}", f"[{durable[0]:.2f},",
                                   f"{durable[1]:.2f}]"]

    # A run stopped after its first round: the tables of that round alone.
    first = str(tmp_path / "first.json")
    with open(first, "w") as f:
        json.dump({k: v[:1] for k, v in data.items()}, f)
    report = bench("--report", first)
    assert report.stdout.startswith(f"{first}: 1 round(s)")
    native = next(line.split() for line in report.stdout.splitlines()
                  if line.split()[:2] == ["native", "1"])
    assert native[2] == f"{data['native/w1'][0]['save_gbps']:.2f}"
    assert f"{data['native/w1'][0]['save_nosync_gbps']:.2f}" == native[3]


def test_report_refuses_a_file_that_is_not_a_bench_json(tmp_path):
    path = tmp_path / "other.json"
    path.write_text(json.dumps({"format": "not rounds"}))
    bad = bench("--report", str(path), check=False)
    assert bad.returncode != 0
    assert str(path) in bad.stderr and "'format'" in bad.stderr
    missing = bench("--report", str(tmp_path / "missing.json"), check=False)
    assert missing.returncode != 0 and "missing.json" in missing.stderr
