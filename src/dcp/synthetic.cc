#include "dcp/synthetic.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <functional>
#include <map>

namespace megackpt::dcp::synthetic {
namespace {

uint64_t Mix(uint64_t z) {
  z += 0x9E3779B97F4A7C15ull;
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
  return z ^ (z >> 31);
}

uint64_t HashString(const std::string& s) {
  uint64_t h = 1469598103934665603ull;
  for (unsigned char c : s) h = (h ^ c) * 1099511628211ull;
  return h;
}

uint64_t EntryKey(const Spec& spec, const EntrySpec& e) {
  const uint64_t key = Mix(spec.seed ^ HashString(e.fqn));
  return e.generation == 0 ? key : Mix(key ^ Mix(e.generation));
}

// Global content bytes [pos, pos + n) of the entry with `key`.
void Generate(uint64_t key, uint64_t pos, size_t n, std::byte* out) {
  uint64_t w = pos / 8;
  size_t skip = pos % 8;
  while (n > 0) {
    uint64_t v = Mix(key + w * 0xD1B54A32D192ED03ull);
    size_t take = std::min<size_t>(8 - skip, n);
    if (skip == 0 && take == 8) {
      std::memcpy(out, &v, 8);
    } else {
      unsigned char tmp[8];
      std::memcpy(tmp, &v, 8);
      std::memcpy(out, tmp + skip, take);
    }
    out += take;
    n -= take;
    skip = 0;
    ++w;
  }
}

// Calls fn(global_element_offset, elements, box_element_offset) for each
// contiguous run of the box (offsets, sizes) of a row-major tensor of `shape`.
void ForEachRun(const Shape& shape, const Shape& offsets, const Shape& sizes,
                const std::function<void(uint64_t, uint64_t, uint64_t)>& fn) {
  const size_t nd = shape.size();
  for (int64_t s : sizes) {
    if (s == 0) return;
  }
  if (nd == 0) {
    fn(0, 1, 0);
    return;
  }
  std::vector<int64_t> gstr = ContiguousStrides(shape);
  // Dims [j, nd) form runs: every dim after j is whole.
  size_t j = nd - 1;
  while (j > 0 && sizes[j] == shape[j]) --j;
  uint64_t run = 1;
  for (size_t d = j; d < nd; ++d) run *= static_cast<uint64_t>(sizes[d]);
  std::vector<int64_t> idx(j, 0);
  uint64_t box_off = 0;
  while (true) {
    uint64_t g = 0;
    for (size_t d = 0; d < j; ++d) g += static_cast<uint64_t>(offsets[d] + idx[d]) * gstr[d];
    for (size_t d = j; d < nd; ++d) g += static_cast<uint64_t>(offsets[d]) * gstr[d];
    fn(g, run, box_off);
    box_off += run;
    size_t d = j;
    bool done = true;
    while (d > 0) {
      --d;
      if (++idx[d] < sizes[d]) {
        done = false;
        break;
      }
      idx[d] = 0;
    }
    if (done) return;
  }
}

std::pair<int64_t, int64_t> Part(int64_t n, int parts, int p) {
  int64_t a = n * p / parts, b = n * (p + 1) / parts;
  return {a, b - a};
}

StateValue* Slot(StateDict& root, const ObjectPath& path) {
  // Walks/creates containers along path; returns the leaf slot.
  StateValue* cur = nullptr;
  for (size_t i = 0; i < path.size(); ++i) {
    const bool last = i + 1 == path.size();
    const bool next_is_index = !last && std::holds_alternative<int64_t>(path[i + 1].key);
    StateValue* slot;
    if (i == 0) {
      const auto& key = std::get<std::string>(path[0].key);
      slot = root.Find(key);
      if (!slot) slot = &root.Set(key, StateValue());
    } else if (const auto* key = std::get_if<std::string>(&path[i].key)) {
      slot = cur->dict().Find(*key);
      if (!slot) slot = &cur->dict().Set(*key, StateValue());
    } else {
      auto idx = static_cast<size_t>(std::get<int64_t>(path[i].key));
      if (cur->list().size() <= idx) cur->list().resize(idx + 1);
      slot = &cur->list()[idx];
    }
    if (!last && slot->is_none())
      *slot = next_is_index ? StateValue::List({}) : StateValue(StateDict());
    cur = slot;
  }
  return cur;
}

ObjectPath MakePath(std::initializer_list<std::variant<std::string, int64_t>> keys) {
  ObjectPath p;
  for (const auto& k : keys) p.push_back(PathKey{k});
  return p;
}

std::string PathFqn(const ObjectPath& p) {
  std::string s;
  for (const auto& k : p) {
    if (!s.empty()) s += '.';
    if (const auto* str = std::get_if<std::string>(&k.key)) {
      s += *str;
    } else {
      s += std::to_string(std::get<int64_t>(k.key));
    }
  }
  return s;
}

}  // namespace

const char* LayoutName(Layout layout) {
  switch (layout) {
    case Layout::kReplicated:
      return "replicated";
    case Layout::kRows:
      return "rows";
    case Layout::kCols:
      return "cols";
    case Layout::kUnevenRows:
      return "uneven-rows";
    case Layout::kBlocks2D:
      return "blocks-2d";
    case Layout::kReplicatedRows:
      return "replicated-rows";
  }
  return "?";
}

Spec MakeSpec(uint64_t seed, uint64_t target_bytes) {
  Spec spec;
  spec.seed = seed;
  uint64_t rng = Mix(seed);
  auto next = [&rng]() { return rng = Mix(rng); };
  int layout_counter = static_cast<int>(seed % kNumLayouts);
  auto add_tensor = [&](ObjectPath path, DType dtype, Shape shape) {
    EntrySpec e;
    e.path = std::move(path);
    e.fqn = PathFqn(e.path);
    e.dtype = dtype;
    e.shape = std::move(shape);
    e.layout =
        e.shape.empty() ? Layout::kReplicated : static_cast<Layout>(layout_counter++ % kNumLayouts);
    spec.total_bytes += LogicalNbytes(dtype, e.shape).value();
    spec.entries.push_back(std::move(e));
  };
  auto add_bytes = [&](ObjectPath path, uint64_t len) {
    EntrySpec e;
    e.path = std::move(path);
    e.fqn = PathFqn(e.path);
    e.is_bytes = true;
    e.bytes_len = len;
    spec.total_bytes += len;
    spec.entries.push_back(std::move(e));
  };
  const DType kTypes[] = {DType::kF32, DType::kBF16, DType::kF16,
                          DType::kF64, DType::kI32,  DType::kU8};
  // Big 2-D tensors of ~target/12 bytes each; sizes are deliberately not
  // multiples of small rank counts.
  const uint64_t per_tensor = std::max<uint64_t>(target_bytes / 12, 4096);
  auto shape_for = [&](DType dt) {
    uint64_t elems = std::max<uint64_t>(per_tensor / DTypeSize(dt), 64);
    double jitter = 0.8 + 0.4 * static_cast<double>(next() % 1000) / 1000.0;
    int64_t rows = std::max<int64_t>(7, static_cast<int64_t>(std::sqrt(elems * jitter / 2.0)) | 1);
    int64_t cols = std::max<int64_t>(5, static_cast<int64_t>(elems / rows) | 1);
    return Shape{rows, cols};
  };
  add_tensor(MakePath({"model", "embed"}), DType::kF16, shape_for(DType::kF16));
  add_tensor(MakePath({"model", "scale"}), DType::kF64, Shape{});
  add_tensor(MakePath({"model", "empty"}), DType::kF32, Shape{0, 5});
  add_bytes(MakePath({"rng_state"}), 4099);
  add_bytes(MakePath({"meta", "config"}), 211);
  add_bytes(MakePath({"meta", "empty"}), 0);
  int layer = 0;
  do {
    DType dt = kTypes[layer % 6];
    Shape w = shape_for(dt);
    add_tensor(MakePath({"model", "layers", int64_t{layer}, "attn", "weight"}), dt, w);
    add_tensor(MakePath({"model", "layers", int64_t{layer}, "attn", "bias"}), DType::kF32,
               Shape{w[1]});
    add_tensor(MakePath({"model", "layers", int64_t{layer}, "mlp", "weight"}), DType::kBF16,
               shape_for(DType::kBF16));
    add_tensor(MakePath({"optim", "state", int64_t{layer}, "exp_avg"}), DType::kF32,
               shape_for(DType::kF32));
    add_bytes(MakePath({"optim", "state", int64_t{layer}, "step"}), 8);
    ++layer;
  } while (spec.total_bytes < target_bytes || layer < 2);
  return spec;
}

Layout LoadLayout(const EntrySpec& entry, int variant) {
  if (entry.shape.empty()) return Layout::kReplicated;
  return static_cast<Layout>((static_cast<int>(entry.layout) + variant) % kNumLayouts);
}

std::vector<ChunkStorageMetadata> ChunksFor(Layout layout, const Shape& shape, int world, int rank,
                                            uint64_t salt) {
  std::vector<ChunkStorageMetadata> out;
  const size_t nd = shape.size();
  auto add = [&](Shape offsets, Shape sizes) {
    for (int64_t s : sizes) {
      if (s == 0) return;
    }
    out.push_back(ChunkStorageMetadata{std::move(offsets), std::move(sizes)});
  };
  auto rows = [&](int parts, int p) {
    auto [a, n] = Part(shape[0], parts, p);
    Shape off(nd, 0), sz = shape;
    off[0] = a;
    sz[0] = n;
    add(off, sz);
  };
  if (nd == 0) {
    add({}, {});
    return out;
  }
  if (nd < 2 && (layout == Layout::kCols || layout == Layout::kBlocks2D)) layout = Layout::kRows;
  switch (layout) {
    case Layout::kReplicated:
      add(Shape(nd, 0), shape);
      break;
    case Layout::kRows:
      rows(world, rank);
      break;
    case Layout::kCols: {
      auto [a, n] = Part(shape[1], world, rank);
      Shape off(nd, 0), sz = shape;
      off[1] = a;
      sz[1] = n;
      add(off, sz);
      break;
    }
    case Layout::kUnevenRows: {
      // 2*world parts at pseudo-random cuts; rank r holds parts r and r + world.
      const int parts = 2 * world;
      std::vector<int64_t> cuts{0, shape[0]};
      uint64_t h = Mix(salt ^ static_cast<uint64_t>(world));
      for (int k = 1; k < parts; ++k) {
        h = Mix(h);
        cuts.push_back(
            shape[0] == 0 ? 0 : static_cast<int64_t>(h % static_cast<uint64_t>(shape[0] + 1)));
      }
      std::sort(cuts.begin(), cuts.end());
      for (int p : {rank, rank + world}) {
        Shape off(nd, 0), sz = shape;
        off[0] = cuts[p];
        sz[0] = cuts[p + 1] - cuts[p];
        add(off, sz);
      }
      break;
    }
    case Layout::kBlocks2D:
      for (int b = 0; b < 4; ++b) {
        if (b % world != rank) continue;
        auto [r0, rn] = Part(shape[0], 2, b / 2);
        auto [c0, cn] = Part(shape[1], 2, b % 2);
        Shape off(nd, 0), sz = shape;
        off[0] = r0;
        sz[0] = rn;
        off[1] = c0;
        sz[1] = cn;
        add(off, sz);
      }
      break;
    case Layout::kReplicatedRows:
      rows((world + 1) / 2, rank / 2);
      break;
  }
  return out;
}

std::string BytesValue(const Spec& spec, const EntrySpec& entry) {
  std::string s(entry.bytes_len, '\0');
  Generate(EntryKey(spec, entry), 0, s.size(), reinterpret_cast<std::byte*>(s.data()));
  return s;
}

Status FillBox(const Spec& spec, const EntrySpec& entry, const Shape& offsets, const Tensor& dst) {
  if (!dst.is_contiguous()) return InvalidArgumentError("FillBox needs a contiguous tensor");
  const uint64_t key = EntryKey(spec, entry);
  const uint64_t es = DTypeSize(entry.dtype);
  auto* out = static_cast<std::byte*>(dst.data());
  ForEachRun(entry.shape, offsets, dst.shape(), [&](uint64_t g, uint64_t n, uint64_t b) {
    Generate(key, g * es, n * es, out + b * es);
  });
  return Status::OK();
}

Result<StateDict> BuildRankState(const Spec& spec, int world, int rank, int variant, bool fill) {
  StateDict root;
  for (const EntrySpec& e : spec.entries) {
    StateValue* slot = Slot(root, e.path);
    if (e.is_bytes) {
      *slot = StateValue::Bytes(fill ? BytesValue(spec, e) : std::string());
      continue;
    }
    Layout layout = LoadLayout(e, variant);
    const uint64_t salt = HashString(e.fqn) ^ static_cast<uint64_t>(variant);
    auto chunks = ChunksFor(layout, e.shape, world, rank, salt);
    uint64_t total = 0;
    for (const auto& c : chunks) total += (LogicalNbytes(e.dtype, c.sizes).value() + 63) / 64 * 64;
    MEGA_ASSIGN_OR_RETURN(std::shared_ptr<std::byte> mem, AllocateBuffer(total, /*prefault=*/true));
    if (!fill) std::memset(mem.get(), 0xCD, total);
    std::vector<Shard> shards;
    uint64_t off = 0;
    for (const auto& c : chunks) {
      MEGA_ASSIGN_OR_RETURN(Tensor t, Tensor::FromBlob(mem.get() + off, e.dtype, c.sizes, mem));
      if (fill) MEGA_RETURN_IF_ERROR(FillBox(spec, e, c.offsets, t));
      off += (t.nbytes() + 63) / 64 * 64;
      shards.push_back(Shard{c.offsets, std::move(t)});
    }
    if (layout == Layout::kReplicated) {
      if (shards.size() != 1) {
        // Zero-element tensor: a whole empty tensor.
        MEGA_ASSIGN_OR_RETURN(Tensor t, Tensor::Empty(e.dtype, e.shape));
        *slot = StateValue(std::move(t));
      } else {
        *slot = StateValue(std::move(shards[0].tensor));
      }
    } else {
      *slot = StateValue(ShardedTensor{e.dtype, e.shape, std::move(shards)});
    }
  }
  return root;
}

namespace {

Status CompareBox(const Spec& spec, const EntrySpec& e, const Shape& offsets, const Tensor& t) {
  if (t.dtype() != e.dtype) {
    return DataLossError("'" + e.fqn + "': dtype " + std::string(DTypeName(t.dtype())) +
                         ", expected " + std::string(DTypeName(e.dtype)));
  }
  Tensor c = t;
  if (!t.is_contiguous()) {
    MEGA_ASSIGN_OR_RETURN(c, Tensor::Empty(t.dtype(), t.shape()));
    MEGA_RETURN_IF_ERROR(CopyTensor(t, c));
  }
  const uint64_t key = EntryKey(spec, e);
  const uint64_t es = DTypeSize(e.dtype);
  const auto* have = static_cast<const std::byte*>(c.data());
  std::vector<std::byte> want;
  Status status;
  ForEachRun(e.shape, offsets, c.shape(), [&](uint64_t g, uint64_t n, uint64_t b) {
    if (!status.ok()) return;
    for (uint64_t done = 0; done < n * es;) {
      uint64_t len = std::min<uint64_t>(n * es - done, 1 << 20);
      want.resize(len);
      Generate(key, g * es + done, len, want.data());
      if (std::memcmp(want.data(), have + b * es + done, len) != 0) {
        uint64_t k = 0;
        while (want[k] == have[b * es + done + k]) ++k;
        status = DataLossError("'" + e.fqn + "' chunk at " + ShapeToString(offsets) + " of " +
                               ShapeToString(c.shape()) + " differs at global byte " +
                               std::to_string(g * es + done + k));
        return;
      }
      done += len;
    }
  });
  return status;
}

}  // namespace

Status VerifyRankState(const Spec& spec, StateDict& state) {
  std::map<std::string, const EntrySpec*> by_fqn;
  for (const auto& e : spec.entries) by_fqn[e.fqn] = &e;
  MEGA_ASSIGN_OR_RETURN(auto flat, FlattenStateDict(state, nullptr));
  size_t seen = 0;
  for (const FlatEntry& fe : flat) {
    auto it = by_fqn.find(fe.fqn);
    if (it == by_fqn.end()) return DataLossError("unexpected entry '" + fe.fqn + "'");
    ++seen;
    const EntrySpec& e = *it->second;
    const StateValue& v = *fe.value;
    if (e.is_bytes) {
      if (!v.is_bytes()) return DataLossError("'" + fe.fqn + "' should be bytes");
      if (v.bytes() != BytesValue(spec, e)) {
        return DataLossError("bytes value '" + fe.fqn + "' differs (" +
                             std::to_string(v.bytes().size()) + " bytes, expected " +
                             std::to_string(e.bytes_len) + ")");
      }
    } else if (v.is_tensor()) {
      if (v.tensor().shape() != e.shape)
        return DataLossError("'" + fe.fqn + "' has the wrong shape");
      MEGA_RETURN_IF_ERROR(CompareBox(spec, e, Shape(e.shape.size(), 0), v.tensor()));
    } else if (v.is_sharded()) {
      if (v.sharded().global_shape != e.shape) {
        return DataLossError("'" + fe.fqn + "' has the wrong global shape");
      }
      for (const Shard& sh : v.sharded().shards) {
        MEGA_RETURN_IF_ERROR(CompareBox(spec, e, sh.offsets, sh.tensor));
      }
    } else {
      return DataLossError("'" + fe.fqn + "' has kind " + std::string(KindName(v.kind())));
    }
  }
  if (seen != spec.entries.size()) {
    return DataLossError("state has " + std::to_string(seen) + " entries, expected " +
                         std::to_string(spec.entries.size()));
  }
  return Status::OK();
}

uint64_t RankStateBytes(StateDict& state) {
  auto flat = FlattenStateDict(state, nullptr);
  if (!flat.ok()) return 0;
  uint64_t n = 0;
  for (const FlatEntry& fe : *flat) {
    const StateValue& v = *fe.value;
    if (v.is_bytes()) n += v.bytes().size();
    if (v.is_tensor()) n += v.tensor().nbytes();
    if (v.is_sharded()) {
      for (const auto& sh : v.sharded().shards) n += sh.tensor.nbytes();
    }
  }
  return n;
}

}  // namespace megackpt::dcp::synthetic
