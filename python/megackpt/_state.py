"""Python state dicts <-> the trees the engine understands.

The engine stores dicts (str keys), lists, arrays, sharded tensors and bytes.
This module maps everything else onto those, following torch.distributed.checkpoint's
traversal so both name entries alike:

- dict keys become ``str(key)``; nested entries are named by their dotted path
  ("optim.state.0.exp_avg") and the nesting is rebuilt on load;
- a list is traversed when it holds (at any depth) an array, ShardedTensor,
  bytes or dict; otherwise it is one object;
- arrays (numpy, CPU torch/TensorPlay tensors, anything with the buffer protocol
  or ``__dlpack__``) and ShardedTensors are stored as tensors, zero-copy;
- ``bytes`` are stored as they are;
- any other value (numbers, strings, None, tuples, ...) is pickled and restored
  as the object. Their names go into the checkpoint's planner data
  (``{"megackpt.python": 1, "objects": [...]}``) so a load knows to unpickle.
"""

import json
import pickle
from collections.abc import Mapping

from .errors import InvalidArgumentError

_EXTRA_KEY = "megackpt.python"


class ShardedTensor:
    """This rank's pieces of a larger tensor.

    ``global_shape``: the shape of the whole tensor. ``dtype``: its element type
    (a name such as "F32"/"float32"/"bfloat16", a numpy dtype or a torch dtype).
    ``shards``: ``[(offsets, array), ...]``, each array holding the elements
    ``[offsets[d], offsets[d] + array.shape[d])`` of every dimension ``d``.
    Across all ranks the shards must tile the global shape exactly once
    (replicas of the same shard are allowed; one copy is stored).

    Saving reads the arrays in place; loading into a ShardedTensor fills its
    arrays in place, whatever the sharding the checkpoint was saved with.
    """

    __slots__ = ("global_shape", "dtype", "shards")

    def __init__(self, global_shape, dtype, shards=()):
        from ._dtypes import dtype_name

        self.global_shape = tuple(int(d) for d in global_shape)
        self.dtype = dtype_name(dtype)
        self.shards = [(tuple(int(o) for o in off), arr) for off, arr in shards]

    def __repr__(self):
        return (f"ShardedTensor(global_shape={self.global_shape}, dtype={self.dtype!r}, "
                f"shards={[(o, tuple(a.shape)) for o, a in self.shards]})")


def _is_array(value) -> bool:
    if isinstance(value, (bytes, str, ShardedTensor)) or value is None:
        return False
    t = type(value)
    if t.__module__ == "numpy" and t.__name__ == "ndarray":
        return True
    return hasattr(value, "__dlpack__") and hasattr(value, "shape")


def _array_leaf(value):
    # torch refuses __dlpack__ on tensors that require grad; detach() shares memory.
    if getattr(value, "requires_grad", False):
        value = value.detach()
    return value


def _is_stored_leaf(value) -> bool:
    return isinstance(value, (bytes, ShardedTensor)) or _is_array(value)


def _traverse_list(value) -> bool:
    for v in value:
        if _is_stored_leaf(v) or isinstance(v, Mapping):
            return True
        if isinstance(v, list) and _traverse_list(v):
            return True
    return False


def _join(fqn, key):
    return key if not fqn else f"{fqn}.{key}"


def _walk(value, fqn, leaf):
    """Rebuilds ``value`` as an engine tree; ``leaf(fqn, value)`` maps each leaf."""
    if isinstance(value, Mapping):
        out = {}
        for k, v in value.items():
            key = str(k)
            if key in out:
                raise InvalidArgumentError(f"state dict '{fqn}': two keys are both {key!r} as str")
            out[key] = _walk(v, _join(fqn, key), leaf)
        return out
    if isinstance(value, list) and _traverse_list(value):
        return [_walk(v, _join(fqn, str(i)), leaf) for i, v in enumerate(value)]
    return leaf(fqn, value)


def prepare_save(state_dict):
    """(engine tree, planner extra JSON) for a save."""
    if not isinstance(state_dict, Mapping):
        raise InvalidArgumentError("a state dict must be a dict (a Mapping)")
    objects = []

    def leaf(fqn, value):
        if _is_array(value):
            return _array_leaf(value)
        if isinstance(value, (bytes, ShardedTensor)):
            return value
        objects.append(fqn)
        return pickle.dumps(value, protocol=pickle.HIGHEST_PROTOCOL)

    tree = _walk(state_dict, "", leaf)
    extra = json.dumps({_EXTRA_KEY: 1, "objects": objects}) if objects else ""
    return tree, extra


def objects_of(extra: str) -> set:
    """The fqns a checkpoint's planner extra marks as pickled objects."""
    if not extra:
        return set()
    try:
        doc = json.loads(extra)
    except ValueError:
        return set()
    if not isinstance(doc, dict) or _EXTRA_KEY not in doc:
        return set()
    return set(doc.get("objects", ()))


class LoadTarget:
    """The caller's state dict as a load destination: arrays and ShardedTensors
    are filled in place; every other leaf is replaced after the load."""

    def __init__(self, state_dict):
        if not isinstance(state_dict, Mapping):
            raise InvalidArgumentError("a state dict must be a dict (a Mapping)")
        self.state_dict = state_dict
        self.replace = []  # (fqn, container, key)
        self.tree = self._build(state_dict, "")

    def _build(self, value, fqn):
        items = value.items() if isinstance(value, Mapping) else enumerate(value)
        out = {} if isinstance(value, Mapping) else []
        for k, v in items:
            key = str(k)
            child = _join(fqn, key)
            if isinstance(v, Mapping) or (isinstance(v, list) and _traverse_list(v)):
                built = self._build(v, child)
            else:
                built = self._leaf(child, v, value, k)
            if isinstance(out, dict):
                out[key] = built
            else:
                out.append(built)
        return out

    def _leaf(self, fqn, value, container, key):
        if _is_array(value):
            return _array_leaf(value)
        if isinstance(value, ShardedTensor):
            return value
        self.replace.append((fqn, container, key))
        return b""  # placeholder: the stored bytes/object replaces it

    def finish(self, loaded_bytes, extra):
        objects = objects_of(extra)
        for fqn, container, key in self.replace:
            if fqn not in loaded_bytes:
                continue  # allow_partial: left as it was
            value = loaded_bytes[fqn]
            container[key] = pickle.loads(value) if fqn in objects else value
        return self.state_dict


def finish_built(tree, extra, raw_dtypes, tensor_type):
    """Unpickles objects of a freshly built tree; converts arrays for torch."""
    objects = objects_of(extra)
    if tensor_type not in ("numpy", "torch"):
        raise InvalidArgumentError("tensor_type must be 'numpy' or 'torch'")
    convert = None
    if tensor_type == "torch":
        import torch

        from ._dtypes import framework_dtype

        def convert(fqn, a):
            t = torch.from_numpy(a)
            name = raw_dtypes.get(fqn)
            if name is not None and name != "F4":
                t = t.view(framework_dtype(torch, name))
            return t

    def fix(value, fqn):
        if isinstance(value, dict):
            for k in list(value):
                value[k] = fix(value[k], _join(fqn, k))
            return value
        if isinstance(value, list):
            for i in range(len(value)):
                value[i] = fix(value[i], _join(fqn, str(i)))
            return value
        if isinstance(value, bytes):
            return pickle.loads(value) if fqn in objects else value
        if value is not None and convert is not None:
            return convert(fqn, value)
        return value

    return fix(tree, "")
