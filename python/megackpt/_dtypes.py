"""dtype names: megackpt's on-disk names ("F32", "BF16", ...) and numpy/torch dtypes."""

# on-disk name -> (numpy dtype name or None, torch/TensorPlay attribute or None)
_TABLE = {
    "BOOL": ("bool", "bool"),
    "U8": ("uint8", "uint8"),
    "I8": ("int8", "int8"),
    "I16": ("int16", "int16"),
    "U16": ("uint16", "uint16"),
    "I32": ("int32", "int32"),
    "U32": ("uint32", "uint32"),
    "I64": ("int64", "int64"),
    "U64": ("uint64", "uint64"),
    "F16": ("float16", "float16"),
    "BF16": (None, "bfloat16"),
    "F32": ("float32", "float32"),
    "F64": ("float64", "float64"),
    "F8_E5M2": (None, "float8_e5m2"),
    "F8_E4M3": (None, "float8_e4m3fn"),
    "F8_E8M0": (None, "float8_e8m0fnu"),
    "F4": (None, None),
}

NAMES = tuple(_TABLE)
_BY_ALIAS = {}
for _name, (_np, _fw) in _TABLE.items():
    _BY_ALIAS[_name] = _name
    _BY_ALIAS[_name.lower()] = _name
    for _alias in (_np, _fw):
        if _alias:
            _BY_ALIAS[_alias] = _name


def dtype_name(dtype) -> str:
    """The on-disk name of ``dtype``: a name ("F32", "float32", "bfloat16"), a
    numpy dtype or type, or a torch/TensorPlay dtype."""
    from .errors import InvalidArgumentError

    if isinstance(dtype, str):
        key = dtype
    else:
        text = str(dtype)  # torch.float32 -> "torch.float32"; np.dtype -> "float32"
        if text.startswith("<class 'numpy."):
            text = text[len("<class 'numpy."):-2]
        key = text.rsplit(".", 1)[-1]
    try:
        return _BY_ALIAS[key]
    except KeyError:
        raise InvalidArgumentError(f"unsupported dtype {dtype!r}") from None


def framework_dtype(module, name: str):
    """The dtype object of ``module`` (torch or tensorplay) for an on-disk name."""
    from .errors import InvalidArgumentError

    attr = _TABLE[name][1]
    value = getattr(module, attr, None) if attr else None
    if value is None:
        raise InvalidArgumentError(f"{module.__name__} has no dtype for {name}")
    return value
