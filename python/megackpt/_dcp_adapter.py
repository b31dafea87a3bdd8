"""megackpt storage for DCP frameworks shaped like ``torch.distributed.checkpoint``
(torch itself, and TensorPlay's copy of it): one implementation, bound to a
framework by :class:`Framework`.

The framework plans (its planners, its collectives); the engine stores. Each
StorageWriter / StorageReader method hands the plan to the engine's writer or
reader (``_core._DcpWriter`` / ``_DcpReader``, the C++ MegaStorageWriter/Reader or
FileSystemWriter/Reader):

- plans travel as tuples; the engine's per-plan data (file names) is its own text
  in ``SavePlan.storage_data``; each ``WriteResult.storage_data`` is the engine's
  encoded result, so what the framework gathers and pickles is plain strings;
- ``write_data`` resolves every item through the framework's planner and passes
  the tensors themselves: the engine writes their memory to the files in
  parallel with the GIL released, no Python-level copy;
- ``read_data`` passes the planner's destination views: the engine reads only the
  byte ranges needed straight into them, verifying checksums;
- ``stage`` (torch's ``async_save``; writers are torch AsyncStagers): the caller's
  tensors are copied into a staged copy of the state that is reused by the next
  async save once this one's ``write_data`` has returned (one per process, like
  ``megackpt.async_save``'s pool), so only the first async save pays for fresh,
  page-faulting buffers;
- ``finish`` turns the framework's Metadata into the engine's and commits
  (``.metadata`` in megackpt's portable encoding, never a pickle), so the
  checkpoint is the same thing a C++ or ``megackpt.save`` job writes, and either
  side loads the other's, resharded.
"""

import copy
import dataclasses
import io
import os
import threading

from . import _core
from ._dtypes import dtype_name, framework_dtype
from ._options import writer_options

_TENSOR, _SHARD, _BYTE_IO = 0, 1, 2


class Framework:
    """The pieces of one DCP framework the adapter needs."""

    def __init__(self, module, dcp, future=None, stager=False):
        self.module = module
        self.dcp = dcp
        # True: the writers implement the framework's AsyncStager protocol (stage):
        # torch's async_save then stages through them (_Staging) instead of
        # copying the state into fresh buffers each time.
        self.stager = stager
        self.Size = module.Size
        # The future write_data/read_data return: torch's torch.futures.Future
        # (wait/value); TensorPlay's DCP calls .result() (concurrent.futures).
        self.Future = future or module.futures.Future

    def dtype_name(self, dtype):
        return dtype_name(dtype)

    def dtype(self, name):
        return framework_dtype(self.module, name)

    def world_size(self):
        d = getattr(self.module, "distributed", None)
        if d is not None and d.is_available() and d.is_initialized():
            return d.get_world_size()
        return 1

    def rank(self):
        d = getattr(self.module, "distributed", None)
        if d is not None and d.is_available() and d.is_initialized():
            return d.get_rank()
        return 0


def _offset(index):
    return None if index.offset is None else tuple(int(x) for x in index.offset)


def _dims(seq):
    return tuple(int(x) for x in seq)


def _write_tuple(fw, item):
    index = item.index
    if item.tensor_data is None:
        nbytes = item.bytes_io_data.nbytes if getattr(item, "bytes_io_data", None) else 0
        return (index.fqn, _offset(index), _BYTE_IO, None, None, None, None, int(nbytes or 0))
    td = item.tensor_data
    kind = _SHARD if item.type == fw.dcp.planner.WriteItemType.SHARD else _TENSOR
    return (index.fqn, _offset(index), kind, fw.dtype_name(td.properties.dtype), _dims(td.size),
            _dims(td.chunk.offsets), _dims(td.chunk.sizes), 0)


def _read_tuple(fw, item):
    kind = 1 if item.type == fw.dcp.planner.LoadItemType.BYTE_IO else 0
    return (kind, item.dest_index.fqn, _offset(item.dest_index), _dims(item.dest_offsets),
            item.storage_index.fqn, _offset(item.storage_index), _dims(item.storage_offsets),
            _dims(item.lengths))


