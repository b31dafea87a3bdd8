"""The native API: save, load, async_save, inspect, verify, convert, consolidate."""

import json
import os

from . import _core
from ._options import writer_options
from ._state import LoadTarget, finish_built, prepare_save
from .errors import DataLossError

__all__ = [
    "save",
    "load",
    "async_save",
    "AsyncSaveHandle",
    "process_group",
    "inspect",
    "verify",
    "convert",
    "consolidate",
]

_DEFAULT = object()


def process_group(backend=None, *, timeout=300.0):
    """The process group a save or load runs on.

    ``backend``: ``"single"`` (this process alone), ``"mpi"`` (every process of an
    ``mpirun``/``mpiexec`` launch, through the engine's MPI backend; mpi4py is not
    needed), or None: ``"mpi"`` when this process was started by an MPI launcher,
    else ``"single"``. The MPI group is created once per process and shared;
    ``timeout`` (seconds) bounds every collective: a rank that stops answering makes
    the others fail with DeadlineExceededError instead of hanging.

    The returned ``ProcessGroup`` has ``rank``, ``world_size``, ``backend`` and
    ``barrier()``.
    """
    if backend is None:
        backend = "mpi" if _core._launched_by_mpi() else "single"
    if backend == "single":
        return _core._single_group()
    if backend == "mpi":
        return _core._mpi_group(float(timeout))
    from .errors import InvalidArgumentError

    raise InvalidArgumentError(f"backend must be 'single', 'mpi' or None (got {backend!r})")


def _group(group):
    if group is None:
        return process_group(None) if _core._launched_by_mpi() else None
    return group


def _path(path):
    return os.fspath(path)


def save(state_dict, path, *, storage="mega", group=None, thread_count=2, sync=True,
         overwrite=True, fqn_to_index_mapping=None, checksum=None, consolidate=None,
         use_collectives=True, direct_io=False):
    """Saves ``state_dict`` as a distributed checkpoint at ``path``.

    ``state_dict``: nested dicts/lists of numpy arrays, CPU torch or TensorPlay
    tensors (any dtype they share with megackpt, bfloat16 included; any strides),
    :class:`ShardedTensor` pieces, ``bytes``, and any other picklable object
    (stored pickled, restored as the object). Tensor bytes go from the arrays'
    memory to the files without a copy, in parallel, with the GIL released; the
    arrays must not change until ``save`` returns (see :func:`async_save`).

    ``path``: a local folder or a ``mega://`` URI (``mega://NS/REPO[@rev]/dir``: one
    hub commit per save; the hub is ``MEGA_ENDPOINT`` — ``http://127.0.0.1:PORT`` for
    a ``megahub`` server, ``file:///DIR`` for an embedded one).

    ``storage``: ``"mega"`` (``.mega`` shards + ``model.mega.index.json``, readable by
    TensorPlay and megatensors) or ``"fs"`` (the DCP layout of ``.distcp`` files).
    ``group``: a :func:`process_group`; by default the MPI group under mpirun, else
    this process alone. Every rank calls ``save`` with its own state dict; replicated
    entries are written once; every rank returns after the commit, or raises the
    same error.

    Options: ``thread_count`` writer threads per rank; ``sync`` (fsync data and the
    commit: durable across power loss; False is faster and still atomic);
    ``overwrite`` (False: raise AlreadyExistsError if a checkpoint is there);
    ``storage="mega"`` only: ``fqn_to_index_mapping`` (fqn -> shard bucket 1..N),
    ``checksum`` ("crc32" default, "sha256", "none"), ``consolidate`` (rewrite as
    whole tensors after the commit). ``use_collectives=False``: every rank saves
    alone. ``direct_io=True`` (with ``sync``): the data files go to the device with
    O_DIRECT instead of through the page cache, where the file system allows it:
    faster durable saves on VMs whose free memory goes back to the host, at the
    price of a load right after reading from the device (docs/benchmarks.md,
    "Direct-I/O durable writes").

    A crash or error at any moment leaves ``path`` holding the previous checkpoint
    or the new one, never a mix. Raises :class:`megackpt.Error` subclasses
    (InvalidArgumentError for a bad state dict or option, AlreadyExistsError,
    AbortedError for a lost hub commit race, IOFailureError, ...).
    """
    tree, extra = prepare_save(state_dict)
    _core._save(tree, _path(path), storage, _group(group), extra, use_collectives,
                writer_options(thread_count, sync, overwrite, direct_io,
                               fqn_to_index_mapping=fqn_to_index_mapping, checksum=checksum,
                               consolidate=consolidate))


