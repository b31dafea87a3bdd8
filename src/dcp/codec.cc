// JSON encodings of Metadata (public, docs/dcp.md "Metadata encoding") and of the
// plans/results exchanged between ranks. Decoders never trust input: every
// member is type-checked, every number range-checked, and errors name the field
// path ("state_dict_metadata[3].chunks[1].sizes[0]").
#include "dcp/codec.h"

#include <cinttypes>
#include <cstdio>
#include <limits>
#include <nlohmann/json.hpp>
#include <set>

#include "megackpt/core/checksum.h"
#include "megackpt/core/path_safety.h"
#include "megackpt/core/text.h"

namespace megackpt::dcp {
namespace {

using nlohmann::json;

constexpr std::string_view kSavePlanFormat = "megackpt-dcp-save-plan";
constexpr std::string_view kLoadPlanFormat = "megackpt-dcp-load-plan";
constexpr std::string_view kWriteResultsFormat = "megackpt-dcp-write-results";
constexpr int kWireVersion = 1;
// Tensors have at most this many dimensions (a guard against absurd input).
constexpr size_t kMaxDims = 64;

// ---- encoding helpers ---------------------------------------------------------

json ShapeJson(const Shape& s) { return json(s); }

json IndexJson(const MetadataIndex& idx) {
  json j = json::object();
  j["fqn"] = idx.fqn;
  if (idx.offset) j["offset"] = ShapeJson(*idx.offset);
  if (idx.index) j["index"] = *idx.index;
  return j;
}

json ChunkJson(const ChunkStorageMetadata& c) {
  return json{{"offsets", ShapeJson(c.offsets)}, {"sizes", ShapeJson(c.sizes)}};
}

// ---- inline block CRC tables -------------------------------------------------
//
// Checkpoints written before the tables moved into the data files (docs/dcp.md,
// "Block CRC tables") carry each table inline as `block_crc32`: 8 lowercase hex
// digits per block. Decoders read them; encoders write them only for such a
// piece (e.g. one an incremental save references from an older base).

std::string CrcHex(const std::vector<uint32_t>& crcs) {
  std::string out;
  out.resize(crcs.size() * 8);
  static const char* kHex = "0123456789abcdef";
  char* o = out.data();
  for (uint32_t c : crcs) {
    for (int n = 0; n < 8; ++n) o[n] = kHex[(c >> (28 - 4 * n)) & 0xF];
    o += 8;
  }
  return out;
}

// Hex digit values (-1: not a lowercase hex digit).
struct HexTable {
  int8_t v[256];
  constexpr HexTable() : v() {
    for (int i = 0; i < 256; ++i) v[i] = -1;
    for (int i = 0; i < 10; ++i) v['0' + i] = static_cast<int8_t>(i);
    for (int i = 0; i < 6; ++i) v['a' + i] = static_cast<int8_t>(10 + i);
  }
};
constexpr HexTable kHexDigits;

json StorageInfoJson(const StorageInfo& info) {
  json j = json::object();
  j["relative_path"] = info.relative_path;
  j["offset"] = info.offset;
  j["length"] = info.length;
  if (!info.checksum.empty()) j["checksum"] = info.checksum;
  if (info.block_size != 0) {
    j["block_size"] = info.block_size;
    if (info.block_table_offset) {
      j["block_table_offset"] = *info.block_table_offset;
    } else {
      j["block_crc32"] = CrcHex(info.block_crc32);
    }
  }
  if (!info.extra.empty()) j["extra"] = info.extra;
  return j;
}

json PlannerDataJson(const PlannerData& pd) {
  json j = json::object();
  j["object_paths"] = internal::ObjectPathsJson(pd.object_paths);
  if (!pd.extra.empty()) j["extra"] = pd.extra;
  return j;
}

json WriteItemJson(const WriteItem& item) {
  json j = json::object();
  j["index"] = IndexJson(item.index);
  j["type"] = WriteItemTypeName(item.type);
  if (item.tensor_data) {
    j["chunk"] = ChunkJson(item.tensor_data->chunk);
    j["dtype"] = DTypeName(item.tensor_data->properties.dtype);
    if (item.tensor_data->properties.requires_grad) j["requires_grad"] = true;
    j["size"] = ShapeJson(item.tensor_data->size);
  }
  if (item.type == WriteItemType::kByteIO) j["bytes_size"] = item.bytes_size;
  return j;
}

json ReadItemJson(const ReadItem& item) {
  return json{{"type", LoadItemTypeName(item.type)},
              {"dest_index", IndexJson(item.dest_index)},
              {"dest_offsets", ShapeJson(item.dest_offsets)},
              {"storage_index", IndexJson(item.storage_index)},
              {"storage_offsets", ShapeJson(item.storage_offsets)},
              {"lengths", ShapeJson(item.lengths)}};
}

std::string Dump(const json& j) { return j.dump(-1, ' ', false, json::error_handler_t::replace); }

// ---- decoding helpers -----------------------------------------------------------

Status Bad(const std::string& what, const std::string& path, const std::string& msg) {
  return DataLossError(what + ": " + path + ": " + msg);
}

// A cursor into a parsed document that knows its path for messages.
struct Node {
  const json& j;
  std::string path;
  const std::string& what;  // "metadata", "save plan", ...

