"""megackpt.tensorplay under TensorPlay's DCP, and interop with TensorPlay's own
MegaStorageWriter/Reader (the seed, tensorplay 1.0.0 from PyPI).

What TensorPlay's own code cannot do (its seed defects, spec/dcp.md §4), and so is
not tested as working:
- its MegaStorageReader cannot open a checkpoint megackpt wrote: it unpickles
  `.metadata` (defect 7) and ours is portable JSON. Our shards are plain MEGA
  files, though, and `tensorplay.load` reads each of them (whole and sharded);
- its MegaStorageWriter cannot store bytes/objects (defect 5: "MEGA stores
  tensors and JSON primitives") nor sharded entries from several ranks (defects
  1, 4): interop in that direction uses tensors-only, single-process state.
"""
import os
import subprocess

import numpy as np
import pytest

tp = pytest.importorskip("tensorplay", reason="tensorplay (PyPI, manylinux_2_35) is not installed")
import tensorplay.distributed.checkpoint as tdcp  # noqa: E402

import megackpt  # noqa: E402
from megackpt.tensorplay import MegaStorageReader, MegaStorageWriter  # noqa: E402

from conftest import tool  # noqa: E402


def state():
    tp.manual_seed(3)
    return {"w": tp.randn(4, 5), "b": tp.arange(6).to(tp.bfloat16),
            "n": {"x": tp.ones(2), "step": 3}}


def zeros():
    return {"w": tp.zeros(4, 5), "b": tp.zeros(6).to(tp.bfloat16), "n": {"x": tp.zeros(2), "step": 0}}


def test_tensorplay_dcp_through_our_storage(tmp_path):
    sd = state()
    tdcp.save(sd, storage_writer=MegaStorageWriter(tmp_path / "c"))
    dst = zeros()
    tdcp.load(dst, storage_reader=MegaStorageReader(tmp_path / "c"))
    assert tp.equal(dst["w"], sd["w"]) and tp.equal(dst["b"], sd["b"])
    assert dst["n"]["step"] == 3
    r = subprocess.run([tool("megackpt"), "verify", str(tmp_path / "c")], capture_output=True, text=True)
    assert r.returncode == 0, r.stderr


def test_checkpoint_of_tensorplays_own_writer_loads_everywhere(tmp_path):
    sd = state()
    tensors = {"w": sd["w"], "b": sd["b"], "n": {"x": sd["n"]["x"]}}
    tdcp.save(tensors, storage_writer=tdcp.MegaStorageWriter(str(tmp_path / "theirs")))
    # megackpt.load: its pickled .metadata is never unpickled; Metadata comes from the shards.
    out = megackpt.load(tmp_path / "theirs")
    np.testing.assert_array_equal(out["w"], np.from_dlpack(sd["w"]))
    # Our reader under TensorPlay's DCP, and the C++ CLI.
    dst = {"w": tp.zeros(4, 5), "b": tp.zeros(6).to(tp.bfloat16), "n": {"x": tp.zeros(2)}}
    tdcp.load(dst, storage_reader=MegaStorageReader(tmp_path / "theirs"))
    assert tp.equal(dst["w"], sd["w"]) and tp.equal(dst["b"], sd["b"])
    r = subprocess.run([tool("megackpt"), "verify", str(tmp_path / "theirs")], capture_output=True,
                       text=True)
    assert r.returncode == 0, r.stderr


def test_tensorplay_reads_our_shards(tmp_path):
    full = np.arange(16, dtype=np.float32).reshape(4, 4)
    st = megackpt.ShardedTensor((4, 4), "F32", [((0, 0), full[:2].copy()), ((2, 0), full[2:].copy())])
    megackpt.save({"w": np.arange(12, dtype=np.float32).reshape(3, 4), "s": st}, tmp_path / "c",
                  fqn_to_index_mapping={"w": 1, "s": 2})
    pieces = {}
    for name in sorted(os.listdir(tmp_path / "c")):
        if name.endswith(".mega"):
            for k, v in tp.load(str(tmp_path / "c" / name)).items():
                pieces.setdefault(k, []).append(np.from_dlpack(v))
    np.testing.assert_array_equal(pieces["w"][0], np.arange(12, dtype=np.float32).reshape(3, 4))
    np.testing.assert_array_equal(np.concatenate(pieces["s"]), full)
    # Consolidated, the folder is one truthful weight_map for any MEGA consumer.
    megackpt.consolidate(tmp_path / "c", tmp_path / "c")
    whole = {}
    for name in sorted(os.listdir(tmp_path / "c")):
        if name.endswith(".mega"):
            whole.update({k: np.from_dlpack(v) for k, v in tp.load(str(tmp_path / "c" / name)).items()})
    np.testing.assert_array_equal(whole["s"], full)


def test_their_reader_cannot_open_ours(tmp_path):
    """Documents the limit: TensorPlay's reader unpickles .metadata (seed defect 7)."""
    tdcp.save(state(), storage_writer=MegaStorageWriter(tmp_path / "c"))
    with pytest.raises(BaseException, match="load key"):
        tdcp.load(zeros(), storage_reader=tdcp.MegaStorageReader(str(tmp_path / "c")))
