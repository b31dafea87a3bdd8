"""Exceptions raised by megackpt.

Every failure of the C++ engine arrives as one subclass of :class:`Error`, chosen
by the engine's status code (the mapping is made in one place, the extension's
``errors.cc``, through ``_BY_CODE`` below). Messages name the file, tensor, key or
offset involved, exactly as the C++ API reports them. Where a Python built-in
exception means the same thing, the class also derives from it, so
``except FileNotFoundError`` or ``except ValueError`` keep working.
"""

__all__ = [
    "Error",
    "InvalidArgumentError",
    "NotFoundError",
    "AlreadyExistsError",
    "DataLossError",
    "AbortedError",
    "UnavailableError",
    "FailedPreconditionError",
    "OutOfRangeError",
    "ResourceExhaustedError",
    "PermissionDeniedError",
    "UnauthenticatedError",
    "DeadlineExceededError",
    "UnimplementedError",
    "InternalError",
    "IOFailureError",
]


class Error(Exception):
    """Base class of every megackpt error. ``code`` is the status code name."""

    code = "Unknown"


class InvalidArgumentError(Error, ValueError):
    """The caller passed something wrong (bad option, shape or dtype mismatch)."""

    code = "InvalidArgument"


class NotFoundError(Error, FileNotFoundError):
    """A file, checkpoint, tensor, repo or revision does not exist."""

    code = "NotFound"


class AlreadyExistsError(Error, FileExistsError):
    """Creating something that is already there (e.g. save with overwrite=False)."""

    code = "AlreadyExists"


class DataLossError(Error):
    """Stored bytes are corrupt or malformed (checksum mismatch, truncated shard)."""

    code = "DataLoss"


class AbortedError(Error):
    """A conditional write lost (hub commit conflict), or a peer rank failed."""

    code = "Aborted"


class UnavailableError(Error, ConnectionError):
    """Transient: retrying may succeed (connection refused, 503)."""

    code = "Unavailable"


class FailedPreconditionError(Error):
    """The system is not in the state the call needs."""

    code = "FailedPrecondition"


class OutOfRangeError(Error, IndexError):
    """A read past the end of a file or tensor."""

    code = "OutOfRange"


class ResourceExhaustedError(Error):
    """A size limit was hit (out of memory or disk, header too big)."""

    code = "ResourceExhausted"


class PermissionDeniedError(Error, PermissionError):
    """Authenticated but not allowed."""

    code = "PermissionDenied"


class UnauthenticatedError(Error):
    """No or invalid credentials (hub token)."""

    code = "Unauthenticated"


class DeadlineExceededError(Error, TimeoutError):
    """A timeout elapsed (e.g. a peer rank stopped answering)."""

    code = "DeadlineExceeded"


class UnimplementedError(Error, NotImplementedError):
    """The operation is not supported by this backend."""

    code = "Unimplemented"


class InternalError(Error):
    """A bug: an invariant of megackpt itself was broken."""

    code = "Internal"


class IOFailureError(Error, OSError):
    """The operating system refused an I/O call (the errno text is in the message)."""

    code = "IOError"


_BY_CODE = {cls.code: cls for cls in (Error, *(globals()[n] for n in __all__[1:]))}
