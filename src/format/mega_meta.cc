// Typed metadata values (MetaValue, MegaMetadata) and their on-disk codec.
#include <bit>
#include <cmath>
#include <limits>
#include <nlohmann/json.hpp>

#include "format/mega_internal.h"
#include "format/quote.h"
#include "megackpt/core/text.h"
#include "megackpt/format/mega.h"

namespace megackpt::format {

static_assert(std::endian::native == std::endian::little,
              "the MEGA codec stores integers with memcpy and assumes a little-endian host");

using mega_internal::ByteSource;
using mega_internal::ByteWriter;
using mega_internal::MetaScalarWidth;

std::string_view MetaTypeName(MetaType type) {
  switch (type) {
    case MetaType::kUint8:
      return "UINT8";
    case MetaType::kInt8:
      return "INT8";
    case MetaType::kUint16:
      return "UINT16";
    case MetaType::kInt16:
      return "INT16";
    case MetaType::kUint32:
      return "UINT32";
    case MetaType::kInt32:
      return "INT32";
    case MetaType::kUint64:
      return "UINT64";
    case MetaType::kInt64:
      return "INT64";
    case MetaType::kFloat32:
      return "FLOAT32";
    case MetaType::kFloat64:
      return "FLOAT64";
    case MetaType::kBool:
      return "BOOL";
    case MetaType::kString:
      return "STRING";
    case MetaType::kArray:
      return "ARRAY";
  }
  return "UNKNOWN";
}

std::string_view MegaCodecName(MegaCodec codec) {
  switch (codec) {
    case MegaCodec::kNone:
      return "NONE";
    case MegaCodec::kZstd:
      return "ZSTD";
  }
  return "UNKNOWN";
}

std::string_view MegaChecksumTypeName(MegaChecksumType type) {
  switch (type) {
    case MegaChecksumType::kNone:
      return "NONE";
    case MegaChecksumType::kCrc32:
      return "CRC32";
    case MegaChecksumType::kSha256:
      return "SHA256";
  }
  return "UNKNOWN";
}

std::string_view MegaStorageFormatName(MegaStorageFormat format) {
  return format == MegaStorageFormat::kRawDense ? "raw_dense" : "chunked_raw_dense";
}

namespace mega_internal {

int MetaScalarWidth(MetaType type) {
  switch (type) {
    case MetaType::kUint8:
    case MetaType::kInt8:
    case MetaType::kBool:
      return 1;
    case MetaType::kUint16:
    case MetaType::kInt16:
      return 2;
    case MetaType::kUint32:
    case MetaType::kInt32:
    case MetaType::kFloat32:
      return 4;
    case MetaType::kUint64:
    case MetaType::kInt64:
    case MetaType::kFloat64:
      return 8;
    case MetaType::kString:
    case MetaType::kArray:
      return 0;
  }
  return 0;
}

bool IsKnownMetaType(uint32_t type) { return type <= static_cast<uint32_t>(MetaType::kArray); }

}  // namespace mega_internal

namespace {

bool IsSigned(MetaType t) {
  return t == MetaType::kInt8 || t == MetaType::kInt16 || t == MetaType::kInt32 ||
         t == MetaType::kInt64;
}

// Sign-extends the low `width` bytes of bits for signed types; masks otherwise.
uint64_t NormalizeBits(MetaType t, uint64_t bits) {
  int width = MetaScalarWidth(t);
  if (width == 8 || width == 0) return bits;
  uint64_t mask = (1ull << (8 * width)) - 1;
  bits &= mask;
  if (IsSigned(t) && (bits >> (8 * width - 1)) & 1) bits |= ~mask;
  return bits;
}

}  // namespace

MetaValue MetaCodec::Scalar(MetaType type, uint64_t bits) {
  MetaValue m;
  m.type_ = type;
  m.bits_ = bits;
  return m;
}

// Levels of array nesting of v (1 for an array of scalars, 0 for a scalar).
int MetaValue::ArrayDepth(const MetaValue& v) {
  if (v.type_ != MetaType::kArray) return 0;
  int d = 0;
  for (const MetaValue& item : v.items_) d = std::max(d, ArrayDepth(item));
  return d + 1;
}

namespace {
uint64_t SignExtended(int64_t v) { return static_cast<uint64_t>(v); }
}  // namespace

MetaValue MetaValue::U8(uint8_t v) { return MetaCodec::Scalar(MetaType::kUint8, v); }
MetaValue MetaValue::I8(int8_t v) { return MetaCodec::Scalar(MetaType::kInt8, SignExtended(v)); }
MetaValue MetaValue::U16(uint16_t v) { return MetaCodec::Scalar(MetaType::kUint16, v); }
MetaValue MetaValue::I16(int16_t v) { return MetaCodec::Scalar(MetaType::kInt16, SignExtended(v)); }
MetaValue MetaValue::U32(uint32_t v) { return MetaCodec::Scalar(MetaType::kUint32, v); }
MetaValue MetaValue::I32(int32_t v) { return MetaCodec::Scalar(MetaType::kInt32, SignExtended(v)); }
MetaValue MetaValue::U64(uint64_t v) { return MetaCodec::Scalar(MetaType::kUint64, v); }
MetaValue MetaValue::I64(int64_t v) { return MetaCodec::Scalar(MetaType::kInt64, SignExtended(v)); }
MetaValue MetaValue::F32(float v) {
  return MetaCodec::Scalar(MetaType::kFloat32, std::bit_cast<uint32_t>(v));
}
MetaValue MetaValue::F64(double v) {
  return MetaCodec::Scalar(MetaType::kFloat64, std::bit_cast<uint64_t>(v));
}
MetaValue MetaValue::Bool(bool v) { return MetaCodec::Scalar(MetaType::kBool, v ? 1 : 0); }
MetaValue MetaValue::String(std::string v) {
  MetaValue m;
  m.type_ = MetaType::kString;
  m.bytes_ = std::move(v);
  return m;
}
MetaValue MetaValue::UInt(uint64_t v) {
  return v <= std::numeric_limits<uint32_t>::max() ? U32(static_cast<uint32_t>(v)) : U64(v);
}

Result<MetaValue> MetaValue::Array(MetaType element_type, std::vector<MetaValue> elements) {
  if (!mega_internal::IsKnownMetaType(static_cast<uint32_t>(element_type))) {
    return InvalidArgumentError("metadata array: unknown element type " +
                                std::to_string(static_cast<uint32_t>(element_type)));
  }
  MetaValue m;
  m.type_ = MetaType::kArray;
  m.elem_type_ = element_type;
  m.count_ = elements.size();
  int width = MetaScalarWidth(element_type);
  int depth = 0;
  for (size_t i = 0; i < elements.size(); ++i) {
    const MetaValue& e = elements[i];
    if (e.type_ != element_type) {
      return InvalidArgumentError("metadata array of " + std::string(MetaTypeName(element_type)) +
                                  ": element " + std::to_string(i) + " is " +
                                  std::string(MetaTypeName(e.type_)));
    }
    if (element_type == MetaType::kArray) depth = std::max(depth, ArrayDepth(e));
  }
  if (depth + 1 > mega_internal::kMaxArrayDepth) {
    return InvalidArgumentError("metadata array nested deeper than " +
                                std::to_string(mega_internal::kMaxArrayDepth));
  }
  if (width > 0) {
    m.bytes_.reserve(elements.size() * width);
    for (const MetaValue& e : elements)
      m.bytes_.append(reinterpret_cast<const char*>(&e.bits_), width);
  } else if (element_type == MetaType::kString) {
    m.strings_.reserve(elements.size());
    for (MetaValue& e : elements) m.strings_.push_back(std::move(e.bytes_));
  } else {
    m.items_ = std::move(elements);
  }
  return m;
}

MetaValue MetaValue::StringArray(std::vector<std::string> v) {
  MetaValue m;
  m.type_ = MetaType::kArray;
  m.elem_type_ = MetaType::kString;
  m.count_ = v.size();
  m.strings_ = std::move(v);
  return m;
}

namespace {
template <typename T>
MetaValue PackedArray(MetaType elem, std::span<const T> v) {
  std::vector<MetaValue> items;
  items.reserve(v.size());
  for (T x : v) {
    if constexpr (std::is_same_v<T, uint32_t>) items.push_back(MetaValue::U32(x));
    if constexpr (std::is_same_v<T, uint64_t>) items.push_back(MetaValue::U64(x));
    if constexpr (std::is_same_v<T, int64_t>) items.push_back(MetaValue::I64(x));
    if constexpr (std::is_same_v<T, double>) items.push_back(MetaValue::F64(x));
  }
  return *MetaValue::Array(elem, std::move(items));
}
}  // namespace

MetaValue MetaValue::U32Array(std::span<const uint32_t> v) {
  return PackedArray(MetaType::kUint32, v);
}
MetaValue MetaValue::U64Array(std::span<const uint64_t> v) {
  return PackedArray(MetaType::kUint64, v);
}
MetaValue MetaValue::I64Array(std::span<const int64_t> v) {
  return PackedArray(MetaType::kInt64, v);
}
MetaValue MetaValue::F64Array(std::span<const double> v) {
  return PackedArray(MetaType::kFloat64, v);
}

bool MetaValue::is_integer() const {
  return static_cast<uint32_t>(type_) <= static_cast<uint32_t>(MetaType::kInt64);
}

Result<uint64_t> MetaValue::AsUint64() const {
  if (!is_integer()) {
    return InvalidArgumentError("metadata value of type " + std::string(MetaTypeName(type_)) +
                                " is not an integer");
  }
  if (IsSigned(type_) && static_cast<int64_t>(bits_) < 0) {
    return InvalidArgumentError("metadata value " + std::to_string(static_cast<int64_t>(bits_)) +
                                " is negative");
  }
  return bits_;
}

Result<int64_t> MetaValue::AsInt64() const {
  if (!is_integer()) {
    return InvalidArgumentError("metadata value of type " + std::string(MetaTypeName(type_)) +
                                " is not an integer");
  }
  if (!IsSigned(type_) && bits_ > static_cast<uint64_t>(std::numeric_limits<int64_t>::max())) {
    return InvalidArgumentError("metadata value " + std::to_string(bits_) + " exceeds int64");
  }
  return static_cast<int64_t>(bits_);
}

Result<double> MetaValue::AsDouble() const {
  if (type_ == MetaType::kFloat32)
    return static_cast<double>(std::bit_cast<float>(static_cast<uint32_t>(bits_)));
  if (type_ == MetaType::kFloat64) return std::bit_cast<double>(bits_);
  if (is_integer()) {
    return IsSigned(type_) ? static_cast<double>(static_cast<int64_t>(bits_))
                           : static_cast<double>(bits_);
  }
  return InvalidArgumentError("metadata value of type " + std::string(MetaTypeName(type_)) +
                              " is not a number");
}

Result<bool> MetaValue::AsBool() const {
  if (type_ != MetaType::kBool) {
    return InvalidArgumentError("metadata value of type " + std::string(MetaTypeName(type_)) +
                                " is not BOOL");
  }
  return bits_ != 0;
}

Result<std::string_view> MetaValue::AsString() const {
  if (type_ != MetaType::kString) {
    return InvalidArgumentError("metadata value of type " + std::string(MetaTypeName(type_)) +
                                " is not STRING");
  }
  return std::string_view(bytes_);
}

uint64_t MetaValue::size() const { return is_array() ? count_ : 0; }

Result<MetaValue> MetaValue::element(uint64_t i) const {
  if (!is_array()) return InvalidArgumentError("metadata value is not an ARRAY");
  if (i >= count_) {
    return InvalidArgumentError("metadata array index " + std::to_string(i) + " out of range " +
                                std::to_string(count_));
  }
  int width = MetaScalarWidth(elem_type_);
  if (width > 0) {
    MetaValue m;
    m.type_ = elem_type_;
    uint64_t bits = 0;
    std::memcpy(&bits, bytes_.data() + i * width, width);
    m.bits_ = NormalizeBits(elem_type_, bits);
    return m;
  }
  if (elem_type_ == MetaType::kString) return String(strings_[i]);
  return items_[i];
}

namespace {

nlohmann::json ToJsonValue(const MetaValue& v) {
  switch (v.type()) {
    case MetaType::kFloat32:
    case MetaType::kFloat64: {
      double d = *v.AsDouble();
      if (!std::isfinite(d)) return nullptr;
      return d;
    }
    case MetaType::kBool:
      return *v.AsBool();
    case MetaType::kString:
      return std::string(*v.AsString());
    case MetaType::kArray: {
      nlohmann::json arr = nlohmann::json::array();
      for (uint64_t i = 0; i < v.size(); ++i) arr.push_back(ToJsonValue(*v.element(i)));
      return arr;
    }
    case MetaType::kInt8:
    case MetaType::kInt16:
    case MetaType::kInt32:
    case MetaType::kInt64:
      return *v.AsInt64();
    default:
      return *v.AsUint64();
  }
}

}  // namespace

std::string MetaValue::ToJson() const {
  return ToJsonValue(*this).dump(-1, ' ', false, nlohmann::json::error_handler_t::replace);
}

bool operator==(const MetaValue& a, const MetaValue& b) {
  if (a.type_ != b.type_) return false;
  if (a.type_ == MetaType::kArray) {
    return a.elem_type_ == b.elem_type_ && a.count_ == b.count_ && a.bytes_ == b.bytes_ &&
           a.strings_ == b.strings_ && a.items_ == b.items_;
  }
  if (a.type_ == MetaType::kString) return a.bytes_ == b.bytes_;
  return a.bits_ == b.bits_;
}

// ---- MegaMetadata ------------------------------------------------------------

const MetaValue* MegaMetadata::Find(std::string_view key) const {
  auto it = index_.find(std::string(key));
  return it == index_.end() ? nullptr : &entries_[it->second].value;
}

Status MegaMetadata::Add(std::string key, MetaValue value) {
  if (index_.count(key)) return InvalidArgumentError("duplicate metadata key '" + key + "'");
  index_.emplace(key, entries_.size());
  entries_.push_back({std::move(key), std::move(value)});
  return Status::OK();
}

void MegaMetadata::Set(std::string key, MetaValue value) {
  auto it = index_.find(key);
  if (it != index_.end()) {
    entries_[it->second].value = std::move(value);
    return;
  }
  index_.emplace(key, entries_.size());
  entries_.push_back({std::move(key), std::move(value)});
}

Result<std::string_view> MegaMetadata::GetString(std::string_view key) const {
  const MetaValue* v = Find(key);
  if (!v) return NotFoundError("metadata key '" + std::string(key) + "' not present");
  auto s = v->AsString();
  if (!s.ok()) return s.status().WithContext("metadata key '" + std::string(key) + "'");
  return *s;
}

Result<uint64_t> MegaMetadata::GetUint64(std::string_view key) const {
  const MetaValue* v = Find(key);
  if (!v) return NotFoundError("metadata key '" + std::string(key) + "' not present");
  auto u = v->AsUint64();
  if (!u.ok()) return u.status().WithContext("metadata key '" + std::string(key) + "'");
  return *u;
}

bool IsMegaStructuralKey(std::string_view key) {
  return key == "general.alignment" || key == "mega.tensor_info.format" ||
         key.starts_with("mega.chunk_directory.") || key.starts_with("mega.segment_directory.") ||
         key.starts_with("mega.moe.expert_table.") || key == "mega.moe.n_experts";
}

// ---- codec -------------------------------------------------------------------

void MetaCodec::EncodeValue(const MetaValue& v, ByteWriter& w) {
  int width = MetaScalarWidth(v.type_);
  if (width > 0) {
    w.Raw(&v.bits_, width);
    return;
  }
  if (v.type_ == MetaType::kString) {
    w.String(v.bytes_);
    return;
  }
  w.U32(static_cast<uint32_t>(v.elem_type_));
  w.U64(v.count_);
  if (MetaScalarWidth(v.elem_type_) > 0) {
    w.Bytes(v.bytes_);
  } else if (v.elem_type_ == MetaType::kString) {
    for (const std::string& s : v.strings_) w.String(s);
  } else {
    for (const MetaValue& item : v.items_) EncodeValue(item, w);
  }
}

Result<MetaValue> MetaCodec::DecodeValue(ByteSource& src, MetaType type, int depth) {
  MetaValue m;
  m.type_ = type;
  int width = MetaScalarWidth(type);
  if (width > 0) {
    MEGA_ASSIGN_OR_RETURN(auto bytes, src.Bytes(width, "metadata value"));
    uint64_t bits = 0;
    std::memcpy(&bits, bytes.data(), width);
    m.bits_ = NormalizeBits(type, bits);
    return m;
  }
  if (type == MetaType::kString) {
    const uint64_t at = src.position();
    MEGA_ASSIGN_OR_RETURN(m.bytes_, src.String("metadata string value"));
    if (!IsCleanText(m.bytes_)) {
      return src.ErrorAt(at, "metadata string " + format_internal::Quote(m.bytes_) +
                                 " is not valid UTF-8 without NUL");
    }
    return m;
  }
  // ARRAY
  uint64_t at = src.position();
  MEGA_ASSIGN_OR_RETURN(uint32_t elem, src.U32("metadata array element type"));
  if (!mega_internal::IsKnownMetaType(elem)) {
    return src.ErrorAt(at, "unknown metadata array element type " + std::to_string(elem));
  }
  m.elem_type_ = static_cast<MetaType>(elem);
  MEGA_ASSIGN_OR_RETURN(m.count_, src.U64("metadata array count"));
  int ew = MetaScalarWidth(m.elem_type_);
  // Smallest possible encoding of one element: bounds the count before any allocation.
  uint64_t min_elem = ew > 0 ? ew : (m.elem_type_ == MetaType::kString ? 8 : 12);
  uint64_t min_total;
  if (mega_internal::MulOverflows(m.count_, min_elem, &min_total) || min_total > src.remaining()) {
    return src.Error("metadata array of " + std::to_string(m.count_) + " " +
                     std::string(MetaTypeName(m.elem_type_)) + " elements needs at least " +
                     (mega_internal::MulOverflows(m.count_, min_elem, &min_total)
                          ? std::string("2^64")
                          : std::to_string(min_total)) +
                     " bytes but only " + std::to_string(src.remaining()) + " remain");
  }
  if (ew > 0) {
    MEGA_ASSIGN_OR_RETURN(auto bytes, src.Bytes(min_total, "metadata array values"));
    m.bytes_.assign(reinterpret_cast<const char*>(bytes.data()), bytes.size());
  } else if (m.elem_type_ == MetaType::kString) {
    m.strings_.reserve(m.count_);
    for (uint64_t i = 0; i < m.count_; ++i) {
      const uint64_t sat = src.position();
      MEGA_ASSIGN_OR_RETURN(std::string s, src.String("metadata array string"));
      if (!IsCleanText(s)) {
        return src.ErrorAt(sat, "metadata array string " + format_internal::Quote(s) +
                                    " is not valid UTF-8 without NUL");
      }
      m.strings_.push_back(std::move(s));
    }
  } else {
    if (depth + 1 >= mega_internal::kMaxArrayDepth) {
      return src.Error("metadata arrays nested deeper than " +
                       std::to_string(mega_internal::kMaxArrayDepth));
    }
    m.items_.reserve(m.count_);
    for (uint64_t i = 0; i < m.count_; ++i) {
      MEGA_ASSIGN_OR_RETURN(MetaValue item, DecodeValue(src, MetaType::kArray, depth + 1));
      m.items_.push_back(std::move(item));
    }
  }
  return m;
}

Status MetaCodec::DecodeEntries(ByteSource& src, uint64_t count, std::string_view section,
                                MegaMetadata* out) {
  uint64_t min_total;
  if (mega_internal::MulOverflows(count, mega_internal::kMinMetaEntryBytes, &min_total) ||
      min_total > src.remaining()) {
    return src.Error(std::string(section) + " claims " + std::to_string(count) +
                     " metadata entries but only " + std::to_string(src.remaining()) +
                     " bytes remain");
  }
  for (uint64_t i = 0; i < count; ++i) {
    uint64_t at = src.position();
    MEGA_ASSIGN_OR_RETURN(std::string key, src.String("metadata key"));
    const std::string quoted = format_internal::Quote(key);
    if (!IsCleanText(key)) {
      return src.ErrorAt(
          at, std::string(section) + " key " + quoted + " is not valid UTF-8 without NUL");
    }
    MEGA_ASSIGN_OR_RETURN(uint32_t type, src.U32("metadata value type"));
    if (!mega_internal::IsKnownMetaType(type)) {
      return src.ErrorAt(at, std::string(section) + " key " + quoted + " has unknown value type " +
                                 std::to_string(type));
    }
    auto value = DecodeValue(src, static_cast<MetaType>(type), 0);
    if (!value.ok()) {
      return DataLossError(value.status().message() + " (" + std::string(section) + " key " +
                           quoted + ")");
    }
    if (out->Contains(key)) {
      return src.ErrorAt(at, std::string(section) + " has duplicate key " + quoted);
    }
    MEGA_RETURN_IF_ERROR(out->Add(std::move(key), std::move(*value)));
  }
  return Status::OK();
}

void MetaCodec::EncodeEntry(std::string_view key, const MetaValue& v, ByteWriter& w) {
  w.String(key);
  w.U32(static_cast<uint32_t>(v.type()));
  EncodeValue(v, w);
}

void MetaCodec::EncodeEntries(const MegaMetadata& md, ByteWriter& w) {
  for (const MetaEntry& e : md.entries()) EncodeEntry(e.key, e.value, w);
}

}  // namespace megackpt::format
