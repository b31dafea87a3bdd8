"""`megackpt push` killed at random points, then run again (issue 16).

For each trial a fresh megahub on loopback receives a push of ~184 MiB in
four files (the largest spans three xorbs); the push is SIGKILLed once the server has received a random
fraction of the bytes (polling its /api/stats), then the same push is run to
completion. Checked at the server:

* the resumed push sends at most 1.1 x the bytes the first push had not yet
  stored (plus a little JSON/shard/lookup overhead): what the hub holds is
  never sent again;
* after completion and a GC the hub holds no more xorb bytes than a clean
  push of the same folder (nothing left behind that the resumed push did not
  reuse), and a pull gives back the same bytes.
"""
import json
import os
import random
import signal
import subprocess
import time
import urllib.request

import pytest

from conftest import running_megahub, tool

MIB = 1 << 20
SIZES = [150 * MIB, 30 * MIB + 12345, 1 * MIB, 3 * MIB]
OVERHEAD = 1 * MIB  # chunk lookups (32 B per chunk), shards, commit JSON


@pytest.fixture(scope="module")
def folder(tmp_path_factory):
    import numpy as np
    d = tmp_path_factory.mktemp("push-src")
    rng = np.random.default_rng(1616)
    for i, size in enumerate(SIZES):
        (d / f"shard-{i}.bin").write_bytes(rng.bytes(size))
    (d / "index.json").write_text("{\"shards\": 4}\n")
    return d


def stats(endpoint):
    with urllib.request.urlopen(endpoint + "/api/stats", timeout=10) as r:
        return json.load(r)


def xorb_bytes(root):
    total = 0
    for dirpath, _, files in os.walk(os.path.join(root, "cas", "xorbs")):
        total += sum(os.path.getsize(os.path.join(dirpath, f)) for f in files)
    return total


def push(folder, endpoint, token, **popen):
    env = dict(os.environ, MEGA_ENDPOINT=endpoint, MEGA_TOKEN=token)
    return subprocess.Popen([tool("megackpt"), "push", "-q", str(folder), "mega://org/ckpt", "--json"],
                            env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, **popen)


def run_push(folder, endpoint, token):
    p = push(folder, endpoint, token)
    out, err = p.communicate(timeout=300)
    assert p.returncode == 0, err
    return json.loads(out)


@pytest.fixture(scope="module")
def clean_xorb_bytes(folder, tmp_path_factory):
    """Xorb bytes a hub holds after one uninterrupted push of `folder`."""
    with running_megahub(str(tmp_path_factory.mktemp("clean-hub"))) as (endpoint, token, root):
        run_push(folder, endpoint, token)
        return xorb_bytes(root)


TOTAL = sum(SIZES)


@pytest.mark.parametrize("trial", range(5))
def test_killed_push_resumes_without_resending_or_leftovers(folder, clean_xorb_bytes, tmp_path, trial):
    rnd = random.Random(16_000 + trial)
    kill_at = int(TOTAL * rnd.uniform(0.05, 0.95))
    with running_megahub(str(tmp_path / "hub")) as (endpoint, token, root):
        first = push(folder, endpoint, token)
        deadline = time.time() + 120
        while time.time() < deadline and first.poll() is None:
            if stats(endpoint)["request_body_bytes"] >= kill_at:
                break
            time.sleep(0.002)
        killed = first.poll() is None
        if killed:
            first.send_signal(signal.SIGKILL)
        first.wait(timeout=30)
        # Requests the server had fully received finish storing their xorbs:
        # wait until the store stops changing.
        stored_first, quiet_since = xorb_bytes(root), time.time()
        while time.time() - quiet_since < 0.5:
            time.sleep(0.05)
            now = xorb_bytes(root)
            if now != stored_first:
                stored_first, quiet_since = now, time.time()
        not_stored = clean_xorb_bytes - stored_first
        before = stats(endpoint)
        result = run_push(folder, endpoint, token)
        after = stats(endpoint)
        sent = after["request_body_bytes"] - before["request_body_bytes"]
        print(f"trial {trial}: killed={killed} at {kill_at / MIB:.1f} MiB received; first push stored "
              f"{stored_first / MIB:.1f} MiB of {clean_xorb_bytes / MIB:.1f}; resumed push sent "
              f"{sent / MIB:.1f} MiB for {not_stored / MIB:.1f} MiB not yet stored")
        assert sent <= 1.1 * not_stored + OVERHEAD
        assert result["uploaded_bytes"] <= 1.1 * not_stored + OVERHEAD
        # GC (no grace: everything live is committed now) leaves exactly the
        # content of the commit: nothing the resumed push failed to reuse.
        subprocess.run([tool("megahub"), "gc", "--root", root, "--grace-seconds", "0"],
                       check=True, capture_output=True, text=True)
        held = xorb_bytes(root)
        print(f"trial {trial}: after gc the hub holds {held / MIB:.2f} MiB of xorbs "
              f"(a clean push: {clean_xorb_bytes / MIB:.2f})")
        assert held <= clean_xorb_bytes * 1.002
        out = tmp_path / "pulled"
        env = dict(os.environ, MEGA_ENDPOINT=endpoint, MEGA_TOKEN=token)
        subprocess.run([tool("megackpt"), "pull", "-q", "mega://org/ckpt", str(out)], env=env, check=True,
                       capture_output=True)
        for name in sorted(os.listdir(folder)):
            assert (out / name).read_bytes() == (folder / name).read_bytes(), name
