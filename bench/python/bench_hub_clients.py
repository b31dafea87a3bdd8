#!/usr/bin/env python3
"""Hub transfer benchmark: the real hf_xet client vs megackpt push/pull against
the same megahub on loopback, next to the loopback TCP ceiling, in one run.

    python3 bench/python/bench_hub_clients.py [--size 1GiB] [--reps 3] [--dir /tmp]

Rows (GB/s = 1e9 bytes per second of file content; median, min and max of
--reps after a dropped warm-up repetition):
  tcp ceiling       one plain TCP stream over loopback between two processes
                    (1 MiB sends from a reused buffer into a reused receive
                    buffer): what any HTTP upload or download could reach
  hf_xet upload     huggingface_hub.upload_file (HF_ENDPOINT = megahub), which
                    chunks, hashes and uploads through hf_xet
  hf_xet download   huggingface_hub.hf_hub_download (reconstruction + xorb
                    range fetches through hf_xet) into an empty cache
  megackpt push     `megackpt push` of a folder holding the file
  megackpt pull     `megackpt pull` into an empty folder
Every upload goes to a fresh megahub root (nothing deduplicates against an
earlier repetition), every download into an empty folder; the file is random
bytes (incompressible: every byte travels). hf_xet steps run in their own
interpreter (tests/python/hub_client_worker.py) and are timed around the
client call (imports excluded); megackpt steps are timed as whole processes.
Ratios: each row / the TCP ceiling, and megackpt / hf_xet for the same
direction.

Needs megahub and megackpt on PATH (or --megahub/--megackpt) and huggingface_hub
+ hf_xet importable. Do not run it while other jobs load the machine.
"""
import argparse
import json
import os
import re
import shutil
import socket
import statistics
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
WORKER = os.path.join(HERE, "..", "..", "tests", "python", "hub_client_worker.py")
BLOCK = 1 << 20


def parse_size(text):
    units = {"k": 1e3, "m": 1e6, "g": 1e9, "kib": 1 << 10, "mib": 1 << 20, "gib": 1 << 30}
    t = text.strip().lower()
    t = t if t.endswith("ib") else t.rstrip("b")
    for u in sorted(units, key=len, reverse=True):
        if t.endswith(u):
            return int(float(t[: -len(u)]) * units[u])
    return int(t)


# ---- the loopback TCP ceiling ----

def _tcp_receiver(port_file, size):
    """Child process: accept one connection, receive `size` bytes into a reused buffer."""
    srv = socket.socket()
    srv.bind(("127.0.0.1", 0))
    srv.listen(1)
    with open(port_file, "w") as f:
        f.write(str(srv.getsockname()[1]))
    conn, _ = srv.accept()
    buf = bytearray(BLOCK)
    view = memoryview(buf)
    got = 0
    while got < size:
        n = conn.recv_into(view)
        if n == 0:
            break
        got += n
    conn.sendall(b"k")
    conn.close()


def tcp_ceiling(size, workdir):
    port_file = os.path.join(workdir, "tcp.port")
    if os.path.exists(port_file):
        os.remove(port_file)
    child = subprocess.Popen([sys.executable, __file__, "--tcp-receiver", port_file, str(size)])
    deadline = time.time() + 30
    while not (os.path.exists(port_file) and os.path.getsize(port_file)) and time.time() < deadline:
        time.sleep(0.01)
    with open(port_file) as f:
        port = int(f.read())
    block = os.urandom(BLOCK)
    s = socket.create_connection(("127.0.0.1", port))
    t = time.perf_counter()
    sent = 0
    while sent < size:
        n = min(BLOCK, size - sent)
        s.sendall(block[:n] if n < BLOCK else block)
        sent += n
    s.recv(1)  # the receiver has every byte
    elapsed = time.perf_counter() - t
    s.close()
    child.wait(timeout=60)
    return elapsed


# ---- megahub ----

class Hub:
    def __init__(self, megahub, root):
        self.root = root
        os.makedirs(root, exist_ok=True)
        self.token = subprocess.run([megahub, "token", "create", "--root", root, "--scope", "write"],
                                    check=True, capture_output=True, text=True).stdout.split()[-1]
        self.log = open(os.path.join(root, "serve.log"), "w")
        self.proc = subprocess.Popen([megahub, "serve", "--root", root, "--port", "0"], stdout=self.log,
                                     stderr=subprocess.STDOUT)
        deadline = time.time() + 30
        port = None
        while port is None and time.time() < deadline:
            time.sleep(0.05)
            with open(os.path.join(root, "serve.log")) as f:
                m = re.search(r"listening on 127\.0\.0\.1:(\d+)", f.read())
            port = int(m.group(1)) if m else None
        if port is None:
            raise SystemExit("megahub did not start: see " + os.path.join(root, "serve.log"))
        self.endpoint = f"http://127.0.0.1:{port}"

    def stop(self):
        self.proc.terminate()
        self.proc.wait(timeout=60)
        self.log.close()


def client_env(hub, home):
    env = dict(os.environ)
    env.update({
        "HF_ENDPOINT": hub.endpoint, "HF_TOKEN": hub.token, "HF_HOME": os.path.join(home, "hf"),
        "HF_XET_CACHE": os.path.join(home, "xet"), "HF_HUB_DISABLE_TELEMETRY": "1",
        "HF_HUB_DISABLE_PROGRESS_BARS": "1",
        "MEGA_ENDPOINT": hub.endpoint, "MEGA_TOKEN": hub.token, "MEGA_HOME": os.path.join(home, "mega"),
        "MEGA_HUB_DISABLE_PROGRESS_BARS": "1",
    })
    return env