def _done_future(fw, value):
    fut = fw.Future()
    fut.set_result(value)
    return fut


def _valid_id(checkpoint_id):
    try:
        os.fspath(checkpoint_id)
    except TypeError:
        return False
    return True


class _EngineBase:
    """What writers and readers share: the path (the checkpoint id) and the
    engine object bound to it; subclasses set ``_fw``, ``_kind`` and ``_engine_type``."""

    _fw: Framework
    _kind: str

    def __init__(self, path, options):
        super().__init__()
        self.path = os.fspath(path)
        self._engine = self._engine_type(self._kind, self.path, options)

    @property
    def checkpoint_id(self):
        return self.path

    def reset(self, checkpoint_id=None):
        if checkpoint_id is not None:
            self.path = os.fspath(checkpoint_id)
        self._engine.reset(self.path)

    @classmethod
    def validate_checkpoint_id(cls, checkpoint_id):
        return _valid_id(checkpoint_id)


class _Staging:
    """The staged copies of async saves: stage() copies a state dict into a copy
    reused from an earlier save when that one's data is written (release), else
    into fresh tensors. One free copy is kept per process; a copy still being
    written is never handed out twice."""

    def __init__(self):
        self._lock = threading.Lock()
        self._free = None

    def stage(self, fw, state_dict):
        with self._lock:
            cached, self._free = self._free, None
        return _stage_value(fw.module, state_dict, cached)

    def release(self, staged):
        with self._lock:
            self._free = staged


_STAGING = _Staging()


def _plain_tensor(module, value):
    return type(value) is module.Tensor  # not DTensor / ShardedTensor / subclasses


def _stage_value(module, value, cached):
    """A copy of ``value`` (dicts, lists and tuples rebuilt; plain CPU tensors
    copied into ``cached``'s matching tensor when it has the same shape and
    dtype, else into a new one; any other leaf deep-copied)."""
    if _plain_tensor(module, value):
        if (_plain_tensor(module, cached) and cached.shape == value.shape
                and cached.dtype == value.dtype):
            out = cached
        else:
            out = module.empty(tuple(value.shape), dtype=value.dtype)
        out.copy_(value.detach())
        return out
    if type(value) is dict:
        prev = cached if type(cached) is dict else {}
        return {k: _stage_value(module, v, prev.get(k)) for k, v in value.items()}
    if type(value) in (list, tuple):
        prev = cached if isinstance(cached, (list, tuple)) and len(cached) == len(value) else None
        items = [_stage_value(module, v, None if prev is None else prev[i])
                 for i, v in enumerate(value)]
        return items if type(value) is list else tuple(items)
    return copy.deepcopy(value)


def _stageable(module, value):
    """True when _stage_value copies ``value`` faithfully: containers of plain CPU
    tensors and other (deep-copyable) leaves; DTensor, torch's ShardedTensor,
    device tensors and the like go to the framework's own stager."""
    if isinstance(value, module.Tensor):
        return _plain_tensor(module, value) and value.device.type == "cpu"
    if type(value) is dict:
        return all(_stageable(module, v) for v in value.values())
    if type(value) in (list, tuple):
        return all(_stageable(module, v) for v in value)
    return not isinstance(value, (dict, list, tuple))  # their subclasses: the framework's


