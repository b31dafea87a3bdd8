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

from ._dcp_adapter import Framework, storage_classes

__all__ = ["MegaStorageWriter", "MegaStorageReader", "FileSystemWriter", "FileSystemReader"]

_TORCH = Framework(_torch, _dcp, stager=True)


MegaStorageWriter, MegaStorageReader, FileSystemWriter, FileSystemReader = storage_classes(
    _TORCH, __name__)
