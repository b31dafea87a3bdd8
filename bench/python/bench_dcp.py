#!/usr/bin/env python3
"""Python checkpointing benchmark: one program, one run, one table.

    python3 bench/python/bench_dcp.py [--size 2GiB] [--rounds 5] [--reps 1] [--dir /tmp]
        [--worlds 1,2] [--systems native,...,cpp] [--json FILE]
    python3 bench/python/bench_dcp.py --report FILE   (the tables of a --json file)

State: --size bytes per job of float32 and bfloat16 tensors (32 MiB each; half of
the bytes each dtype), split evenly over the ranks (distinct names per rank).
Systems, each at world size 1 and 2 (processes; gloo on loopback for the DCP
frameworks, mpirun for the native API):
  native      megackpt.save / load / async_save (MEGA storage)
  native-rows the same calls on the cpp row's own state: 16 F32 tensors of --size/16
              bytes, row-sharded over the ranks as megackpt.ShardedTensor pieces, in
              pre-faulted huge-page buffers (what `megackpt bench mega` allocates)
  mega-dcp    torch.distributed.checkpoint + megackpt.torch.MegaStorageWriter/Reader
  torch-fs    torch.distributed.checkpoint + torch's FileSystemWriter/Reader
  torch-hf    torch's HuggingFaceStorageWriter/Reader (world 1; where torch has it)
  tp-mega     TensorPlay's DCP + its own MegaStorageWriter/Reader (the seed; world 1:
              at world 2 its ranks overwrite each other's model.mega, seed defect 1)
  safetensors safetensors.torch save_file / load_file, one file per rank
  cpp         `megackpt bench mega --json` (C++ engine) for reference; at world size
              2 under mpirun (--backend mpi), like the native rows, when mpirun exists
--threads I/O threads per rank (default 2) go to native, native-rows, mega-dcp and
cpp alike (torch-fs, tp-mega keep their own defaults); every system's durable save
fsyncs and its no-sync save does not. Async saves of native/native-rows stage the
whole state in one pool (staging_bytes = the rank's state), as the cpp row does.
Metrics: durable save (fsync) and no-sync save in GB/s (decimal), load in GB/s
(into preallocated, pre-faulted, reused tensors where the API loads in place),
the time async save blocks the caller, and the peak extra RSS (above the state)
during a durable save; per repetition the slowest rank's time.

Fresh writes: before every timed save each rank writes back dirty pages, then
primes the free memory with its state's size (fresh_write.py; docs/benchmarks.md,
"Priming the free memory"), as the C++ benches do; MEGACKPT_BENCH_NO_PRIME=1 skips it.

Rounds: page-cache writes on this kind of VM are bimodal (docs/benchmarks.md,
"Page-cache writes on a VM with free page reporting"), and a mode lasts longer
than one system's repetitions. So each of --rounds runs every system once (a
dropped warm-up, then --reps measured repetitions; the order rotated per round),
the tables give median [min, max] over the rounds, and every ratio is paired:
ours / theirs within one round, then median [min, max] of those. Ratios:
mega-dcp vs torch-fs, mega-dcp vs tp-mega, native-rows vs cpp (the same state,
threads, durability and processes: what the Python layer costs), and, for
information, native vs cpp (different states). The cpp row also measures the machine's parallel
ceilings (page-cache write, write + fdatasync, warm read) in its round: each goal
line says the most any system could reach against that peer in the same round
(ceiling / peer; a goal above it cannot be met on this machine then), and
mega-dcp and native are given as fractions of those ceilings.

--json FILE keeps every round's values, rewritten after each round; --report FILE
prints the tables from such a file, so a run stopped after some rounds still gives
its tables (over the rounds it finished).

Do not run it while other jobs load the machine: the numbers are only meaningful
on a quiet one.
"""
import argparse
import json
import mmap
import os
import shutil
import socket
import statistics
import subprocess
import sysconfig
import sys
import threading
import time

from fresh_write import fresh_writes_primed, mark_freed_memory, prime_free_memory  # bench/python, beside this script

# The last save before "load" leaves the checkpoint the load runs read.
ORDER = ["save_nosync", "async_blocked", "save", "load"]
# A round's value of each metric, named as `megackpt bench mega --json` names them:
# GB/s for saves and loads, seconds for the caller's blocked time of an async save.
KEYS = {"save": "save_gbps", "save_nosync": "save_nosync_gbps", "load": "load_gbps",
        "async_blocked": "async_blocked_seconds"}
