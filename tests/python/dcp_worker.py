"""One rank of a torch DCP job on gloo over loopback (run by test_torch_dcp.py and
the benchmark as separate processes).

  dcp_worker.py save|async_save|load torch STORAGE PATH RANK WORLD PORT

STORAGE: mega | fs (megackpt.torch writers/readers) | torch-fs (torch's own
FileSystemWriter/Reader). The state is deterministic: every rank builds the same
full tensors and keeps its DTensor shards (Shard(0) over a 1-d mesh of WORLD ranks,
uneven when WORLD does not divide the rows; a bf16 DTensor sharded on dim 1), a
replicated tensor and non-tensor objects. `load` fills zeroed destinations of its
own world size and compares every byte.
"""
import os
import sys


def full_state(torch):
    g = torch.Generator().manual_seed(1234)
    return {
        "w": torch.randn(7, 10, generator=g),
        "emb": (torch.randn(5, 9, generator=g) * 10).to(torch.bfloat16),
        "bias": torch.arange(10, dtype=torch.int64),
    }


def build(torch, mesh, zero):
    from torch.distributed.tensor import Shard, distribute_tensor

    full = full_state(torch)
    mk = (lambda t: torch.zeros_like(t)) if zero else (lambda t: t)
    return {
        "model": {
            "w": distribute_tensor(mk(full["w"]), mesh, [Shard(0)]),
            "emb": distribute_tensor(mk(full["emb"]), mesh, [Shard(1)]),
            "bias": mk(full["bias"]),
        },
        "extra": {"step": 0 if zero else 42, "name": "" if zero else "run-7"},
    }, full


def main():
    mode, _framework, storage, path, rank, world, port = sys.argv[1:8]
    rank, world = int(rank), int(world)
    import torch
    import torch.distributed as dist
    import torch.distributed.checkpoint as dcp
    from torch.distributed.device_mesh import init_device_mesh

    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank,
                            world_size=world)
    mesh = init_device_mesh("cpu", (world,))
    if storage == "torch-fs":
        writer, reader = dcp.FileSystemWriter, dcp.FileSystemReader
    else:
        import megackpt.torch as mt

        writer, reader = ((mt.MegaStorageWriter, mt.MegaStorageReader) if storage == "mega"
                          else (mt.FileSystemWriter, mt.FileSystemReader))
    if mode == "save":
        state, _ = build(torch, mesh, zero=False)
        dcp.save(state, storage_writer=writer(path))
    elif mode == "async_save":
        state, _ = build(torch, mesh, zero=False)
        dcp.async_save(state, storage_writer=writer(path)).result()
    else:
        state, full = build(torch, mesh, zero=True)
        dcp.load(state, storage_reader=reader(path))
        m = state["model"]
        for name in ("w", "emb"):
            got = m[name].full_tensor()
            assert got.dtype == full[name].dtype, name
            assert got.view(torch.uint8).equal(full[name].view(torch.uint8)), name  # bit-exact
        assert torch.equal(m["bias"], full["bias"])
        assert state["extra"] == {"step": 42, "name": "run-7"}, state["extra"]
    dist.barrier()
    dist.destroy_process_group()
    print(f"rank {rank} {mode} OK", flush=True)
    exit_without_finalizing()


def exit_without_finalizing():
    """End a gloo rank that has finished its work with status 0, skipping Python's
    finalization. torch's gloo worker threads can still be releasing their last work
    objects after destroy_process_group returns; those hold tensors, and so Python
    references, and a thread that needs the GIL while the interpreter finalizes is
    ended by Python mid-destructor: std::terminate, "terminate called without an
    active exception", status -6 (seen here in about 1 of 30 three-rank loads; the
    stack is c10d::ProcessGroupGloo::runLoop -> ~AsyncBarrierWork -> decref ->
    take_gil -> pthread_exit). It is torch's (pytorch/pytorch PR 179291 discusses it),
    not the storage's, so the ranks end the way a launcher would end them."""
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)


if __name__ == "__main__":
    main()
