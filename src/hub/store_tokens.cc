// HubStore: bearer tokens (only their SHA-256 is stored) and the server secret.
#include "hub/store_internal.h"
#include "hub/util.h"
#include "megackpt/hub/mega_uri.h"
#include "megackpt/hub/store.h"

namespace megackpt::hub {

using namespace store_internal;

Result<std::string> HubStore::CreateToken(TokenScope scope, std::optional<std::string> ns,
                                          std::string description) {
  if (ns) MEGA_RETURN_IF_ERROR(ValidateRepoNamePart(*ns, "namespace"));
  std::string token = "mega_" + RandomHex(20);
  MEGA_ASSIGN_OR_RETURN(auto db, impl_->pool->Acquire());
  MEGA_RETURN_IF_ERROR(WithWriteTxn(db.db(), [&]() -> Status {
    MEGA_ASSIGN_OR_RETURN(auto st, db->Prepare("INSERT INTO tokens(hash, scope, namespace, "
                                               "description, created_ms) VALUES(?, ?, ?, ?, ?)"));
    return st.Bind(1, Sha256Hex(token))
        .Bind(2, scope == TokenScope::kWrite ? "write" : "read")
        .Bind(3, ns)
        .Bind(4, description)
        .Bind(5, NowMs())
        .Run();
  }));
  return token;
}

Result<TokenInfo> HubStore::Authenticate(std::string_view token) {
  if (token.empty()) return UnauthenticatedError("no token");
  std::string hash = Sha256Hex(token);
  MEGA_ASSIGN_OR_RETURN(auto db, impl_->pool->Acquire());
  MEGA_ASSIGN_OR_RETURN(
      auto st,
      db->Prepare("SELECT scope, namespace, description, created_ms FROM tokens WHERE hash = ?"));
  st.Bind(1, hash);
  MEGA_ASSIGN_OR_RETURN(bool has, st.Step());
  if (!has) return UnauthenticatedError("invalid token");
  TokenInfo info;
  info.id = hash.substr(0, 8);
  info.scope = ScopeFromText(st.Text(0));
  info.ns = st.OptText(1);
  info.description = st.Text(2);
  info.created_ms = st.Int(3);
  return info;
}

Result<std::string> HubStore::ServerSecret() {
  if (!impl_->secret.empty()) return impl_->secret;
  MEGA_ASSIGN_OR_RETURN(auto db, impl_->pool->Acquire());
  MEGA_ASSIGN_OR_RETURN(auto st, db->Prepare("SELECT value FROM meta WHERE key = 'secret'"));
  MEGA_ASSIGN_OR_RETURN(bool has, st.Step());
  if (!has) return InternalError("hub root " + root_ + ": no server secret in meta");
  impl_->secret = st.Text(0);
  return impl_->secret;
}

}  // namespace megackpt::hub
