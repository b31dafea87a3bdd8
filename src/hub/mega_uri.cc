// mega:// URI parsing (grammar in include/megackpt/hub/mega_uri.h).
#include "megackpt/hub/mega_uri.h"

#include <cctype>

#include "megackpt/core/path_components.h"
#include "megackpt/core/text.h"

namespace megackpt::hub {
namespace {

constexpr std::string_view kScheme = "mega://";
constexpr size_t kMaxNamePart = 96;
constexpr size_t kMaxPath = 1024;
constexpr size_t kMaxPathSegment = 255;
constexpr size_t kMaxRevision = 255;

// Quotes a user-supplied fragment for an error message.
std::string Quote(std::string_view s) {
  std::string out = "'";
  for (char c : s) {
    unsigned char u = static_cast<unsigned char>(c);
    if (u < 0x20 || u == 0x7f) {
      static const char* kHex = "0123456789abcdef";
      out += "\\x";
      out += kHex[u >> 4];
      out += kHex[u & 15];
    } else {
      out += c;
    }
  }
  out += "'";
  return out;
}

// InvalidArgument when the `what` ("path", "revision") `s` is longer than
// `max` bytes; the message quotes its first 64 bytes.
Status CheckLength(std::string_view what, std::string_view s, size_t max) {
  if (s.size() <= max) return Status::OK();
  return InvalidArgumentError(std::string(what) + " " + Quote(s.substr(0, 64)) +
                              "... is longer than " + std::to_string(max) + " bytes");
}

bool IsDigits(std::string_view s) {
  if (s.empty()) return false;
  for (char c : s) {
    if (c < '0' || c > '9') return false;
  }
  return true;
}

bool IsUnreserved(unsigned char c) {
  return std::isalnum(c) || c == '-' || c == '.' || c == '_' || c == '~';
}

// A revision that needs no percent-encoding although it contains '/'.
bool IsSpecialRef(std::string_view rev) {
  if (rev.starts_with("refs/pr/")) return IsDigits(rev.substr(8));
  if (rev.starts_with("refs/convert/")) {
    std::string_view rest = rev.substr(13);
    return !rest.empty() && rest.find('/') == std::string_view::npos;
  }
  return false;
}

// Every repo type with its name and plural (the one table of the three
// functions below).
struct RepoTypeNames {
  RepoType type;
  std::string_view name, plural;
};
constexpr RepoTypeNames kRepoTypes[] = {{RepoType::kModel, "model", "models"},
                                        {RepoType::kDataset, "dataset", "datasets"},
                                        {RepoType::kSpace, "space", "spaces"}};

const RepoTypeNames& NamesOf(RepoType type) {
  for (const RepoTypeNames& t : kRepoTypes) {
    if (t.type == type) return t;
  }
  return kRepoTypes[0];  // not a RepoType value: a model
}

}  // namespace

std::string_view RepoTypeName(RepoType type) { return NamesOf(type).name; }

std::string_view RepoTypePlural(RepoType type) { return NamesOf(type).plural; }

Result<RepoType> RepoTypeFromName(std::string_view name) {
  for (const RepoTypeNames& t : kRepoTypes) {
    if (name == t.name || name == t.plural) return t.type;
  }
  return InvalidArgumentError("unknown repo type " + Quote(name) +
                              " (expected model, dataset or space)");
}

bool IsMegaUri(std::string_view s) { return s.starts_with(kScheme); }

std::string PercentEncode(std::string_view s) {
  static const char* kHex = "0123456789ABCDEF";
  std::string out;
  out.reserve(s.size());
  for (char c : s) {
    unsigned char u = static_cast<unsigned char>(c);
    if (IsUnreserved(u)) {
      out += c;
    } else {
      out += '%';
      out += kHex[u >> 4];
      out += kHex[u & 15];
    }
  }
  return out;
}

std::string PercentEncodePath(std::string_view s) {
  const std::vector<std::string_view> parts = PathComponents(s);
  std::string out;
  for (size_t i = 0; i < parts.size(); ++i) {
    if (i > 0) out += '/';
    out += PercentEncode(parts[i]);
  }
  return out;
}

Result<std::string> PercentDecode(std::string_view s) {
  std::string out;
  out.reserve(s.size());
  for (size_t i = 0; i < s.size(); ++i) {
    if (s[i] != '%') {
      out += s[i];
      continue;
    }
    if (i + 2 >= s.size()) {
      return InvalidArgumentError("truncated percent escape at offset " + std::to_string(i) +
                                  " in " + Quote(s));
    }
    int hi = HexDigitValue(s[i + 1]);
    int lo = HexDigitValue(s[i + 2]);
    if (hi < 0 || lo < 0) {
      return InvalidArgumentError("bad percent escape " + Quote(s.substr(i, 3)) + " at offset " +
                                  std::to_string(i) + " in " + Quote(s));
    }
    out += static_cast<char>(hi * 16 + lo);
    i += 2;
  }
  return out;
}

Status ValidateRepoNamePart(std::string_view part, std::string_view what) {
  if (part.empty()) return InvalidArgumentError("empty " + std::string(what));
  if (part.size() > kMaxNamePart) {
    return InvalidArgumentError(std::string(what) + " " + Quote(part) + " is longer than " +
                                std::to_string(kMaxNamePart) + " characters");
  }
  if (part == "." || part == "..") {
    return InvalidArgumentError(std::string(what) + " " + Quote(part) + " is not allowed");
  }
  for (char c : part) {
    unsigned char u = static_cast<unsigned char>(c);
    if (!(std::isalnum(u) || c == '-' || c == '_' || c == '.')) {
      return InvalidArgumentError(std::string(what) + " " + Quote(part) + " has character " +
                                  Quote(std::string_view(&c, 1)) +
                                  " (allowed: letters, digits, '-', '_', '.')");
    }
  }
  return Status::OK();
}

Status ValidateRepoPath(std::string_view path) {
  if (path.empty()) return InvalidArgumentError("empty file path");
  MEGA_RETURN_IF_ERROR(CheckLength("path", path, kMaxPath));
  if (path.front() == '/') {
    return InvalidArgumentError("path " + Quote(path) + " is absolute (starts with '/')");
  }
  for (char c : path) {
    unsigned char u = static_cast<unsigned char>(c);
    if (u < 0x20 || u == 0x7f) {
      return InvalidArgumentError("path " + Quote(path) + " contains a control character");
    }
    if (c == '\\') return InvalidArgumentError("path " + Quote(path) + " contains '\\'");
  }
  for (std::string_view seg : PathComponents(path)) {
    if (seg.empty()) {
      return InvalidArgumentError("path " + Quote(path) +
                                  " has an empty segment ('//' or trailing '/')");
    }
    if (seg == "." || seg == "..") {
      return InvalidArgumentError("path " + Quote(path) + " has a " + Quote(seg) +
                                  " segment (path traversal is not allowed)");
    }
    // A longer name cannot be a file name on common filesystems (NAME_MAX),
    // so such a file could never be pulled.
    if (seg.size() > kMaxPathSegment) {
      return InvalidArgumentError("path " + Quote(path.substr(0, 64)) + "...: segment " +
                                  Quote(seg.substr(0, 32)) + "... is " +
                                  std::to_string(seg.size()) + " bytes long (at most " +
                                  std::to_string(kMaxPathSegment) + ")");
    }
  }
  return Status::OK();
}

Status ValidateRevision(std::string_view rev) {
  if (rev.empty()) return InvalidArgumentError("empty revision");
  MEGA_RETURN_IF_ERROR(CheckLength("revision", rev, kMaxRevision));
  for (char c : rev) {
    unsigned char u = static_cast<unsigned char>(c);
    if (u <= 0x20 || u == 0x7f || c == '\\' || c == '~' || c == '^' || c == ':' || c == '?' ||
        c == '*' || c == '[') {
      return InvalidArgumentError("revision " + Quote(rev) + " contains the character " +
                                  Quote(std::string_view(&c, 1)));
    }
  }
  if (rev.find("..") != std::string_view::npos) {
    return InvalidArgumentError("revision " + Quote(rev) + " contains '..'");
  }
  if (rev.front() == '/' || rev.back() == '/' || rev.find("//") != std::string_view::npos) {
    return InvalidArgumentError("revision " + Quote(rev) + " has an empty '/' segment");
  }
  return Status::OK();
}

std::string MegaUri::ToString() const {
  std::string out(kScheme);
  if (is_bucket) {
    out += "buckets/";
  } else if (type != RepoType::kModel) {
    out += RepoTypePlural(type);
    out += '/';
  }
  out += ns;
  out += '/';
  out += name;
  if (!is_bucket && has_revision) {
    out += '@';
    out += IsSpecialRef(revision) ? revision : PercentEncode(revision);
  }
  if (!path.empty()) {
    out += '/';
    out += path;
  }
  return out;
}

Result<MegaUri> MegaUri::WithPath(std::string_view new_path) const {
  while (!new_path.empty() && new_path.back() == '/') new_path.remove_suffix(1);
  while (!new_path.empty() && new_path.front() == '/') new_path.remove_prefix(1);
  MegaUri out = *this;
  out.path = std::string(new_path);
  if (!out.path.empty()) MEGA_RETURN_IF_ERROR(ValidateRepoPath(out.path));
  return out;
}

MegaUri MegaUri::Root() const {
  MegaUri out = *this;
  out.path.clear();
  return out;
}

Result<MegaUri> ParseMegaUri(std::string_view uri) {
  auto fail = [&](const std::string& what) -> Status {
    return InvalidArgumentError("bad mega:// URI " + Quote(uri) + ": " + what);
  };
  if (!uri.starts_with(kScheme)) return fail("it does not start with 'mega://'");
  std::string_view rest = uri.substr(kScheme.size());
  MegaUri out;
  if (rest.starts_with("buckets/")) {
    out.is_bucket = true;
    rest.remove_prefix(8);
  } else if (rest.starts_with("datasets/")) {
    out.type = RepoType::kDataset;
    rest.remove_prefix(9);
  } else if (rest.starts_with("spaces/")) {
    out.type = RepoType::kSpace;
    rest.remove_prefix(7);
  }
  const char* kind = out.is_bucket ? "bucket" : "repo";

  // <namespace>/
  size_t slash = rest.find('/');
  std::string_view ns = rest.substr(0, slash);
  if (ns.empty())
    return fail(std::string("empty namespace segment (expected ") + kind + " id 'namespace/name')");
  if (slash == std::string_view::npos) {
    return fail(std::string("missing name after namespace ") + Quote(ns) + " (expected " + kind +
                " id 'namespace/name')");
  }
  if (ns.find('@') != std::string_view::npos) {
    return fail("namespace " + Quote(ns) + " contains '@' (the revision follows the name)");
  }
  if (Status s = ValidateRepoNamePart(ns, "namespace"); !s.ok()) return fail(s.message());
  out.ns = std::string(ns);
  rest.remove_prefix(slash + 1);

  // <name>[@<revision>]
  size_t end = rest.find_first_of("/@");
  std::string_view name = rest.substr(0, end);
  if (name.empty()) return fail("empty name segment after namespace " + Quote(ns));
  if (Status s = ValidateRepoNamePart(name, "name"); !s.ok()) return fail(s.message());
  out.name = std::string(name);
  rest = end == std::string_view::npos ? std::string_view() : rest.substr(end);

  if (rest.starts_with("@")) {
    if (out.is_bucket) {
      return fail("buckets take no revision (found '@' after bucket " +
                  Quote(out.ns + "/" + out.name) + ")");
    }
    rest.remove_prefix(1);
    std::string_view raw;
    if (rest.starts_with("refs/pr/")) {
      size_t e = rest.find('/', 8);
      raw = rest.substr(0, e);
      if (!IsDigits(raw.substr(8))) {
        return fail("pull-request revision " + Quote(raw) + " must be refs/pr/<number>");
      }
    } else if (rest.starts_with("refs/convert/")) {
      size_t e = rest.find('/', 13);
      raw = rest.substr(0, e);
      if (raw.size() == 13) return fail("revision 'refs/convert/' has an empty name");
    } else {
      raw = rest.substr(0, rest.find('/'));
    }
    if (raw.empty()) return fail("empty revision after '@'");
    auto decoded = PercentDecode(raw);
    if (!decoded.ok()) return fail("revision " + Quote(raw) + ": " + decoded.status().message());
    if (Status s = ValidateRevision(*decoded); !s.ok()) return fail(s.message());
    out.revision = *std::move(decoded);
    out.has_revision = true;
    rest.remove_prefix(raw.size());
  } else if (!out.is_bucket) {
    out.revision = "main";
  }

  // [/<path>]
  if (!rest.empty()) {
    // rest starts with '/'.
    rest.remove_prefix(1);
    if (rest.ends_with("/")) rest.remove_suffix(1);
    if (!rest.empty()) {
      if (Status s = ValidateRepoPath(rest); !s.ok()) return fail(s.message());
      out.path = std::string(rest);
    } else if (uri.ends_with("//")) {
      return fail("empty path segment ('//')");
    }
  }
  return out;
}

}  // namespace megackpt::hub
