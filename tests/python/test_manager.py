"""megackpt.CheckpointManager: steps, latest, retention, objects, async saves,
damaged steps passed over, resharded loads."""
import os
import threading

import numpy as np
import pytest

import megackpt
from conftest import assert_saved_around_the_page_cache


def state(step):
    rng = np.random.default_rng(step)
    return {
        "model": {"w": rng.standard_normal((64, 32)).astype(np.float32),
                  "b": np.full((32,), step, np.int64)},
        "optim": [{"lr": 0.1 * step, "name": f"adam-{step}"}],
        "step": step,
    }


def assert_state(loaded, step):
    want = state(step)
    np.testing.assert_array_equal(loaded["model"]["w"], want["model"]["w"])
    np.testing.assert_array_equal(loaded["model"]["b"], want["model"]["b"])
    assert loaded["optim"][0]["lr"] == want["optim"][0]["lr"]
    assert loaded["optim"][0]["name"] == want["optim"][0]["name"]
    assert loaded["step"] == step


def test_steps_latest_load_and_retention(tmp_path):
    root = str(tmp_path / "run")
    with megackpt.CheckpointManager(root, keep_last=2, keep_best=1, sync=False) as mgr:
        assert mgr.latest() is None
        losses = {1: 0.5, 2: 0.1, 3: 0.9, 4: 0.8, 5: 0.7}
        for step, loss in losses.items():
            mgr.save(step, state(step), metric=loss)
        assert mgr.all_steps() == [2, 4, 5]          # best (2) + last two
        assert mgr.latest() == 5
        assert os.path.isdir(os.path.join(root, "step-000000005"))
        assert mgr.step_path(5) == os.path.join(root, "step-000000005")
        steps = {s["step"]: s for s in mgr.steps()}
        assert steps[2]["metric"] == pytest.approx(0.1)
        assert steps[5]["complete"] and steps[5]["storage"] == "fs"
        assert_state(mgr.load(), 5)
        assert mgr.last_load == {"step": 5, "skipped": []}
        assert_state(mgr.load(step=2), 2)
        # In place, into the caller's arrays.
        mine = state(0)
        w = mine["model"]["w"]
        out = mgr.load(mine)
        assert out is mine and out["model"]["w"] is w
        assert_state(mine, 5)
        with pytest.raises(megackpt.AlreadyExistsError):
            mgr.save(5, state(6))
        mgr.save(5, state(6), overwrite=True)
        assert_state(mgr.load(step=5), 6)
        assert mgr.gc(keep_last=1) == [2, 4]
        assert mgr.all_steps() == [5]
        with pytest.raises(megackpt.NotFoundError):
            mgr.load(step=3)


def test_damaged_newest_step_is_passed_over_and_named(tmp_path):
    root = str(tmp_path / "run")
    mgr = megackpt.CheckpointManager(root, sync=False)
    for step in (1, 2):
        mgr.save(step, state(step))
    data = sorted(f for f in os.listdir(mgr.step_path(2)) if f.endswith(".distcp"))
    path = os.path.join(mgr.step_path(2), data[0])
    with open(path, "r+b") as f:
        f.seek(10)
        b = f.read(1)
        f.seek(10)
        f.write(bytes([b[0] ^ 0x10]))
    step, skipped = mgr.latest_valid()
    assert step == 1
    assert skipped[0][0] == 2 and data[0] in skipped[0][1]
    assert mgr.latest_valid(verify="structure")[0] == 2
    with pytest.raises(megackpt.DataLossError):
        mgr.verify_step(2)
    assert_state(mgr.load(), 1)
    assert mgr.last_load["step"] == 1
    assert mgr.last_load["skipped"][0][0] == 2
    with pytest.raises(megackpt.DataLossError):
        mgr.load(step=2)
    mgr.close()


def test_async_saves_one_at_a_time(tmp_path):
    root = str(tmp_path / "run")
    mgr = megackpt.CheckpointManager(root, keep_last=3, sync=False)
    handles = []
    for step in range(1, 6):
        s = state(step)
        h = mgr.save(step, s, async_=True)
        assert h.step == step
        h.wait_staged()
        s["model"]["w"][:] = -1  # allowed once staged
        handles.append(h)
    mgr.wait()
    for h in handles:
        assert h.done()
        h.result()
    assert mgr.all_steps() == [3, 4, 5]
    assert_state(mgr.load(), 5)

    failing = megackpt.CheckpointManager(str(tmp_path / "run2"), in_flight="fail", sync=False,
                                         staging_bytes=1 << 20)
    big = {"x": np.ones((4096, 1024), np.float32)}  # 16 MiB: staged in waves, takes a while
    h = failing.save(1, big, async_=True)
    try:
        failing.save(2, big)
        # The first one may already be done on a fast machine.
        assert h.done()
    except megackpt.FailedPreconditionError as e:
        assert "in flight" in str(e)
    h.result()
    failing.close()