class WriterBase(_EngineBase):
    """StorageWriter methods; subclasses set ``_fw`` and ``_kind`` and inherit from
    the framework's StorageWriter too."""

    _engine_type = _core._DcpWriter

    def __init__(self, path, options, reuse_staging=True):
        super().__init__(path, options)
        self._rank = 0
        self._reuse_staging = reuse_staging
        self._staged = []  # staged copies of this writer's async saves, oldest first

    def set_up_storage_writer(self, is_coordinator, *args, **kwargs):
        self._rank = int(kwargs.get("rank", self._fw.rank()))
        use_collectives = bool(kwargs.get("use_collectives", True))
        self._engine.set_up(bool(is_coordinator), self._rank, self._fw.world_size(), use_collectives)

    def storage_meta(self):
        meta = self._engine.storage_meta()
        if meta is None:
            return None
        return self._fw.dcp.metadata.StorageMeta(checkpoint_id=meta[0], save_id=meta[1])

    def prepare_local_plan(self, plan):
        items = [_write_tuple(self._fw, i) for i in plan.items]
        return dataclasses.replace(plan, storage_data=self._engine.prepare_local_plan(items))

    def prepare_global_plan(self, plans):
        fw = self._fw
        storage = self._engine.prepare_global_plan(
            [([_write_tuple(fw, i) for i in p.items], p.storage_data or "") for p in plans])
        return [dataclasses.replace(p, storage_data=s) for p, s in zip(plans, storage)]

    def write_data(self, plan, planner):
        fw = self._fw
        byte_io = fw.dcp.planner.WriteItemType.BYTE_IO
        items, data = [], []
        for item in plan.items:
            value = planner.resolve_data(item)
            if item.type == byte_io:
                # The framework serialises objects only now: the plan had no size.
                value = value.getvalue() if hasattr(value, "getvalue") else bytes(value)
                items.append(_write_tuple(fw, item)[:-1] + (len(value),))
                data.append(value)
                continue
            items.append(_write_tuple(fw, item))
            value = value.detach()
            if value.device.type != "cpu":
                value = value.cpu()  # staged off the accelerator
            data.append(value)
        try:
            results = self._engine.write_data(items, plan.storage_data or "", data)
        finally:
            if self._staged:  # its bytes are in the files (or the save failed)
                staged = self._staged.pop(0)
                del data
                if self._reuse_staging:
                    _STAGING.release(staged)
        WriteResult = fw.dcp.storage.WriteResult
        MetadataIndex = fw.dcp.metadata.MetadataIndex
        out = [WriteResult(index=MetadataIndex(fqn, offset), size_in_bytes=size, storage_data=enc)
               for fqn, offset, size, enc in results]
        return _done_future(fw, out)

    def finish(self, metadata, results):
        fw = self._fw
        tensor_md = fw.dcp.metadata.TensorStorageMetadata
        entries = {}
        for fqn, md in metadata.state_dict_metadata.items():
            if isinstance(md, tensor_md):
                entries[fqn] = ("tensor", fw.dtype_name(md.properties.dtype), _dims(md.size),
                                [(_dims(c.offsets), _dims(c.sizes)) for c in md.chunks])
            else:
                entries[fqn] = ("bytes",)
        paths = {}
        if isinstance(metadata.planner_data, dict):
            for fqn, path in metadata.planner_data.items():
                if fqn in entries and isinstance(path, (tuple, list)) and len(path) > 1:
                    paths[fqn] = list(path)
        meta = metadata.storage_meta
        checkpoint_id = None if meta is None or meta.checkpoint_id is None else os.fspath(
            meta.checkpoint_id)
        save_id = None if meta is None else meta.save_id
        encoded = [[r.storage_data for r in rank] for rank in results]
        self._engine.finish(entries, paths, checkpoint_id, save_id, metadata.version or "",
                            encoded)

    def abort(self):
        """Removes what this rank wrote in the current save, unless committed."""
        self._engine.abort()


class StagingWriterBase:
    """torch's AsyncStager protocol on the writers (frameworks with ``stager``):
    dcp.async_save stages through ``stage``. The staging is blocking, so there is
    nothing to synchronize afterwards."""

    _synchronize_after_execute = False

    @property
    def should_synchronize_after_execute(self):
        return self._synchronize_after_execute

    def stage(self, state_dict):
        """A copy of ``state_dict`` that the caller's later updates do not reach
        (torch's ``async_save`` saves it in the background)."""
        fw = self._fw
        if not _stageable(fw.module, state_dict):
            from torch.distributed._state_dict_utils import _copy_state_dict, _create_cpu_state_dict

            staged = _create_cpu_state_dict(state_dict)
            return _copy_state_dict(state_dict, staged)
        staged = _STAGING.stage(fw, state_dict) if self._reuse_staging else _stage_value(
            fw.module, state_dict, None)
        self._staged.append(staged)
        return staged

    def synchronize_staging(self):
        """Nothing to wait for: stage() returns when the copy is complete."""

    def close(self):
        """Nothing to free: a staged copy is kept for the next async save."""