def load(path, state_dict=None, *, storage="auto", group=None, tensor_type="numpy",
         thread_count=2, verify=True, allow_partial=False, use_collectives=True):
    """Loads the checkpoint at ``path`` and returns its state dict.

    With ``state_dict`` given, its arrays/tensors and :class:`ShardedTensor` pieces
    are filled in place (they define the layout: any sharding and any world size
    the checkpoint was saved with is resharded into them), and its other leaves
    (bytes, objects) are replaced by the stored values; the same (updated) dict is
    returned. Destinations must be writable CPU arrays of the stored dtype and
    shape: a mismatch raises InvalidArgumentError naming the tensor, an entry
    missing from the checkpoint NotFoundError (unless ``allow_partial``).

    Without ``state_dict``, a new state dict with the saved nesting is returned:
    whole tensors as numpy arrays (``tensor_type="torch"``: torch tensors); dtypes
    numpy lacks come back as raw integers of the same width (BF16 as uint16, F8 as
    uint8) unless ``tensor_type="torch"``.

    Every byte returned has been verified against the stored checksums (``verify``):
    corruption raises DataLossError naming the file and tensor. ``path``: a folder
    (written by :func:`save`, C++ ``megackpt::dcp::Save``, torch or TensorPlay DCP
    through megackpt storage, or TensorPlay's own MegaStorageWriter), a ``.mega`` /
    ``.safetensors`` file or index, or a ``mega://`` URI. ``storage``: ``"auto"``
    (from what the folder holds), ``"mega"`` or ``"fs"``. Reads run in parallel
    (``thread_count`` per rank) with the GIL released. ``group``: as for
    :func:`save`.
    """
    target = None if state_dict is None else LoadTarget(state_dict)
    out, extra, raw = _core._load(_path(path), None if target is None else target.tree, storage,
                                  _group(group), allow_partial, use_collectives,
                                  {"thread_count": thread_count, "verify": verify})
    if target is None:
        return finish_built(out, extra, raw, tensor_type)
    return target.finish(out, extra)


class _SaveHandle:
    """The methods of a background save's handle (:class:`AsyncSaveHandle`,
    :class:`StepSaveHandle`) over the engine's handle ``impl``."""

    _still_running = "save still running"  # result()'s TimeoutError message

    def __init__(self, impl):
        self._impl = impl

    def staged(self) -> bool:
        """True once the state dict may be modified again (non-blocking)."""
        return self._impl.staged()

    def done(self) -> bool:
        """True once the save has committed or failed (non-blocking)."""
        return self._impl.done()

    def wait_staged(self, timeout=None) -> bool:
        """Waits until staged; raises the save's error if it failed before. False
        on timeout (seconds)."""
        return self._impl.wait(False, -1.0 if timeout is None else float(timeout))

    def result(self, timeout=None) -> None:
        """Waits until the save is committed; raises its error (a megackpt.Error).
        TimeoutError when ``timeout`` seconds pass first."""
        if not self._impl.wait(True, -1.0 if timeout is None else float(timeout)):
            raise TimeoutError(self._still_running)

    wait = result


class AsyncSaveHandle(_SaveHandle):
    """A save running in the background (see :func:`async_save`).

    ``staged()`` / ``wait_staged()``: every value has been copied out of the
    caller's state dict, which may now change. ``done()`` / ``result()``: the save
    is committed on every rank (or failed with the same error everywhere).
    Dropping the handle waits for the save to finish.
    """

    _still_running = "async save still running"


