#include "hub/remote_cas.h"

#include <cstring>
#include <nlohmann/json.hpp>

#include "megackpt/cas/shard.h"
#include "megackpt/cas/xorb.h"

namespace megackpt::hub {
namespace {

using json = nlohmann::json;

constexpr size_t kLookupBatch = 1 << 15;

class RemoteCasBackend final : public cas::CasBackend {
 public:
  explicit RemoteCasBackend(std::shared_ptr<HttpClient> http) : http_(std::move(http)) {}

  std::string Describe() const override { return "hub CAS " + http_->endpoint(); }

  Result<bool> PutXorb(std::string_view serialized, const cas::XorbLayout& layout) override {
    if (layout.serialized_bytes != serialized.size()) {
      return InvalidArgumentError("xorb " + layout.xorb_hash.ToHex() + ": layout says " +
                                  std::to_string(layout.serialized_bytes) + " bytes, got " +
                                  std::to_string(serialized.size()));
    }
    HttpRequest req;
    req.method = "POST";
    req.target = "/v1/xorbs/default/" + layout.xorb_hash.ToHex();
    req.body_ref = serialized;
    req.content_type = "application/octet-stream";
    MEGA_ASSIGN_OR_RETURN(auto res, http_->Call(req));
    auto j = json::parse(res.body, nullptr, false);
    if (j.is_object() && j.contains("was_inserted") && j["was_inserted"].is_boolean()) {
      return j["was_inserted"].get<bool>();
    }
    return true;
  }

  Result<bool> HasXorb(const cas::MerkleHash& h) override {
    return Exists("/v1/xorbs/default/" + h.ToHex());
  }

  Result<std::string> GetXorbRange(const cas::MerkleHash& h, uint64_t offset,
                                   uint64_t length) override {
    std::string out(length, '\0');
    MEGA_RETURN_IF_ERROR(
        ReadXorbRange(h, offset, std::as_writable_bytes(std::span<char>(out.data(), out.size()))));
    return out;
  }

  Status ReadXorbRange(const cas::MerkleHash& h, uint64_t offset,
                       std::span<std::byte> dst) override {
    if (dst.empty()) return Status::OK();
    size_t pos = 0;
    MEGA_ASSIGN_OR_RETURN(auto res,
                          http_->GetRange("/v1/xorbs/default/" + h.ToHex(), offset, dst, &pos));
    if (res.status == 206 && pos < dst.size()) {
      // The hub clamps a range running past the end ("bytes a-b/total").
      std::string cr = res.Header("Content-Range");
      size_t slash = cr.rfind('/');
      uint64_t total =
          slash == std::string::npos ? 0 : std::strtoull(cr.c_str() + slash + 1, nullptr, 10);
      if (total > 0 && offset + dst.size() > total) {
        return OutOfRangeError("xorb " + h.ToHex() + " range [" + std::to_string(offset) + ", " +
                               std::to_string(offset + dst.size()) + ") is past its end (" +
                               std::to_string(total) + " bytes)");
      }
    }
    if (pos != dst.size() || res.status != 206) {
      return DataLossError("xorb " + h.ToHex() + " range [" + std::to_string(offset) + ", " +
                           std::to_string(offset + dst.size()) + "): got " + std::to_string(pos) +
                           " bytes with HTTP " + std::to_string(res.status));
    }
    return Status::OK();
  }

  Result<std::string> GetXorb(const cas::MerkleHash& h) override {
    HttpRequest req;
    req.target = "/v1/xorbs/default/" + h.ToHex();
    MEGA_ASSIGN_OR_RETURN(auto res, http_->Call(req));
    return std::move(res.body);
  }

  Result<cas::XorbLayout> GetXorbLayout(const cas::MerkleHash& h) override {
    HttpRequest req;
    req.target = "/v1/xorbs/default/" + h.ToHex() + "/layout";
    MEGA_ASSIGN_OR_RETURN(auto res, http_->Call(req));
    return cas::ParseXorbFooter(
        std::as_bytes(std::span<const char>(res.body.data(), res.body.size())), h);
  }

  Result<std::vector<cas::MerkleHash>> ListXorbs() override {
    return UnimplementedError(Describe() + ": listing xorbs is done by the hub itself");
  }
  Status DeleteXorbs(std::span<const cas::MerkleHash>) override {
    return UnimplementedError(Describe() + ": deletion is done by the hub's GC");
  }

  Result<uint64_t> XorbSize(const cas::MerkleHash& h) override {
    HttpRequest req;
    req.method = "HEAD";
    req.target = "/v1/xorbs/default/" + h.ToHex();
    MEGA_ASSIGN_OR_RETURN(auto res, http_->Call(req));
    return std::strtoull(res.Header("Content-Length").c_str(), nullptr, 10);
  }