def worker(op, env, **args):
    p = subprocess.run([sys.executable, WORKER, op, json.dumps(args)], capture_output=True, text=True, env=env)
    if p.returncode != 0:
        raise SystemExit(f"{op} failed:\n{p.stderr[-3000:]}")
    return json.loads(p.stdout.strip().splitlines()[-1])


def timed_process(args, env):
    t = time.perf_counter()
    p = subprocess.run(args, capture_output=True, text=True, env=env)
    elapsed = time.perf_counter() - t
    if p.returncode != 0:
        raise SystemExit(f"{' '.join(args)} failed:\n{p.stderr[-3000:]}")
    return elapsed


def one_round(size, work, megahub, megackpt, rep, src_dir, src_file):
    """One repetition of every row: {row: seconds}."""
    out = {"tcp ceiling": tcp_ceiling(size, work)}
    # hf_xet: upload to a fresh hub, download into an empty cache.
    hub = Hub(megahub, os.path.join(work, f"hub-hf-{rep}"))
    try:
        home = os.path.join(work, f"home-hf-{rep}")
        env = client_env(hub, home)
        worker("hf_create_repo", env, repo="bench/hf")
        out["hf_xet upload"] = worker("hf_upload_file", env, repo="bench/hf", path="big.bin",
                                      local=src_file)["seconds"]
        env["HF_XET_CACHE"] = os.path.join(home, "xet-download")
        out["hf_xet download"] = worker("hf_hub_download", env, repo="bench/hf", path="big.bin",
                                        cache_dir=os.path.join(home, "cache"))["seconds"]
    finally:
        hub.stop()
        shutil.rmtree(hub.root, ignore_errors=True)
        shutil.rmtree(os.path.join(work, f"home-hf-{rep}"), ignore_errors=True)
    # megackpt: push to a fresh hub, pull into an empty folder.
    hub = Hub(megahub, os.path.join(work, f"hub-mk-{rep}"))
    try:
        env = client_env(hub, os.path.join(work, f"home-mk-{rep}"))
        out["megackpt push"] = timed_process([megackpt, "push", "-q", src_dir, "mega://bench/mk", "--json"], env)
        dst = os.path.join(work, f"pulled-{rep}")
        out["megackpt pull"] = timed_process([megackpt, "pull", "-q", "mega://bench/mk", dst, "--json"], env)
        shutil.rmtree(dst, ignore_errors=True)
    finally:
        hub.stop()
        shutil.rmtree(hub.root, ignore_errors=True)
    return out


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--size", default="1GiB", help="file size (default 1GiB)")
    ap.add_argument("--reps", type=int, default=3, help="measured repetitions after one warm-up (default 3)")
    ap.add_argument("--dir", default=None, help="work folder (default: a new temp folder)")
    ap.add_argument("--megahub", default=shutil.which("megahub"))
    ap.add_argument("--megackpt", default=shutil.which("megackpt"))
    ap.add_argument("--json", action="store_true", help="print the results as JSON too")
    ap.add_argument("--tcp-receiver", nargs=2, help=argparse.SUPPRESS)
    a = ap.parse_args()
    if a.tcp_receiver:
        _tcp_receiver(a.tcp_receiver[0], int(a.tcp_receiver[1]))
        return
    if not a.megahub or not a.megackpt:
        raise SystemExit("megahub and megackpt must be on PATH (or give --megahub / --megackpt)")
    size = parse_size(a.size)
    work = tempfile.mkdtemp(prefix="bench-hub-clients-", dir=a.dir)
    try:
        src_dir = os.path.join(work, "src")
        os.makedirs(src_dir)
        src_file = os.path.join(src_dir, "big.bin")
        with open(src_file, "wb") as f:
            left = size
            while left:
                n = min(left, 64 << 20)
                f.write(os.urandom(n))
                left -= n
        rounds = [one_round(size, work, a.megahub, a.megackpt, rep, src_dir, src_file)
                  for rep in range(a.reps + 1)][1:]
    finally:
        shutil.rmtree(work, ignore_errors=True)
    rows = ["tcp ceiling", "hf_xet upload", "megackpt push", "hf_xet download", "megackpt pull"]
    rates = {r: sorted(size / x[r] / 1e9 for x in rounds) for r in rows}
    med = {r: statistics.median(v) for r, v in rates.items()}
    print(f"hub transfers of one {size / (1 << 20):.0f} MiB file of random bytes, megahub on loopback, "
          f"{a.reps} repetitions after a warm-up (GB/s: median [min, max])")
    print(f"{'row':<17} {'GB/s':>24}  {'/ tcp':>6}  {'vs hf_xet':>9}")
    for r in rows:
        vs = ""
        if r == "megackpt push":
            vs = f"{med[r] / med['hf_xet upload']:.2f}x"
        elif r == "megackpt pull":
            vs = f"{med[r] / med['hf_xet download']:.2f}x"
        rng = f"{med[r]:.3f} [{rates[r][0]:.3f}, {rates[r][-1]:.3f}]"
        print(f"{r:<17} {rng:>24}  {med[r] / med['tcp ceiling']:>5.2f}x  {vs:>9}")
    if a.json:
        print(json.dumps({"bytes": size, "reps": a.reps, "gb_per_s": rates, "median": med}))


if __name__ == "__main__":
    main()
