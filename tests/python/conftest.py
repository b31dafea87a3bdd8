"""Fixtures of the Python test suite (run by scripts/test.sh after `pip install .`;
in-tree: PYTHONPATH=build/python PATH=build/tools:$PATH python3 -m pytest tests/python).

Everything writes inside pytest's temp folders; servers listen on loopback only.
"""
import contextlib
import os
import re
import shutil
import subprocess
import sys
import time

import pytest

HERE = os.path.dirname(os.path.abspath(__file__))


def tool(name):
    """Path of the `megackpt` / `megahub` executable installed with the package."""
    path = shutil.which(name)
    if path is None:
        candidate = os.path.join(os.path.dirname(sys.executable), name)
        path = candidate if os.path.exists(candidate) else None
    if path is None:
        pytest.fail(f"{name} is not installed next to this interpreter or on PATH")
    return path


@contextlib.contextmanager
def running_megahub(root, extra_args=()):
    """Runs `megahub serve --root ROOT --port 0` (a fresh write token); yields
    (endpoint, token, root). Stops it (SIGTERM, then waits) on exit."""
    token = subprocess.run([tool("megahub"), "token", "create", "--root", root, "--scope", "write"],
                           check=True, capture_output=True, text=True).stdout.strip().split()[-1]
    log_path = os.path.join(root, "serve.log")
    log = open(log_path, "w")
    proc = subprocess.Popen([tool("megahub"), "serve", "--root", root, "--port", "0", *extra_args],
                            stdout=log, stderr=subprocess.STDOUT)
    port = None
    deadline = time.time() + 30
    while port is None and time.time() < deadline and proc.poll() is None:
        time.sleep(0.05)
        with open(log_path) as f:
            m = re.search(r"listening on 127\.0\.0\.1:(\d+)", f.read())
        if m:
            port = int(m.group(1))
    if port is None:
        proc.kill()
        proc.wait()
        with open(log_path) as f:
            pytest.fail("megahub did not report its port: " + f.read())
    try:
        yield f"http://127.0.0.1:{port}", token, root
    finally:
        proc.terminate()
        proc.wait(timeout=30)
        log.close()


@pytest.fixture(scope="session")
def megahub(tmp_path_factory):
    """A `megahub serve` on a loopback port with a write token: (endpoint, token)."""
    with running_megahub(str(tmp_path_factory.mktemp("hub"))) as (endpoint, token, _):
        yield endpoint, token


def run_python(code_or_args, env=None, timeout=300):
    """Runs a Python child (same interpreter); returns CompletedProcess."""
    args = [sys.executable] + (["-c", code_or_args] if isinstance(code_or_args, str) else code_or_args)
    full_env = dict(os.environ)
    full_env.update(env or {})
    return subprocess.run(args, capture_output=True, text=True, env=full_env, timeout=timeout)


def resident_fraction(path):
    """The fraction of `path`'s pages the page cache holds now (mincore over a
    read-only mapping, which faults nothing in): about 1 right after a buffered
    write, about 0 after a direct-I/O one."""
    import ctypes
    import mmap
    size = os.path.getsize(path)
    if size == 0:
        return 0.0
    libc = ctypes.CDLL(None, use_errno=True)
    libc.mmap.restype = ctypes.c_void_p
    libc.mmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int, ctypes.c_int, ctypes.c_int,
                          ctypes.c_long]
    libc.munmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t]
    libc.mincore.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_char_p]
    fd = os.open(path, os.O_RDONLY)
    try:
        addr = libc.mmap(None, size, mmap.PROT_READ, mmap.MAP_SHARED, fd, 0)
    finally:
        os.close(fd)
    if addr in (None, ctypes.c_void_p(-1).value):
        raise OSError(ctypes.get_errno(), f"mmap {path}")
    pages = (size + mmap.PAGESIZE - 1) // mmap.PAGESIZE
    vec = ctypes.create_string_buffer(pages)
    try:
        if libc.mincore(addr, size, vec) != 0:
            raise OSError(ctypes.get_errno(), f"mincore {path}")
    finally:
        libc.munmap(addr, size)
    return sum(b & 1 for b in vec.raw) / pages


def direct_io_works(folder):
    """Whether the file system of the existing `folder` takes O_DIRECT writes
    (tmpfs does not; there direct_io saves are buffered by design). The probe
    file is removed again."""
    import mmap
    probe = os.path.join(folder, "direct-io-probe")
    try:
        fd = os.open(probe, os.O_WRONLY | os.O_CREAT | os.O_DIRECT, 0o600)
    except OSError:
        return False
    try:
        block = mmap.mmap(-1, 4096)  # page-aligned
        return os.pwrite(fd, block, 0) == 4096
    except OSError:
        return False
    finally:
        os.close(fd)
        os.remove(probe)


def assert_saved_around_the_page_cache(direct_dir, buffered_dir=None):
    """The data files (.mega / .distcp) of `direct_dir`, saved with direct_io,
    have (almost) no pages cached; those of `buffered_dir` (the same state saved
    buffered), to show the check sees the difference, almost all. Call it right
    after the saves, before anything reads the files. Does nothing where the
    file system refuses O_DIRECT."""
    if not direct_io_works(str(direct_dir)):
        return
    def data_files(d):
        return sorted(os.path.join(d, n) for n in os.listdir(d) if n.endswith((".mega", ".distcp")))
    files = data_files(direct_dir)
    assert files, f"no data files in {direct_dir}"
    for f in files:
        assert resident_fraction(f) < 0.05, f"{f}: a direct-I/O save left its pages in the page cache"
    for f in data_files(buffered_dir) if buffered_dir else []:
        assert resident_fraction(f) > 0.95, f"{f}: a buffered save's pages are not in the page cache"
