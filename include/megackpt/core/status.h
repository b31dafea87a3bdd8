// Status and Result<T>: the error vocabulary of megackpt.
//
// No exceptions cross the public API. A function that can fail returns Status
// (no value) or Result<T> (a value or a Status). Messages name the file, offset
// or key involved and what was expected, e.g.
//   "model.mega: tensor 'w' payload range [4096, 8192) exceeds payload size 6000".
//
// Codes follow absl::StatusCode's meaning:
//   kInvalidArgument    the caller passed something wrong (bad option, bad URI)
//   kNotFound           a file, key, tensor, repo or revision does not exist
//   kAlreadyExists      creating something that is already there
//   kDataLoss           stored bytes are corrupt or malformed (bad magic, checksum mismatch)
//   kAborted            a conditional write lost (commit conflict), or a peer rank failed
//   kUnavailable        transient; retrying may succeed (connection refused, 503)
//   kFailedPrecondition the system is not in the state the call needs
//   kOutOfRange         a read past the end of a file or tensor
//   kResourceExhausted  a size limit was hit (request too large, header too big)
//   kPermissionDenied   authenticated but not allowed
//   kUnauthenticated    no or invalid credentials
//   kDeadlineExceeded   a timeout elapsed (e.g. a peer rank stopped answering)
//   kUnimplemented      the operation is not supported by this backend
//   kInternal           a bug: an invariant of megackpt itself was broken
//   kIOError            the operating system refused an I/O call (errno in message)
#ifndef MEGACKPT_CORE_STATUS_H_
#define MEGACKPT_CORE_STATUS_H_

#include <cassert>
#include <memory>
#include <string>
#include <string_view>
#include <utility>
#include <variant>

namespace megackpt::inline core {

enum class StatusCode : int {
  kOk = 0,
  kInvalidArgument,
  kNotFound,
  kAlreadyExists,
  kDataLoss,
  kAborted,
  kUnavailable,
  kFailedPrecondition,
  kOutOfRange,
  kResourceExhausted,
  kPermissionDenied,
  kUnauthenticated,
  kDeadlineExceeded,
  kUnimplemented,
  kInternal,
  kIOError,
};

// Returns a stable, human-readable name ("NotFound", "DataLoss", ...).
std::string_view StatusCodeName(StatusCode code);

class [[nodiscard]] Status {
 public:
  // An OK status. Cheap: holds no allocation.
  Status() = default;
  Status(StatusCode code, std::string message);

  static Status OK() { return Status(); }

  bool ok() const { return rep_ == nullptr; }
  StatusCode code() const { return rep_ ? rep_->code : StatusCode::kOk; }
  // Empty for OK.
  const std::string& message() const;
  // "OK" or "<CodeName>: <message>".
  std::string ToString() const;

  // Returns a copy whose message is "<prefix>: <message>"; OK stays OK.
  Status WithContext(std::string_view prefix) const;

  // Explicitly discards the status (documents intent at call sites).
  void IgnoreError() const {}

  friend bool operator==(const Status& a, const Status& b) {
    return a.code() == b.code() && a.message() == b.message();
  }

 private:
  struct Rep {
    StatusCode code;
    std::string message;
  };
  std::shared_ptr<const Rep> rep_;
};

// Factories, one per code.
Status InvalidArgumentError(std::string message);
Status NotFoundError(std::string message);
Status AlreadyExistsError(std::string message);
Status DataLossError(std::string message);
Status AbortedError(std::string message);
Status UnavailableError(std::string message);
Status FailedPreconditionError(std::string message);
Status OutOfRangeError(std::string message);
Status ResourceExhaustedError(std::string message);
Status PermissionDeniedError(std::string message);
Status UnauthenticatedError(std::string message);
Status DeadlineExceededError(std::string message);
Status UnimplementedError(std::string message);
Status InternalError(std::string message);
Status IOError(std::string message);

// Maps an errno value to a Status: ENOENT -> NotFound, EEXIST -> AlreadyExists,
// EACCES/EPERM -> PermissionDenied, ENOSPC/EDQUOT -> ResourceExhausted,
// anything else -> IOError. Message: "<context>: <strerror(err)>".
Status ErrnoToStatus(std::string_view context, int err);

// A value of type T or an error Status. REQUIRES: the Status given is not OK.
template <typename T>
class [[nodiscard]] Result {
 public:
  Result(T value) : v_(std::move(value)) {}        // NOLINT: implicit by design
  Result(Status status) : v_(std::move(status)) {  // NOLINT
    assert(!std::get<Status>(v_).ok() && "Result constructed from OK status");
    if (std::get<Status>(v_).ok()) v_ = InternalError("Result constructed from OK status");
  }

  bool ok() const { return std::holds_alternative<T>(v_); }
  // OK when a value is held.
  Status status() const { return ok() ? Status::OK() : std::get<Status>(v_); }

  // REQUIRES: ok().
  T& value() & { return std::get<T>(v_); }
  const T& value() const& { return std::get<T>(v_); }
  T&& value() && { return std::get<T>(std::move(v_)); }

  T& operator*() & { return value(); }
  const T& operator*() const& { return value(); }
  T&& operator*() && { return std::move(*this).value(); }
  T* operator->() { return &value(); }
  const T* operator->() const { return &value(); }

 private:
  std::variant<Status, T> v_;
};

namespace internal {
inline Status AsStatus(const Status& s) { return s; }
template <typename T>
Status AsStatus(const Result<T>& r) {
  return r.status();
}
}  // namespace internal

}  // namespace megackpt::inline core

#define MEGA_CONCAT_INNER_(a, b) a##b
#define MEGA_CONCAT_(a, b) MEGA_CONCAT_INNER_(a, b)

// Returns from the enclosing function if `expr` (a Status or Result) is an error.
#define MEGA_RETURN_IF_ERROR(expr)                                            \
  do {                                                                        \
    ::megackpt::Status mega_status_ = ::megackpt::internal::AsStatus((expr)); \
    if (!mega_status_.ok()) return mega_status_;                              \
  } while (0)

// `lhs = value of expr` or returns its error. lhs may declare: `auto x`.
#define MEGA_ASSIGN_OR_RETURN(lhs, expr) \
  MEGA_ASSIGN_OR_RETURN_IMPL_(MEGA_CONCAT_(mega_result_, __LINE__), lhs, expr)
#define MEGA_ASSIGN_OR_RETURN_IMPL_(tmp, lhs, expr) \
  auto tmp = (expr);                                \
  if (!tmp.ok()) return tmp.status();               \
  lhs = std::move(tmp).value()

#endif  // MEGACKPT_CORE_STATUS_H_