class ReaderBase(_EngineBase):
    """StorageReader methods; subclasses set ``_fw`` and ``_kind``."""

    _engine_type = _core._DcpReader

    def __init__(self, path, options):
        super().__init__(path, options)
        self._entries = {}
        self.load_id = None

    def reset(self, checkpoint_id=None):
        super().reset(checkpoint_id)
        self._entries = {}

    def read_metadata(self, *args, **kwargs):
        fw = self._fw
        m = fw.dcp.metadata
        entries, paths, meta, version, storage = self._engine.read_metadata()
        self._entries = entries
        sdm = {}
        for fqn, e in entries.items():
            if e[0] == "bytes":
                sdm[fqn] = m.BytesStorageMetadata()
                continue
            sdm[fqn] = m.TensorStorageMetadata(
                properties=m.TensorProperties(dtype=fw.dtype(e[1])), size=fw.Size(e[2]),
                chunks=[m.ChunkStorageMetadata(offsets=fw.Size(o), sizes=fw.Size(s))
                        for o, s in e[3]])
        planner_data = {fqn: tuple(path) for fqn, path in paths.items()}
        for fqn in sdm:
            planner_data.setdefault(fqn, (fqn,))
        storage_data = {m.MetadataIndex(fqn, off): rel for (fqn, off), rel in storage.items()}
        storage_meta = m.StorageMeta(checkpoint_id=meta[0] if meta else self.path,
                                     save_id=meta[1] if meta else None, load_id=self.load_id)
        return m.Metadata(state_dict_metadata=sdm, planner_data=planner_data,
                          storage_data=storage_data, storage_meta=storage_meta,
                          version=version or None)

    def set_up_storage_reader(self, metadata, is_coordinator, *args, **kwargs):
        rank = int(kwargs.get("rank", self._fw.rank()))
        use_collectives = bool(kwargs.get("use_collectives", True))
        self._engine.set_up(bool(is_coordinator), rank, self._fw.world_size(), use_collectives)

    def prepare_local_plan(self, plan):
        return plan

    def prepare_global_plan(self, plans):
        return plans

    def read_data(self, plan, planner):
        fw = self._fw
        byte_io = fw.dcp.planner.LoadItemType.BYTE_IO
        items, dests, targets = [], [], []
        for item in plan.items:
            items.append(_read_tuple(fw, item))
            if item.type == byte_io:
                dests.append(None)
                targets.append(None)
                continue
            target = planner.resolve_tensor(item).detach()
            stored = fw.dtype(self._entries[item.storage_index.fqn][1])
            dest = target
            if target.dtype != stored or target.device.type != "cpu":
                # The framework converts dtypes / devices on load: read into a staging
                # tensor of the stored dtype, then copy.
                dest = fw.module.empty(tuple(target.shape), dtype=stored)
            dests.append(dest)
            targets.append(target)
        loaded = self._engine.read_data(items, dests)
        for i, item in enumerate(plan.items):
            if item.type == byte_io:
                planner.load_bytes(item, io.BytesIO(loaded[i]))
                continue
            target = targets[i]
            if dests[i] is not target:
                target.copy_(dests[i])
            planner.commit_tensor(item, target)
        return _done_future(fw, None)


