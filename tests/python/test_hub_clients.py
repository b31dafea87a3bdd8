"""The real PyPI hub clients against a real megahub on a loopback port.

* megatensors (its MegaApi / MegaFileSystem, which upload and download
  through hf_xet): a 200 MiB file uploaded, downloaded whole and by byte
  range, added to a bucket, listed and downloaded from it; a second version
  with 10% of its bytes changed uploads about 10% (counted at the server).
* huggingface_hub (HF_ENDPOINT at megahub): create_repo, upload_file,
  upload_folder, list_repo_files, hf_hub_download, snapshot_download.

Every client step runs in its own process (hub_client_worker.py) with its own
Xet cache, so nothing is deduplicated on the client side across steps.
Skipped only when the client packages cannot be imported (the reason is the
import error); scripts/test-python.sh installs them from
tests/python/requirements.txt.
"""
import hashlib
import json
import os
import subprocess
import sys
import urllib.request

import pytest

from conftest import HERE, running_megahub

try:
    import hf_xet  # noqa: F401
    import huggingface_hub  # noqa: F401
    import megatensors._hub  # noqa: F401
    _IMPORT_ERROR = None
except Exception as e:  # ImportError, or a broken compiled extension
    _IMPORT_ERROR = f"{type(e).__name__}: {e}"

pytestmark = pytest.mark.skipif(_IMPORT_ERROR is not None,
                                reason=f"hub client packages not installed: {_IMPORT_ERROR}")

MIB = 1 << 20
BIG = 200 * MIB


@pytest.fixture(scope="module")
def hub(tmp_path_factory):
    """A megahub of this module's own (so its byte counters are this module's)."""
    with running_megahub(str(tmp_path_factory.mktemp("clients-hub"))) as h:
        yield h


class Client:
    """Runs hub_client_worker.py steps against `hub` with a private home."""

    def __init__(self, hub, home):
        self.endpoint, self.token, self.root = hub
        self.home = str(home)
        self.steps = 0

    def run(self, op, **args):
        self.steps += 1
        env = dict(os.environ)
        env.update({
            "MEGA_ENDPOINT": self.endpoint, "MEGA_TOKEN": self.token,
            "MEGA_HOME": os.path.join(self.home, "mega"),
            "HF_ENDPOINT": self.endpoint, "HF_TOKEN": self.token,
            "HF_HOME": os.path.join(self.home, "hf"),
            # A new Xet cache per step: no client-side dedup between steps.
            "HF_XET_CACHE": os.path.join(self.home, f"xet-{self.steps}"),
            "HF_HUB_DISABLE_TELEMETRY": "1", "MEGA_HUB_DISABLE_TELEMETRY": "1",
            "HF_HUB_DISABLE_PROGRESS_BARS": "1", "MEGA_HUB_DISABLE_PROGRESS_BARS": "1",
        })
        p = subprocess.run([sys.executable, os.path.join(HERE, "hub_client_worker.py"), op, json.dumps(args)],
                           capture_output=True, text=True, env=env, timeout=600)
        assert p.returncode == 0, f"{op} failed:\n{p.stderr[-4000:]}\nserver log:\n{self.server_log()}"
        return json.loads(p.stdout.strip().splitlines()[-1])

    def stats(self):
        with urllib.request.urlopen(self.endpoint + "/api/stats") as r:
            return json.load(r)

    def cas_bytes(self):
        total = 0
        for dirpath, _, files in os.walk(os.path.join(self.root, "cas")):
            for f in files:
                total += os.path.getsize(os.path.join(dirpath, f))
        return total

    def server_log(self):
        with open(os.path.join(self.root, "serve.log")) as f:
            return "".join(f.readlines()[-40:])


def sha256_file(path):
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(8 * MIB), b""):
            h.update(block)
    return h.hexdigest()


def same_file(a, b):
    return os.path.getsize(a) == os.path.getsize(b) and sha256_file(a) == sha256_file(b)


