"""One step of a real hub client against megahub, run in its own process.

Used by test_hub_clients.py and bench/python/bench_hub_clients.py: each step
is a fresh interpreter, so the clients read their endpoint from the
environment at import (MEGA_ENDPOINT / HF_ENDPOINT) and keep no dedup state
between steps (HF_XET_CACHE is a new folder per step): what a step uploads
is what another machine would upload.

    python hub_client_worker.py OP JSON_ARGS     prints one JSON line

Ops: mt_* drive megatensors (its MegaApi / MegaFileSystem, through hf_xet),
hf_* drive huggingface_hub (through hf_xet).
"""
import json
import os
import sys
import time


def _mt():
    from megatensors._hub import MegaApi
    return MegaApi(endpoint=os.environ["MEGA_ENDPOINT"], token=os.environ["MEGA_TOKEN"])


def _hf():
    from huggingface_hub import HfApi
    return HfApi(endpoint=os.environ["HF_ENDPOINT"], token=os.environ["HF_TOKEN"])


def mt_upload(a):
    api = _mt()
    api.create_repo(a["repo"], exist_ok=True)
    info = api.upload_file(path_or_fileobj=a["local"], path_in_repo=a["path"], repo_id=a["repo"])
    return {"commit": info.oid}


def mt_download(a):
    from megatensors._hub import mega_hub_download
    path = mega_hub_download(a["repo"], a["path"], cache_dir=a["cache_dir"])
    return {"local": path}


def mt_range(a):
    from megatensors._hub.mega_file_system import MegaFileSystem
    fs = MegaFileSystem(endpoint=os.environ["MEGA_ENDPOINT"], token=os.environ["MEGA_TOKEN"])
    with fs.open(a["repo"] + "/" + a["path"], "rb", block_size=a.get("block_size", 1 << 20)) as f:
        f.seek(a["offset"])
        data = f.read(a["length"])
    with open(a["out"], "wb") as out:
        out.write(data)
    return {"bytes": len(data)}


def mt_bucket_add(a):
    api = _mt()
    api.create_bucket(a["bucket"], exist_ok=True)
    api.batch_bucket_files(a["bucket"], add=[(src, dst) for src, dst in a["add"]])
    return {}


def mt_bucket_list(a):
    tree = _mt().list_bucket_tree(a["bucket"], recursive=True)
    return {"files": sorted([x.path, getattr(x, "size", None)] for x in tree if hasattr(x, "size"))}


def mt_bucket_download(a):
    _mt().download_bucket_files(a["bucket"], [(src, dst) for src, dst in a["files"]],
                                raise_on_missing_files=True)
    return {}


def hf_create_repo(a):
    url = _hf().create_repo(a["repo"], exist_ok=a.get("exist_ok", False))
    return {"url": str(url)}


def hf_upload_file(a):
    src = a["local"] if "local" in a else a["bytes"].encode()
    info = _hf().upload_file(path_or_fileobj=src, path_in_repo=a["path"], repo_id=a["repo"])
    return {"commit": info.oid, "url": info.commit_url}


def hf_upload_folder(a):
    info = _hf().upload_folder(folder_path=a["folder"], repo_id=a["repo"], path_in_repo=a.get("path_in_repo"))
    return {"commit": info.oid}


def hf_list_repo_files(a):
    return {"files": _hf().list_repo_files(a["repo"], revision=a.get("revision"))}


def hf_hub_download(a):
    import huggingface_hub
    path = huggingface_hub.hf_hub_download(a["repo"], a["path"], revision=a.get("revision"),
                                           cache_dir=a["cache_dir"], endpoint=os.environ["HF_ENDPOINT"],
                                           token=os.environ["HF_TOKEN"])
    return {"local": path}


def hf_snapshot_download(a):
    import huggingface_hub
    path = huggingface_hub.snapshot_download(a["repo"], cache_dir=a["cache_dir"],
                                             endpoint=os.environ["HF_ENDPOINT"], token=os.environ["HF_TOKEN"])
    return {"local": path}


def main():
    op, args = sys.argv[1], json.loads(sys.argv[2])
    t = time.perf_counter()
    out = globals()[op](args)
    out["seconds"] = time.perf_counter() - t
    print(json.dumps(out))


if __name__ == "__main__":
    main()