def test_incomplete_step_is_ignored_then_removed(tmp_path):
    root = str(tmp_path / "run")
    mgr = megackpt.CheckpointManager(root, sync=False)
    mgr.save(1, state(1))
    mgr.save(2, state(2))
    os.remove(os.path.join(mgr.step_path(2), ".metadata"))  # as if cut short
    mgr.close()
    keep = megackpt.CheckpointManager(root, remove_incomplete=False)
    assert [s["complete"] for s in keep.steps()] == [True, False]
    assert keep.latest() == 1
    assert_state(keep.load(), 1)
    keep.close()
    mgr = megackpt.CheckpointManager(root)
    assert [s["step"] for s in mgr.steps()] == [1]
    mgr.close()


def test_sharded_save_loads_into_another_layout(tmp_path):
    # A sharded save from one process, loaded into another layout.
    root = str(tmp_path / "run")
    full = np.arange(8 * 6, dtype=np.float32).reshape(8, 6)
    mgr = megackpt.CheckpointManager(root, sync=False)
    mgr.save(7, {"w": megackpt.ShardedTensor((8, 6), "F32", [((0, 0), full[:4]), ((4, 0), full[4:])])})
    cols = np.zeros((8, 3), np.float32)
    mgr.load({"w": megackpt.ShardedTensor((8, 6), "F32", [((0, 3), cols)])})
    np.testing.assert_array_equal(cols, full[:, 3:])
    mgr.close()


@pytest.mark.parametrize("storage", ["fs", "mega"])
def test_direct_io_steps_skip_the_page_cache(tmp_path, storage):
    rng = np.random.default_rng(7)
    big = {1: rng.standard_normal((256, 1027)).astype(np.float32),
           2: rng.standard_normal((256, 1027)).astype(np.float32)}
    with megackpt.CheckpointManager(tmp_path / "run", storage=storage, direct_io=True) as mgr:
        mgr.save(1, {"w": big[1], "step": 1})
        mgr.save(2, {"w": big[2], "step": 2}, async_=True).wait()
        for step in (1, 2):
            assert_saved_around_the_page_cache(mgr.step_path(step))
        for step in (1, 2):
            out = mgr.load(step=step)
            np.testing.assert_array_equal(out["w"], big[step])
            assert out["step"] == step


def test_bad_arguments(tmp_path):
    with pytest.raises(megackpt.InvalidArgumentError):
        megackpt.CheckpointManager(str(tmp_path / "r"), best_mode="median")
    with pytest.raises(megackpt.InvalidArgumentError):
        megackpt.CheckpointManager(str(tmp_path / "r"), storage="zip")
    mgr = megackpt.CheckpointManager(str(tmp_path / "r"))
    with pytest.raises(megackpt.InvalidArgumentError):
        mgr.save(-1, state(1))
    with pytest.raises(megackpt.NotFoundError):
        mgr.load()
    mgr.close()


def _open_deleted_files_under(folder):
    """This process's open descriptors whose file was removed from `folder`."""
    found = []
    for fd in os.listdir("/proc/self/fd"):
        try:
            target = os.readlink(f"/proc/self/fd/{fd}")
        except OSError:
            continue
        if target.startswith(folder) and target.endswith(" (deleted)"):
            found.append(target)
    return found


def test_retired_steps_are_freed_by_finish_background_frees(tmp_path):
    # Steps of 32 MiB: each data file is over the 8 MiB from which a local file
    # system frees a removed file on its background thread (docs/dcp.md,
    # "Freeing garbage off the caller's path").
    root = str(tmp_path / "run")
    big = {"w": np.arange(8 << 20, dtype=np.float32)}
    with megackpt.CheckpointManager(root, keep_last=1, sync=False) as mgr:
        for step in (1, 2, 3):
            big["w"][0] = step
            mgr.save(step, big)
        assert mgr.all_steps() == [3]
        assert not os.path.exists(mgr.step_path(1))   # the names are gone at once
        megackpt.finish_background_frees()
        assert _open_deleted_files_under(root) == []  # and now the space too
        assert mgr.load()["w"][0] == 3
    # A save over the previous one in the same folder (its files are garbage).
    path = str(tmp_path / "one")
    for value in (1.0, 2.0):
        big["w"][0] = value
        megackpt.save(big, path, sync=False)
    megackpt.finish_background_frees()
    assert _open_deleted_files_under(path) == []
    assert megackpt.load(path)["w"][0] == 2.0
