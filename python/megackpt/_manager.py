"""megackpt.CheckpointManager: the checkpoints of a training run, one folder per step.

See docs/checkpoint-manager.md for the layout (``ROOT/step-000000100/``, ``ROOT/latest``),
the crash-safety argument and the retention rules.
"""

from . import _core
from ._api import _SaveHandle, _group, _path
from ._state import LoadTarget, finish_built, prepare_save
from .errors import InvalidArgumentError


class StepSaveHandle(_SaveHandle):
    """An async step save (see :meth:`CheckpointManager.save` with ``async_=True``).

    ``staged()`` / ``wait_staged()``: the state dict may change again.
    ``done()`` / ``result()``: the step is committed, recorded in ``latest`` and
    retention was applied (or the save failed with the same error on every rank).
    """

    _still_running = "step save still running"

    @property
    def step(self) -> int:
        return self._impl.step


class CheckpointManager:
    """Saves a training run's state every few steps into ``root/step-<N>`` folders,
    keeps the ones the retention rules say, and resumes from the newest good one.

    ``root``: a local folder or a ``mega://`` folder. ``storage``: ``"fs"``
    (``.distcp`` files, the default for local roots) or ``"mega"`` (``.mega`` shards;
    the default for ``mega://``). Retention (a step is kept when any rule keeps it;
    the newest complete step always; all 0: keep everything): ``keep_last`` newest
    steps, every step that is a multiple of ``keep_every``, the ``keep_best`` steps
    with the best ``metric`` (lower is better, ``best_mode="max"``: higher).
    ``direct_io=True`` (with ``sync``): the steps' data files skip the page cache, as
    :func:`megackpt.save`'s ``direct_io``; suited to a save loop, whose steps are
    loaded at a restart rather than right after the save.
    ``in_flight``: what a save does while an async save is running: ``"wait"`` for
    it, or ``"fail"`` with FailedPreconditionError. ``remove_incomplete``: on opening,
    remove step folders a crash left without a committed checkpoint (they are never
    loaded either way). ``group``: as for :func:`megackpt.save`; every rank creates
    a manager on the same root and calls save/load with the same arguments.

    A crash at any instant leaves every complete step loadable and ``latest`` naming
    one; :meth:`load` without a step loads the newest step that loads, passing over
    damaged ones (see :attr:`last_load`).
    """

    def __init__(self, root, *, storage=None, group=None, keep_last=0, keep_every=0, keep_best=0,
                 best_mode="min", thread_count=2, sync=True, direct_io=False, in_flight="wait",
                 remove_incomplete=True, staging_bytes=None):
        if best_mode not in ("min", "max"):
            raise InvalidArgumentError("best_mode must be 'min' or 'max'")
        if in_flight not in ("wait", "fail"):
            raise InvalidArgumentError("in_flight must be 'wait' or 'fail'")
        self._impl = _core._CheckpointManager(
            _path(root), storage or "", _group(group), int(keep_last), int(keep_every),
            int(keep_best), best_mode == "max", int(thread_count), bool(sync), bool(direct_io),
            in_flight == "fail",
            bool(remove_incomplete), int(staging_bytes or 0))
        #: ``{"step": N, "skipped": [(step, reason), ...]}`` of the last :meth:`load`.
        self.last_load = None

    @property
    def root(self) -> str:
        return self._impl.root

    @property
    def storage(self) -> str:
        return self._impl.storage

    def step_path(self, step) -> str:
        """The folder of ``step`` (``root/step-000000100``)."""
        return self._impl.step_path(int(step))

    def save(self, step, state_dict, *, metric=None, overwrite=False, async_=False):
        """Saves ``state_dict`` (as for :func:`megackpt.save`) as step ``step``.

        Returns once the step is committed, durable (``sync``), recorded in ``latest``
        and retention was applied; with ``async_=True`` returns a
        :class:`StepSaveHandle` at once (the state dict may change after
        ``handle.wait_staged()``). At most one async save runs per manager.
        ``metric``: this step's value for ``keep_best``. A step that already exists
        raises AlreadyExistsError unless ``overwrite``.
        """
        tree, extra = prepare_save(state_dict)
        m = None if metric is None else float(metric)
        if async_:
            return StepSaveHandle(self._impl.async_save(int(step), tree, extra, m, bool(overwrite)))
        self._impl.save(int(step), tree, extra, m, bool(overwrite))
        return None

    def load(self, state_dict=None, *, step=None, tensor_type="numpy", allow_partial=False):
        """Loads step ``step`` (default: the newest complete step that loads; damaged
        steps are passed over) and returns the state dict, as :func:`megackpt.load`
        does (in place into ``state_dict`` when given, resharded to its layout).
        :attr:`last_load` tells which step was loaded and which were skipped and why.
        NotFoundError when there is nothing to load.
        """
        target = None if state_dict is None else LoadTarget(state_dict)
        out, extra, raw, loaded, skipped = self._impl.load(
            None if target is None else target.tree, None if step is None else int(step),
            bool(allow_partial))
        self.last_load = {"step": loaded, "skipped": list(skipped)}
        if target is None:
            return finish_built(out, extra, raw, tensor_type)
        return target.finish(out, extra)

    def steps(self) -> list:
        """Every step folder, ascending: dicts with ``step``, ``folder``, ``path``,
        ``complete``, ``problem``, ``storage``, ``metric``, ``saved_unix_seconds``,
        ``entries``, ``stored_bytes``."""
        return self._impl.steps()

    def all_steps(self) -> list:
        """The complete steps, ascending."""
        return [s["step"] for s in self.steps() if s["complete"]]

    def latest(self):
        """The newest complete step, or None."""
        return self._impl.latest()

    def latest_valid(self, *, verify="full"):
        """(step, [(skipped step, reason), ...]): the newest step that passes the
        check (``verify="full"``: every stored byte; ``"structure"``: files and ranges
        only). NotFoundError when none does."""
        if verify not in ("full", "structure"):
            raise InvalidArgumentError("verify must be 'full' or 'structure'")
        step, skipped = self._impl.latest_valid(verify == "full")
        return step, list(skipped)

    def verify_step(self, step, *, verify="full") -> None:
        """Raises DataLossError / NotFoundError (naming file and entry) when ``step``
        is damaged or incomplete."""
        self._impl.verify_step(int(step), verify == "full")

    def gc(self, *, keep_last=None, keep_every=None, keep_best=None, best_mode=None) -> list:
        """Removes incomplete step folders and the steps the rules do not keep
        (default: the manager's rules); returns the removed steps."""
        best_is_max = None if best_mode is None else best_mode == "max"
        return self._impl.gc(keep_last, keep_every, keep_best, best_is_max)

    def remove(self, step) -> None:
        """Removes one step (its commit record first)."""
        self._impl.remove_step(int(step))

    def wait(self) -> None:
        """Waits for an async save in flight; raises its error."""
        self._impl.wait()

    def save_in_flight(self) -> bool:
        return self._impl.save_in_flight()

    def close(self) -> None:
        """Waits for an async save in flight and releases the manager."""
        if self._impl is not None:
            self._impl.wait()
            self._impl = None

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()
        return False
