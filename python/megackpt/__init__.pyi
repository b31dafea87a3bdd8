# Type stubs of the megackpt package (docstrings live in the .py modules).
from os import PathLike
from typing import Any, Iterable, Mapping, Optional, Sequence, Tuple, Union

from ._core import ProcessGroup as ProcessGroup
from .errors import (
    AbortedError as AbortedError,
    AlreadyExistsError as AlreadyExistsError,
    DataLossError as DataLossError,
    DeadlineExceededError as DeadlineExceededError,
    Error as Error,
    FailedPreconditionError as FailedPreconditionError,
    InternalError as InternalError,
    InvalidArgumentError as InvalidArgumentError,
    IOFailureError as IOFailureError,
    NotFoundError as NotFoundError,
    OutOfRangeError as OutOfRangeError,
    PermissionDeniedError as PermissionDeniedError,
    ResourceExhaustedError as ResourceExhaustedError,
    UnauthenticatedError as UnauthenticatedError,
    UnavailableError as UnavailableError,
    UnimplementedError as UnimplementedError,
)

__version__: str

Path = Union[str, PathLike[str]]
StateDict = Mapping[str, Any]

class ShardedTensor:
    global_shape: Tuple[int, ...]
    dtype: str
    shards: list[Tuple[Tuple[int, ...], Any]]
    def __init__(self, global_shape: Sequence[int], dtype: Any,
                 shards: Iterable[Tuple[Sequence[int], Any]] = ...) -> None: ...

class AsyncSaveHandle:
    def staged(self) -> bool: ...
    def done(self) -> bool: ...
    def wait_staged(self, timeout: Optional[float] = ...) -> bool: ...
    def result(self, timeout: Optional[float] = ...) -> None: ...
    def wait(self, timeout: Optional[float] = ...) -> None: ...

def process_group(backend: Optional[str] = ..., *, timeout: float = ...) -> ProcessGroup: ...
def save(state_dict: StateDict, path: Path, *, storage: str = ..., group: Optional[ProcessGroup] = ...,
         thread_count: int = ..., sync: bool = ..., overwrite: bool = ...,
         fqn_to_index_mapping: Optional[Mapping[str, int]] = ..., checksum: Optional[str] = ...,
         consolidate: Optional[bool] = ..., use_collectives: bool = ...) -> None: ...
def load(path: Path, state_dict: Optional[StateDict] = ..., *, storage: str = ...,
         group: Optional[ProcessGroup] = ..., tensor_type: str = ..., thread_count: int = ...,
         verify: bool = ..., allow_partial: bool = ..., use_collectives: bool = ...) -> dict[str, Any]: ...
def async_save(state_dict: StateDict, path: Path, *, storage: str = ...,
               group: Optional[ProcessGroup] = ..., thread_count: int = ..., sync: bool = ...,
               overwrite: bool = ..., fqn_to_index_mapping: Optional[Mapping[str, int]] = ...,
               checksum: Optional[str] = ..., consolidate: Optional[bool] = ...,
               use_collectives: bool = ..., staging_bytes: Optional[int] = ...) -> AsyncSaveHandle: ...
def inspect(path: Path) -> dict[str, Any]: ...
def verify(path: Path, *, raise_on_error: bool = ...) -> dict[str, Any]: ...
def convert(src: Path, dst: Path, *, max_shard_size: Optional[int] = ..., alignment: int = ...,
            checksum: str = ..., compression: str = ..., zstd_level: int = ...,
            format: Optional[str] = ..., sync: bool = ...) -> dict[str, Any]: ...
def consolidate(src: Path, dst: Path, *, format: str = ..., max_shard_size: int = ...,
                thread_count: int = ..., sync: bool = ...,
                group: Optional[ProcessGroup] = ...) -> dict[str, Any]: ...
