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
