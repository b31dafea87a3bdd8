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

from ._dcp_adapter import Framework, storage_classes

__all__ = ["MegaStorageWriter", "MegaStorageReader", "FileSystemWriter", "FileSystemReader"]

_TENSORPLAY = Framework(_tp, _dcp, future=_futures.Future)


MegaStorageWriter, MegaStorageReader, FileSystemWriter, FileSystemReader = storage_classes(
    _TENSORPLAY, __name__)
