// megahub answers: Status -> HTTP status, error and JSON responses, and
// request bodies read only after the route accepted the headers.
#include "hub/server_internal.h"

namespace megackpt::hub {

int HttpStatusFor(const Status& s) {
  switch (s.code()) {
    case StatusCode::kInvalidArgument:
    case StatusCode::kDataLoss:
    case StatusCode::kOutOfRange:
      return 400;
    case StatusCode::kNotFound:
      return 404;
    case StatusCode::kAlreadyExists:
    case StatusCode::kAborted:
      return 409;
    case StatusCode::kFailedPrecondition:
      return 412;
    case StatusCode::kUnauthenticated:
      return 401;
    case StatusCode::kPermissionDenied:
      return 403;
    case StatusCode::kResourceExhausted:
      return 413;
    case StatusCode::kUnavailable:
      return 503;
    case StatusCode::kUnimplemented:
      return 501;
    default:
      return 500;
  }
}

Response ErrorResponse(int status, const std::string& message, const std::string& code) {
  Response r = JsonResponse({{"error", message}}, status);
  if (!code.empty()) r.SetHeader("X-Error-Code", code);
  std::string header_msg;
  for (char c : message.substr(0, 300)) header_msg += (c >= 0x20 && c < 0x7f) ? c : '?';
  r.SetHeader("X-Error-Message", header_msg);
  return r;
}

Response ErrorFrom(const Status& s, const std::string& code) {
  return ErrorResponse(HttpStatusFor(s), s.message(), code);
}

Response JsonResponse(const json& body, int status) {
  Response r;
  r.status = status;
  r.body = Dump(body);
  r.SetHeader("Content-Type", "application/json");
  return r;
}

Response BytesResponse(std::string body, const std::string& type) {
  Response r;
  r.body = std::move(body);
  r.SetHeader("Content-Type", type);
  return r;
}

Status CheckDeclaredLength(const Request& req, uint64_t limit) {
  if (req.content_length && *req.content_length > limit) {
    return ResourceExhaustedError("request body of " + std::to_string(*req.content_length) +
                                  " bytes exceeds " + std::to_string(limit) + " bytes");
  }
  return Status::OK();
}

Result<Action> WithBody(const Call& call, uint64_t limit,
                        std::function<Result<Response>(std::string body)> then) {
  MEGA_RETURN_IF_ERROR(CheckDeclaredLength(call.req, limit));
  return Action(httpd::BufferedBody(limit, call.req.content_length.value_or(0), std::move(then)));
}

Result<Action> WithJsonBody(const Call& call, uint64_t limit,
                            std::function<Result<Response>(json body)> then) {
  return WithBody(call, limit, [then = std::move(then)](std::string body) -> Result<Response> {
    json j = json::parse(body, nullptr, false);
    if (j.is_discarded() || !j.is_object()) return ErrorResponse(400, "body is not a JSON object");
    return then(std::move(j));
  });
}

}  // namespace megackpt::hub
