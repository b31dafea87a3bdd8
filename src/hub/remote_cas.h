// A CasBackend over HTTP: the Xet CAS routes of a megahub (POST /v1/xorbs,
// POST /v1/shards, GET /v1/reconstructions, xorb range GETs) plus megahub's
// batch dedup lookup (POST /v1/chunks/lookup). With it, CasStore uploads to a
// remote hub exactly as to a local store: chunks are hashed and deduplicated
// locally, and only xorbs holding chunks the hub lacks are sent.
#ifndef MEGACKPT_HUB_REMOTE_CAS_H_
#define MEGACKPT_HUB_REMOTE_CAS_H_

#include <memory>

#include "hub/http_client.h"
#include "megackpt/cas/store.h"

namespace megackpt::hub {

// Listing and deletion (GC) are server-side only: Unimplemented here.
std::shared_ptr<cas::CasBackend> NewRemoteCasBackend(std::shared_ptr<HttpClient> http);

}  // namespace megackpt::hub

#endif  // MEGACKPT_HUB_REMOTE_CAS_H_