SYSTEMS = ["native", "native-rows", "mega-dcp", "torch-fs", "torch-hf", "tp-mega", "safetensors"]
TENSOR_BYTES = 32 << 20
# The state of `megackpt bench mega` (bench/mega_bench.cc): ROW_TENSORS F32 tensors
# of ROW_COLS columns, rows split evenly over the ranks.
ROW_TENSORS, ROW_COLS = 16, 1024
HUGE_PAGE = 2 << 20


def parse_size(text):
    units = {"k": 1e3, "m": 1e6, "g": 1e9, "kib": 1 << 10, "mib": 1 << 20, "gib": 1 << 30}
    t = text.strip().lower().rstrip("b") if not text.lower().endswith("ib") else text.strip().lower()
    for u in sorted(units, key=len, reverse=True):
        if t.endswith(u):
            return int(float(t[: -len(u)]) * units[u])
    return int(t)


class PeakRss:
    """Samples this process's RSS while the block runs; .extra = peak - start."""

    def __enter__(self):
        self.start = self.peak = self._rss()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()
        return self

    def __exit__(self, *exc):
        self._stop.set()
        self._thread.join()
        self.peak = max(self.peak, self._rss())
        self.extra = max(0, self.peak - self.start)

    @staticmethod
    def _rss():
        with open("/proc/self/statm") as f:
            return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")

    def _run(self):
        while not self._stop.wait(0.002):
            self.peak = max(self.peak, self._rss())


def rss_text(nbytes, unit=" MiB"):
    """MiB of an extra-RSS sample; below 1 MiB the peak never rose above the RSS
    before the save (the sampler saw no growth), which is not a measured zero."""
    if nbytes < (1 << 20):
        return "<1" + unit + (" (not above the baseline)" if unit else "")
    return f"{nbytes / (1 << 20):.0f}{unit}"


# ---- one rank of one system ------------------------------------------------------