@pytest.fixture(scope="module")
def big_files(tmp_path_factory):
    """v1: 200 MiB of random bytes; v2: v1 with 10 random 1% regions rewritten (10% of the bytes)."""
    import numpy as np
    d = tmp_path_factory.mktemp("big")
    rng = np.random.default_rng(16)
    data = bytearray(rng.bytes(BIG))
    v1 = str(d / "v1.bin")
    with open(v1, "wb") as f:
        f.write(data)
    region = BIG // 100
    for start in sorted(rng.choice(BIG // region, size=10, replace=False)):
        data[start * region:(start + 1) * region] = rng.bytes(region)
    v2 = str(d / "v2.bin")
    with open(v2, "wb") as f:
        f.write(data)
    return v1, v2


@pytest.fixture(scope="module")
def mt(hub, tmp_path_factory, big_files):
    """megatensors client; the 200 MiB file is uploaded once (org/big, big.bin) before the tests."""
    client = Client(hub, tmp_path_factory.mktemp("mt-home"))
    before = client.stats()
    client.first_upload = client.run("mt_upload", repo="org/big", path="big.bin", local=big_files[0])
    after = client.stats()
    client.first_upload_xorb_bytes = after["xorb_bytes_received"] - before["xorb_bytes_received"]
    return client


def test_megatensors_uploads_a_200_mib_file_through_hf_xet(mt, big_files):
    # Everything went through the Xet routes: the xorbs hold the whole file
    # (random bytes do not compress), nothing came as a blob or multipart part.
    assert len(mt.first_upload["commit"]) == 40
    assert BIG <= mt.first_upload_xorb_bytes <= BIG * 1.01
    assert mt.stats()["blob_bytes_received"] == 0


def test_megatensors_downloads_whole_file(mt, big_files, tmp_path):
    out = mt.run("mt_download", repo="org/big", path="big.bin", cache_dir=str(tmp_path / "cache"))
    assert same_file(out["local"], big_files[0])


@pytest.mark.parametrize("offset,length", [(0, 1), (123_457, 3 * MIB + 11), (BIG - 5000, 5000)])
def test_megatensors_reads_a_byte_range(mt, big_files, tmp_path, offset, length):
    out = str(tmp_path / "range.bin")
    got = mt.run("mt_range", repo="org/big", path="big.bin", offset=offset, length=length, out=out)
    assert got["bytes"] == length
    with open(big_files[0], "rb") as f:
        f.seek(offset)
        want = f.read(length)
    with open(out, "rb") as f:
        assert f.read() == want


def test_megatensors_bucket_add_list_download(mt, big_files, tmp_path):
    small = tmp_path / "small.txt"
    small.write_bytes(b"hello bucket\n")
    before = mt.stats()["xorb_bytes_received"]
    mt.run("mt_bucket_add", bucket="org/bkt", add=[[big_files[0], "ckpt/big.bin"], [str(small), "small.txt"]])
    # The big file's chunks are on the hub already (the repo upload): the
    # server's global dedup answer lets hf_xet skip them.
    assert mt.stats()["xorb_bytes_received"] - before < 2 * MIB
    listed = mt.run("mt_bucket_list", bucket="org/bkt")["files"]
    assert listed == [["ckpt/big.bin", BIG], ["small.txt", small.stat().st_size]]
    dst_big, dst_small = str(tmp_path / "dl-big.bin"), str(tmp_path / "dl-small.txt")
    mt.run("mt_bucket_download", bucket="org/bkt", files=[["ckpt/big.bin", dst_big], ["small.txt", dst_small]])
    assert same_file(dst_big, big_files[0])
    assert open(dst_small, "rb").read() == b"hello bucket\n"


def test_megatensors_second_version_uploads_only_the_changed_tenth(mt, big_files, tmp_path):
    before, cas_before = mt.stats(), mt.cas_bytes()
    mt.run("mt_upload", repo="org/big", path="big.bin", local=big_files[1])
    sent = mt.stats()["xorb_bytes_received"] - before["xorb_bytes_received"]
    grown = mt.cas_bytes() - cas_before
    print(f"second version: {sent} xorb bytes received ({100 * sent / BIG:.1f}%), store grew {grown} bytes")
    # 10% of the bytes changed, in 10 regions; each region also re-sends the
    # chunks its edges cut (~2 x 64 KiB): about 10%, and never the whole file.
    assert 0.09 * BIG <= sent <= 0.13 * BIG
    assert grown <= 0.14 * BIG
    out = mt.run("mt_download", repo="org/big", path="big.bin", cache_dir=str(tmp_path / "cache2"))
    assert same_file(out["local"], big_files[1])


# ---------------------------------------------------------------------------
# huggingface_hub with HF_ENDPOINT at megahub
# ---------------------------------------------------------------------------

@pytest.fixture(scope="module")
def hf(hub, tmp_path_factory):
    client = Client(hub, tmp_path_factory.mktemp("hf-home"))
    client.repo = "org/hf-model"
    url = client.run("hf_create_repo", repo=client.repo)["url"]
    assert url == f"{client.endpoint}/{client.repo}"
    return client


@pytest.fixture(scope="module")
def hf_folder(tmp_path_factory):
    import numpy as np
    d = tmp_path_factory.mktemp("hf-folder")
    (d / "config.json").write_text('{"hidden_size": 8}\n')
    (d / "README.md").write_text("---\nlicense: mit\n---\n# a model\n")
    (d / "weights").mkdir()
    (d / "weights" / "model.safetensors").write_bytes(np.random.default_rng(3).bytes(6 * MIB + 5))
    return d


def test_hf_create_repo_exist_ok(hf):
    assert hf.run("hf_create_repo", repo=hf.repo, exist_ok=True)["url"] == f"{hf.endpoint}/{hf.repo}"


def test_hf_upload_file_and_folder_then_list_and_download(hf, hf_folder, tmp_path):
    before = hf.stats()
    small = hf.run("hf_upload_file", repo=hf.repo, path="notes.txt", bytes="plain text\n")
    assert small["url"].startswith(f"{hf.endpoint}/{hf.repo}/commit/")
    big = tmp_path / "big.bin"
    big.write_bytes(os.urandom(3 * MIB))
    hf.run("hf_upload_file", repo=hf.repo, path="data/big.bin", local=str(big))
    hf.run("hf_upload_folder", repo=hf.repo, folder=str(hf_folder), path_in_repo="model")
    after = hf.stats()
    # Binary files went through the Xet routes (hf_xet), text inline.
    assert after["xorb_bytes_received"] - before["xorb_bytes_received"] >= 9 * MIB
    files = hf.run("hf_list_repo_files", repo=hf.repo)["files"]
    assert sorted(files) == ["data/big.bin", "model/README.md", "model/config.json",
                             "model/weights/model.safetensors", "notes.txt"]
    got = hf.run("hf_hub_download", repo=hf.repo, path="data/big.bin", cache_dir=str(tmp_path / "c1"))
    assert same_file(got["local"], str(big))
    got = hf.run("hf_hub_download", repo=hf.repo, path="model/weights/model.safetensors",
                 cache_dir=str(tmp_path / "c1"))
    assert same_file(got["local"], str(hf_folder / "weights" / "model.safetensors"))
    snap = hf.run("hf_snapshot_download", repo=hf.repo, cache_dir=str(tmp_path / "c2"))["local"]
    local = {}
    for dirpath, _, names in os.walk(snap):
        for n in names:
            local[os.path.relpath(os.path.join(dirpath, n), snap)] = os.path.join(dirpath, n)
    assert sorted(local) == sorted(files)
    assert open(local["notes.txt"]).read() == "plain text\n"
    assert same_file(local["data/big.bin"], str(big))
    assert same_file(local["model/config.json"], str(hf_folder / "config.json"))
    assert same_file(local["model/weights/model.safetensors"], str(hf_folder / "weights" / "model.safetensors"))


def test_hf_download_of_an_older_revision(hf, tmp_path):
    first = hf.run("hf_upload_file", repo=hf.repo, path="versioned.txt", bytes="one\n")["commit"]
    hf.run("hf_upload_file", repo=hf.repo, path="versioned.txt", bytes="two\n")
    old = hf.run("hf_hub_download", repo=hf.repo, path="versioned.txt", revision=first,
                 cache_dir=str(tmp_path / "c"))
    assert open(old["local"]).read() == "one\n"
    new = hf.run("hf_hub_download", repo=hf.repo, path="versioned.txt", cache_dir=str(tmp_path / "c"))
    assert open(new["local"]).read() == "two\n"
    assert "versioned.txt" in hf.run("hf_list_repo_files", repo=hf.repo, revision=first)["files"]
