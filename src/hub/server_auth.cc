// megahub authentication: bearer hub tokens (HubStore::Authenticate) and
// short-lived Xet CAS tokens ("xet_" + hex payload + "." + HMAC-SHA256 with
// the store's secret; payload "r|w" "|" expiry "|" resource), and the
// read/write rules on them (docs/hub.md §5).
#include <cstdlib>

#include "hub/server_internal.h"
#include "hub/util.h"
#include "megackpt/core/checksum.h"

namespace megackpt::hub {
namespace {

Result<Identity> VerifyXetToken(const ServerContext& ctx, std::string_view token) {
  token.remove_prefix(4);
  size_t dot = token.find('.');
  if (dot == std::string_view::npos || dot % 2 != 0 || dot > 2048) {
    return UnauthenticatedError("malformed xet token");
  }
  std::string payload(dot / 2, '\0');
  if (!FromHex(token.substr(0, dot),
               std::span<uint8_t>(reinterpret_cast<uint8_t*>(payload.data()), payload.size()))
           .ok()) {
    return UnauthenticatedError("malformed xet token");
  }
  if (!ConstantTimeEquals(token.substr(dot + 1), HmacSha256Hex(ctx.secret, payload))) {
    return UnauthenticatedError("bad xet token signature");
  }
  size_t p1 = payload.find('|');
  size_t p2 = payload.find('|', p1 == std::string::npos ? 0 : p1 + 1);
  if (p1 == std::string::npos || p2 == std::string::npos)
    return UnauthenticatedError("malformed xet token");
  int64_t exp = std::atoll(payload.substr(p1 + 1, p2 - p1 - 1).c_str());
  if (exp < NowMs() / 1000) return UnauthenticatedError("xet token expired");
  Identity who;
  who.presented = who.valid = who.xet = true;
  who.scope = payload[0] == 'w' ? TokenScope::kWrite : TokenScope::kRead;
  who.xet_resource = payload.substr(p2 + 1);
  who.name = "xet:" + who.xet_resource;
  return who;
}

}  // namespace

std::string ServerContext::Endpoint(const Request& req) const {
  std::string host = req.Header("Host");
  if (host.empty()) host = options.host + ":" + std::to_string(port);
  return "http://" + host;
}

Identity Authenticate(ServerContext& ctx, const Request& req) {
  Identity who;
  std::string auth = req.Header("Authorization");
  if (auth.empty()) return who;
  who.presented = true;
  constexpr std::string_view kBearer = "Bearer ";
  if (auth.size() <= kBearer.size() || auth.compare(0, kBearer.size(), kBearer) != 0) return who;
  std::string token = auth.substr(kBearer.size());
  if (token.rfind("xet_", 0) == 0) {
    auto x = VerifyXetToken(ctx, token);
    if (x.ok()) return *x;
    return who;
  }
  auto info = ctx.store->Authenticate(token);
  if (!info.ok()) return who;
  who.valid = true;
  who.scope = info->scope;
  who.ns = info->ns;
  who.name = info->ns ? *info->ns : "token-" + info->id;
  return who;
}

std::string MakeXetToken(const ServerContext& ctx, bool write, const std::string& resource) {
  int64_t exp = NowMs() / 1000 + ctx.options.xet_token_seconds;
  std::string payload = std::string(write ? "w" : "r") + "|" + std::to_string(exp) + "|" + resource;
  std::string hex_payload = ToHex(
      std::span<const uint8_t>(reinterpret_cast<const uint8_t*>(payload.data()), payload.size()));
  return "xet_" + hex_payload + "." + HmacSha256Hex(ctx.secret, payload);
}

Response XetTokenResponse(const ServerContext& ctx, const Request& req, bool write,
                          const std::string& resource) {
  std::string token = MakeXetToken(ctx, write, resource);
  int64_t exp = NowMs() / 1000 + ctx.options.xet_token_seconds;
  std::string cas_url = ctx.Endpoint(req);
  Response res = JsonResponse({{"accessToken", token}, {"exp", exp}, {"casUrl", cas_url}});
  res.SetHeader("X-Xet-Access-Token", token);
  res.SetHeader("X-Xet-Token-Expiration", std::to_string(exp));
  res.SetHeader("X-Xet-Cas-Url", cas_url);
  return res;
}

std::string SignedXorbUrl(const ServerContext& ctx, const std::string& endpoint,
                          const std::string& xorb_hex) {
  int64_t exp = NowMs() / 1000 + ctx.options.xet_token_seconds;
  std::string exp_text = std::to_string(exp);
  return endpoint + "/v1/xorbs/default/" + xorb_hex + "?X-Xet-Expires=" + exp_text +
         "&X-Xet-Signature=" + HmacSha256Hex(ctx.secret, "xorb|" + xorb_hex + "|" + exp_text);
}

bool HasValidXorbSignature(const ServerContext& ctx, const Request& req,
                           std::string_view xorb_hex) {
  if (!req.HasParam("X-Xet-Signature")) return false;
  std::string exp_text = req.Param("X-Xet-Expires");
  if (exp_text.empty() || exp_text.size() > 20 ||
      exp_text.find_first_not_of("0123456789") != std::string::npos) {
    return false;
  }
  if (std::strtoll(exp_text.c_str(), nullptr, 10) < NowMs() / 1000) return false;
  return ConstantTimeEquals(
      req.Param("X-Xet-Signature"),
      HmacSha256Hex(ctx.secret, "xorb|" + ToLower(xorb_hex) + "|" + exp_text));
}

Status CheckRead(const Identity& who, bool is_private, const std::string& ns) {
  if (who.presented && !who.valid) return UnauthenticatedError("invalid token");
  if (!is_private) return Status::OK();
  if (!who.valid || who.xet)
    return UnauthenticatedError("a token is required for this private repository");
  if (who.ns && *who.ns != ns) {
    return PermissionDeniedError("token is limited to namespace '" + *who.ns + "'");
  }
  return Status::OK();
}

Status CheckAnyWrite(const Identity& who) {
  if (!who.presented) return UnauthenticatedError("a write token is required");
  if (!who.valid || who.xet) return UnauthenticatedError("invalid token");
  if (who.scope != TokenScope::kWrite) return PermissionDeniedError("token is read-only");
  return Status::OK();
}

Status CheckWrite(const Identity& who, const std::string& ns) {
  MEGA_RETURN_IF_ERROR(CheckAnyWrite(who));
  if (who.ns && *who.ns != ns) {
    return PermissionDeniedError("token may not write to namespace '" + ns + "' (limited to '" +
                                 *who.ns + "')");
  }
  return Status::OK();
}

ContentAccess AccessOf(const Identity& who) {
  ContentAccess a;
  if (who.xet) {
    // "repo:ns/name" or "bucket:ns/name": the namespace of the resource the
    // token was issued for.
    size_t colon = who.xet_resource.find(':');
    std::string id =
        colon == std::string::npos ? who.xet_resource : who.xet_resource.substr(colon + 1);
    a.ns = id.substr(0, id.find('/'));
  } else if (who.valid) {
    a.ns = who.ns;
  } else {
    a.ns = "";  // anonymous: public content only
  }
  return a;
}

}  // namespace megackpt::hub