  Status PutFile(const cas::FileReconstruction& recon) override {
    MEGA_RETURN_IF_ERROR(recon.Validate());
    cas::Shard shard;
    cas::ShardFileInfo info;
    info.reconstruction = recon;
    shard.files.push_back(std::move(info));
    HttpRequest req;
    req.method = "POST";
    req.target = "/v1/shards";
    req.body = cas::SerializeShard(shard);
    req.content_type = "application/octet-stream";
    return http_->Call(req).status();
  }

  Result<cas::FileReconstruction> GetFile(const cas::MerkleHash& h) override {
    HttpRequest req;
    req.target = "/v1/reconstructions/" + h.ToHex();
    MEGA_ASSIGN_OR_RETURN(auto res, http_->Call(req));
    auto j = json::parse(res.body, nullptr, false);
    if (j.is_discarded() || !j.is_object() || !j.contains("terms") || !j["terms"].is_array()) {
      return DataLossError("reconstruction of " + h.ToHex() + ": malformed answer");
    }
    cas::FileReconstruction recon;
    recon.file_hash = h;
    try {
      for (const auto& t : j["terms"]) {
        cas::ReconstructionTerm term;
        MEGA_ASSIGN_OR_RETURN(term.xorb_hash,
                              cas::MerkleHash::FromHex(t.at("hash").get<std::string>()));
        term.chunk_start = t.at("range").at("start").get<uint32_t>();
        term.chunk_end = t.at("range").at("end").get<uint32_t>();
        term.unpacked_bytes = t.at("unpacked_length").get<uint64_t>();
        // megahub extension: the term's Xet verification hash (whole terms only).
        if (t.contains("verification_hash") && t["verification_hash"].is_string()) {
          MEGA_ASSIGN_OR_RETURN(
              term.verification_hash,
              cas::MerkleHash::FromHex(t["verification_hash"].get<std::string>()));
        }
        recon.size += term.unpacked_bytes;
        recon.terms.push_back(term);
      }
    } catch (const std::exception& e) {
      return DataLossError("reconstruction of " + h.ToHex() + ": " + e.what());
    }
    MEGA_RETURN_IF_ERROR(recon.Validate());
    return recon;
  }

  Result<bool> HasFile(const cas::MerkleHash& h) override {
    return Exists("/v1/files/" + h.ToHex());
  }

  Result<std::vector<cas::MerkleHash>> ListFiles() override {
    return UnimplementedError(Describe() + ": listing files is done by the hub itself");
  }
  Status DeleteFiles(std::span<const cas::MerkleHash>) override {
    return UnimplementedError(Describe() + ": deletion is done by the hub's GC");
  }

  Result<std::vector<std::optional<cas::ChunkLocation>>> LookupChunks(
      std::span<const cas::MerkleHash> hashes) override {
    std::vector<std::optional<cas::ChunkLocation>> out;
    out.reserve(hashes.size());
    for (size_t start = 0; start < hashes.size(); start += kLookupBatch) {
      size_t n = std::min(kLookupBatch, hashes.size() - start);
      HttpRequest req;
      req.method = "POST";
      req.target = "/v1/chunks/lookup";
      req.content_type = "application/octet-stream";
      req.body.resize(n * 32);
      for (size_t i = 0; i < n; ++i)
        std::memcpy(req.body.data() + 32 * i, hashes[start + i].bytes.data(), 32);
      MEGA_ASSIGN_OR_RETURN(auto res, http_->Call(req));
      if (res.body.size() != n * 37) {
        return DataLossError(Describe() + ": chunk lookup answered " +
                             std::to_string(res.body.size()) + " bytes for " + std::to_string(n) +
                             " hashes");
      }
      for (size_t i = 0; i < n; ++i) {
        const char* rec = res.body.data() + 37 * i;
        if (rec[0] == 0) {
          out.emplace_back();
          continue;
        }
        cas::ChunkLocation loc;
        std::memcpy(loc.xorb_hash.bytes.data(), rec + 1, 32);
        const auto* p = reinterpret_cast<const unsigned char*>(rec + 33);
        loc.chunk_index = p[0] | (p[1] << 8) | (p[2] << 16) | (static_cast<uint32_t>(p[3]) << 24);
        out.push_back(loc);
      }
    }
    return out;
  }

 private:
  Result<bool> Exists(const std::string& target) {
    HttpRequest req;
    req.method = "HEAD";
    req.target = target;
    MEGA_ASSIGN_OR_RETURN(auto res, http_->Send(req));
    if (res.status == 404) return false;
    if (res.status >= 400) return http_->ErrorFor(res, "HEAD " + target);
    return true;
  }

  std::shared_ptr<HttpClient> http_;
};

}  // namespace

std::shared_ptr<cas::CasBackend> NewRemoteCasBackend(std::shared_ptr<HttpClient> http) {
  return std::make_shared<RemoteCasBackend>(std::move(http));
}

}  // namespace megackpt::hub