def make_state(torch, rank_bytes, rank):
    n = max(1, rank_bytes // TENSOR_BYTES)
    state = {}
    for i in range(n):
        bf16 = i % 2 == 1
        elems = TENSOR_BYTES // (2 if bf16 else 4)
        t = torch.empty(elems // 1024, 1024, dtype=torch.bfloat16 if bf16 else torch.float32)
        t.uniform_(-1, 1)
        state[f"r{rank}.layer{i}.{'bf16' if bf16 else 'f32'}"] = t
    return state


def huge_array(np, shape):
    """A zeroed (pre-faulted) F32 array in its own huge-page mapping, as the C++
    bench's AllocateBuffer(n, prefault=true) makes them."""
    nbytes = max(64, shape[0] * shape[1] * 4)
    # Private anonymous (the default MAP_SHARED would be shmem, without huge pages).
    m = mmap.mmap(-1, (nbytes + HUGE_PAGE - 1) // HUGE_PAGE * HUGE_PAGE,
                  flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS)
    if hasattr(m, "madvise") and hasattr(mmap, "MADV_HUGEPAGE"):
        m.madvise(mmap.MADV_HUGEPAGE)
    a = np.frombuffer(m, dtype=np.float32, count=shape[0] * shape[1]).reshape(shape)
    a.fill(0)
    return a


def make_rows_state(size, world, rank):
    """(state, make_dst, nbytes) of this rank: the cpp row's row-sharded state, and a
    function that makes its load destinations."""
    import numpy as np

    import megackpt

    rows = max(1, size // ROW_TENSORS // (ROW_COLS * 4))
    r0, r1 = rows * rank // world, rows * (rank + 1) // world
    pieces = lambda arr: [((r0, 0), arr)] if r1 > r0 else []  # noqa: E731
    state, nbytes = {}, 0
    for t in range(ROW_TENSORS):
        a = huge_array(np, (r1 - r0, ROW_COLS))
        np.random.default_rng(7000 + t * 64 + rank).random(dtype=np.float32, out=a)
        state[f"layers.{t}.weight"] = megackpt.ShardedTensor((rows, ROW_COLS), "F32", pieces(a))
        nbytes += a.nbytes if r1 > r0 else 0

    def make_dst():
        return {name: megackpt.ShardedTensor((rows, ROW_COLS), "F32",
                                             pieces(huge_array(np, (r1 - r0, ROW_COLS))))
                for name in state}
    return state, make_dst, nbytes


def worker(args):
    import torch

    rank, world = args.rank, args.world
    if os.environ.get("OMPI_COMM_WORLD_RANK") is not None:
        rank = int(os.environ["OMPI_COMM_WORLD_RANK"])
    if args.system == "native-rows":
        state, make_dst, nbytes = make_rows_state(args.size, world, rank)
    else:
        state = make_state(torch, args.size // world, rank)
        nbytes = sum(t.numel() * t.element_size() for t in state.values())

        def make_dst():
            return {k: torch.zeros_like(v) for k, v in state.items()}  # pre-faulted, reused
    # The loads' destinations are made before the load row, not now: memory held during the
    # save rows lowers the kernel's dirty-page limits (docs/benchmarks.md, "Fresh writes wait
    # for the reporting pass"). The load functions read this dict when they run.
    dst = {}
    path = os.path.join(args.dir, f"bench-{args.system}-w{world}")
    barrier, ops = setup_system(args.system, torch, rank, world, path, state, dst, nbytes,
                                args.threads)

    def fresh():
        barrier()
        if rank == 0:
            shutil.rmtree(path, ignore_errors=True)
            os.makedirs(path, exist_ok=True)
        barrier()  # the old checkpoint is removed: its pages are free from here
        mark = mark_freed_memory()
        os.sync()
        prime_free_memory(f"{path}.prime{rank}", nbytes, mark)  # last, right before the write
        barrier()

    results = {"rank": rank, "bytes": nbytes, "times": {}}
    for metric in [m for m in ORDER if m in ops]:
        if metric == "load" and not dst:
            dst.update(make_dst())
        fn = ops[metric]
        times, extra = [], 0
        for rep in range(args.reps + 1):
            if metric != "load":
                fresh()
            else:
                barrier()
            with PeakRss() as rss:
                t0 = time.perf_counter()
                fn()
                dt = time.perf_counter() - t0
            if metric == "async_blocked":
                ops["_async_wait"]()
            barrier()
            if rep > 0:
                times.append(dt)
                if metric == "save":
                    extra = max(extra, rss.extra)
        results["times"][metric] = times
        if metric == "save":
            results["rss_extra"] = extra
    print("RESULT " + json.dumps(results), flush=True)


def setup_system(system, torch, rank, world, path, state, dst, nbytes, threads):
    """(barrier, {metric: fn}) for one system; metric order matters: the load runs
    after the last durable save."""
    if system in ("native", "native-rows"):
        import megackpt

        g = megackpt.process_group()
        # One staging wave, like the cpp row's pool (state + a page per tensor).
        staging = nbytes + (len(state) + 1) * 4096
        ops = {
            "save_nosync": lambda: megackpt.save(state, path, sync=False, group=g,
                                                 thread_count=threads),
            "async_blocked": lambda: _native_async(megackpt, state, path, g, threads, staging),
            "save": lambda: megackpt.save(state, path, group=g, thread_count=threads),
            "load": lambda: megackpt.load(path, dst, group=g, thread_count=threads),
        }
        ops["_async_wait"] = lambda: _NATIVE_HANDLE.pop().result()
        return g.barrier, ops
    if system == "safetensors":
        from safetensors.torch import load_file, save_file

        f = os.path.join(path, f"rank{rank}.safetensors")

        def durable():
            save_file(state, f)
            fd = os.open(f, os.O_RDONLY)
            os.fsync(fd)
            os.close(fd)

        return _gloo_barrier(torch, rank, world), {
            "save_nosync": lambda: save_file(state, f), "save": durable,
            # load_file maps the file lazily: copy into the destinations to read every byte.
            "load": lambda: [dst[k].copy_(v) for k, v in load_file(f).items()]}
    barrier = _gloo_barrier(torch, rank, world)
    if system == "tp-mega":
        import tensorplay as tp
        import tensorplay.distributed.checkpoint as tdcp

        def native_tp(v):  # TensorPlay's serializer refuses DLPack imports ("cpu:0")
            t = tp.rand(*v.shape)
            return t.to(tp.bfloat16) if v.dtype == torch.bfloat16 else t

        tstate = {k: native_tp(v) for k, v in state.items()}
        tdst = {}

        def tp_load():
            if not tdst:  # made by the dropped warm-up load, as `dst` is (see worker)
                tdst.update({k: tp.zeros_like(v) for k, v in tstate.items()})
            tdcp.load(tdst, storage_reader=tdcp.MegaStorageReader(path))

        return barrier, {
            "save_nosync": lambda: tdcp.save(tstate, storage_writer=tdcp.MegaStorageWriter(path)),
            "load": tp_load,
        }
    import torch.distributed.checkpoint as dcp

    if system == "mega-dcp":
        import megackpt.torch as mt

        W = lambda sync: mt.MegaStorageWriter(path, sync_files=sync, thread_count=threads)  # noqa: E731
        R = lambda: mt.MegaStorageReader(path, thread_count=threads)  # noqa: E731
    elif system == "torch-fs":
        W = lambda sync: dcp.FileSystemWriter(path, sync_files=sync)  # noqa: E731
        R = lambda: dcp.FileSystemReader(path)  # noqa: E731
    else:  # torch-hf
        W = lambda sync: dcp.HuggingFaceStorageWriter(path)  # noqa: E731
        R = lambda: dcp.HuggingFaceStorageReader(path)  # noqa: E731
    pending = []
    ops = {
        "save_nosync": lambda: dcp.save(state, storage_writer=W(False)),
        "async_blocked": lambda: pending.append(dcp.async_save(state, storage_writer=W(True))),
        "save": lambda: dcp.save(state, storage_writer=W(True)),
        "load": lambda: dcp.load(dst, storage_reader=R()),
        "_async_wait": lambda: pending.pop().result(),
    }
    if system == "torch-hf":  # no sync option: one (no-sync) save number
        ops = {"save_nosync": ops["save_nosync"], "load": ops["load"]}
    return barrier, ops


_NATIVE_HANDLE = []


def _native_async(megackpt, state, path, g, threads, staging):
    h = megackpt.async_save(state, path, group=g, thread_count=threads, staging_bytes=staging)
    h.wait_staged()
    _NATIVE_HANDLE.append(h)


def _gloo_barrier(torch, rank, world):
    import torch.distributed as dist

    if world > 1 and not dist.is_initialized():
        dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{os.environ['BENCH_PORT']}",
                                rank=rank, world_size=world)
    return dist.barrier if world > 1 else (lambda: None)


# ---- the driver -------------------------------------------------------------------

def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def parse_results(out):
    """Every `RESULT {json}` a worker printed. mpirun forwards its ranks' output
    through one stream, so two ranks' lines can run together: decode each JSON
    object where a marker starts instead of splitting by lines."""
    dec, found, i = json.JSONDecoder(), [], out.find("RESULT ")
    while i >= 0:
        obj, end = dec.raw_decode(out, i + len("RESULT "))
        found.append(obj)
        i = out.find("RESULT ", end)
    return found


def mpirun(world, cmd, env=None):
    """`cmd` as `world` ranks under mpirun, and the environment (`env`, default
    os.environ, plus Open MPI's consent to run as root) it runs in: the
    one launcher of the rows that run under MPI (the native rows, and the cpp
    row at world > 1), so native-rows / cpp compares the Python layer alone.
    --bind-to none: Open MPI pins each of 2 ranks to one core by default, so a
    rank's I/O threads would share its core while every other row (the gloo
    processes, the cpp row's thread ranks at world 1) runs unpinned."""
    env = dict(os.environ if env is None else env, OMPI_ALLOW_RUN_AS_ROOT="1",
               OMPI_ALLOW_RUN_AS_ROOT_CONFIRM="1")
    return ["mpirun", "-np", str(world), "--oversubscribe", "--bind-to", "none"] + cmd, env


def run_system(system, world, args):
    base = [sys.executable, os.path.abspath(__file__), "--worker", system, "--world", str(world),
            "--size", str(args.size), "--reps", str(args.reps), "--dir", args.dir,
            "--threads", str(args.threads)]
    env = dict(os.environ, BENCH_PORT=str(free_port()))
    if system.startswith("native") and world > 1:
        if not shutil.which("mpirun"):
            return None, "mpirun missing"
        cmd, env = mpirun(world, base, env)
        procs = [subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env)]
    else:
        procs = [subprocess.Popen(base + ["--rank", str(r)], stdout=subprocess.PIPE,
                                  stderr=subprocess.STDOUT, text=True, env=env) for r in range(world)]
    ranks, log = [], ""
    for p in procs:
        out, _ = p.communicate()
        log += out
        ranks += parse_results(out)
    if len(ranks) != world:
        return None, log.strip().splitlines()[-1] if log.strip() else "failed"
    # Per repetition the slowest rank's time; the round's value is their median.
    agg = {"bytes": sum(r["bytes"] for r in ranks)}
    for m in ORDER:
        if not all(m in r["times"] for r in ranks):
            continue
        slowest = statistics.median(max(ts) for ts in zip(*(r["times"][m] for r in ranks)))
        agg[KEYS[m]] = slowest if m == "async_blocked" else agg["bytes"] / slowest / 1e9
    if all("rss_extra" in r for r in ranks):
        agg["rss_extra"] = max(r["rss_extra"] for r in ranks)
    return agg, ""


def run_cpp(world, args):
    """`megackpt bench mega --json` of the same interpreter's installation (the
    engine the native rows use): (results, None), or (None, why)."""
    scripts = sysconfig.get_path("scripts")
    exe = os.path.join(scripts, "megackpt")
    if not os.access(exe, os.X_OK):
        exe = shutil.which("megackpt")
    if exe is None:
        return None, f"no megackpt in {scripts} or on PATH"
    cmd = [exe, "bench", "mega", "--size", str(args.size), "--reps", str(args.reps),
           "--threads", str(args.threads), "--dir", args.dir, "--json"]
    env = None
    if world > 1 and shutil.which("mpirun"):
        cmd, env = mpirun(world, cmd + ["--backend", "mpi"])  # the native rows' processes
    else:
        cmd += ["--world-size", str(world)]
    r = subprocess.run(cmd, capture_output=True, text=True, env=env)
    try:
        return json.loads(r.stdout), None
    except ValueError:
        lines = (r.stderr or r.stdout).strip().splitlines()
        return None, f"{exe} exited {r.returncode}: " + (lines[-1] if lines else "no output")


def write_rounds(path, rounds):
    """The rounds so far as JSON ({"system/wN": [round values]}), replacing `path`
    atomically: a reader never sees half a file."""
    tmp = path + ".tmp"
    with open(tmp, "w") as f:
        json.dump({f"{s}/w{w}": v for (s, w), v in rounds.items()}, f, indent=1)
    os.replace(tmp, path)


def read_rounds(path):
    """(rounds, worlds, systems) of a --json file: the inverse of write_rounds, with
    the worlds and systems in the order a run lists them."""
    try:
        with open(path) as f:
            data = json.load(f)
    except (OSError, ValueError) as e:
        raise SystemExit(f"{path}: cannot read the rounds: {e}") from None
    if not isinstance(data, dict):
        raise SystemExit(f"{path}: not a bench_dcp.py --json file (no 'system/wN' keys)")
    rounds = {}
    for key, values in data.items():
        system, _, world = key.rpartition("/w")
        if not system or not world.isdigit() or not isinstance(values, list):
            raise SystemExit(f"{path}: {key!r} is not a 'system/wN' list of rounds "
                             "(not a bench_dcp.py --json file?)")
        rounds[(system, int(world))] = values
    known = SYSTEMS + ["cpp"]
    names = {s for s, _ in rounds}
    systems = [s for s in known if s in names] + sorted(names - set(known))
    return rounds, sorted({w for _, w in rounds}), systems


def not_run(system, world):
    """Why `system` has no rows at `world` by design, or None."""
    if world > 1 and system == "tp-mega":
        return "seed defect 1: ranks overwrite model.mega"
    if world > 1 and system == "torch-hf":
        return "world 1 only"
    return None


def spread(values, fmt="{:.2f}"):
    """'median [min, max]' of a list (one value: just it; none: '-')."""
    if not values:
        return "-"
    if len(values) == 1:
        return fmt.format(values[0])
    return (fmt.format(statistics.median(values)) + " [" + fmt.format(min(values)) + ", "
            + fmt.format(max(values)) + "]")


# Ratio goals (issue 12): (ours, theirs, metric, goal); "higher is better" for GB/s.
GOALS = [("mega-dcp", "torch-fs", "save_gbps", 1.5), ("mega-dcp", "torch-fs", "save_nosync_gbps", 3),
         ("mega-dcp", "torch-fs", "load_gbps", 3), ("mega-dcp", "tp-mega", "save_nosync_gbps", 5),
         ("mega-dcp", "tp-mega", "load_gbps", 5)]
# The machine's limit of each metric: the parallel ceiling the cpp row's
# `megackpt bench mega --json` measured in the same round (best of 1, 2 and
# ranks x threads plain writers/readers, the same bytes).
CEILINGS = {"save_gbps": "durable_write_gbps", "save_nosync_gbps": "pagecache_write_gbps",
            "load_gbps": "pagecache_read_gbps"}
SAME_STATE = [("native-rows", "cpp", " [>= 0.95]", "the same state"),
              ("native", "cpp", "", "f32+bf16 state vs the cpp's F32 rows: for information")]


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--size", default="2GiB")
    ap.add_argument("--rounds", type=int, default=5,
                    help="rounds; each runs every system once, in an order rotated per round")
    ap.add_argument("--reps", type=int, default=1, help="measured repetitions per system per round")
    ap.add_argument("--dir", default=os.environ.get("TMPDIR", "/tmp"))
    ap.add_argument("--worlds", default="1,2")
    ap.add_argument("--threads", type=int, default=2, help="I/O threads per rank (native, mega-dcp, cpp)")
    ap.add_argument("--systems", default=",".join(SYSTEMS + ["cpp"]))
    ap.add_argument("--json", help="also write every round's values to this file (rewritten after "
                    "each round, so an interrupted run keeps the rounds it finished)")
    ap.add_argument("--report", metavar="FILE",
                    help="print the tables of a --json file (of a finished or interrupted run) "
                    "and exit; nothing is measured")
    ap.add_argument("--worker")
    ap.add_argument("--world", type=int, default=1)
    ap.add_argument("--rank", type=int, default=0)
    args = ap.parse_args()
    args.size = parse_size(str(args.size))
    if args.worker:
        args.system = args.worker
        worker(args)
        if "torch.distributed" in sys.modules and sys.modules["torch.distributed"].is_initialized():
            # gloo's threads may abort a finalizing interpreter (tests/python/dcp_worker.py,
            # exit_without_finalizing): the results are printed, end here.
            sys.stdout.flush()
            sys.stderr.flush()
            os._exit(0)
        return None
    if args.report:
        rounds, worlds, systems = read_rounds(args.report)
        print(f"{args.report}: {max((len(v) for v in rounds.values()), default=0)} round(s)")
        report(rounds, {}, worlds, systems)
        return None
    worlds = [int(w) for w in args.worlds.split(",")]
    systems = args.systems.split(",")
    print(f"state {args.size / 1e9:.2f} GB (f32 + bf16, {TENSOR_BYTES >> 20} MiB tensors), "
          f"{args.rounds} rounds x {args.reps} rep(s) after a warm-up, {args.threads} I/O threads "
          f"per rank, dir {args.dir}"
          + ("" if fresh_writes_primed() else "; MEGACKPT_BENCH_NO_PRIME: fresh writes not primed"),
          flush=True)
    rounds = {}  # (system, world) -> [round values]
    failed = {}  # (system, world) -> why its last run failed
    for r in range(args.rounds):
        for world in worlds:
            order = systems[r % len(systems):] + systems[:r % len(systems)]
            for system in order:
                if not_run(system, world):
                    continue
                agg, why = run_cpp(world, args) if system == "cpp" else run_system(system, world, args)
                if agg is None:
                    failed[(system, world)] = why
                    print(f"  round {r + 1}: {system} w{world} failed: {why}", flush=True)
                    continue
                rounds.setdefault((system, world), []).append(agg)
            print(f"  round {r + 1}/{args.rounds}, world {world} done", flush=True)
            if args.json:  # after every round, so an interrupted run keeps what it measured
                write_rounds(args.json, rounds)
    for world in worlds:  # the checkpoints the workers left (about --size each)
        for system in systems:
            shutil.rmtree(os.path.join(args.dir, f"bench-{system}-w{world}"), ignore_errors=True)
    report(rounds, failed, worlds, systems)


def report(rounds, failed, worlds, systems):
    """Prints the tables: per system and world the median [min, max] over the rounds,
    then the paired ratios against the goals and the ceilings. `rounds`:
    (system, world) -> [round values]; `failed`: (system, world) -> why its run failed.
    A system that does not run at a world by design (not_run) gets an n/a row."""

    def series(system, world, key):
        return [a[key] for a in rounds.get((system, world), []) if a.get(key)]

    print("\nmedian [min, max] over the rounds; GB/s (decimal), async: seconds the caller is blocked")
    print(f"{'system':<12} {'world':>5} {'durable':>20} {'no-sync':>20} {'load':>20} "
          f"{'async blocked s':>24} {'extra RSS MiB':>14}")
    for world in worlds:
        for system in systems:
            why = not_run(system, world) or (
                f"failed: {failed[(system, world)]}" if (system, world) in failed else None)
            if why and (system, world) not in rounds:
                print(f"{system:<12} {world:>5}  n/a ({why})")
                continue
            cols = [spread(series(system, world, k)) for k in
                    ("save_gbps", "save_nosync_gbps", "load_gbps")]
            blocked = spread(series(system, world, "async_blocked_seconds"), "{:.3f}")
            rss = [a["rss_extra"] for a in rounds.get((system, world), []) if "rss_extra" in a]
            print(f"{system:<12} {world:>5} {cols[0]:>20} {cols[1]:>20} {cols[2]:>20} {blocked:>24} "
                  f"{rss_text(max(rss), unit='') if rss else '-':>14}")
    print("\nratios, paired by round (ours / theirs of the same round): median [min, max]; "
          "goal in brackets")

    def paired(a, b, world, key, b_key=None):
        """Per round: a's `key` / b's `b_key` (default: the same key)."""
        b_key = b_key or key
        out = []
        for x, y in zip(rounds.get((a, world), []), rounds.get((b, world), [])):
            if x.get(key) and y.get(b_key):
                out.append(x[key] / y[b_key])
        return out

    def best(a, b, world, key):
        """a's best round / b's best round (None without both). This VM's page-cache
        speed flips between two modes from one run to the next (docs/benchmarks.md),
        so a pair of rounds can hold one system's slow mode and the other's fast one;
        each system's best round is its fast mode."""
        xs, ys = series(a, world, key), series(b, world, key)
        return max(xs) / max(ys) if xs and ys else None

    for world in worlds:
        for ours, theirs, key, goal in GOALS:
            ratio = paired(ours, theirs, world, key)
            if ratio:
                # The round's ceiling / theirs: the most any system could beat them by then.
                most = paired("cpp", theirs, world, CEILINGS[key], key)
                limit = (f"; the machine allows at most {spread(most)}x (the same round's "
                         f"{CEILINGS[key][:-5].replace('_', ' ')} ceiling / {theirs})" if most else "")
                print(f"  world {world}: {ours} vs {theirs}, {key[:-5]}: {spread(ratio)}x "
                      f"[>= {goal}x]{limit}; best round / best round "
                      f"{best(ours, theirs, world, key):.2f}x")
        for ours in ("mega-dcp", "native"):
            parts = []
            for key, ceiling in CEILINGS.items():
                vs = paired(ours, "cpp", world, key, ceiling)
                if vs:
                    parts.append(f"{key[:-5]} {spread(vs)}")
            if parts:
                print(f"  world {world}: {ours} / the same round's ceiling: " + ", ".join(parts))
        for system, ref, goal, what in SAME_STATE:
            parts = [f"{key[:-5]} {spread(paired(system, ref, world, key))}{goal}"
                     for key in ("save_gbps", "save_nosync_gbps", "load_gbps")
                     if paired(system, ref, world, key)]
            if parts:
                print(f"  world {world}: {system} / {ref} throughput ({what}): " + ", ".join(parts))
            bests = [f"{key[:-5]} {b:.2f}" for key in ("save_gbps", "save_nosync_gbps", "load_gbps")
                     if (b := best(system, ref, world, key)) is not None]
            if bests:
                print(f"  world {world}: {system} / {ref}, best round / best round: " + ", ".join(bests))
    rss = [f"world {w}: {rss_text(max(a['rss_extra'] for a in rounds[('native', w)]))}"
           for w in worlds if rounds.get(("native", w)) and
           all("rss_extra" in a for a in rounds[("native", w)])]
    if rss:
        print("  native extra RSS (peak above the RSS before a durable save), " + ", ".join(rss)
              + " [<= 256 MiB for 2 GiB]")


if __name__ == "__main__":
    main()
