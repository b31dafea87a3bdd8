"""megackpt: distributed checkpoints in MEGA (.mega) and safetensors format.

The C++ engine behind a Python API::

    import megackpt
    megackpt.save({"model": {"w": array}, "step": 10}, "/ckpt/step-10")
    state = megackpt.load("/ckpt/step-10")              # new numpy arrays
    megackpt.load("/ckpt/step-10", state_dict=mine)     # in place, resharded

- :func:`save`, :func:`load`, :func:`async_save` over numpy arrays and CPU
  torch/TensorPlay tensors (zero-copy), :class:`ShardedTensor` pieces, bytes and
  pickled objects; local folders or ``mega://`` hub paths; MPI under mpirun.
- :class:`CheckpointManager`: a run's checkpoints in ``step-<N>`` folders with
  retention, a ``latest`` record and resume from the newest good step.
- :func:`inspect`, :func:`verify`, :func:`convert`, :func:`consolidate`;
  :func:`finish_background_frees` (disk space of removed checkpoints back now).
- ``megackpt.torch``: storage for ``torch.distributed.checkpoint``;
  ``megackpt.tensorplay``: the same for TensorPlay's DCP.
- Errors: :class:`Error` and its subclasses (``megackpt.errors``).
"""

from . import _core
from ._api import (
    AsyncSaveHandle,
    async_save,
    consolidate,
    convert,
    finish_background_frees,
    inspect,
    load,
    process_group,
    save,
    verify,
)
from ._core import ProcessGroup
from ._manager import CheckpointManager, StepSaveHandle
from ._state import ShardedTensor
from . import errors as _errors
from .errors import *  # noqa: F401,F403  (Error and its subclasses, errors.__all__)

__version__ = _core.__version__

__all__ = [
    "__version__",
    "save",
    "load",
    "async_save",
    "AsyncSaveHandle",
    "ShardedTensor",
    "CheckpointManager",
    "StepSaveHandle",
    "ProcessGroup",
    "process_group",
    "inspect",
    "verify",
    "convert",
    "consolidate",
    "finish_background_frees",
    *_errors.__all__,
]
