// megahub's Xet CAS routes (spec/xet-cas.md, docs/hub.md §4): xorbs
// (POST, GET/HEAD with ranges, layout), shards (POST), global dedup
// (GET /v1/chunks/..., megahub's batch POST /v1/chunks/lookup), file
// existence, and reconstructions (V1, V2, batch). Every CAS route needs a
// valid token; writes need write scope (CheckCasAccess).
#include <algorithm>
#include <cstring>
#include <functional>
#include <map>

#include "cas/bytes.h"
#include "hub/server_internal.h"
#include "hub/util.h"
#include "megackpt/cas/shard.h"
#include "megackpt/cas/xorb.h"
#include "megackpt/core/checksum.h"

namespace megackpt::hub {
namespace {

// At most this many xorbs in a global dedup answer besides the queried one
// (~48 KiB of shard per full xorb: 12 MiB at most, 16 GiB of file content).
constexpr size_t kMaxDedupXorbs = 256;

// The chunk ranges of a file (or of a byte range of it) grouped by xorb, as
// Xet's reconstruction answers need them.
struct ReconPlan {
  uint64_t offset_into_first_range = 0;
  json terms = json::array();
  // xorb -> merged [start, end) chunk ranges, ascending.
  std::map<cas::MerkleHash, std::vector<std::pair<uint32_t, uint32_t>>> ranges;
  std::map<cas::MerkleHash, cas::XorbLayout> layouts;
};

// Terms covering bytes [first, last] of `recon` (whole chunks; the first
// term's leading bytes before `first` are offset_into_first_range). Terms
// that are not narrowed carry their verification hash (megahub extension
// "verification_hash", omitted when unknown).
Status PlanReconstruction(cas::CasBackend& backend, const cas::FileReconstruction& recon,
                          uint64_t want_first, uint64_t want_last, ReconPlan* plan) {
  uint64_t term_start = 0;
  bool first_term = true;
  for (const auto& t : recon.terms) {
    uint64_t term_end = term_start + t.unpacked_bytes;  // exclusive
    if (recon.size == 0 || term_end <= want_first || term_start > want_last) {
      term_start = term_end;
      continue;
    }
    auto it = plan->layouts.find(t.xorb_hash);
    if (it == plan->layouts.end()) {
      MEGA_ASSIGN_OR_RETURN(auto layout, backend.GetXorbLayout(t.xorb_hash));
      it = plan->layouts.emplace(t.xorb_hash, std::move(layout)).first;
    }
    const cas::XorbLayout& layout = it->second;
    if (t.chunk_end > layout.chunks.size() || t.chunk_start >= t.chunk_end) {
      return DataLossError("file " + recon.file_hash.ToHex() + ": term past the chunks of xorb " +
                           t.xorb_hash.ToHex());
    }
    // Narrow the chunk range to the chunks overlapping the wanted bytes.
    uint32_t cs = t.chunk_start, ce = t.chunk_end;
    uint64_t pos = term_start;
    uint64_t narrowed_start = term_start;
    for (uint32_t c = t.chunk_start; c < t.chunk_end; ++c) {
      uint64_t cend = pos + layout.chunks[c].unpacked_bytes;
      if (cend <= want_first) {
        cs = c + 1;
        narrowed_start = cend;
      }
      if (pos > want_last) {
        ce = c;
        break;
      }
      pos = cend;
    }
    uint64_t unpacked = 0;
    for (uint32_t c = cs; c < ce; ++c) unpacked += layout.chunks[c].unpacked_bytes;
    if (first_term) {
      plan->offset_into_first_range = want_first - narrowed_start;
      first_term = false;
    }
    json term = {{"hash", t.xorb_hash.ToHex()},
                 {"unpacked_length", unpacked},
                 {"range", {{"start", cs}, {"end", ce}}}};
    if (cs == t.chunk_start && ce == t.chunk_end && t.verification_hash != cas::MerkleHash{}) {
      term["verification_hash"] = t.verification_hash.ToHex();
    }
    plan->terms.push_back(std::move(term));
    plan->ranges[t.xorb_hash].emplace_back(cs, ce);
    term_start = term_end;
  }
  // Merge overlapping / adjacent chunk ranges per xorb (as Xet does).
  for (auto& [xorb, list] : plan->ranges) {
    std::sort(list.begin(), list.end());
    std::vector<std::pair<uint32_t, uint32_t>> merged;
    for (const auto& r : list) {
      if (!merged.empty() && r.first <= merged.back().second) {
        merged.back().second = std::max(merged.back().second, r.second);
      } else {
        merged.push_back(r);
      }
    }
    list = std::move(merged);
  }
  return Status::OK();
}

// xorb hex -> [entry(url, chunk range, byte range)] over the merged chunk
// ranges of `plan` (byte ranges inclusive, as HTTP Range has them).
json PerXorbRanges(const ServerContext& ctx, const ReconPlan& plan, const std::string& endpoint,
                   const std::function<json(const std::string& url, const json& chunks,
                                            const json& bytes)>& entry) {
  json out = json::object();
  for (const auto& [xorb, list] : plan.ranges) {
    const cas::XorbLayout& layout = plan.layouts.at(xorb);
    std::string xh = xorb.ToHex();
    std::string url = SignedXorbUrl(ctx, endpoint, xh);
    json arr = json::array();
    for (const auto& [cs, ce] : list) {
      arr.push_back(
          entry(url, {{"start", cs}, {"end", ce}},
                {{"start", layout.chunks[cs].byte_offset}, {"end", layout.RecordEnd(ce - 1) - 1}}));
    }
    out[xh] = std::move(arr);
  }
  return out;
}

// V1 fetch_info: xorb -> [{range, url, url_range (inclusive)}].
json FetchInfoV1(const ServerContext& ctx, const ReconPlan& plan, const std::string& endpoint) {
  return PerXorbRanges(ctx, plan, endpoint,
                       [](const std::string& url, const json& chunks, const json& bytes) {
                         return json{{"range", chunks}, {"url", url}, {"url_range", bytes}};
                       });
}

// V2 xorbs: xorb -> [{url, ranges: [{chunks, bytes (inclusive)}]}], one
// single-range entry per merged range (so every fetch is a plain 206).
json XorbsV2(const ServerContext& ctx, const ReconPlan& plan, const std::string& endpoint) {
  return PerXorbRanges(
      ctx, plan, endpoint, [](const std::string& url, const json& chunks, const json& bytes) {
        return json{{"url", url},
                    {"ranges", json::array({{{"chunks", chunks}, {"bytes", bytes}}})}};
      });
}

// POST /v1/xorbs/{prefix}/{hash}: the body goes into a recycled buffer
// (no fresh pages per upload), is verified record by record, and stored.
class XorbBody final : public httpd::BodyReader {
 public:
  XorbBody(ServerContext& ctx, cas::MerkleHash hash, uint64_t reserve)
      : ctx_(ctx), hash_(hash), body_(static_cast<size_t>(reserve)) {
    body_->Clear();
  }
  Status Append(std::span<const std::byte> data) override {
    if (body_->size() + data.size() > ctx_.options.max_object_bytes) {
      return ResourceExhaustedError("xorb body exceeds " +
                                    std::to_string(ctx_.options.max_object_bytes) + " bytes");
    }
    body_->Append(data.data(), data.size());
    return Status::OK();
  }
  Result<Response> Finish(const Status& status) override {
    MEGA_RETURN_IF_ERROR(status);
    ++ctx_.counters.xorbs_received;
    ctx_.counters.xorb_bytes_received += body_->size();
    // Every record decoded and hashed without keeping the decoded bytes.
    MEGA_ASSIGN_OR_RETURN(cas::XorbLayout layout, cas::VerifyXorb(body_->span()));
    if (layout.xorb_hash != hash_) {
      return ErrorResponse(
          400, "xorb content hashes to " + layout.xorb_hash.ToHex() + ", not to " + hash_.ToHex());
    }
    MEGA_ASSIGN_OR_RETURN(
        bool inserted,
        ctx_.store->cas().backend().PutXorb(
            std::string_view(reinterpret_cast<const char*>(body_->data()), body_->size()), layout));
    if (inserted) ++ctx_.counters.xorbs_inserted;
    return JsonResponse({{"was_inserted", inserted}});
  }

