#!/usr/bin/python3
"""Torch peers of `megackpt bench mega`: the same state through torch.save /
torch.load and torch's distributed checkpoint (torch 1.13:
torch.distributed._shard.checkpoint), measured the same way.

State (as bench/mega_bench.cc): 16 float32 tensors of shape [rows, 1024] with
rows = size / 16 / 4096, filled with random data; with --world-size N each
tensor is split by rows over N ranks (a ShardedTensor per tensor, because torch
1.13's DCP keeps plain tensors of rank 0 only).

Rows printed (decimal GB/s, min / median / max of --reps runs after a dropped
warm-up):
  torch.save (+ fsync)            one process, the whole state, file fsynced
  torch.save (no fsync)
  torch.load                      one process (allocates the tensors, as it must)
  torch DCP save (sync_files)     N ranks (gloo on 127.0.0.1), single file per rank
  torch DCP save (no sync)
  torch DCP load                  into pre-allocated sharded tensors, reused

Usage:
  /usr/bin/python3 bench/torch_peer.py --size 256MB --world-size 2 [--reps 5] [--json]

Debian's python3-torch 1.13 on Python 3.11: importing the DCP package fails
("mutable default ... TensorProperties"); the import below patches the dataclass
field in-process (default -> default_factory) before importing.
"""
import argparse
import copy
import dataclasses
import json
import os
import re
import shutil
import socket
import statistics
import sys
import tempfile
import time

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "python"))
from fresh_write import mark_freed_memory, prime_free_memory  # noqa: E402  (bench/python/fresh_write.py)

import torch
import torch.distributed as dist
import torch.multiprocessing as mp

TENSORS = 16
COLS = 1024
WARMUP = 1


def import_torch_dcp():
    """Imports torch.distributed._shard.checkpoint with the 3.11 dataclass fix."""
    orig = dataclasses._get_field

    def get_field(cls, a_name, *args):
        f = cls.__dict__.get(a_name, dataclasses.MISSING)
        if (isinstance(f, dataclasses.Field) and f.default is not dataclasses.MISSING
                and type(f.default).__name__ == "TensorProperties"):
            value = f.default
            f.default = dataclasses.MISSING
            f.default_factory = lambda: copy.deepcopy(value)
        return orig(cls, a_name, *args)

    dataclasses._get_field = get_field
    try:
        import torch.distributed._shard.checkpoint as dcp
        from torch.distributed._shard import sharded_tensor
        from torch.distributed._shard.metadata import ShardMetadata
    finally:
        dataclasses._get_field = orig
    return dcp, sharded_tensor, ShardMetadata


def parse_size(text):
    m = re.fullmatch(r"([0-9.]+)\s*([a-zA-Z]*)", text.strip())
    if not m:
        raise ValueError(f"bad size {text!r}")
    units = {"": 1, "b": 1, "k": 1e3, "kb": 1e3, "m": 1e6, "mb": 1e6, "g": 1e9, "gb": 1e9,
             "kib": 1024, "mib": 1024 ** 2, "gib": 1024 ** 3}
    unit = m.group(2).lower()
    if unit not in units:
        raise ValueError(f"bad size unit in {text!r}")
    return int(float(m.group(1)) * units[unit])


def summary(values):
    return {"min": min(values), "median": statistics.median(values), "max": max(values)}


def gbps(seconds, nbytes):
    return [nbytes / s / 1e9 for s in seconds]