def storage_classes(fw, module_name):
    """The four storage classes of framework ``fw``, as its module exports them:
    ``(MegaStorageWriter, MegaStorageReader, FileSystemWriter, FileSystemReader)``,
    subclasses of ``fw.dcp.StorageWriter`` / ``StorageReader`` named as if defined
    in ``module_name`` (so they pickle by reference)."""

    writer_bases = (WriterBase, StagingWriterBase) if fw.stager else (WriterBase,)

    class MegaStorageWriter(*writer_bases, fw.dcp.StorageWriter):
        """Writes a checkpoint as MEGA shards (``megackpt::dcp::MegaStorageWriter``).

        ``path``: a folder or ``mega://`` URI. ``fqn_to_index_mapping``: fqn -> bucket
        1..N; entries of bucket b go to files ``model-...-of-M.mega`` of that bucket.
        ``thread_count`` writer threads per rank; ``sync_files`` fsyncs shards and the
        commit (False: faster, still atomic); ``overwrite=False`` refuses to replace a
        committed checkpoint; ``checksum``: "crc32" (default), "sha256" or "none";
        ``consolidate``: rewrite as whole tensors after the commit. ``files_per_rank``:
        shard files per rank without a mapping (None/0: ``thread_count``; 1: one file
        per rank); a mapping keeps one file per bucket per rank. ``reuse_staging``
        (torch's ``async_save``): stage into the process's reusable staged copy
        (pre-faulted after the first save; it stays allocated, as
        ``megackpt.async_save``'s pool does); False: a fresh copy per save.
        ``direct_io``: with ``sync_files``, shards go to the device with O_DIRECT
        (``megackpt.save``'s ``direct_io``).
        """

        _fw = fw
        _kind = "mega"

        def __init__(self, path, fqn_to_index_mapping=None, *, thread_count=2, sync_files=True,
                     overwrite=True, checksum=None, consolidate=None, reuse_staging=True,
                     files_per_rank=None, direct_io=False):
            super().__init__(path, writer_options(
                thread_count, sync_files, overwrite, direct_io,
                fqn_to_index_mapping=fqn_to_index_mapping,
                checksum=checksum, consolidate=consolidate,
                files_per_rank=None if files_per_rank is None else int(files_per_rank)),
                reuse_staging)
            self.fqn_to_index_mapping = fqn_to_index_mapping

    class MegaStorageReader(ReaderBase, fw.dcp.StorageReader):
        """Reads MEGA checkpoints (``megackpt::dcp::MegaStorageReader``): ours, TensorPlay's
        (whose pickled ``.metadata`` is never unpickled: it is rebuilt from the shard
        headers), Hugging Face safetensors layouts, locally or on ``mega://``.
        ``verify``: check checksums of every byte read (default)."""

        _fw = fw
        _kind = "mega"

        def __init__(self, path, *, thread_count=2, verify=True):
            super().__init__(path, {"thread_count": int(thread_count), "verify": bool(verify)})

    class FileSystemWriter(*writer_bases, fw.dcp.StorageWriter):
        """Writes megackpt's DCP layout (``__<save>_<rank>_<n>.distcp`` data files +
        ``.metadata``; ``megackpt::dcp::FileSystemWriter``). Options as for
        MegaStorageWriter (``thread_count`` is also the number of data files per rank)."""

        _fw = fw
        _kind = "fs"

        def __init__(self, path, *, thread_count=2, sync_files=True, overwrite=True,
                     reuse_staging=True, direct_io=False):
            super().__init__(path, writer_options(thread_count, sync_files, overwrite, direct_io),
                             reuse_staging)

    class FileSystemReader(ReaderBase, fw.dcp.StorageReader):
        """Reads checkpoints of :class:`FileSystemWriter` (block CRCs verified)."""

        _fw = fw
        _kind = "fs"

        def __init__(self, path, *, thread_count=2, verify=True):
            super().__init__(path, {"thread_count": int(thread_count), "verify": bool(verify)})

    classes = (MegaStorageWriter, MegaStorageReader, FileSystemWriter, FileSystemReader)
    for cls in classes:
        cls.__module__ = module_name
        cls.__qualname__ = cls.__name__
    return classes
