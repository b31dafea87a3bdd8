#include "megackpt/core/status.h"

#include <cerrno>
#include <cstring>

namespace megackpt::inline core {

std::string_view StatusCodeName(StatusCode code) {
  switch (code) {
    case StatusCode::kOk:
      return "OK";
    case StatusCode::kInvalidArgument:
      return "InvalidArgument";
    case StatusCode::kNotFound:
      return "NotFound";
    case StatusCode::kAlreadyExists:
      return "AlreadyExists";
    case StatusCode::kDataLoss:
      return "DataLoss";
    case StatusCode::kAborted:
      return "Aborted";
    case StatusCode::kUnavailable:
      return "Unavailable";
    case StatusCode::kFailedPrecondition:
      return "FailedPrecondition";
    case StatusCode::kOutOfRange:
      return "OutOfRange";
    case StatusCode::kResourceExhausted:
      return "ResourceExhausted";
    case StatusCode::kPermissionDenied:
      return "PermissionDenied";
    case StatusCode::kUnauthenticated:
      return "Unauthenticated";
    case StatusCode::kDeadlineExceeded:
      return "DeadlineExceeded";
    case StatusCode::kUnimplemented:
      return "Unimplemented";
    case StatusCode::kInternal:
      return "Internal";
    case StatusCode::kIOError:
      return "IOError";
  }
  return "Unknown";
}

Status::Status(StatusCode code, std::string message) {
  if (code != StatusCode::kOk) rep_ = std::make_shared<const Rep>(Rep{code, std::move(message)});
}

const std::string& Status::message() const {
  static const std::string kEmpty;
  return rep_ ? rep_->message : kEmpty;
}

std::string Status::ToString() const {
  if (ok()) return "OK";
  std::string out(StatusCodeName(code()));
  out += ": ";
  out += message();
  return out;
}

Status Status::WithContext(std::string_view prefix) const {
  if (ok()) return *this;
  std::string msg(prefix);
  msg += ": ";
  msg += message();
  return Status(code(), std::move(msg));
}

#define MEGA_DEFINE_FACTORY_(Name, Code) \
  Status Name(std::string message) { return Status(StatusCode::Code, std::move(message)); }
MEGA_DEFINE_FACTORY_(InvalidArgumentError, kInvalidArgument)
MEGA_DEFINE_FACTORY_(NotFoundError, kNotFound)
MEGA_DEFINE_FACTORY_(AlreadyExistsError, kAlreadyExists)
MEGA_DEFINE_FACTORY_(DataLossError, kDataLoss)
MEGA_DEFINE_FACTORY_(AbortedError, kAborted)
MEGA_DEFINE_FACTORY_(UnavailableError, kUnavailable)
MEGA_DEFINE_FACTORY_(FailedPreconditionError, kFailedPrecondition)
MEGA_DEFINE_FACTORY_(OutOfRangeError, kOutOfRange)
MEGA_DEFINE_FACTORY_(ResourceExhaustedError, kResourceExhausted)
MEGA_DEFINE_FACTORY_(PermissionDeniedError, kPermissionDenied)
MEGA_DEFINE_FACTORY_(UnauthenticatedError, kUnauthenticated)
MEGA_DEFINE_FACTORY_(DeadlineExceededError, kDeadlineExceeded)
MEGA_DEFINE_FACTORY_(UnimplementedError, kUnimplemented)
MEGA_DEFINE_FACTORY_(InternalError, kInternal)
MEGA_DEFINE_FACTORY_(IOError, kIOError)
#undef MEGA_DEFINE_FACTORY_

Status ErrnoToStatus(std::string_view context, int err) {
  std::string msg(context);
  msg += ": ";
  msg += std::strerror(err);
  switch (err) {
    case ENOENT:
    case ENOTDIR:
      return NotFoundError(std::move(msg));
    case EEXIST:
      return AlreadyExistsError(std::move(msg));
    case EACCES:
    case EPERM:
      return PermissionDeniedError(std::move(msg));
    case ENOSPC:
    case EDQUOT:
    case ENOMEM:
      return ResourceExhaustedError(std::move(msg));
    case EINVAL:
      return InvalidArgumentError(std::move(msg));
    default:
      return IOError(std::move(msg));
  }
}

}  // namespace megackpt::inline core