 private:
  ServerContext& ctx_;
  cas::MerkleHash hash_;
  cas::internal::CachedBuffer body_;
};

Routed PostXorbRoute(Call& c) {
  MEGA_ASSIGN_OR_RETURN(auto hash, cas::MerkleHash::FromHex(c.p(1)));
  MEGA_RETURN_IF_ERROR(CheckDeclaredLength(c.req, c.ctx.options.max_object_bytes));
  return Action(std::make_unique<XorbBody>(c.ctx, hash, c.req.content_length.value_or(0)));
}

// HEAD/GET /v1/xorbs/{prefix}/{hash}[/layout]
Routed GetXorbRoute(Call& c) {
  cas::CasBackend& backend = c.store().cas().backend();
  MEGA_ASSIGN_OR_RETURN(auto hash, cas::MerkleHash::FromHex(c.p(1)));
  if (c.tail() == "layout") {
    MEGA_ASSIGN_OR_RETURN(auto layout, backend.GetXorbLayout(hash));
    return (BytesResponse(cas::EncodeXorbFooter(layout)));
  }
  if (!c.tail().empty())
    return (ErrorResponse(404, "no route for " + c.req.method + " " + c.req.path));
  MEGA_ASSIGN_OR_RETURN(uint64_t size, backend.XorbSize(hash));
  Response res;
  res.SetHeader("Accept-Ranges", "bytes");
  RangeRequest range = ParseRange(c.req.Header("Range"), size);
  if (range.kind == RangeRequest::Kind::kUnsatisfiable) return (RangeNotSatisfiable(size));
  uint64_t first = 0, len = size;
  if (range.kind == RangeRequest::Kind::kRange) {
    first = range.range.first;
    len = range.range.last - first + 1;
    res.status = 206;
    res.SetHeader("Content-Range", "bytes " + std::to_string(first) + "-" +
                                       std::to_string(range.range.last) + "/" +
                                       std::to_string(size));
  }
  res.SetHeader("Content-Type", "application/octet-stream");
  if (c.req.method == "HEAD") {
    res.head_length = len;
    return res;
  }
  MEGA_ASSIGN_OR_RETURN(res.body, backend.GetXorbRange(hash, first, len));
  return res;
}

// POST /v1/shards
Routed PostShardRoute(Call& c) {
  return WithBody(c, c.ctx.options.max_object_bytes, [&c](std::string body) -> Result<Response> {
    cas::CasBackend& backend = c.store().cas().backend();
    ++c.ctx.counters.shards_received;
    MEGA_ASSIGN_OR_RETURN(auto shard, cas::ParseShard(AsBytes(body)));
    MEGA_ASSIGN_OR_RETURN(auto imported, cas::ImportShard(backend, AsBytes(body)));
    ContentAccess access = AccessOf(c.who);
    for (const auto& f : shard.files) {
      FileEntry e;
      e.size = f.reconstruction.size;
      e.xet_hash = f.reconstruction.file_hash.ToHex();
      if (f.sha256) e.sha256 = ToHex(*f.sha256);
      if (e.size == 0) continue;
      MEGA_RETURN_IF_ERROR(c.store().RecordContent(e, /*sha256_verified=*/false, access.ns));
    }
    return JsonResponse({{"result", imported.files_imported > 0 ? 1 : 0}});
  });
}

// GET /v1/chunks/{prefix}/{hash}: global dedup, answered with a shard.
Routed GetChunkRoute(Call& c) {
  cas::CasBackend& backend = c.store().cas().backend();
  MEGA_ASSIGN_OR_RETURN(auto hash, cas::MerkleHash::FromHex(c.p(1)));
  MEGA_ASSIGN_OR_RETURN(auto loc, backend.LookupChunks(std::span<const cas::MerkleHash>(&hash, 1)));
  if (loc.empty() || !loc[0]) return (ErrorResponse(404, "chunk not found"));
  MEGA_ASSIGN_OR_RETURN(auto layout, backend.GetXorbLayout(loc[0]->xorb_hash));
  cas::Shard shard;
  shard.xorbs.push_back(cas::ShardXorbInfoFromLayout(layout));
  // Xet clients query only ~1 chunk in 1024 (and a file's first chunk), so the
  // answer names the other xorbs of the files using this one, as Xet's shard
  // answers do; without them a new version re-sends every xorb none of whose
  // chunks was queried. Only files the caller may read contribute.
  MEGA_ASSIGN_OR_RETURN(auto companions, c.store().DedupCompanionXorbs(
                                             loc[0]->xorb_hash, AccessOf(c.who), kMaxDedupXorbs));
  for (const auto& x : companions) {
    auto other = backend.GetXorbLayout(x);
    if (other.ok()) shard.xorbs.push_back(cas::ShardXorbInfoFromLayout(*other));
  }
  return (BytesResponse(cas::SerializeShard(shard)));
}

// POST /v1/chunks/lookup (megahub extension): body = N raw 32-byte chunk
// hashes; answer = N records of {u8 found, 32-byte xorb hash, u32 LE index}.
Routed LookupChunksRoute(Call& c) {
  return WithBody(c, c.ctx.options.max_json_bytes, [&c](std::string body) -> Result<Response> {
    if (body.size() % 32 != 0) return ErrorResponse(400, "body must be a multiple of 32 bytes");
    std::vector<cas::MerkleHash> hashes(body.size() / 32);
    for (size_t i = 0; i < hashes.size(); ++i)
      std::memcpy(hashes[i].bytes.data(), body.data() + 32 * i, 32);
    MEGA_ASSIGN_OR_RETURN(auto locs, c.store().cas().backend().LookupChunks(hashes));
    std::string out;
    out.reserve(locs.size() * 37);
    for (const auto& l : locs) {
      out += static_cast<char>(l ? 1 : 0);
      cas::MerkleHash h = l ? l->xorb_hash : cas::MerkleHash{};
      out.append(reinterpret_cast<const char*>(h.bytes.data()), 32);
      uint32_t idx = l ? l->chunk_index : 0;
      char le[4] = {static_cast<char>(idx), static_cast<char>(idx >> 8),
                    static_cast<char>(idx >> 16), static_cast<char>(idx >> 24)};
      out.append(le, 4);
    }
    return BytesResponse(std::move(out));
  });
}

// HEAD/GET /v1/files/{hash}
Routed FileRoute(Call& c) {
  MEGA_ASSIGN_OR_RETURN(auto hash, cas::MerkleHash::FromHex(c.p(0)));
  MEGA_ASSIGN_OR_RETURN(auto recon, c.store().cas().backend().GetFile(hash));
  if (c.req.method == "HEAD") {
    Response res;
    res.SetHeader("X-File-Size", std::to_string(recon.size));
    res.head_length = 0;
    return res;
  }
  Response res = JsonResponse({{"file_hash", hash.ToHex()}, {"size", recon.size}});
  res.SetHeader("X-File-Size", std::to_string(recon.size));
  return res;
}

// GET /v{1,2}/reconstructions/{file_hash} [Range: bytes=a-b].
Routed ReconstructionRoute(Call& c, bool v2) {
  cas::CasBackend& backend = c.store().cas().backend();
  MEGA_ASSIGN_OR_RETURN(auto hash, cas::MerkleHash::FromHex(c.p(0)));
  MEGA_ASSIGN_OR_RETURN(auto recon, backend.GetFile(hash));
  RangeRequest range = ParseRange(c.req.Header("Range"), recon.size);
  if (range.kind == RangeRequest::Kind::kUnsatisfiable) return (RangeNotSatisfiable(recon.size));
  bool ranged = range.kind == RangeRequest::Kind::kRange;
  uint64_t want_first = ranged ? range.range.first : 0;
  uint64_t want_last = ranged ? range.range.last : (recon.size ? recon.size - 1 : 0);
  ReconPlan plan;
  MEGA_RETURN_IF_ERROR(PlanReconstruction(backend, recon, want_first, want_last, &plan));
  json out = {{"offset_into_first_range", plan.offset_into_first_range}, {"terms", plan.terms}};
  if (v2) {
    out["xorbs"] = XorbsV2(c.ctx, plan, c.ctx.Endpoint(c.req));
  } else {
    out["fetch_info"] = FetchInfoV1(c.ctx, plan, c.ctx.Endpoint(c.req));
  }
  return (JsonResponse(out));
}

Result<Response> BatchReconstructions(const Call& c, const std::vector<std::string>& ids) {
  cas::CasBackend& backend = c.store().cas().backend();
  if (ids.empty()) return ErrorResponse(400, "no file ids given");
  if (ids.size() > 1000) return ErrorResponse(400, "at most 1000 file ids per request");
  ReconPlan plan;
  json files = json::object();
  for (const auto& id : ids) {
    MEGA_ASSIGN_OR_RETURN(auto hash, cas::MerkleHash::FromHex(id));
    std::string key = hash.ToHex();
    if (files.contains(key)) continue;
    MEGA_ASSIGN_OR_RETURN(auto recon, backend.GetFile(hash));
    plan.terms = json::array();
    MEGA_RETURN_IF_ERROR(
        PlanReconstruction(backend, recon, 0, recon.size ? recon.size - 1 : 0, &plan));
    files[key] = plan.terms;
  }
  return JsonResponse(
      {{"files", files}, {"fetch_info", FetchInfoV1(c.ctx, plan, c.ctx.Endpoint(c.req))}});
}

// Batch (V1 only): POST /v1/reconstructions {"file_ids": [...]} or
// GET /v1/reconstructions?file_id=A&file_id=B.
Routed BatchReconstructionRoute(Call& c) {
  if (c.req.method != "POST") return BatchReconstructions(c, c.req.Params("file_id"));
  return WithJsonBody(c, c.ctx.options.max_json_bytes, [&c](json j) -> Result<Response> {
    if (!j.contains("file_ids") || !j["file_ids"].is_array()) {
      return ErrorResponse(400, "body must be {\"file_ids\": [...]}");
    }
    std::vector<std::string> ids;
    for (const auto& id : j["file_ids"]) {
      if (!id.is_string()) return ErrorResponse(400, "file_ids[] must be strings");
      ids.push_back(id.get<std::string>());
    }
    return BatchReconstructions(c, ids);
  });
}

}  // namespace

std::optional<Status> CheckCasAccess(const ServerContext& ctx, const Request& req,
                                     const Identity& who) {
  const auto& seg = req.segments;
  bool cas = (!seg.empty() && seg[0] == "v1") ||
             (seg.size() >= 2 && seg[0] == "v2" && seg[1] == "reconstructions");
  if (!cas) return std::nullopt;
  bool write = req.method == "POST" || req.method == "PUT";
  // A xorb URL from a reconstruction answer is presigned (hf_xet sends no
  // Authorization header with it).
  if (!write && seg.size() == 4 && seg[1] == "xorbs" && !(who.presented && !who.valid) &&
      HasValidXorbSignature(ctx, req, seg[3])) {
    return Status::OK();
  }
  // Batch dedup lookups and the batch reconstruction query are reads even
  // though they are POSTs; so is hf_xet's telemetry (not served: 404).
  if (seg.size() == 3 && seg[1] == "chunks" && seg[2] == "lookup") write = false;
  if (seg.size() == 2 && (seg[1] == "reconstructions" || seg[1] == "telemetry")) write = false;
  if (!who.valid) {
    return UnauthenticatedError(who.presented ? "invalid token" : "a CAS token is required");
  }
  if (write && who.scope != TokenScope::kWrite) return PermissionDeniedError("token is read-only");
  return Status::OK();
}

void AddCasRoutes(HubRouter& r) {
  r.Add("POST", "/v1/xorbs/{prefix}/{hash}", PostXorbRoute);
  r.Add("GET", "/v1/xorbs/{prefix}/{hash}/*?", GetXorbRoute);
  r.Add("POST", "/v1/shards", PostShardRoute);
  r.Add("POST", "/v1/chunks/lookup", LookupChunksRoute);
  r.Add("GET", "/v1/chunks/{prefix}/{hash}", GetChunkRoute);
  r.Add("GET", "/v1/files/{hash}", FileRoute);
  r.Add("GET", "/v1/reconstructions/{hash}", [](Call& c) { return ReconstructionRoute(c, false); });
  r.Add("GET", "/v2/reconstructions/{hash}", [](Call& c) { return ReconstructionRoute(c, true); });
  r.Add("GET|POST", "/v1/reconstructions", BatchReconstructionRoute);
}

}  // namespace megackpt::hub
