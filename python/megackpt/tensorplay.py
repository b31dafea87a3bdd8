"""megackpt storage for TensorPlay's DCP (``tensorplay.distributed.checkpoint``).

Drop-ins for ``tensorplay.distributed.checkpoint.MegaStorageWriter`` /
``MegaStorageReader`` (the seed), same constructor arguments, without the seed's
defects (spec/dcp.md §4): file names unique per rank and numbered globally, an
index covering every rank's entries, sharded entries and bytes stored, a portable
``.metadata`` instead of a pickle, atomic commits, checksums verified on every
read, and only the needed byte ranges read::

    import tensorplay.distributed.checkpoint as dcp
    from megackpt.tensorplay import MegaStorageWriter, MegaStorageReader

    dcp.save(state_dict, storage_writer=MegaStorageWriter("/ckpt/step-10"))
    dcp.load(state_dict, storage_reader=MegaStorageReader("/ckpt/step-10"))

The reader also opens what TensorPlay's own MegaStorageWriter wrote (its pickled
``.metadata`` is ignored: Metadata is rebuilt from the index and shard headers).
``FileSystemWriter`` / ``FileSystemReader`` write/read megackpt's ``.distcp`` layout.
"""

from concurrent import futures as _futures

import tensorplay as _tp
import tensorplay.distributed.checkpoint as _dcp

from ._dcp_adapter import Framework, ReaderBase, WriterBase

__all__ = ["MegaStorageWriter", "MegaStorageReader", "FileSystemWriter", "FileSystemReader"]

_TENSORPLAY = Framework(_tp, _dcp, future=_futures.Future)


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

    _fw = _TENSORPLAY
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

    _fw = _TENSORPLAY
    _kind = "mega"

    def __init__(self, path, *, thread_count=2, verify=True):
        super().__init__(path, {"thread_count": int(thread_count), "verify": bool(verify)})


class FileSystemWriter(WriterBase, _dcp.StorageWriter):
    """Writes megackpt's DCP layout (``__<save>_<rank>_<n>.distcp`` data files +
    ``.metadata``; ``megackpt::dcp::FileSystemWriter``). Options as for
    MegaStorageWriter (``thread_count`` is also the number of data files per rank)."""

    _fw = _TENSORPLAY
    _kind = "fs"

    def __init__(self, path, *, thread_count=2, sync_files=True, overwrite=True):
        super().__init__(path, _writer_options(thread_count, sync_files, overwrite))


class FileSystemReader(ReaderBase, _dcp.StorageReader):
    """Reads checkpoints of :class:`FileSystemWriter` (block CRCs verified)."""

    _fw = _TENSORPLAY
    _kind = "fs"

    def __init__(self, path, *, thread_count=2, verify=True):
        super().__init__(path, {"thread_count": int(thread_count), "verify": bool(verify)})
