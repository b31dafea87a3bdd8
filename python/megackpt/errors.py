"""Exceptions raised by megackpt.

Every failure of the C++ engine arrives as one subclass of :class:`Error`, chosen
by the engine's status code (the mapping is made in one place, the extension's
``errors.cc``, through ``_BY_CODE`` below). Messages name the file, tensor, key or
offset involved, exactly as the C++ API reports them. Where a Python built-in
exception means the same thing, the class also derives from it, so
``except FileNotFoundError`` or ``except ValueError`` keep working.
"""

class Error(Exception):
    """Base class of every megackpt error. ``code`` is the status code name."""

    code = "Unknown"


# (class name, status code, Python built-ins it also derives from, meaning). One
# row per code of include/megackpt/core/status.h; the classes are made from it.
_TABLE = [
    ("InvalidArgumentError", "InvalidArgument", (ValueError,),
     "The caller passed something wrong (bad option, shape or dtype mismatch)."),
    ("NotFoundError", "NotFound", (FileNotFoundError,),
     "A file, checkpoint, tensor, repo or revision does not exist."),
    ("AlreadyExistsError", "AlreadyExists", (FileExistsError,),
     "Creating something that is already there (e.g. save with overwrite=False)."),
    ("DataLossError", "DataLoss", (),
     "Stored bytes are corrupt or malformed (checksum mismatch, truncated shard)."),
    ("AbortedError", "Aborted", (),
     "A conditional write lost (hub commit conflict), or a peer rank failed."),
    ("UnavailableError", "Unavailable", (ConnectionError,),
     "Transient: retrying may succeed (connection refused, 503)."),
    ("FailedPreconditionError", "FailedPrecondition", (),
     "The system is not in the state the call needs."),
    ("OutOfRangeError", "OutOfRange", (IndexError,), "A read past the end of a file or tensor."),
    ("ResourceExhaustedError", "ResourceExhausted", (),
     "A size limit was hit (out of memory or disk, header too big)."),
    ("PermissionDeniedError", "PermissionDenied", (PermissionError,), "Authenticated but not allowed."),
    ("UnauthenticatedError", "Unauthenticated", (), "No or invalid credentials (hub token)."),
    ("DeadlineExceededError", "DeadlineExceeded", (TimeoutError,),
     "A timeout elapsed (e.g. a peer rank stopped answering)."),
    ("UnimplementedError", "Unimplemented", (NotImplementedError,),
     "The operation is not supported by this backend."),
    ("InternalError", "Internal", (), "A bug: an invariant of megackpt itself was broken."),
    ("IOFailureError", "IOError", (OSError,),
     "The operating system refused an I/O call (the errno text is in the message)."),
]

for _name, _code, _builtins, _doc in _TABLE:
    globals()[_name] = type(_name, (Error, *_builtins),
                            {"code": _code, "__doc__": _doc, "__module__": __name__})

__all__ = ["Error", *(row[0] for row in _TABLE)]

_BY_CODE = {cls.code: cls for cls in (Error, *(globals()[n] for n in __all__[1:]))}
