"""scripts/bench_summary.py: which rows it calls bimodal ("modes: ..."), from the
repetitions and ceiling rounds that `bench dcp` / `bench mega` --json keep
(`<row>_by_rep`, `<ceiling>_by_round`), and that a row whose repetitions are one
cloud gets no such flag. Known answers on hand-made values; the bench itself is
exercised by the C++ suite (DcpCli.BenchJsonHasEveryKey).
"""
import json
import os
import subprocess
import sys

SCRIPTS = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "scripts")
sys.path.insert(0, SCRIPTS)

from bench_summary import modes  # noqa: E402


def test_two_groups_far_apart_are_two_modes():
    assert modes([5.9, 4.0, 6.1, 4.1, 5.8]) == "2 low (4-4.1) / 3 high (5.8-6.1)"
    # Durable saves of session 56's mega mpi2 row had this shape: ratio 0.57-1.65.
    assert modes([1.6, 0.57, 1.65, 0.6, 1.5]) == "2 low (0.57-0.6) / 3 high (1.5-1.65)"


def test_one_repetition_apart_is_named():
    assert modes([5.8, 2.0, 6.0, 5.9, 6.1]) == "1 low (2) / 4 high (5.8-6.1)"
    assert modes([5.8, 5.9, 6.0, 9.5]) == "3 low (5.8-6) / 1 high (9.5)"


def test_one_cloud_is_not_two_modes():
    assert modes([4.0, 4.6, 5.2, 5.8, 6.1]) is None  # evenly spread: noisy, not bimodal
    assert modes([5.0] * 5) is None
    # A gap twice the spread inside each side, but under 15% of the median.
    assert modes([10.0, 10.1, 10.2, 11.0, 11.1]) is None


def test_too_few_values_say_nothing():
    assert modes([]) is None
    assert modes([1.0, 9.0, 9.1]) is None


def test_summary_flags_the_bimodal_row_and_its_ceiling(tmp_path):
    row = {
        "save_gbps": 2.0, "durable_write_gbps": 2.2,
        "save_gbps_by_rep": [2.0, 2.05, 1.98, 2.02, 2.01],  # one cloud
        "durable_write_gbps_by_round": [2.2, 2.2, 2.25, 1.1, 1.15],  # two modes
        "save_nosync_gbps": 5.0, "pagecache_write_gbps": 7.0,
        "save_nosync_gbps_by_rep": [4.0, 6.1, 4.1, 5.9, 6.0],
        "pagecache_write_gbps_by_round": [7.0, 7.1, 6.9, 7.05, 6.95],
        "load_gbps": 10.0, "pagecache_read_gbps": 12.0,
    }
    (tmp_path / "dcp_w1.json").write_text(json.dumps(row))
    out = subprocess.run([sys.executable, os.path.join(SCRIPTS, "bench_summary.py"), str(tmp_path)],
                         check=True, capture_output=True, text=True).stdout

    def line(row):
        return next(x for x in out.splitlines() if x.startswith("dcp_w1 ") and row in x)

    durable, nosync, load = line("save (durable)"), line("save --no-sync"), line("load (verified)")
    assert "ceiling modes (GB/s): 2 low (1.1-1.15) / 3 high (2.2-2.25)" in durable
    assert "modes: 2 low" not in durable.split("ceiling modes")[0]  # the save itself: one cloud
    assert "modes: 2 low (4-4.1) / 3 high (5.9-6.1)" in nosync
    assert "ceiling modes" not in nosync
    assert "modes" not in load  # no repetitions recorded: nothing said
