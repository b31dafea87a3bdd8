"""The native API: megackpt.save / load / async_save / ShardedTensor / tools."""
import os
import pickle
import shutil
import subprocess
import sys

import numpy as np
import pytest

import megackpt

from conftest import assert_saved_around_the_page_cache, run_python, tool

NUMPY_DTYPES = [np.bool_, np.uint8, np.int8, np.int16, np.uint16, np.int32, np.uint32, np.int64,
                np.uint64, np.float16, np.float32, np.float64]


def sample(dtype, shape, seed):
    rng = np.random.default_rng(seed)
    if dtype == np.bool_:
        return rng.integers(0, 2, size=shape).astype(np.bool_)
    if np.issubdtype(dtype, np.integer):
        info = np.iinfo(dtype)
        return rng.integers(info.min, info.max, size=shape, dtype=dtype, endpoint=True)
    return rng.standard_normal(size=shape).astype(dtype)


@pytest.mark.parametrize("storage", ["mega", "fs"])
def test_every_numpy_dtype_round_trips(tmp_path, storage):
    state = {f"t{i}": sample(dt, (3, 5), i) for i, dt in enumerate(NUMPY_DTYPES)}
    state["scalar"] = np.array(3.5, dtype=np.float32)
    state["empty"] = np.zeros((0, 4), dtype=np.int32)
    state["strided"] = sample(np.float32, (6, 8), 99)[::2, 1::3]  # non-contiguous view
    megackpt.save(state, tmp_path / "c", storage=storage)
    out = megackpt.load(tmp_path / "c")
    assert set(out) == set(state)
    for k, v in state.items():
        assert out[k].dtype == v.dtype and out[k].shape == v.shape, k
        assert out[k].tobytes() == np.ascontiguousarray(v).tobytes(), k


@pytest.mark.parametrize("storage", ["mega", "fs"])
def test_direct_io_save_writes_the_bytes_of_a_buffered_one(tmp_path, storage):
    # Odd sizes and a strided view: partial 4 KiB blocks and sources off the
    # block grid (bounced) next to a large array.
    state = {"big": sample(np.float32, (1024, 1031), 1), "odd": sample(np.int16, (777,), 2),
             "strided": sample(np.float64, (300, 40), 3)[::3, ::2], "tiny": np.arange(3, dtype=np.uint8)}
    megackpt.save(state, tmp_path / "buffered", storage=storage)
    megackpt.save(state, tmp_path / "direct", storage=storage, direct_io=True)
    assert_saved_around_the_page_cache(tmp_path / "direct", tmp_path / "buffered")

    def data_files(name):  # in save order (fs names carry the save's id)
        return sorted(n for n in os.listdir(tmp_path / name) if n.endswith((".mega", ".distcp")))

    # A MEGA shard's header holds the save id (and its CRC): compare from its
    # first tensor on (payload and block tables); a load checks the headers.
    # fs data files hold no id: compare them whole.
    start = {}
    if storage == "mega":
        for t in megackpt.inspect(tmp_path / "buffered")["tensors"]:
            start[t["file"]] = min(start.get(t["file"], t["offset"]), t["offset"])
    buffered, direct = data_files("buffered"), data_files("direct")
    assert buffered and len(buffered) == len(direct)
    for a_name, d_name in zip(buffered, direct):
        a = (tmp_path / "buffered" / a_name).read_bytes()
        d = (tmp_path / "direct" / d_name).read_bytes()
        assert len(a) == len(d), a_name
        at = start.get(a_name, 0)
        assert a[at:] == d[at:], f"{d_name} differs from the buffered save's bytes after offset {at}"
    out = megackpt.load(tmp_path / "direct")
    for k, v in state.items():
        assert out[k].tobytes() == np.ascontiguousarray(v).tobytes(), k


def test_every_torch_dtype_round_trips_bf16_included(tmp_path):
    torch = pytest.importorskip("torch")
    dtypes = [torch.bool, torch.uint8, torch.int8, torch.int16, torch.int32, torch.int64,
              torch.float16, torch.bfloat16, torch.float32, torch.float64]
    g = torch.Generator().manual_seed(0)
    state = {}
    for i, dt in enumerate(dtypes):
        t = torch.randn(4, 3, generator=g) * 100
        state[str(dt)] = t.to(dt)
    state["param"] = torch.nn.Parameter(torch.randn(2, 2, generator=g))  # requires_grad
    megackpt.save(state, tmp_path / "c")
    out = megackpt.load(tmp_path / "c", tensor_type="torch")
    for k, v in state.items():
        assert out[k].dtype == v.dtype, k
        assert torch.equal(out[k], v.detach()), k
    # numpy results: bf16 comes back as its raw uint16 bits.
    raw = megackpt.load(tmp_path / "c")["torch.bfloat16"]
    assert raw.dtype == np.uint16
    assert raw.tobytes() == state["torch.bfloat16"].view(torch.int16).numpy().tobytes()
    # In place into torch tensors (bf16 too).
    dst = {k: torch.zeros_like(v.detach()) for k, v in state.items()}
    megackpt.load(tmp_path / "c", dst)
    for k, v in state.items():
        assert torch.equal(dst[k], v.detach()), k