def async_save(state_dict, path, *, storage="mega", group=None, thread_count=2, sync=True,
               overwrite=True, fqn_to_index_mapping=None, checksum=None, consolidate=None,
               use_collectives=True, staging_bytes=None, direct_io=False):
    """Starts saving ``state_dict`` in the background; returns an
    :class:`AsyncSaveHandle`.

    Arguments as for :func:`save`. Tensors are copied into a reusable, pre-faulted
    staging pool (``staging_bytes``, default 1 GiB, created once per process); a
    larger state is staged in pieces, each written as soon as it is full, so
    ``staged`` comes after all but the last piece is written. The caller may change
    its tensors once ``handle.staged()``; ``group`` must not be used for other
    collectives until ``handle.done()``.
    """
    tree, extra = prepare_save(state_dict)
    impl = _core._async_save(tree, _path(path), storage, _group(group), extra, use_collectives,
                             int(staging_bytes or 0),
                             writer_options(thread_count, sync, overwrite, direct_io,
                                            fqn_to_index_mapping=fqn_to_index_mapping,
                                            checksum=checksum, consolidate=consolidate))
    return AsyncSaveHandle(impl)


def inspect(path) -> dict:
    """Tensors, dtypes, shapes, sizes and metadata of a ``.mega`` or ``.safetensors``
    file, an index, or a folder holding one: the ``megackpt inspect --json``
    document ``{"format", "path", "metadata", "tensors": [{"name", "dtype", "shape",
    "nbytes", "file", ...}], "files", "total_nbytes"}``. Only headers are read."""
    return json.loads(_core._inspect(_path(path)))


def verify(path, *, raise_on_error=True) -> dict:
    """Checks every structure rule and every checksum of the checkpoint at
    ``path`` (as ``megackpt verify``). Returns the report ``{"ok", "problems",
    "warnings", "files", "files_ok", "tensors", "bytes", "format", "path"}``; with
    ``raise_on_error`` a failed check raises DataLossError whose message lists the
    problems (each naming the file and tensor). NotFoundError / InvalidArgumentError
    when ``path`` is not a checkpoint."""
    report = _core._verify(_path(path))
    if raise_on_error and not report["ok"]:
        raise DataLossError("; ".join(report["problems"]))
    return report


def finish_background_frees() -> None:
    """Waits until the disk space of checkpoint files this process removed as
    garbage is free. A save over an earlier save in the same folder, and
    :class:`CheckpointManager` retention (``gc``, ``remove_step``), take the old
    files' names at once but leave freeing their blocks (which costs as much as
    writing them on some file systems) to a background thread, off the training
    loop's path. Not needed for correctness: the names are gone already, and
    at exit the operating system frees what is left. Call it before measuring
    free disk space, or before a step that needs that space now."""
    _core._finish_background_frees()


def convert(src, dst, *, max_shard_size=None, alignment=4096, checksum="crc32",
            compression="none", zstd_level=3, format=None, sync=True) -> dict:
    """Converts between MEGA and safetensors (files or sharded folders with an
    index), preserving every tensor's name, dtype, shape and bytes, as
    ``megackpt convert``. ``dst``: ``NAME.mega`` / ``NAME.safetensors`` (one file), an
    index name (a folder of shards + that index), or a folder. MEGA output options:
    ``alignment``, ``checksum``, ``compression`` ("none"/"zstd"), ``zstd_level``.
    Returns a summary dict."""
    return _core._convert(_path(src), _path(dst), max_shard_size, alignment, checksum,
                          compression, zstd_level, format, sync)


def consolidate(src, dst, *, format="mega", max_shard_size=0, thread_count=2, sync=True,
                group=None) -> dict:
    """Rewrites a sharded checkpoint as whole tensors, one entry per fqn
    (``model-NNNNN-of-MMMMM.{mega,safetensors}`` + index), so Hugging Face,
    megatensors or TensorPlay read it directly. ``dst`` may equal ``src`` (in place,
    crash-safe). Memory stays bounded by the largest tensor. Returns
    ``{"files", "total_size", "entries", "index_file"}``."""
    return _core._consolidate(_path(src), _path(dst), format, max_shard_size, thread_count, sync,
                              _group(group))