  Status Error(const std::string& msg) const {
    return Bad(what, path.empty() ? "<root>" : path, msg);
  }

  Status ExpectObject() const {
    if (!j.is_object()) return Error(std::string("expected an object, got ") + j.type_name());
    return Status::OK();
  }
  Status ExpectArray() const {
    if (!j.is_array()) return Error(std::string("expected an array, got ") + j.type_name());
    return Status::OK();
  }
  bool Has(const char* key) const { return j.is_object() && j.contains(key); }
  // REQUIRES: j is an object.
  Result<Node> Member(const char* key) const {
    MEGA_RETURN_IF_ERROR(ExpectObject());
    auto it = j.find(key);
    if (it == j.end()) return Error(std::string("missing member \"") + key + "\"");
    return Node{*it, path.empty() ? std::string(key) : path + "." + key, what};
  }
  Node At(size_t i) const { return Node{j[i], path + "[" + std::to_string(i) + "]", what}; }

  Result<std::string> String() const {
    if (!j.is_string()) return Error(std::string("expected a string, got ") + j.type_name());
    return j.get<std::string>();
  }
  Result<bool> Bool() const {
    if (!j.is_boolean()) return Error(std::string("expected a boolean, got ") + j.type_name());
    return j.get<bool>();
  }
  Result<int64_t> Int() const {
    if (j.is_number_unsigned()) {
      uint64_t v = j.get<uint64_t>();
      if (v > static_cast<uint64_t>(std::numeric_limits<int64_t>::max())) {
        return Error("integer " + std::to_string(v) + " out of range");
      }
      return static_cast<int64_t>(v);
    }
    if (j.is_number_integer()) return j.get<int64_t>();
    return Error(std::string("expected an integer, got ") + j.type_name());
  }
  Result<uint64_t> Uint() const {
    if (j.is_number_unsigned()) return j.get<uint64_t>();
    if (j.is_number_integer()) {
      int64_t v = j.get<int64_t>();
      if (v < 0) return Error("expected a non-negative integer, got " + std::to_string(v));
      return static_cast<uint64_t>(v);
    }
    return Error(std::string("expected a non-negative integer, got ") + j.type_name());
  }
  // A list of non-negative integers of at most kMaxDims entries.
  Result<Shape> ShapeValue() const {
    MEGA_RETURN_IF_ERROR(ExpectArray());
    if (j.size() > kMaxDims) {
      return Error("has " + std::to_string(j.size()) + " dims (at most " +
                   std::to_string(kMaxDims) + ")");
    }
    Shape s;
    for (size_t i = 0; i < j.size(); ++i) {
      MEGA_ASSIGN_OR_RETURN(int64_t v, At(i).Int());
      if (v < 0) return At(i).Error("negative value " + std::to_string(v));
      s.push_back(v);
    }
    return s;
  }
  // Optional member helpers.
  Result<std::string> OptString(const char* key) const {
    if (!Has(key)) return std::string();
    MEGA_ASSIGN_OR_RETURN(Node n, Member(key));
    return n.String();
  }
  Result<uint64_t> OptUint(const char* key) const {
    if (!Has(key)) return uint64_t{0};
    MEGA_ASSIGN_OR_RETURN(Node n, Member(key));
    return n.Uint();
  }
  Result<bool> OptBool(const char* key) const {
    if (!Has(key)) return false;
    MEGA_ASSIGN_OR_RETURN(Node n, Member(key));
    return n.Bool();
  }
};

Result<json> Parse(std::string_view text, const std::string& what) {
  if (text.size() > kMaxMetadataBytes) {
    return DataLossError(what + ": " + std::to_string(text.size()) + " bytes exceeds limit " +
                         std::to_string(kMaxMetadataBytes));
  }
  json j = json::parse(text.begin(), text.end(), nullptr, /*allow_exceptions=*/false);
  if (j.is_discarded()) return DataLossError(what + ": not valid JSON");
  return j;
}

Status CheckHeader(const Node& root, std::string_view format, int max_version) {
  MEGA_RETURN_IF_ERROR(root.ExpectObject());
  MEGA_ASSIGN_OR_RETURN(Node f, root.Member("format"));
  MEGA_ASSIGN_OR_RETURN(std::string fs, f.String());
  if (fs != format) {
    return f.Error("is \"" + EscapeBytes(fs) + "\", expected \"" + std::string(format) + "\"");
  }
  MEGA_ASSIGN_OR_RETURN(Node v, root.Member("version"));
  MEGA_ASSIGN_OR_RETURN(int64_t ver, v.Int());
  if (ver < 1 || ver > max_version) {
    return v.Error("unsupported version " + std::to_string(ver) + " (this reader knows 1.." +
                   std::to_string(max_version) + ")");
  }
  return Status::OK();
}

Result<MetadataIndex> ParseIndex(const Node& n) {
  MEGA_RETURN_IF_ERROR(n.ExpectObject());
  MetadataIndex idx;
  MEGA_ASSIGN_OR_RETURN(Node fqn, n.Member("fqn"));
  MEGA_ASSIGN_OR_RETURN(idx.fqn, fqn.String());
  if (n.Has("offset") && !n.j["offset"].is_null()) {
    MEGA_ASSIGN_OR_RETURN(Node off, n.Member("offset"));
    MEGA_ASSIGN_OR_RETURN(Shape s, off.ShapeValue());
    idx.offset = std::move(s);
  }
  if (n.Has("index") && !n.j["index"].is_null()) {
    MEGA_ASSIGN_OR_RETURN(Node hint, n.Member("index"));
    MEGA_ASSIGN_OR_RETURN(int64_t h, hint.Int());
    idx.index = h;
  }
  return idx;
}

Result<ChunkStorageMetadata> ParseChunk(const Node& n) {
  MEGA_RETURN_IF_ERROR(n.ExpectObject());
  ChunkStorageMetadata c;
  MEGA_ASSIGN_OR_RETURN(Node off, n.Member("offsets"));
  MEGA_ASSIGN_OR_RETURN(c.offsets, off.ShapeValue());
  MEGA_ASSIGN_OR_RETURN(Node sz, n.Member("sizes"));
  MEGA_ASSIGN_OR_RETURN(c.sizes, sz.ShapeValue());
  if (c.offsets.size() != c.sizes.size()) {
    return n.Error("offsets has " + std::to_string(c.offsets.size()) + " dims, sizes has " +
                   std::to_string(c.sizes.size()));
  }
  return c;
}

Result<DType> ParseDType(const Node& n) {
  MEGA_ASSIGN_OR_RETURN(std::string name, n.String());
  auto d = DTypeFromName(name);
  if (!d.ok()) return n.Error("unknown dtype \"" + EscapeBytes(name) + "\"");
  return *d;
}

Result<StorageInfo> ParseStorageInfo(const Node& n) {
  MEGA_RETURN_IF_ERROR(n.ExpectObject());
  StorageInfo info;
  MEGA_ASSIGN_OR_RETURN(Node rp, n.Member("relative_path"));
  MEGA_ASSIGN_OR_RETURN(info.relative_path, rp.String());
  // Readers open this name inside the checkpoint folder: it must stay there.
  if (Status valid = ValidateRelativePath(info.relative_path); !valid.ok()) {
    return rp.Error(valid.message());
  }
  MEGA_ASSIGN_OR_RETURN(info.offset, n.OptUint("offset"));
  MEGA_ASSIGN_OR_RETURN(info.length, n.OptUint("length"));
  if (info.offset > std::numeric_limits<uint64_t>::max() - info.length) {
    return n.Error("offset + length overflows");
  }
  MEGA_ASSIGN_OR_RETURN(info.checksum, n.OptString("checksum"));
  if (!info.checksum.empty()) {
    const std::string& c = info.checksum;
    auto all_hex = [](std::string_view s) {
      return s.find_first_not_of("0123456789abcdef") == std::string_view::npos;
    };
    bool ok = (c.size() == 6 + 8 && c.starts_with("crc32:") && all_hex(c.substr(6))) ||
              (c.size() == 7 + 64 && c.starts_with("sha256:") && all_hex(c.substr(7)));
    if (!ok)
      return n.Error("checksum \"" + EscapeBytes(c) + "\" is not crc32:<8 hex> or sha256:<64 hex>");
  }
  MEGA_ASSIGN_OR_RETURN(info.block_size, n.OptUint("block_size"));
  if (n.Has("block_table_offset")) {
    MEGA_ASSIGN_OR_RETURN(Node bt, n.Member("block_table_offset"));
    if (info.block_size == 0) return bt.Error("present but block_size is 0");
    if (n.Has("block_crc32")) return bt.Error("present together with block_crc32");
    MEGA_ASSIGN_OR_RETURN(uint64_t table_offset, bt.Uint());
    const uint64_t blocks = BlockCount(info);
    if (blocks > (std::numeric_limits<uint64_t>::max() - table_offset) / 4) {
      return bt.Error("table of " + std::to_string(blocks) + " CRCs at " +
                      std::to_string(table_offset) + " overflows");
    }
    info.block_table_offset = table_offset;
  } else if (info.block_size != 0) {
    MEGA_ASSIGN_OR_RETURN(Node bc, n.Member("block_crc32"));
    MEGA_ASSIGN_OR_RETURN(std::string hex, bc.String());
    const uint64_t blocks = BlockCount(info);
    if (hex.size() % 8 != 0 || hex.size() / 8 != blocks) {
      return bc.Error("has " + std::to_string(hex.size()) + " hex digits, expected " +
                      std::to_string(blocks) + " CRCs of 8 digits for length " +
                      std::to_string(info.length) + " and block_size " +
                      std::to_string(info.block_size));
    }
    info.block_crc32.resize(blocks);
    const auto* h = reinterpret_cast<const unsigned char*>(hex.data());
    for (uint64_t b = 0; b < blocks; ++b) {
      uint32_t v = 0;
      for (int k = 0; k < 8; ++k) {
        const int d = kHexDigits.v[h[b * 8 + k]];
        if (d < 0) return bc.Error("non-hex character at " + std::to_string(b * 8 + k));
        v = (v << 4) | static_cast<uint32_t>(d);
      }
      info.block_crc32[b] = v;
    }
  } else if (n.Has("block_crc32")) {
    MEGA_ASSIGN_OR_RETURN(Node bc, n.Member("block_crc32"));
    MEGA_ASSIGN_OR_RETURN(std::string hex, bc.String());
    if (!hex.empty()) return bc.Error("present but block_size is 0");
  }
  MEGA_ASSIGN_OR_RETURN(info.extra, n.OptString("extra"));
  return info;
}

Result<PlannerData> ParsePlannerData(const Node& n) {
  MEGA_RETURN_IF_ERROR(n.ExpectObject());
  PlannerData pd;
  if (n.Has("object_paths")) {
    MEGA_ASSIGN_OR_RETURN(Node paths, n.Member("object_paths"));
    MEGA_RETURN_IF_ERROR(paths.ExpectObject());
    for (auto it = paths.j.begin(); it != paths.j.end(); ++it) {
      Node p{it.value(), paths.path + "[\"" + it.key() + "\"]", n.what};
      MEGA_RETURN_IF_ERROR(p.ExpectArray());
      if (p.j.empty()) return p.Error("empty path");
      if (p.j.size() > 4096) return p.Error("path too deep");
      ObjectPath path;
      for (size_t i = 0; i < p.j.size(); ++i) {
        Node step = p.At(i);
        if (step.j.is_string()) {
          path.emplace_back().key.emplace<std::string>(step.j.get<std::string>());
        } else {
          MEGA_ASSIGN_OR_RETURN(int64_t idx, step.Int());
          if (idx < 0) return step.Error("negative list index");
          path.emplace_back().key.emplace<int64_t>(idx);
        }
      }
      if (!std::holds_alternative<std::string>(path[0].key)) {
        return p.Error("must start with a key (string)");
      }
      pd.object_paths.emplace(it.key(), std::move(path));
    }
  }
  MEGA_ASSIGN_OR_RETURN(pd.extra, n.OptString("extra"));
  return pd;
}

Result<StorageMeta> ParseStorageMeta(const Node& n) {
  MEGA_RETURN_IF_ERROR(n.ExpectObject());
  StorageMeta m;
  MEGA_ASSIGN_OR_RETURN(m.checkpoint_id, n.OptString("checkpoint_id"));
  MEGA_ASSIGN_OR_RETURN(m.save_id, n.OptString("save_id"));
  MEGA_ASSIGN_OR_RETURN(m.load_id, n.OptString("load_id"));
  if (n.Has("modules")) {
    MEGA_ASSIGN_OR_RETURN(Node mods, n.Member("modules"));
    MEGA_RETURN_IF_ERROR(mods.ExpectArray());
    for (size_t i = 0; i < mods.j.size(); ++i) {
      MEGA_ASSIGN_OR_RETURN(std::string s, mods.At(i).String());
      m.modules.push_back(std::move(s));
    }
  }
  return m;
}

// The item type whose name (WriteItemTypeName / LoadItemTypeName) is `name`.
std::string_view ItemTypeName(WriteItemType t) { return WriteItemTypeName(t); }
std::string_view ItemTypeName(LoadItemType t) { return LoadItemTypeName(t); }
template <typename E>
Result<E> ItemTypeNamed(const Node& n, const std::string& name, const char* kind,
                        std::initializer_list<E> all) {
  for (E e : all) {
    if (ItemTypeName(e) == name) return e;
  }
  return n.Error(std::string("unknown ") + kind + " item type \"" + EscapeBytes(name) + "\"");
}

Result<WriteItem> ParseWriteItem(const Node& n) {
  MEGA_RETURN_IF_ERROR(n.ExpectObject());
  WriteItem item;
  MEGA_ASSIGN_OR_RETURN(Node idx, n.Member("index"));
  MEGA_ASSIGN_OR_RETURN(item.index, ParseIndex(idx));
  MEGA_ASSIGN_OR_RETURN(Node type, n.Member("type"));
  MEGA_ASSIGN_OR_RETURN(std::string t, type.String());
  MEGA_ASSIGN_OR_RETURN(item.type, ItemTypeNamed(type, t, "write",
                                                 {WriteItemType::kTensor, WriteItemType::kShard,
                                                  WriteItemType::kByteIO}));
  if (item.type == WriteItemType::kByteIO) {
    MEGA_ASSIGN_OR_RETURN(item.bytes_size, n.OptUint("bytes_size"));
    return item;
  }
  TensorWriteData td;
  MEGA_ASSIGN_OR_RETURN(Node chunk, n.Member("chunk"));
  MEGA_ASSIGN_OR_RETURN(td.chunk, ParseChunk(chunk));
  MEGA_ASSIGN_OR_RETURN(Node dt, n.Member("dtype"));
  MEGA_ASSIGN_OR_RETURN(td.properties.dtype, ParseDType(dt));
  MEGA_ASSIGN_OR_RETURN(td.properties.requires_grad, n.OptBool("requires_grad"));
  MEGA_ASSIGN_OR_RETURN(Node size, n.Member("size"));
  MEGA_ASSIGN_OR_RETURN(td.size, size.ShapeValue());
  if (td.size.size() != td.chunk.sizes.size()) return n.Error("chunk and size dims differ");
  item.tensor_data = std::move(td);
  return item;
}

Result<ReadItem> ParseReadItem(const Node& n) {
  MEGA_RETURN_IF_ERROR(n.ExpectObject());
  ReadItem item;
  MEGA_ASSIGN_OR_RETURN(Node type, n.Member("type"));
  MEGA_ASSIGN_OR_RETURN(std::string t, type.String());
  MEGA_ASSIGN_OR_RETURN(
      item.type, ItemTypeNamed(type, t, "read", {LoadItemType::kTensor, LoadItemType::kByteIO}));
  MEGA_ASSIGN_OR_RETURN(Node di, n.Member("dest_index"));
  MEGA_ASSIGN_OR_RETURN(item.dest_index, ParseIndex(di));
  MEGA_ASSIGN_OR_RETURN(Node dof, n.Member("dest_offsets"));
  MEGA_ASSIGN_OR_RETURN(item.dest_offsets, dof.ShapeValue());
  MEGA_ASSIGN_OR_RETURN(Node si, n.Member("storage_index"));
  MEGA_ASSIGN_OR_RETURN(item.storage_index, ParseIndex(si));
  MEGA_ASSIGN_OR_RETURN(Node sof, n.Member("storage_offsets"));
  MEGA_ASSIGN_OR_RETURN(item.storage_offsets, sof.ShapeValue());
  MEGA_ASSIGN_OR_RETURN(Node len, n.Member("lengths"));
  MEGA_ASSIGN_OR_RETURN(item.lengths, len.ShapeValue());
  if (item.dest_offsets.size() != item.lengths.size() ||
      item.storage_offsets.size() != item.lengths.size()) {
    return n.Error("dest_offsets, storage_offsets and lengths must have the same dims");
  }
  return item;
}

// ---- Metadata ------------------------------------------------------------------

// The metadata document protects itself: EncodeMetadata ends it with the member
// "content_crc32", the CRC-32 of every byte before `,"content_crc32"`. A
// document without the member (written before it existed) is accepted; one
// with it must end with it and match. So one damaged byte either breaks the
// structure, fails the CRC, or lies inside the member itself (then no other
// byte changed: what is loaded is the same).
constexpr std::string_view kContentCrcKey = ",\"content_crc32\":\"";
constexpr size_t kContentCrcTrailer = kContentCrcKey.size() + 8 + 2;  // key, 8 hex, "}

std::string WithContentCrc(std::string body) {
  // body is one JSON object: {...}
  body.pop_back();
  char buf[16];
  std::snprintf(buf, sizeof buf, "%08x", Crc32(AsBytes(body)));
  body += kContentCrcKey;
  body += buf;
  body += "\"}";
  return body;
}

Status CheckContentCrc(std::string_view text, const Node& root) {
  if (!root.Has("content_crc32")) return Status::OK();
  MEGA_ASSIGN_OR_RETURN(Node member, root.Member("content_crc32"));
  MEGA_ASSIGN_OR_RETURN(std::string stored, member.String());
  while (!text.empty() && (text.back() == '\n' || text.back() == ' ' || text.back() == '\r')) {
    text.remove_suffix(1);
  }
  if (text.size() < kContentCrcTrailer ||
      text.substr(text.size() - kContentCrcTrailer, kContentCrcKey.size()) != kContentCrcKey ||
      stored.size() != 8) {
    return member.Error("must be the document's last member, 8 hex digits");
  }
  const std::string_view body = text.substr(0, text.size() - kContentCrcTrailer);
  char buf[16];
  std::snprintf(buf, sizeof buf, "%08x", Crc32(AsBytes(body)));
  if (stored != buf) {
    return DataLossError("metadata: content checksum mismatch (content_crc32 " +
                         EscapeBytes(stored) + ", computed " + buf +
                         "): the metadata file is damaged");
  }
  return Status::OK();
}

Result<Metadata> DecodeMetadataImpl(std::string_view encoded) {
  static const std::string kWhat = "metadata";
  MEGA_ASSIGN_OR_RETURN(json doc, Parse(encoded, kWhat));
  Node root{doc, "", kWhat};
  MEGA_RETURN_IF_ERROR(CheckHeader(root, kMetadataFormat, kMetadataFormatVersion));
  Metadata md;
  MEGA_ASSIGN_OR_RETURN(md.version, root.OptString("producer"));

  MEGA_ASSIGN_OR_RETURN(Node entries, root.Member("state_dict_metadata"));
  MEGA_RETURN_IF_ERROR(entries.ExpectArray());
  for (size_t i = 0; i < entries.j.size(); ++i) {
    Node e = entries.At(i);
    MEGA_RETURN_IF_ERROR(e.ExpectObject());
    MEGA_ASSIGN_OR_RETURN(Node fqn_node, e.Member("fqn"));
    MEGA_ASSIGN_OR_RETURN(std::string fqn, fqn_node.String());
    if (md.state_dict_metadata.count(fqn))
      return fqn_node.Error("duplicate fqn \"" + EscapeBytes(fqn) + "\"");
    MEGA_ASSIGN_OR_RETURN(Node type, e.Member("type"));
    MEGA_ASSIGN_OR_RETURN(std::string t, type.String());
    if (t == "bytes") {
      md.state_dict_metadata.emplace(fqn, BytesStorageMetadata{});
      continue;
    }
    if (t != "tensor") return type.Error("unknown entry type \"" + EscapeBytes(t) + "\"");
    TensorStorageMetadata tm;
    MEGA_ASSIGN_OR_RETURN(Node dt, e.Member("dtype"));
    MEGA_ASSIGN_OR_RETURN(tm.properties.dtype, ParseDType(dt));
    MEGA_ASSIGN_OR_RETURN(tm.properties.requires_grad, e.OptBool("requires_grad"));
    MEGA_ASSIGN_OR_RETURN(Node size, e.Member("size"));
    MEGA_ASSIGN_OR_RETURN(tm.size, size.ShapeValue());
    MEGA_ASSIGN_OR_RETURN(Node chunks, e.Member("chunks"));
    MEGA_RETURN_IF_ERROR(chunks.ExpectArray());
    for (size_t c = 0; c < chunks.j.size(); ++c) {
      MEGA_ASSIGN_OR_RETURN(ChunkStorageMetadata chunk, ParseChunk(chunks.At(c)));
      tm.chunks.push_back(std::move(chunk));
    }
    md.state_dict_metadata.emplace(fqn, std::move(tm));
  }

  if (root.Has("planner_data")) {
    MEGA_ASSIGN_OR_RETURN(Node pd, root.Member("planner_data"));
    MEGA_ASSIGN_OR_RETURN(md.planner_data, ParsePlannerData(pd));
  }

  MEGA_ASSIGN_OR_RETURN(Node sd, root.Member("storage_data"));
  MEGA_RETURN_IF_ERROR(sd.ExpectArray());
  for (size_t i = 0; i < sd.j.size(); ++i) {
    Node e = sd.At(i);
    MEGA_ASSIGN_OR_RETURN(Node idx_node, e.Member("index"));
    MEGA_ASSIGN_OR_RETURN(MetadataIndex idx, ParseIndex(idx_node));
    idx.index.reset();
    MEGA_ASSIGN_OR_RETURN(Node info_node, e.Member("info"));
    MEGA_ASSIGN_OR_RETURN(StorageInfo info, ParseStorageInfo(info_node));
    if (!md.storage_data.emplace(idx, std::move(info)).second) {
      return idx_node.Error("duplicate storage entry for " + ToString(idx));
    }
  }

  if (root.Has("storage_meta") && !root.j["storage_meta"].is_null()) {
    MEGA_ASSIGN_OR_RETURN(Node sm, root.Member("storage_meta"));
    MEGA_ASSIGN_OR_RETURN(StorageMeta meta, ParseStorageMeta(sm));
    md.storage_meta = std::move(meta);
  }

  Status valid = ValidateMetadata(md);
  if (!valid.ok()) return DataLossError(valid.message());
  MEGA_RETURN_IF_ERROR(CheckContentCrc(encoded, root));
  return md;
}

template <typename T, typename F>
Result<T> Guarded(F&& f, const char* what) {
  // nlohmann may throw on conditions our checks do not foresee (e.g. allocation);
  // never let an exception escape a decoder.
  try {
    return f();
  } catch (const std::exception& e) {
    return DataLossError(std::string(what) + ": malformed input (" + e.what() + ")");
  }
}

}  // namespace

std::string EncodeMetadata(const Metadata& md) {
  json root = json::object();
  root["format"] = kMetadataFormat;
  root["version"] = kMetadataFormatVersion;
  root["producer"] = md.version;
  json entries = json::array();
  for (const auto& [fqn, value] : md.state_dict_metadata) {
    json e = json::object();
    e["fqn"] = fqn;
    if (const auto* t = std::get_if<TensorStorageMetadata>(&value)) {
      e["type"] = "tensor";
      e["dtype"] = DTypeName(t->properties.dtype);
      if (t->properties.requires_grad) e["requires_grad"] = true;
      e["size"] = ShapeJson(t->size);
      json chunks = json::array();
      for (const auto& c : t->chunks) chunks.push_back(ChunkJson(c));
      e["chunks"] = std::move(chunks);
    } else {
      e["type"] = "bytes";
    }
    entries.push_back(std::move(e));
  }
  root["state_dict_metadata"] = std::move(entries);
  root["planner_data"] = PlannerDataJson(md.planner_data);
  json sd = json::array();
  for (const auto& [idx, info] : md.storage_data) {
    MetadataIndex key = idx;
    key.index.reset();
    sd.push_back(json{{"index", IndexJson(key)}, {"info", StorageInfoJson(info)}});
  }
  root["storage_data"] = std::move(sd);
  if (md.storage_meta) {
    root["storage_meta"] = json{{"checkpoint_id", md.storage_meta->checkpoint_id},
                                {"save_id", md.storage_meta->save_id},
                                {"load_id", md.storage_meta->load_id},
                                {"modules", md.storage_meta->modules}};
  } else {
    root["storage_meta"] = nullptr;
  }
  return WithContentCrc(Dump(root));
}

Result<Metadata> DecodeMetadata(std::string_view encoded) {
  return Guarded<Metadata>([&] { return DecodeMetadataImpl(encoded); }, "metadata");
}

namespace internal {

json ObjectPathsJson(const std::map<std::string, ObjectPath>& paths) {
  json out = json::object();
  for (const auto& [fqn, path] : paths) {
    json arr = json::array();
    for (const PathKey& k : path) {
      if (const auto* s = std::get_if<std::string>(&k.key)) {
        arr.push_back(*s);
      } else {
        arr.push_back(std::get<int64_t>(k.key));
      }
    }
    out[fqn] = std::move(arr);
  }
  return out;
}

namespace {

// SavePlan and LoadPlan share one wire shape: {format, version, items: [...],
// storage_data, planner_data}; only the item type and the format tag differ.
template <typename Plan, typename ItemToJson>
std::string EncodePlan(const Plan& plan, std::string_view format, ItemToJson item_json) {
  json root{{"format", format}, {"version", kWireVersion}};
  json items = json::array();
  for (const auto& it : plan.items) items.push_back(item_json(it));
  root["items"] = std::move(items);
  root["storage_data"] = plan.storage_data;
  root["planner_data"] = PlannerDataJson(plan.planner_data);
  return Dump(root);
}

template <typename Plan, typename ParseItem>
Result<Plan> DecodePlan(std::string_view encoded, std::string_view format, const std::string& what,
                        ParseItem parse_item) {
  return Guarded<Plan>(
      [&]() -> Result<Plan> {
        MEGA_ASSIGN_OR_RETURN(json doc, Parse(encoded, what));
        Node root{doc, "", what};
        MEGA_RETURN_IF_ERROR(CheckHeader(root, format, kWireVersion));
        Plan plan;
        MEGA_ASSIGN_OR_RETURN(Node items, root.Member("items"));
        MEGA_RETURN_IF_ERROR(items.ExpectArray());
        for (size_t i = 0; i < items.j.size(); ++i) {
          MEGA_ASSIGN_OR_RETURN(auto item, parse_item(items.At(i)));
          plan.items.push_back(std::move(item));
        }
        MEGA_ASSIGN_OR_RETURN(plan.storage_data, root.OptString("storage_data"));
        if (root.Has("planner_data")) {
          MEGA_ASSIGN_OR_RETURN(Node pd, root.Member("planner_data"));
          MEGA_ASSIGN_OR_RETURN(plan.planner_data, ParsePlannerData(pd));
        }
        return plan;
      },
      what.c_str());
}

}  // namespace

std::string EncodeSavePlan(const SavePlan& plan) {
  return EncodePlan(plan, kSavePlanFormat, WriteItemJson);
}

Result<SavePlan> DecodeSavePlan(std::string_view encoded) {
  static const std::string kWhat = "save plan";
  return DecodePlan<SavePlan>(encoded, kSavePlanFormat, kWhat, ParseWriteItem);
}

std::string EncodeLoadPlan(const LoadPlan& plan) {
  return EncodePlan(plan, kLoadPlanFormat, ReadItemJson);
}

Result<LoadPlan> DecodeLoadPlan(std::string_view encoded) {
  static const std::string kWhat = "load plan";
  return DecodePlan<LoadPlan>(encoded, kLoadPlanFormat, kWhat, ParseReadItem);
}

std::string EncodeWriteResults(const std::vector<WriteResult>& results) {
  json root{{"format", kWriteResultsFormat}, {"version", kWireVersion}};
  json arr = json::array();
  for (const auto& r : results) {
    json e{{"index", IndexJson(r.index)},
           {"size_in_bytes", r.size_in_bytes},
           {"storage_data", StorageInfoJson(r.storage_data)}};
    if (!r.commit_token.empty()) e["commit_token"] = r.commit_token;
    arr.push_back(std::move(e));
  }
  root["results"] = std::move(arr);
  return Dump(root);
}

Result<std::vector<WriteResult>> DecodeWriteResults(std::string_view encoded) {
  return Guarded<std::vector<WriteResult>>(
      [&]() -> Result<std::vector<WriteResult>> {
        static const std::string kWhat = "write results";
        MEGA_ASSIGN_OR_RETURN(json doc, Parse(encoded, kWhat));
        Node root{doc, "", kWhat};
        MEGA_RETURN_IF_ERROR(CheckHeader(root, kWriteResultsFormat, kWireVersion));
        MEGA_ASSIGN_OR_RETURN(Node arr, root.Member("results"));
        MEGA_RETURN_IF_ERROR(arr.ExpectArray());
        std::vector<WriteResult> out;
        for (size_t i = 0; i < arr.j.size(); ++i) {
          Node e = arr.At(i);
          WriteResult r;
          MEGA_ASSIGN_OR_RETURN(Node idx, e.Member("index"));
          MEGA_ASSIGN_OR_RETURN(r.index, ParseIndex(idx));
          MEGA_ASSIGN_OR_RETURN(r.size_in_bytes, e.OptUint("size_in_bytes"));
          MEGA_ASSIGN_OR_RETURN(Node sd, e.Member("storage_data"));
          MEGA_ASSIGN_OR_RETURN(r.storage_data, ParseStorageInfo(sd));
          MEGA_ASSIGN_OR_RETURN(r.commit_token, e.OptString("commit_token"));
          out.push_back(std::move(r));
        }
        return out;
      },
      "write results");
}

std::string EncodeEnvelope(const Status& status, std::string_view payload) {
  std::string out;
  if (status.ok()) {
    out.reserve(payload.size() + 1);
    out += 'P';
    out += payload;
    return out;
  }
  out += 'E';
  out += std::to_string(static_cast<int>(status.code()));
  out += ':';
  out += status.message();
  return out;
}

Result<std::string> DecodeEnvelope(std::string_view blob) {
  if (blob.empty()) return DataLossError("collective message is empty");
  if (blob[0] == 'P') return std::string(blob.substr(1));
  if (blob[0] != 'E') return DataLossError("collective message has unknown tag");
  size_t colon = blob.find(':');
  if (colon == std::string_view::npos || colon < 2) {
    return DataLossError("collective error message is malformed");
  }
  int code = 0;
  for (size_t i = 1; i < colon; ++i) {
    if (blob[i] < '0' || blob[i] > '9' || code > 1000) {
      return DataLossError("collective error message has a bad code");
    }
    code = code * 10 + (blob[i] - '0');
  }
  if (code <= 0 || code > static_cast<int>(StatusCode::kIOError))
    code = static_cast<int>(StatusCode::kInternal);
  return Status(static_cast<StatusCode>(code), std::string(blob.substr(colon + 1)));
}

}  // namespace internal
}  // namespace megackpt::dcp