def test_nested_state_bytes_and_objects(tmp_path):
    state = {
        "model": {"layer": [{"w": np.arange(6, dtype=np.float32)}, {"w": np.ones(2, np.int64)}]},
        "blob": b"\x00raw bytes\xff",
        "step": 1234,
        "config": {"lr": 0.1, "betas": (0.9, 0.99), "name": "adam", "none": None},
        "history": [1, 2, 3],
    }
    megackpt.save(state, tmp_path / "c")
    out = megackpt.load(tmp_path / "c")
    assert out["blob"] == state["blob"] and isinstance(out["blob"], bytes)
    assert out["step"] == 1234
    assert out["config"] == state["config"]
    assert isinstance(out["config"]["betas"], tuple)
    assert out["history"] == [1, 2, 3]
    np.testing.assert_array_equal(out["model"]["layer"][0]["w"], state["model"]["layer"][0]["w"])
    np.testing.assert_array_equal(out["model"]["layer"][1]["w"], state["model"]["layer"][1]["w"])
    # In place: arrays are filled, other leaves replaced, the same dict comes back.
    mine = {
        "model": {"layer": [{"w": np.zeros(6, np.float32)}, {"w": np.zeros(2, np.int64)}]},
        "blob": b"", "step": 0,
        "config": {"lr": None, "betas": None, "name": None, "none": 5},
        "history": None,
    }
    w0 = mine["model"]["layer"][0]["w"]
    got = megackpt.load(tmp_path / "c", mine)
    assert got is mine and got["model"]["layer"][0]["w"] is w0
    np.testing.assert_array_equal(w0, np.arange(6, dtype=np.float32))
    assert got["step"] == 1234 and got["config"]["betas"] == (0.9, 0.99) and got["history"] == [1, 2, 3]
    assert got["config"]["none"] is None


def test_sharded_tensors_reshard_on_load(tmp_path):
    full = sample(np.float32, (6, 8), 7)
    saved = megackpt.ShardedTensor((6, 8), "float32", [
        ((0, 0), full[:, :3].copy()), ((0, 3), full[:, 3:].copy())])  # column split
    megackpt.save({"w": saved, "extra": np.arange(3)}, tmp_path / "c")
    rows = [np.zeros((2, 8), np.float32) for _ in range(3)]
    dst = megackpt.ShardedTensor((6, 8), np.float32, [((2 * i, 0), r) for i, r in enumerate(rows)])
    megackpt.load(tmp_path / "c", {"w": dst}, allow_partial=True)
    np.testing.assert_array_equal(np.concatenate(rows), full)
    whole = megackpt.load(tmp_path / "c")["w"]  # without a state dict: one whole array
    np.testing.assert_array_equal(whole, full)
    info = megackpt.inspect(tmp_path / "c")
    assert info["format"] == "mega-index"
    assert "extra" in {t["name"] for t in info["tensors"]}  # chunks of "w" are not in weight_map


def test_async_save_staged_then_done(tmp_path):
    arr = sample(np.float32, (256, 1024), 3)
    expected = arr.copy()
    handle = megackpt.async_save({"a": arr, "o": {"k": 1}}, tmp_path / "c")
    assert handle.wait_staged(timeout=120)
    arr[:] = 0  # allowed once staged: the save keeps the staged copy
    handle.result(timeout=120)
    assert handle.done() and handle.staged()
    out = megackpt.load(tmp_path / "c")
    np.testing.assert_array_equal(out["a"], expected)
    assert out["o"] == {"k": 1}


def test_async_save_reports_errors(tmp_path):
    megackpt.save({"a": np.ones(2)}, tmp_path / "c")
    handle = megackpt.async_save({"a": np.ones(2)}, tmp_path / "c", overwrite=False)
    with pytest.raises(megackpt.AlreadyExistsError):
        handle.result(timeout=120)


def test_version_matches_cli():
    cli = subprocess.run([tool("megackpt"), "--version"], capture_output=True, text=True, check=True)
    assert cli.stdout.strip() == f"megackpt {megackpt.__version__}"


