"""Errors: one exception class per status code, messages naming file / tensor;
nothing half-written."""
import os

import numpy as np
import pytest

import megackpt
from megackpt import _core


def test_every_code_maps_to_its_class():
    for code, cls in megackpt.errors._BY_CODE.items():
        if code == "Unknown":
            continue
        with pytest.raises(cls) as e:
            _core._raise_status(code, f"boom {code}")
        assert str(e.value) == f"boom {code}" and e.value.code == code
        assert isinstance(e.value, megackpt.Error)
    assert issubclass(megackpt.NotFoundError, FileNotFoundError)
    assert issubclass(megackpt.InvalidArgumentError, ValueError)


def corrupt_middle(path):
    data = bytearray(path.read_bytes())
    data[len(data) // 2] ^= 0xFF
    path.write_bytes(bytes(data))


@pytest.mark.parametrize("storage", ["mega", "fs"])
def test_corrupt_shard_raises_data_loss_naming_the_file(tmp_path, storage):
    megackpt.save({"w": np.arange(1 << 16, dtype=np.float32)}, tmp_path / "c", storage=storage)
    data_files = [f for f in os.listdir(tmp_path / "c") if f.endswith((".mega", ".distcp"))]
    big = max(data_files, key=lambda f: os.path.getsize(tmp_path / "c" / f))
    corrupt_middle(tmp_path / "c" / big)
    with pytest.raises(megackpt.DataLossError) as e:
        megackpt.load(tmp_path / "c")
    assert big in str(e.value)
    if storage == "mega":
        with pytest.raises(megackpt.DataLossError) as e:
            megackpt.verify(tmp_path / "c")
        assert big in str(e.value) and "'w'" in str(e.value)
        assert not megackpt.verify(tmp_path / "c", raise_on_error=False)["ok"]


def test_corrupt_shard_under_torch_dcp(tmp_path):
    torch = pytest.importorskip("torch")
    import torch.distributed.checkpoint as dcp

    import megackpt.torch as mt

    dcp.save({"w": torch.arange(50000.0)}, storage_writer=mt.MegaStorageWriter(tmp_path / "c"))
    corrupt_middle(tmp_path / "c" / "model.mega")
    with pytest.raises(BaseException) as e:  # torch's CheckpointException
        dcp.load({"w": torch.zeros(50000)}, storage_reader=mt.MegaStorageReader(tmp_path / "c"))
    inner = e.value.failures[0][0]  # torch wraps each rank's exception
    assert isinstance(inner, megackpt.DataLossError)
    assert "model.mega" in str(inner) and "'w'" in str(inner)


def test_shape_and_dtype_mismatch_name_the_tensor(tmp_path):
    megackpt.save({"layer": {"w": np.zeros((3, 4), np.float32)}}, tmp_path / "c")
    with pytest.raises(megackpt.InvalidArgumentError) as e:
        megackpt.load(tmp_path / "c", {"layer": {"w": np.zeros((4, 3), np.float32)}})
    assert "layer.w" in str(e.value)
    with pytest.raises(megackpt.InvalidArgumentError) as e:
        megackpt.load(tmp_path / "c", {"layer": {"w": np.zeros((3, 4), np.float64)}})
    assert "layer.w" in str(e.value)
    with pytest.raises(megackpt.InvalidArgumentError):
        ro = np.zeros((3, 4), np.float32)
        ro.setflags(write=False)
        megackpt.load(tmp_path / "c", {"layer": {"w": ro}})
    with pytest.raises(megackpt.NotFoundError) as e:
        megackpt.load(tmp_path / "c", {"other": np.zeros(2)})
    assert "other" in str(e.value)


def test_failed_save_leaves_the_previous_checkpoint(tmp_path):
    megackpt.save({"w": np.ones(4, np.float32)}, tmp_path / "c")
    before = sorted(os.listdir(tmp_path / "c"))
    with pytest.raises(megackpt.AlreadyExistsError):
        megackpt.save({"w": np.zeros(4, np.float32)}, tmp_path / "c", overwrite=False)
    bad = megackpt.ShardedTensor((4,), "F32", [((0,), np.zeros(2, np.float32))])  # leaves a hole
    with pytest.raises(megackpt.InvalidArgumentError):
        megackpt.save({"w": bad}, tmp_path / "c")
    assert sorted(os.listdir(tmp_path / "c")) == before  # nothing half-written left behind
    np.testing.assert_array_equal(megackpt.load(tmp_path / "c")["w"], np.ones(4, np.float32))


def test_bad_arguments(tmp_path):
    with pytest.raises(megackpt.InvalidArgumentError):
        megackpt.save({"w": np.ones(2)}, tmp_path / "c", storage="tar")
    with pytest.raises(megackpt.InvalidArgumentError):
        megackpt.save({"w": np.ones(2)}, tmp_path / "c", storage="fs", fqn_to_index_mapping={"w": 1})
    with pytest.raises(megackpt.InvalidArgumentError):
        megackpt.save([np.ones(2)], tmp_path / "c")
    with pytest.raises(megackpt.NotFoundError):
        megackpt.inspect(tmp_path / "missing.mega")
