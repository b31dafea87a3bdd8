// CasStore over the local backend: round trips, dedup, streaming, range reads,
// corruption, GC.
#include "megackpt/cas/store.h"

#include <gtest/gtest.h>
#include <sys/stat.h>
#include <unistd.h>

#include <fstream>
#include <random>

#include "cas/test_util.h"
#include "core/test_files.h"
#include "megackpt/cas/chunker.h"
#include "megackpt/cas/xorb.h"

namespace megackpt::cas {
namespace {

using testing::Bytes;
using testing::RandomBytes;
using testing::ScopedTempDir;

std::unique_ptr<CasStore> OpenStore(const std::string& dir, CasStoreOptions opts = {}) {
  LocalBackendOptions local;
  local.sync = false;  // tests: durability is not under test here
  auto store = CasStore::OpenLocal(dir, opts, local);
  EXPECT_TRUE(store.ok()) << store.status().ToString();
  return store.ok() ? std::move(*store) : nullptr;
}

// File hash computed independently of the store: chunk, hash, aggregate.
MerkleHash ExpectedFileHash(const std::string& data) {
  std::vector<HashAndSize> leaves;
  uint64_t prev = 0;
  for (uint64_t end : ChunkBoundaries(Bytes(data))) {
    leaves.push_back({ChunkHash(Bytes(data).subspan(prev, end - prev)), end - prev});
    prev = end;
  }
  return FileHash(leaves);
}

// Float-like data: small normal-ish float32 values (compressible with BG4).
std::string FloatBytes(uint32_t seed, size_t n) { return testing::FloatBytes(seed, n, 0.02f); }

TEST(CasStoreTest, UploadDownloadRoundTrip) {
  ScopedTempDir dir;
  auto store = OpenStore(dir.path());
  ASSERT_TRUE(store);
  std::string data = RandomBytes(1, 5'000'000);
  auto r = store->Upload(Bytes(data));
  ASSERT_TRUE(r.ok()) << r.status().ToString();
  EXPECT_EQ(r->size, data.size());
  EXPECT_EQ(r->file_hash, ExpectedFileHash(data));
  EXPECT_EQ(r->chunks, ChunkBoundaries(Bytes(data)).size());
  EXPECT_EQ(r->new_chunks, r->chunks);
  EXPECT_EQ(r->new_bytes, data.size());
  EXPECT_GE(r->new_xorbs, 1u);
  EXPECT_EQ(r->reconstruction.size, data.size());
  EXPECT_TRUE(r->reconstruction.Validate().ok());
  auto back = store->Read(r->file_hash);
  ASSERT_TRUE(back.ok()) << back.status().ToString();
  EXPECT_TRUE(*back == data);
  EXPECT_TRUE(store->Verify().ok());
}

TEST(CasStoreTest, SecondUploadIsFullyDeduplicated) {
  ScopedTempDir dir;
  auto store = OpenStore(dir.path());
  std::string data = RandomBytes(2, 3'000'000);
  auto a = store->Upload(Bytes(data));
  ASSERT_TRUE(a.ok());
  auto b = store->Upload(Bytes(data));
  ASSERT_TRUE(b.ok());
  EXPECT_EQ(a->file_hash, b->file_hash);
  EXPECT_EQ(b->new_chunks, 0u);
  EXPECT_EQ(b->new_bytes, 0u);
  EXPECT_EQ(b->new_xorbs, 0u);
  // Reopening the store (a new process) sees the index on disk.
  auto again = OpenStore(dir.path());
  auto c = again->Upload(Bytes(data));
  ASSERT_TRUE(c.ok());
  EXPECT_EQ(c->new_bytes, 0u);
}

TEST(CasStoreTest, EditedFileStoresOnlyChangedChunks) {
  ScopedTempDir dir;
  auto store = OpenStore(dir.path());
  std::string data = RandomBytes(3, 8'000'000);
  ASSERT_TRUE(store->Upload(Bytes(data)).ok());
  std::string edited = data;
  for (size_t i = 4'000'000; i < 4'000'100; ++i) edited[i] ^= 0x5a;
  auto r = store->Upload(Bytes(edited));
  ASSERT_TRUE(r.ok());
  EXPECT_GT(r->new_bytes, 0u);
  EXPECT_LE(r->new_bytes, 2 * kMaxChunkSize);
  // Terms are merged: the edit splits the file into few ranges.
  EXPECT_LE(r->reconstruction.terms.size(), 4u);
  EXPECT_TRUE(*store->Read(r->file_hash) == edited);
}

TEST(CasStoreTest, RepeatedChunksInsideOneFileAreStoredOnce) {
  ScopedTempDir dir;
  auto store = OpenStore(dir.path());
  std::string block = RandomBytes(4, 1'000'000);
  std::string data = block + block + block;
  auto r = store->Upload(Bytes(data));
  ASSERT_TRUE(r.ok());
  EXPECT_LT(r->new_bytes, 1'300'000u);
  EXPECT_TRUE(*store->Read(r->file_hash) == data);
}

TEST(CasStoreTest, StreamingUploadIsIndependentOfAppendSizes) {
  ScopedTempDir dir;
  auto store = OpenStore(dir.path());
  std::string data = RandomBytes(5, 2'500'000);
  MerkleHash want = ExpectedFileHash(data);
  for (size_t piece : {size_t{1}, size_t{7}, size_t{1} << 20, size_t{9'000'000}}) {
    auto stream = store->BeginUpload({.name = "piece" + std::to_string(piece)});
    ASSERT_TRUE(stream.ok());
    for (size_t off = 0; off < data.size(); off += piece) {
      ASSERT_TRUE(
          (*stream)->Append(Bytes(data).subspan(off, std::min(piece, data.size() - off))).ok());
    }
    EXPECT_EQ((*stream)->size(), data.size());
    ASSERT_TRUE((*stream)->Close().ok());
    ASSERT_NE((*stream)->result(), nullptr);
    EXPECT_EQ((*stream)->result()->file_hash, want) << "append size " << piece;
    EXPECT_EQ((*stream)->Finish().status().code(), StatusCode::kFailedPrecondition);
  }
}

// Many batches and several xorbs with the background stage, and small xorbs
// (forced) so terms span xorbs; also the single-threaded path.
TEST(CasStoreTest, ManyXorbsAndThreadModes) {
  for (int threads : {1, 2}) {
    ScopedTempDir dir;
    CasStoreOptions opts;
    opts.upload_threads = threads;
    opts.max_xorb_bytes = 1u << 20;
    auto store = OpenStore(dir.path(), opts);
    std::string data = FloatBytes(6, 8'000'000);
    auto r = store->Upload(Bytes(data));
    ASSERT_TRUE(r.ok()) << r.status().ToString();
    EXPECT_GT(r->new_xorbs, 4u);
    EXPECT_EQ(r->file_hash, ExpectedFileHash(data));
    // Float data compresses (BG4): fewer bytes stored than given.
    EXPECT_LT(r->stored_bytes, r->new_bytes);
    EXPECT_TRUE(*store->Read(r->file_hash) == data) << threads << " threads";
    EXPECT_TRUE(store->Verify().ok());
  }
}

TEST(CasStoreTest, RandomRangeReadsMatch) {
  ScopedTempDir dir;
  CasStoreOptions opts;
  opts.max_xorb_bytes = 1u << 20;
  auto store = OpenStore(dir.path(), opts);
  std::string data = RandomBytes(7, 6'000'000) + FloatBytes(7, 3'000'000);
  auto r = store->Upload(Bytes(data));
  ASSERT_TRUE(r.ok());
  std::mt19937_64 rng(11);
  for (int i = 0; i < 200; ++i) {
    uint64_t off = rng() % (data.size() + 1);
    uint64_t len = (i % 3 == 0) ? rng() % 100 : rng() % 3'000'000;
    auto got = store->Read(r->file_hash, {off, len});
    ASSERT_TRUE(got.ok()) << got.status().ToString();
    ASSERT_TRUE(*got == data.substr(off, len)) << "range " << off << "+" << len;
  }
  // Past the end: clipped; offset beyond the size: OutOfRange.
  EXPECT_EQ(store->Read(r->file_hash, {data.size() - 5, 100})->size(), 5u);
  EXPECT_EQ(store->Read(r->file_hash, {data.size() + 1, 1}).status().code(),
            StatusCode::kOutOfRange);
  // RandomAccessFile view.
  auto file = store->OpenFile(r->file_hash);
  ASSERT_TRUE(file.ok());
  EXPECT_EQ((*file)->size(), data.size());
  for (int i = 0; i < 100; ++i) {
    uint64_t off = rng() % data.size();
    const size_t want = (i % 2) ? rng() % 64 : rng() % 200000;
    std::string buf(want, '\0');
    auto n = (*file)->ReadAt(off, std::as_writable_bytes(std::span(buf)));
    ASSERT_TRUE(n.ok());
    ASSERT_EQ(*n, std::min<uint64_t>(want, data.size() - off));
    buf.resize(*n);
    ASSERT_TRUE(buf == data.substr(off, buf.size()));
  }
}

// A range read fetches only the xorb bytes of the chunks it covers.
class CountingBackend final : public CasBackend {
 public:
  explicit CountingBackend(std::shared_ptr<CasBackend> inner) : inner_(std::move(inner)) {}
  uint64_t bytes_read = 0;
  std::string Describe() const override { return "counting"; }
  Result<bool> PutXorb(std::string_view s, const XorbLayout& l) override {
    return inner_->PutXorb(s, l);
  }
  Result<bool> HasXorb(const MerkleHash& h) override { return inner_->HasXorb(h); }
  Result<std::string> GetXorbRange(const MerkleHash& h, uint64_t o, uint64_t n) override {
    bytes_read += n;
    return inner_->GetXorbRange(h, o, n);
  }
  Status ReadXorbRange(const MerkleHash& h, uint64_t o, std::span<std::byte> d) override {
    bytes_read += d.size();
    return inner_->ReadXorbRange(h, o, d);
  }
  Result<std::string> GetXorb(const MerkleHash& h) override { return inner_->GetXorb(h); }
  Result<XorbLayout> GetXorbLayout(const MerkleHash& h) override {
    return inner_->GetXorbLayout(h);
  }
  Result<std::vector<MerkleHash>> ListXorbs() override { return inner_->ListXorbs(); }
  Status DeleteXorbs(std::span<const MerkleHash> h) override { return inner_->DeleteXorbs(h); }
  Result<uint64_t> XorbSize(const MerkleHash& h) override { return inner_->XorbSize(h); }
  Status PutFile(const FileReconstruction& r) override { return inner_->PutFile(r); }
  Result<FileReconstruction> GetFile(const MerkleHash& h) override { return inner_->GetFile(h); }
  Result<bool> HasFile(const MerkleHash& h) override { return inner_->HasFile(h); }
  Result<std::vector<MerkleHash>> ListFiles() override { return inner_->ListFiles(); }
  Status DeleteFiles(std::span<const MerkleHash> h) override { return inner_->DeleteFiles(h); }
  Result<std::vector<std::optional<ChunkLocation>>> LookupChunks(
      std::span<const MerkleHash> h) override {
    return inner_->LookupChunks(h);
  }

