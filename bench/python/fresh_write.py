"""The last step of a timed write's untimed preparation, shared by the Python benches
(bench/python/bench_dcp.py, bench/torch_peer.py); the C++ benches do the same in
bench/bench_util.cc (MarkFreedMemory, PrimeFreeMemory).

On a VM whose balloon reports free memory to the host (docs/benchmarks.md, "Page-cache
writes on a VM with free page reporting"), a reporting pass runs about 2 s after memory
is freed (removing the previous checkpoint, say) and hands what is free then to the host;
every page the guest takes from that memory afterwards costs a host page fault, and a
buffered write into it runs at 0.1-0.5 GB/s instead of 6-10. So the preparation:

1. removes the old files, then takes ``mark = mark_freed_memory()``;
2. syncs;
3. calls ``prime_free_memory(scratch, nbytes, mark)`` last: it writes the timed write's
   size to a scratch file, waits (holding those pages) until the pass armed by step 1
   has run, and removes the file. The timed write that follows at once gets pages that
   were in use a moment ago, and the next pass (armed by that removal) is ~2 s away.
"""
import os
import time

_CHUNK = memoryview(bytes(8 << 20))
_PASSES = "/sys/module/page_reporting/parameters/passes"  # this VM's kernel; absent upstream
_BALLOONS = "/sys/bus/virtio/drivers/virtio_balloon"
_DELAY = 2.3  # the pass comes 2.0-2.05 s after a free and takes ~0.13 s
_CAP = 3.0  # the longest wait, from the mark
_MIN_BYTES = 64 << 20  # smaller writes skip the wait
_reporting_on = None


def fresh_writes_primed():
    """False when MEGACKPT_BENCH_NO_PRIME is set: prime_free_memory then does nothing."""
    return not os.environ.get("MEGACKPT_BENCH_NO_PRIME")


def free_page_reporting_on():
    """True when a virtio balloon reports free pages to the host (feature bit 5)."""
    global _reporting_on
    if _reporting_on is None:
        _reporting_on = False
        try:
            devices = os.listdir(_BALLOONS)
        except OSError:
            devices = []
        for dev in devices:
            try:
                with open(os.path.join(_BALLOONS, dev, "features")) as f:
                    bits = f.read().strip()
            except OSError:
                continue
            if len(bits) > 5 and bits[5] == "1":
                _reporting_on = True
    return _reporting_on


def _passes():
    try:
        with open(_PASSES) as f:
            return int(f.read().split()[0])
    except (OSError, ValueError, IndexError):
        return None


def mark_freed_memory():
    """Call right after removing the previous run's files: (monotonic seconds, pass count)."""
    return (time.monotonic(), _passes() if free_page_reporting_on() else None)


def _await_reporting_pass(mark):
    since, passes = mark
    while time.monotonic() - since < _CAP:
        if passes is not None:
            now = _passes()
            if now is not None and now != passes:
                return
        elif time.monotonic() - since >= _DELAY:
            return
        time.sleep(0.002)


def prime_free_memory(scratch, nbytes, mark=None):
    """Writes `nbytes` through the page cache to the file `scratch`, waits for the free
    page reporting pass armed before `mark` (when reporting is on and `nbytes` is at
    least 64 MiB), then removes the file.

    Call it last, right before the timed write, with the bytes that write will write and
    the mark taken right after the old files were removed (None: taken now). Skipped when
    `nbytes` is 0 or MEGACKPT_BENCH_NO_PRIME is set (to measure the unprimed machine).
    Best effort: an OSError is ignored.
    """
    if nbytes <= 0 or not fresh_writes_primed():
        return
    if mark is None:
        mark = mark_freed_memory()
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
        if nbytes >= _MIN_BYTES and free_page_reporting_on():
            _await_reporting_pass(mark)
        try:
            os.unlink(scratch)
        except OSError:
            pass
