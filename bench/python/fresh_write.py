"""The last step of a timed write's untimed preparation, shared by the Python benches
(bench/python/bench_dcp.py, bench/torch_peer.py); the C++ benches do the same in
bench/bench_util.cc (PrimeFreeMemory).

On a VM whose balloon reports free memory to the host (docs/benchmarks.md, "Page-cache
writes on a VM with free page reporting"), page-cache pages that have been free for more
than about half a second lose their host backing, and a buffered write into them runs at
the host's page-fault rate (about 0.5 GB/s on the development VM, against 6-10 GB/s).
Writing the timed write's size to a scratch file and removing it right before the timed
write hands that write pages that were in use a moment ago, for every system alike.
"""
import os

_CHUNK = memoryview(bytes(8 << 20))


def fresh_writes_primed():
    """False when MEGACKPT_BENCH_NO_PRIME is set: prime_free_memory then does nothing."""
    return not os.environ.get("MEGACKPT_BENCH_NO_PRIME")


def prime_free_memory(scratch, nbytes):
    """Writes `nbytes` through the page cache to the file `scratch`, then removes it.

    Call it last, right before the timed write, with the bytes that write will write.
    Skipped when `nbytes` is 0 or MEGACKPT_BENCH_NO_PRIME is set (to measure the
    unprimed machine). Best effort: an OSError is ignored.
    """
    if nbytes <= 0 or not fresh_writes_primed():
        return
    try:
        fd = os.open(scratch, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    except OSError:
        return
    try:
        off = 0
        while off < nbytes:
            off += os.pwrite(fd, _CHUNK[:min(len(_CHUNK), nbytes - off)], off)
    except OSError:
        pass
    finally:
        os.close(fd)
        try:
            os.unlink(scratch)
        except OSError:
            pass