def rows_for(size):
    return max(1, size // TENSORS // (COLS * 4))


def full_state(rows, seed=0):
    g = torch.Generator().manual_seed(seed)
    return {f"layers.{t}.weight": torch.rand(rows, COLS, generator=g) for t in range(TENSORS)}


def fsync_path(path):
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def bench_torch_save_load(size, reps, base):
    rows = rows_for(size)
    state = full_state(rows)
    nbytes = rows * COLS * 4 * TENSORS
    path = os.path.join(base, "torch_save.pt")
    results = {}
    for key, sync in (("torch_save_gbps", True), ("torch_save_nosync_gbps", False)):
        secs = []
        for i in range(WARMUP + reps):
            if os.path.exists(path):
                os.remove(path)
            mark = mark_freed_memory()
            os.sync()  # as megackpt's benches: every timed write starts with no dirty pages
            prime_free_memory(path + ".prime", nbytes, mark)  # last, right before the write
            t0 = time.perf_counter()
            torch.save(state, path)
            if sync:
                fsync_path(path)
            dt = time.perf_counter() - t0
            if i >= WARMUP:
                secs.append(dt)
        results[key] = summary(gbps(secs, nbytes))
    secs = []
    loaded = None
    for i in range(WARMUP + reps):
        loaded = None
        t0 = time.perf_counter()
        loaded = torch.load(path)
        dt = time.perf_counter() - t0
        if i >= WARMUP:
            secs.append(dt)
    for k, v in state.items():
        if not torch.equal(v, loaded[k]):
            raise RuntimeError(f"torch.load returned different data for {k}")
    results["torch_load_gbps"] = summary(gbps(secs, nbytes))
    os.remove(path)
    return results


def dcp_worker(rank, world, port, size, reps, base, out_path):
    os.environ["MASTER_ADDR"] = "127.0.0.1"
    os.environ["MASTER_PORT"] = str(port)
    os.environ.setdefault("GLOO_SOCKET_IFNAME", "lo")
    dist.init_process_group("gloo", rank=rank, world_size=world)
    dcp, sharded_tensor, ShardMetadata = import_torch_dcp()
    rows = rows_for(size)
    nbytes = rows * COLS * 4 * TENSORS
    r0, r1 = rows * rank // world, rows * (rank + 1) // world
    g = torch.Generator().manual_seed(1000 + rank)

    def make_state(fill):
        sd = {}
        for t in range(TENSORS):
            local = torch.rand(r1 - r0, COLS, generator=g) if fill else torch.zeros(r1 - r0, COLS)
            if world == 1:
                sd[f"layers.{t}.weight"] = local
                continue
            md = ShardMetadata(shard_offsets=[r0, 0], shard_sizes=[r1 - r0, COLS],
                               placement=f"rank:{rank}/cpu")
            shards = [sharded_tensor.Shard(local, md)]
            sd[f"layers.{t}.weight"] = sharded_tensor.init_from_local_shards(shards, rows, COLS)
        return sd

    save_state = make_state(True)
    load_state = make_state(False)
    ckpt = os.path.join(base, "torch_dcp")

    def timed(fn, fresh):
        secs = []
        for i in range(WARMUP + reps):
            if fresh and rank == 0:
                shutil.rmtree(ckpt, ignore_errors=True)
                os.makedirs(ckpt)
            if fresh:
                os.sync()  # as megackpt's benches: no dirty pages left from earlier runs
                dist.barrier()  # rank 0 has removed the old checkpoint
                mark = mark_freed_memory()
                prime_free_memory(f"{ckpt}.prime{rank}", nbytes // world, mark)  # last
            dist.barrier()
            t0 = time.perf_counter()
            fn()
            dist.barrier()
            dt = time.perf_counter() - t0
            if i >= WARMUP:
                secs.append(dt)
        return secs

    results = {}
    for key, sync in (("torch_dcp_save_gbps", True), ("torch_dcp_save_nosync_gbps", False)):
        secs = timed(lambda: dcp.save_state_dict(
            save_state, dcp.FileSystemWriter(ckpt, single_file_per_rank=True, sync_files=sync)), True)
        results[key] = summary(gbps(secs, nbytes))
    secs = timed(lambda: dcp.load_state_dict(load_state, dcp.FileSystemReader(ckpt)), False)
    results["torch_dcp_load_gbps"] = summary(gbps(secs, nbytes))

    def local(v):
        return v if world == 1 else v.local_shards()[0].tensor
    for k in save_state:
        if not torch.equal(local(save_state[k]), local(load_state[k])):
            raise RuntimeError(f"rank {rank}: torch DCP load returned different data for {k}")
    if rank == 0:
        with open(out_path, "w") as f:
            json.dump(results, f)
    dist.barrier()
    dist.destroy_process_group()
    # gloo's threads may abort a finalizing interpreter (tests/python/dcp_worker.py,
    # exit_without_finalizing): the results are written, end here.
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--size", default="2GiB", help="state bytes, e.g. 2GiB (default), 256MB")
    ap.add_argument("--world-size", type=int, default=1, help="DCP ranks (gloo on loopback)")
    ap.add_argument("--reps", type=int, default=5, help="measured repetitions (default 5)")
    ap.add_argument("--dir", default=None, help="folder for the files (default: a temp folder)")
    ap.add_argument("--json", action="store_true", help="print one JSON object")
    args = ap.parse_args()
    size = parse_size(args.size)
    torch.set_num_threads(2)
    base = tempfile.mkdtemp(prefix="megackpt-torch-peer-", dir=args.dir)
    try:
        results = {"bench": "torch_peer", "torch": torch.__version__, "world_size": args.world_size,
                   "bytes": rows_for(size) * COLS * 4 * TENSORS, "reps": args.reps}
        results.update(bench_torch_save_load(size, args.reps, base))
        out_path = os.path.join(base, "dcp.json")
        mp.spawn(dcp_worker, args=(args.world_size, free_port(), size, args.reps, base, out_path),
                 nprocs=args.world_size, join=True)
        with open(out_path) as f:
            results.update(json.load(f))
    finally:
        shutil.rmtree(base, ignore_errors=True)
    if args.json:
        flat = {}
        for k, v in results.items():
            if isinstance(v, dict):
                flat[k] = v["median"]
                flat[k + "_min"] = v["min"]
                flat[k + "_max"] = v["max"]
            else:
                flat[k] = v
        print(json.dumps(flat, indent=2))
        return
    print(f"torch peer ({torch.__version__}): {results['bytes'] / 1e9:.3f} GB state ({TENSORS} F32 "
          f"tensors), DCP world size {args.world_size}, {args.reps} reps after {WARMUP} warm-up; "
          f"GB/s min / median / max")
    rows = [("torch.save (+ fsync)", "torch_save_gbps"),
            ("torch.save (no fsync)", "torch_save_nosync_gbps"),
            ("torch.load", "torch_load_gbps"),
            ("torch DCP save (sync_files)", "torch_dcp_save_gbps"),
            ("torch DCP save (no sync)", "torch_dcp_save_nosync_gbps"),
            ("torch DCP load", "torch_dcp_load_gbps")]
    for label, key in rows:
        s = results[key]
        print(f"{label:<34}{s['min']:9.3f}{s['median']:9.3f}{s['max']:9.3f}")


if __name__ == "__main__":
    sys.exit(main())