def test_convert_consolidate_verify(tmp_path):
    safetensors = pytest.importorskip("safetensors.numpy")
    full = sample(np.float32, (4, 6), 1)
    st = megackpt.ShardedTensor((4, 6), "F32", [((0, 0), full[:2].copy()), ((2, 0), full[2:].copy())])
    megackpt.save({"w": st, "b": np.arange(5, dtype=np.int64)}, tmp_path / "c")
    res = megackpt.consolidate(tmp_path / "c", tmp_path / "st", format="safetensors")
    assert res["entries"] == 2
    loaded = {}
    for f in res["files"]:
        loaded.update(safetensors.load_file(str(tmp_path / "st" / f)))
    np.testing.assert_array_equal(loaded["w"], full)
    summary = megackpt.convert(tmp_path / "st", tmp_path / "back.mega")
    assert summary["tensors"] == 2
    assert megackpt.verify(tmp_path / "back.mega")["ok"]
    np.testing.assert_array_equal(megackpt.load(tmp_path / "back.mega")["w"], full)


def test_mega_uri_to_a_megahub_on_loopback(tmp_path, megahub):
    endpoint, token = megahub
    # A child process: the hub endpoint is fixed per process (MEGA_ENDPOINT).
    code = f"""
import numpy as np, megackpt
a = np.arange(1000, dtype=np.float32)
megackpt.save({{"a": a, "meta": {{"step": 5}}}}, "mega://org/pytest@main/ckpt/step-5")
out = megackpt.load("mega://org/pytest@main/ckpt/step-5")
assert out["meta"] == {{"step": 5}}
assert out["a"].tobytes() == a.tobytes()
dst = {{"a": np.zeros(1000, np.float32), "meta": {{"step": 0}}}}
megackpt.load("mega://org/pytest/ckpt/step-5", dst)
assert dst["a"].tobytes() == a.tobytes()
print("OK")
"""
    r = run_python(code, env={"MEGA_ENDPOINT": endpoint, "MEGA_TOKEN": token})
    assert r.returncode == 0 and "OK" in r.stdout, r.stdout + r.stderr
    listing = subprocess.run(
        [tool("megackpt"), "ls", "mega://org/pytest@main/ckpt/step-5"], capture_output=True,
        text=True, env={**os.environ, "MEGA_ENDPOINT": endpoint, "MEGA_TOKEN": token})
    assert listing.returncode == 0, listing.stderr
    assert ".metadata" in listing.stdout and "model.mega.index.json" in listing.stdout


def test_mega_uri_embedded_hub(tmp_path):
    code = """
import numpy as np, megackpt
megackpt.save({"a": np.ones(10)}, "mega://org/emb/ckpt")
assert megackpt.load("mega://org/emb/ckpt")["a"].sum() == 10
print("OK")
"""
    r = run_python(code, env={"MEGA_ENDPOINT": f"file://{tmp_path}/hub", "MEGA_TOKEN": ""})
    assert r.returncode == 0 and "OK" in r.stdout, r.stdout + r.stderr


def test_mpi_group_without_mpi4py(tmp_path):
    mpirun = shutil.which("mpirun")
    if mpirun is None:
        pytest.skip("mpirun is not installed (openmpi-bin)")
    script = tmp_path / "job.py"
    script.write_text(f"""
import numpy as np, megackpt
g = megackpt.process_group()
assert g.backend == "mpi" and g.world_size == 2, g
r = g.rank
full = np.arange(40, dtype=np.float32).reshape(4, 10)
st = megackpt.ShardedTensor((4, 10), "F32", [((2 * r, 0), full[2 * r:2 * r + 2].copy())])
megackpt.save({{"w": st, "step": 9}}, {str(tmp_path / 'c')!r})
out = megackpt.load({str(tmp_path / 'c')!r})
assert (out["w"] == full).all() and out["step"] == 9
print("rank", r, "OK")
""")
    env = dict(os.environ, OMPI_ALLOW_RUN_AS_ROOT="1", OMPI_ALLOW_RUN_AS_ROOT_CONFIRM="1",
               OMPI_MCA_plm_rsh_agent="")
    r = subprocess.run([mpirun, "-np", "2", "--oversubscribe", sys.executable, str(script)],
                       capture_output=True, text=True, env=env, timeout=300)
    assert r.returncode == 0, r.stdout + r.stderr
    assert r.stdout.count("OK") == 2


def test_objects_are_pickled_with_highest_protocol(tmp_path):
    megackpt.save({"o": {"set": {1, 2}}}, tmp_path / "c")
    assert megackpt.load(tmp_path / "c")["o"] == {"set": {1, 2}}
    assert pickle.HIGHEST_PROTOCOL >= 5