 private:
  std::shared_ptr<CasBackend> inner_;
};

TEST(CasStoreTest, RangeReadFetchesOnlyCoveringChunks) {
  ScopedTempDir dir;
  auto inner = OpenLocalBackend(dir.path(), {.create = true, .sync = false});
  ASSERT_TRUE(inner.ok());
  auto counting = std::make_shared<CountingBackend>(*inner);
  auto store = CasStore::Open(counting);
  ASSERT_TRUE(store.ok());
  std::string data = RandomBytes(8, 16'000'000);
  auto r = (*store)->Upload(Bytes(data));
  ASSERT_TRUE(r.ok());
  counting->bytes_read = 0;
  auto got = (*store)->Read(r->file_hash, {7'000'000, 1000});
  ASSERT_TRUE(got.ok());
  EXPECT_TRUE(*got == data.substr(7'000'000, 1000));
  // At most two chunks (the range may straddle a boundary) plus headers.
  EXPECT_LE(counting->bytes_read, 2 * (kMaxChunkSize + kChunkRecordHeaderSize));
  EXPECT_GT(counting->bytes_read, 0u);
}

std::string XorbFile(const std::string& dir, const MerkleHash& h) {
  std::string hex = h.ToHex();
  return dir + "/xorbs/" + hex.substr(0, 2) + "/" + hex;
}

TEST(CasStoreTest, CorruptXorbByteIsDataLossNamingXorbAndChunk) {
  ScopedTempDir dir;
  auto store = OpenStore(dir.path(), {.compress = false});
  std::string data = RandomBytes(9, 1'000'000);
  auto r = store->Upload(Bytes(data));
  ASSERT_TRUE(r.ok());
  ASSERT_EQ(r->reconstruction.terms.size(), 1u);
  const MerkleHash xorb = r->reconstruction.terms[0].xorb_hash;
  auto layout = store->backend().GetXorbLayout(xorb);
  ASSERT_TRUE(layout.ok());
  ASSERT_GE(layout->chunks.size(), 3u);
  // Flip one payload byte inside chunk 2.
  const uint64_t pos = layout->chunks[2].byte_offset + kChunkRecordHeaderSize + 100;
  ::megackpt::test_util::XorFileByte(XorbFile(dir.path(), xorb), pos, 1);
  // A fresh store object (no cached data).
  auto fresh = OpenStore(dir.path());
  auto got = fresh->Read(r->file_hash);
  ASSERT_FALSE(got.ok());
  EXPECT_EQ(got.status().code(), StatusCode::kDataLoss);
  EXPECT_NE(got.status().message().find("xorb " + xorb.ToHex()), std::string::npos)
      << got.status().message();
  EXPECT_NE(got.status().message().find("chunk 2"), std::string::npos) << got.status().message();
  // Ranges avoiding chunk 2 still read fine.
  uint64_t chunk2_start = layout->chunks[0].unpacked_bytes + layout->chunks[1].unpacked_bytes;
  auto head = fresh->Read(r->file_hash, {0, chunk2_start});
  ASSERT_TRUE(head.ok());
  EXPECT_TRUE(*head == data.substr(0, chunk2_start));
  // The sink never received bytes of the bad chunk.
  uint64_t delivered = 0;
  Status s = fresh->Download(r->file_hash, {chunk2_start, 10}, [&](std::span<const std::byte> p) {
    delivered += p.size();
    return Status::OK();
  });
  EXPECT_EQ(s.code(), StatusCode::kDataLoss);
  EXPECT_EQ(delivered, 0u);
  EXPECT_EQ(fresh->Verify().code(), StatusCode::kDataLoss);
}

TEST(CasStoreTest, CorruptCompressedChunkIsDataLoss) {
  ScopedTempDir dir;
  auto store = OpenStore(dir.path());
  std::string data(2'000'000, 'a');
  for (size_t i = 0; i < data.size(); i += 7) data[i] = static_cast<char>('a' + i % 13);
  auto r = store->Upload(Bytes(data));
  ASSERT_TRUE(r.ok());
  EXPECT_LT(r->stored_bytes, r->new_bytes / 4);  // compressible
  const MerkleHash xorb = r->reconstruction.terms[0].xorb_hash;
  auto layout = store->backend().GetXorbLayout(xorb);
  const uint64_t pos = layout->chunks[0].byte_offset + kChunkRecordHeaderSize + 20;
  {
    std::fstream f(XorbFile(dir.path(), xorb), std::ios::in | std::ios::out | std::ios::binary);
    f.seekp(pos);
    f.write("\x7f\x7f\x7f", 3);
  }
  auto got = OpenStore(dir.path())->Read(r->file_hash, {0, 10});
  EXPECT_EQ(got.status().code(), StatusCode::kDataLoss);
  EXPECT_NE(got.status().message().find("chunk 0"), std::string::npos) << got.status().message();
}

TEST(CasStoreTest, UnknownFileAndMissingXorb) {
  ScopedTempDir dir;
  auto store = OpenStore(dir.path());
  MerkleHash unknown;
  unknown.bytes[0] = 1;
  EXPECT_EQ(store->Read(unknown).status().code(), StatusCode::kNotFound);
  std::string data = RandomBytes(10, 300'000);
  auto r = store->Upload(Bytes(data));
  ASSERT_TRUE(r.ok());
  ASSERT_EQ(::unlink(XorbFile(dir.path(), r->reconstruction.terms[0].xorb_hash).c_str()), 0);
  EXPECT_EQ(OpenStore(dir.path())->Read(r->file_hash).status().code(), StatusCode::kNotFound);
}

TEST(CasStoreTest, EmptyFile) {
  ScopedTempDir dir;
  auto store = OpenStore(dir.path());
  auto r = store->Upload({});
  ASSERT_TRUE(r.ok()) << r.status().ToString();
  EXPECT_TRUE(r->file_hash.IsZero());
  EXPECT_EQ(r->chunks, 0u);
  auto back = store->Read(r->file_hash);
  ASSERT_TRUE(back.ok()) << back.status().ToString();
  EXPECT_TRUE(back->empty());
}

TEST(CasStoreTest, SaltedFileHash) {
  ScopedTempDir dir;
  CasStoreOptions opts;
  opts.file_hash_salt.bytes[0] = 0x42;
  auto store = OpenStore(dir.path(), opts);
  std::string data = RandomBytes(12, 200'000);
  auto r = store->Upload(Bytes(data));
  ASSERT_TRUE(r.ok());
  EXPECT_NE(r->file_hash, ExpectedFileHash(data));
  EXPECT_TRUE(*store->Read(r->file_hash) == data);
  EXPECT_TRUE(store->Verify().ok());
}

TEST(CasStoreTest, GarbageCollection) {
  ScopedTempDir dir;
  auto store = OpenStore(dir.path());
  std::string shared = RandomBytes(13, 2'000'000);
  std::string a = shared + RandomBytes(14, 2'000'000);
  std::string b = shared + RandomBytes(15, 2'000'000);
  auto ra = store->Upload(Bytes(a));
  auto rb = store->Upload(Bytes(b));
  ASSERT_TRUE(ra.ok() && rb.ok());
  auto before = store->Stat();
  ASSERT_TRUE(before.ok());
  EXPECT_EQ(before->files, 2u);
  EXPECT_EQ(before->logical_bytes, a.size() + b.size());
  EXPECT_GT(before->dedup_ratio(), 1.2);

  // Nothing is garbage while both files are live.
  auto none = store->GarbageCollect();
  ASSERT_TRUE(none.ok());
  EXPECT_EQ(none->xorbs_deleted, 0u);
  EXPECT_EQ(none->files_deleted, 0u);

  // A live file that is not stored: NotFound, nothing deleted.
  MerkleHash bogus;
  bogus.bytes[1] = 9;
  EXPECT_EQ(store->GarbageCollect({.live_files = std::vector<MerkleHash>{bogus}}).status().code(),
            StatusCode::kNotFound);

  // Dry run reports without deleting.
  auto dry = store->GarbageCollect(
      {.live_files = std::vector<MerkleHash>{ra->file_hash}, .dry_run = true});
  ASSERT_TRUE(dry.ok());
  EXPECT_EQ(dry->files_deleted, 1u);
  EXPECT_TRUE(*store->HasFile(rb->file_hash));

  auto gc = store->GarbageCollect({.live_files = std::vector<MerkleHash>{ra->file_hash}});
  ASSERT_TRUE(gc.ok()) << gc.status().ToString();
  EXPECT_EQ(gc->files_deleted, 1u);
  EXPECT_FALSE(*store->HasFile(rb->file_hash));
  EXPECT_TRUE(*store->Read(ra->file_hash) == a);
  EXPECT_TRUE(store->Verify().ok());
  auto after = store->Stat();
  EXPECT_EQ(after->files, 1u);
  EXPECT_EQ(after->referenced_xorbs, after->xorbs);
  // b's unique bytes are gone; uploading b again stores them again, and the
  // rebuilt index no longer points at deleted xorbs.
  auto rb2 = store->Upload(Bytes(b));
  ASSERT_TRUE(rb2.ok()) << rb2.status().ToString();
  EXPECT_GE(rb2->new_bytes, 1'500'000u);
  EXPECT_TRUE(*store->Read(rb2->file_hash) == b);
}

TEST(CasStoreTest, UploadFileFromDisk) {
  ScopedTempDir dir;
  auto store = OpenStore(dir.path() + "/store");
  std::string data = RandomBytes(16, 3'333'333);
  std::string path = dir.path() + "/input.bin";
  ASSERT_TRUE(WriteLocalFileAtomically(path, data, false).ok());
  std::vector<uint64_t> progress;
  auto r = store->UploadFile(path, {.progress = [&](uint64_t n) { progress.push_back(n); }});
  ASSERT_TRUE(r.ok()) << r.status().ToString();
  EXPECT_EQ(r->file_hash, ExpectedFileHash(data));
  ASSERT_FALSE(progress.empty());
  EXPECT_EQ(progress.back(), data.size());
  std::string out = dir.path() + "/out.bin";
  ASSERT_TRUE(store->DownloadToFile(r->file_hash, out, {100, 5000}).ok());
  EXPECT_TRUE(*ReadLocalFile(out) == data.substr(100, 5000));
}

TEST(CasStoreTest, OpenRejectsForeignFolders) {
  ScopedTempDir dir;
  ASSERT_TRUE(WriteLocalFileAtomically(dir.path() + "/notes.txt", "hello", false).ok());
  EXPECT_EQ(OpenLocalBackend(dir.path()).status().code(), StatusCode::kFailedPrecondition);
  EXPECT_EQ(OpenLocalBackend(dir.path() + "/missing", {.create = false}).status().code(),
            StatusCode::kNotFound);
}

TEST(LocalBackendTest, PutFileNeedsItsXorbs) {
  ScopedTempDir dir;
  auto backend = OpenLocalBackend(dir.path(), {.sync = false});
  ASSERT_TRUE(backend.ok());
  FileReconstruction rec;
  rec.file_hash.bytes[0] = 1;
  rec.size = 10;
  ReconstructionTerm t;
  t.xorb_hash.bytes[0] = 2;
  t.chunk_start = 0;
  t.chunk_end = 1;
  t.unpacked_bytes = 10;
  rec.terms.push_back(t);
  EXPECT_EQ((*backend)->PutFile(rec).code(), StatusCode::kFailedPrecondition);
  rec.size = 11;
  EXPECT_EQ((*backend)->PutFile(rec).code(), StatusCode::kInvalidArgument);
}

TEST(LocalBackendTest, PutXorbIsIdempotentAndIndexed) {
  ScopedTempDir dir;
  auto backend = OpenLocalBackend(dir.path(), {.sync = false});
  ASSERT_TRUE(backend.ok());
  XorbBuilder builder;
  std::vector<MerkleHash> hashes;
  for (int i = 0; i < 5; ++i) {
    std::string chunk = RandomBytes(100 + i, 10000 + i);
    std::string rec;
    AppendChunkRecord(Bytes(chunk), CompressionPolicy::kAuto, &rec);
    hashes.push_back(ChunkHash(Bytes(chunk)));
    builder.Add(hashes.back(), static_cast<uint32_t>(chunk.size()), rec);
  }
  auto fin = builder.Finish();
  std::string_view bytes(reinterpret_cast<const char*>(fin.serialized.data()),
                         fin.serialized.size());
  EXPECT_TRUE(*(*backend)->PutXorb(bytes, fin.layout));
  EXPECT_FALSE(*(*backend)->PutXorb(bytes, fin.layout));
  auto found = (*backend)->LookupChunks(hashes);
  ASSERT_TRUE(found.ok());
  for (int i = 0; i < 5; ++i) {
    ASSERT_TRUE((*found)[i].has_value());
    EXPECT_EQ((*found)[i]->xorb_hash, fin.layout.xorb_hash);
    EXPECT_EQ((*found)[i]->chunk_index, static_cast<uint32_t>(i));
  }
  EXPECT_EQ(*(*backend)->GetXorbLayout(fin.layout.xorb_hash), fin.layout);
  EXPECT_EQ(*(*backend)->GetXorb(fin.layout.xorb_hash), std::string(bytes));
  EXPECT_EQ((*backend)->GetXorbRange(fin.layout.xorb_hash, bytes.size() - 2, 3).status().code(),
            StatusCode::kOutOfRange);
  // A layout that does not match its name is refused.
  XorbLayout bad = fin.layout;
  bad.chunks[0].unpacked_bytes += 1;
  EXPECT_EQ((*backend)->PutXorb(bytes, bad).status().code(), StatusCode::kInvalidArgument);
  // A torn record at the end of the index is ignored and repaired.
  {
    std::ofstream idx(dir.path() + "/index/chunks.idx", std::ios::app | std::ios::binary);
    idx.write("garbage", 7);
  }
  auto reopened = OpenLocalBackend(dir.path(), {.sync = false});
  auto found2 = (*reopened)->LookupChunks(hashes);
  ASSERT_TRUE(found2.ok());
  EXPECT_TRUE((*found2)[4].has_value());
}

}  // namespace
}  // namespace megackpt::cas
