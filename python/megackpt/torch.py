"""megackpt storage for ``torch.distributed.checkpoint`` (torch 2.x).

Drop-in StorageWriter / StorageReader classes::

    import torch.distributed.checkpoint as dcp
    from megackpt.torch import MegaStorageWriter, MegaStorageReader

    dcp.save(state_dict, storage_writer=MegaStorageWriter("/ckpt/step-10"))
    dcp.load(state_dict, storage_reader=MegaStorageReader("/ckpt/step-10"))
    dcp.async_save(state_dict, storage_writer=MegaStorageWriter("/ckpt/step-11"))

``MegaStorageWriter`` writes ``.mega`` shards (file names unique per rank, numbered
globally), ``model.mega.index.json`` covering every rank's entries and a portable
``.metadata``; ``FileSystemWriter`` writes megackpt's ``.distcp`` layout. Both
commit atomically (a crash leaves the previous checkpoint or the new one), checksum
every piece, and their readers verify every byte they return while reading only
the byte ranges a (resharded) load needs. Paths may be ``mega://`` URIs. The
checkpoints are the ones ``megackpt.save`` and the C++ ``megackpt::dcp::Save``
write: each side loads the other's, at any world size.

Tensors must be on the CPU or are staged there (CUDA tensors are copied); DTensor
and torch's ShardedTensor work through torch's planners.
"""

import torch as _torch
import torch.distributed.checkpoint as _dcp

from ._dcp_adapter import Framework, ReaderBase, WriterBase

__all__ = ["MegaStorageWriter", "MegaStorageReader", "FileSystemWriter", "FileSystemReader"]

_TORCH = Framework(_torch, _dcp)


def _writer_options(thread_count, sync_files, overwrite, **mega):
    options = {"thread_count": int(thread_count), "sync": bool(sync_files),
               "overwrite": bool(overwrite)}
    options.update({k: v for k, v in mega.items() if v is not None})
    return options


class MegaStorageWriter(WriterBase, _dcp.StorageWriter):
    """Writes a checkpoint as MEGA shards (``megackpt::dcp::MegaStorageWriter``).

    ``path``: a folder or ``mega://`` URI. ``fqn_to_index_mapping``: fqn -> bucket
    1..N; entries of bucket b go to files ``model-...-of-M.mega`` of that bucket.
    ``thread_count`` writer threads per rank; ``sync_files`` fsyncs shards and the
    commit (False: faster, still atomic); ``overwrite=False`` refuses to replace a
    committed checkpoint; ``checksum``: "crc32" (default), "sha256" or "none";
    ``consolidate``: rewrite as whole tensors after the commit.
    """

    _fw = _TORCH
    _kind = "mega"

    def __init__(self, path, fqn_to_index_mapping=None, *, thread_count=2, sync_files=True,
                 overwrite=True, checksum=None, consolidate=None):
        super().__init__(path, _writer_options(
            thread_count, sync_files, overwrite, fqn_to_index_mapping=fqn_to_index_mapping,
            checksum=checksum, consolidate=consolidate))
        self.fqn_to_index_mapping = fqn_to_index_mapping


class MegaStorageReader(ReaderBase, _dcp.StorageReader):
    """Reads MEGA checkpoints (``megackpt::dcp::MegaStorageReader``): ours, TensorPlay's
    (whose pickled ``.metadata`` is never unpickled: it is rebuilt from the shard
    headers), Hugging Face safetensors layouts, locally or on ``mega://``.
    ``verify``: check checksums of every byte read (default)."""

    _fw = _TORCH
    _kind = "mega"

    def __init__(self, path, *, thread_count=2, verify=True):
        super().__init__(path, {"thread_count": int(thread_count), "verify": bool(verify)})


class FileSystemWriter(WriterBase, _dcp.StorageWriter):
    """Writes megackpt's DCP layout (``__<save>_<rank>_<n>.distcp`` data files +
    ``.metadata``; ``megackpt::dcp::FileSystemWriter``). Options as for
    MegaStorageWriter (``thread_count`` is also the number of data files per rank)."""

    _fw = _TORCH
    _kind = "fs"

    def __init__(self, path, *, thread_count=2, sync_files=True, overwrite=True):
        super().__init__(path, _writer_options(thread_count, sync_files, overwrite))


class FileSystemReader(ReaderBase, _dcp.StorageReader):
    """Reads checkpoints of :class:`FileSystemWriter` (block CRCs verified)."""

    _fw = _TORCH
    _kind = "fs"

    def __init__(self, path, *, thread_count=2, verify=True):
        super().__init__(path, {"thread_count": int(thread_count), "verify": bool(verify)})
