#include "megackpt/hub/store.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <atomic>
#include <filesystem>
#include <set>
#include <thread>

#include "cas/test_util.h"
#include "core/test_files.h"
#include "hub/sqlite.h"
#include "hub/util.h"
#include "megackpt/core/checksum.h"

namespace megackpt::hub {
namespace {

using ::testing::HasSubstr;

class TempRoot : public test_util::TempDir {
 public:
  TempRoot() : test_util::TempDir("hubstore") {}
};

std::string Bytes(size_t n, uint64_t seed) { return cas::testing::RandomBytes(seed, n); }

class HubStoreTest : public ::testing::Test {
 protected:
  void SetUp() override {
    HubStoreOptions opts;
    opts.sync = false;
    auto s = HubStore::Open(root_.path(), opts);
    ASSERT_TRUE(s.ok()) << s.status().ToString();
    store_ = *std::move(s);
  }

  FileEntry Upload(const std::string& data) {
    auto up = store_->BeginUpload("test");
    EXPECT_TRUE(up.ok()) << up.status().ToString();
    EXPECT_TRUE((*up)->Append(AsBytes(data)).ok());
    Status s = (*up)->Close();
    EXPECT_TRUE(s.ok()) << s.ToString();
    return (*up)->entry();
  }

  CommitOperation Add(const std::string& path, const FileEntry& e) {
    CommitOperation op;
    op.kind = CommitOperation::Kind::kAdd;
    op.path = path;
    op.entry = e;
    return op;
  }

  std::string ReadAll(const FileEntry& e) {
    auto f = store_->OpenContent(e, "x");
    EXPECT_TRUE(f.ok()) << f.status().ToString();
    std::string out(e.size, '\0');
    EXPECT_TRUE(
        (*f)->ReadExactlyAt(0, std::as_writable_bytes(std::span<char>(out.data(), out.size())))
            .ok());
    return out;
  }

  TempRoot root_;
  std::unique_ptr<HubStore> store_;
};

TEST_F(HubStoreTest, NewRepoHasMainAtEmptyInitialCommit) {
  RepoSpec spec{RepoType::kDataset, "org", "data", false, "d"};
  auto repo = store_->CreateRepo(spec);
  ASSERT_TRUE(repo.ok()) << repo.status().ToString();
  EXPECT_EQ(repo->type, RepoType::kDataset);
  auto head = store_->ResolveRevision("org/data", "main");
  ASSERT_TRUE(head.ok());
  EXPECT_TRUE(IsCommitId(*head));
  auto files = store_->ListFiles("org/data", *head);
  ASSERT_TRUE(files.ok());
  EXPECT_TRUE(files->empty());
  auto again = store_->CreateRepo(spec);
  EXPECT_EQ(again.status().code(), StatusCode::kAlreadyExists);
  EXPECT_TRUE(store_->CreateRepo(spec, /*exist_ok=*/true).ok());
  EXPECT_EQ(store_->GetRepo("org/nope").status().code(), StatusCode::kNotFound);
  EXPECT_EQ(store_->CreateRepo({RepoType::kModel, "o/x", "n"}).status().code(),
            StatusCode::kInvalidArgument);
}

TEST_F(HubStoreTest, CommitListReadRoundTrip) {
  ASSERT_TRUE(store_->CreateRepo({RepoType::kModel, "org", "m"}).ok());
  std::string a = Bytes(300000, 1), b = "hello";
  FileEntry ea = Upload(a), eb = Upload(b);
  EXPECT_EQ(ea.sha256, Sha256Hex(a));
  CommitRequest req;
  req.repo = "org/m";
  req.message = "add";
  req.parent = *store_->ResolveRevision("org/m", "main");
  req.ops = {Add("weights/a.bin", ea), Add("README.md", eb)};
  auto c = store_->Commit(req);
  ASSERT_TRUE(c.ok()) << c.status().ToString();
  EXPECT_EQ(*c->parent, *req.parent);
  EXPECT_EQ(*store_->ResolveRevision("org/m", "main"), c->id);
  auto files = store_->ListFiles("org/m", c->id);
  ASSERT_TRUE(files.ok());
  ASSERT_EQ(files->size(), 2u);
  EXPECT_EQ((*files)[0].path, "README.md");
  EXPECT_EQ((*files)[1].path, "weights/a.bin");
  EXPECT_EQ(ReadAll((*files)[1]), a);
  auto prefixed = store_->ListFiles("org/m", c->id, "weights/");
  ASSERT_EQ(prefixed->size(), 1u);
  auto got = store_->GetCommit("org/m", c->id);
  ASSERT_TRUE(got.ok());
  ASSERT_EQ(got->changes.size(), 2u);
  EXPECT_EQ(got->changes[0].change, "add");
  // Range read through the store.
  auto f = store_->OpenContent(ea, "a");
  ASSERT_TRUE(f.ok());
  std::string mid(1000, '\0');
  ASSERT_TRUE(
      (*f)->ReadExactlyAt(123456, std::as_writable_bytes(std::span<char>(mid.data(), mid.size())))
          .ok());
  EXPECT_EQ(mid, a.substr(123456, 1000));
  // Missing entries.
  EXPECT_EQ(store_->GetFile("org/m", c->id, "nope").status().code(), StatusCode::kNotFound);
  EXPECT_EQ(store_->ResolveRevision("org/m", "nope").status().code(), StatusCode::kNotFound);
}

TEST_F(HubStoreTest, StaleParentConflictsUnlessRebaseWithoutCollision) {
  ASSERT_TRUE(store_->CreateRepo({RepoType::kModel, "org", "m"}).ok());
  std::string base = *store_->ResolveRevision("org/m", "main");
  FileEntry e1 = Upload("one"), e2 = Upload("two"), e3 = Upload("three");
  CommitRequest first;
  first.repo = "org/m";
  first.parent = base;
  first.ops = {Add("a.txt", e1)};
  ASSERT_TRUE(store_->Commit(first).ok());

  CommitRequest stale = first;
  stale.ops = {Add("b.txt", e2)};
  auto lost = store_->Commit(stale);
  EXPECT_EQ(lost.status().code(), StatusCode::kAborted);
  EXPECT_THAT(lost.status().message(), HasSubstr("conflict"));

  stale.rebase = true;
  auto rebased = store_->Commit(stale);
  ASSERT_TRUE(rebased.ok()) << rebased.status().ToString();
  auto files = store_->ListFiles("org/m", rebased->id);
  ASSERT_EQ(files->size(), 2u);  // a.txt kept, b.txt added

  CommitRequest colliding = first;  // parent = base, touches a.txt again
  colliding.ops = {Add("a.txt", e3)};
  colliding.rebase = true;
  auto c = store_->Commit(colliding);
  EXPECT_EQ(c.status().code(), StatusCode::kAborted);
  EXPECT_THAT(c.status().message(), HasSubstr("a.txt"));
}

TEST_F(HubStoreTest, DeleteFolderCopyAndClashes) {
  ASSERT_TRUE(store_->CreateRepo({RepoType::kModel, "org", "m"}).ok());
  FileEntry e = Upload("data");
  CommitRequest req;
  req.repo = "org/m";
  req.ops = {Add("d/x", e), Add("d/y", e), Add("z", e)};
  ASSERT_TRUE(store_->Commit(req).ok());

  CommitRequest clash;
  clash.repo = "org/m";
  clash.ops = {Add("z/under", e)};
  EXPECT_EQ(store_->Commit(clash).status().code(), StatusCode::kInvalidArgument);
  clash.ops = {Add("d", e)};
  EXPECT_EQ(store_->Commit(clash).status().code(), StatusCode::kInvalidArgument);

  CommitRequest ops;
  ops.repo = "org/m";
  CommitOperation copy;
  copy.kind = CommitOperation::Kind::kCopy;
  copy.path = "copied";
  copy.source_path = "z";
  CommitOperation delf;
  delf.kind = CommitOperation::Kind::kDeleteFolder;
  delf.path = "d";
  ops.ops = {copy, delf};
  auto c = store_->Commit(ops);
  ASSERT_TRUE(c.ok()) << c.status().ToString();
  auto files = store_->ListFiles("org/m", c->id);
  ASSERT_EQ(files->size(), 2u);
  EXPECT_EQ((*files)[0].path, "copied");

  CommitRequest missing;
  missing.repo = "org/m";
  CommitOperation del;
  del.kind = CommitOperation::Kind::kDelete;
  del.path = "nope";
  missing.ops = {del};
  EXPECT_EQ(store_->Commit(missing).status().code(), StatusCode::kNotFound);

  CommitRequest traversal;
  traversal.repo = "org/m";
  traversal.ops = {Add("../etc/passwd", e)};
  EXPECT_EQ(store_->Commit(traversal).status().code(), StatusCode::kInvalidArgument);
}

TEST_F(HubStoreTest, ContentMustBeUploaded) {
  ASSERT_TRUE(store_->CreateRepo({RepoType::kModel, "org", "m"}).ok());
  FileEntry fake;
  fake.size = 10;
  fake.sha256 = std::string(64, 'a');
  fake.xet_hash = std::string(64, 'b');
  CommitRequest req;
  req.repo = "org/m";
  req.ops = {Add("f", fake)};
  EXPECT_EQ(store_->Commit(req).status().code(), StatusCode::kFailedPrecondition);
  FileEntry real = Upload("0123456789");
  real.size = 11;
  req.ops = {Add("f", real)};
  EXPECT_EQ(store_->Commit(req).status().code(), StatusCode::kInvalidArgument);
  // Empty files need no CAS object.
  FileEntry empty = Upload("");
  EXPECT_EQ(empty.xet_hash, kEmptyXetHash);
  req.ops = {Add("empty", empty)};
  auto c = store_->Commit(req);
  ASSERT_TRUE(c.ok()) << c.status().ToString();
  EXPECT_EQ(ReadAll(empty), "");
}

TEST_F(HubStoreTest, RefsTagsAndHistory) {
  ASSERT_TRUE(store_->CreateRepo({RepoType::kModel, "org", "m"}).ok());
  std::vector<std::string> ids = {*store_->ResolveRevision("org/m", "main")};
  for (int i = 0; i < 5; ++i) {
    CommitRequest req;
    req.repo = "org/m";
    req.message = "c" + std::to_string(i);
    req.ops = {Add("f" + std::to_string(i), Upload("x" + std::to_string(i)))};
    auto c = store_->Commit(req);
    ASSERT_TRUE(c.ok());
    ids.push_back(c->id);
  }
  auto page = store_->ListCommits("org/m", "main", 0, 3);
  ASSERT_TRUE(page.ok());
  ASSERT_EQ(page->size(), 3u);
  EXPECT_EQ((*page)[0].id, ids[5]);
  EXPECT_EQ((*page)[2].id, ids[3]);
  auto rest = store_->ListCommits("org/m", "main", 3, 10);
  ASSERT_EQ(rest->size(), 3u);
  EXPECT_EQ((*rest)[2].id, ids[0]);
  EXPECT_FALSE((*rest)[2].parent.has_value());

  ASSERT_TRUE(store_->CreateRef("org/m", "v1", ids[2], /*is_tag=*/true).ok());
  ASSERT_TRUE(store_->CreateRef("org/m", "dev", "main", /*is_tag=*/false).ok());
  EXPECT_EQ(store_->CreateRef("org/m", "dev", "main", false).status().code(),
            StatusCode::kAlreadyExists);
  EXPECT_EQ(store_->CreateRef("org/m", "x", "nope", false).status().code(), StatusCode::kNotFound);
  EXPECT_EQ(*store_->ResolveRevision("org/m", "v1"), ids[2]);
  EXPECT_EQ(*store_->ResolveRevision("org/m", ids[1]), ids[1]);
  auto refs = store_->ListRefs("org/m");
  ASSERT_EQ(refs->size(), 3u);
  ASSERT_TRUE(store_->DeleteRef("org/m", "dev", false).ok());
  EXPECT_EQ(store_->DeleteRef("org/m", "dev", false).code(), StatusCode::kNotFound);
  // A commit pinned by id keeps its files whatever happens to the branch.
  auto old_files = store_->ListFiles("org/m", ids[2]);
  EXPECT_EQ(old_files->size(), 2u);
}

TEST_F(HubStoreTest, BucketsAreMutable) {
  ASSERT_TRUE(store_->CreateBucket("org", "scratch", false).ok());
  EXPECT_EQ(store_->CreateBucket("org", "scratch", false).status().code(),
            StatusCode::kAlreadyExists);
  FileEntry e = Upload(Bytes(5000, 3));
  BucketOperation add;
  add.entry.path = "run/a.bin";
  add.entry.xet_hash = e.xet_hash;  // size taken from the content
  add.entry.mtime_ms = 1700000000000;
  ASSERT_TRUE(store_->BucketBatch("org/scratch", {add}).ok());
  auto got = store_->GetBucketEntry("org/scratch", "run/a.bin");
  ASSERT_TRUE(got.ok());
  EXPECT_EQ(got->size, 5000u);
  auto info = store_->GetBucket("org/scratch");
  EXPECT_EQ(info->total_files, 1u);
  EXPECT_EQ(info->size, 5000u);
  BucketOperation del;
  del.kind = BucketOperation::Kind::kDelete;
  del.entry.path = "run/a.bin";
  ASSERT_TRUE(store_->BucketBatch("org/scratch", {del}).ok());
  EXPECT_EQ(store_->GetBucketEntry("org/scratch", "run/a.bin").status().code(),
            StatusCode::kNotFound);
  BucketOperation bogus = add;
  bogus.entry.xet_hash = std::string(64, 'c');
  EXPECT_EQ(store_->BucketBatch("org/scratch", {bogus}).code(), StatusCode::kFailedPrecondition);
}

// hub.db holds token hashes and the key that signs CAS tokens: only the owner
// may read it (and -wal/-shm), or enter the store's folders.
TEST_F(HubStoreTest, StoreFilesArePrivate) {
  ASSERT_TRUE(store_->CreateToken(TokenScope::kWrite, std::nullopt).ok());  // writes the WAL
  const std::string root = root_.path() + "/fresh";
  HubStoreOptions opts;
  opts.sync = false;
  auto fresh = HubStore::Open(root, opts);
  ASSERT_TRUE(fresh.ok()) << fresh.status().ToString();
  ASSERT_TRUE((*fresh)->CreateToken(TokenScope::kRead, std::nullopt).ok());
  auto mode = [](const std::string& p) {
    return std::filesystem::status(p).permissions() & std::filesystem::perms::all;
  };
  using std::filesystem::perms;
  EXPECT_EQ(mode(root), perms::owner_all);
  EXPECT_EQ(mode(root + "/cas"), perms::owner_all);
  EXPECT_EQ(mode(root + "/uploads"), perms::owner_all);
  for (const char* f : {"/hub.db", "/hub.db-wal", "/hub.db-shm"}) {
    if (f != std::string("/hub.db") && !std::filesystem::exists(root + f)) continue;
    EXPECT_EQ(mode(root + f), perms::owner_read | perms::owner_write) << f;
  }
  fresh->reset();
  // A database made readable by others is tightened on the next open.
  std::filesystem::permissions(root + "/hub.db", perms::owner_read | perms::owner_write |
                                                     perms::group_read | perms::others_read);
  ASSERT_TRUE(HubStore::Open(root, opts).ok());
  EXPECT_EQ(mode(root + "/hub.db"), perms::owner_read | perms::owner_write);
}

// A commit that leaves an existing branch's tree as it is makes no commit.
TEST_F(HubStoreTest, CommitWithNothingToChangeIsNoCommit) {
  ASSERT_TRUE(store_->CreateRepo({RepoType::kModel, "org", "m"}).ok());
  auto up = store_->BeginUpload("a");
  ASSERT_TRUE(up.ok());
  ASSERT_TRUE((*up)->Append(AsBytes("aaa")).ok());
  ASSERT_TRUE((*up)->Close().ok());
  CommitRequest req;
  req.repo = "org/m";
  req.ops = {Add("a.txt", (*up)->entry())};
  auto first = store_->Commit(req);
  ASSERT_TRUE(first.ok()) << first.status().ToString();
  EXPECT_FALSE(first->no_change);
  for (int i = 0; i < 2; ++i) {
    req.parent = first->id;
    auto again = store_->Commit(req);
    ASSERT_TRUE(again.ok()) << again.status().ToString();
    EXPECT_TRUE(again->no_change);
    EXPECT_EQ(again->id, first->id);
    EXPECT_EQ(*store_->ResolveRevision("org/m", "main"), first->id);
    req.ops.push_back(req.ops.front());  // the same add twice: still nothing
  }
  // Delete + re-add of the same content: nothing either; an empty request too.
  CommitOperation del;
  del.kind = CommitOperation::Kind::kDelete;
  del.path = "a.txt";
  req.ops = {del, Add("a.txt", (*up)->entry())};
  EXPECT_TRUE(store_->Commit(req)->no_change);
  req.ops.clear();
  EXPECT_TRUE(store_->Commit(req)->no_change);
  EXPECT_EQ(store_->ListCommits("org/m", "main", 0, 100)->size(), 2u);
  // A new branch is always created by a commit.
  req.branch = "dev";
  req.create_branch = true;
  auto branch = store_->Commit(req);
  ASSERT_TRUE(branch.ok());
  EXPECT_FALSE(branch->no_change);
  EXPECT_EQ(*store_->ResolveRevision("org/m", "dev"), branch->id);
}

TEST_F(HubStoreTest, Tokens) {
  auto w = store_->CreateToken(TokenScope::kWrite, std::string("org"));
  ASSERT_TRUE(w.ok());
  EXPECT_TRUE(w->starts_with("mega_"));
  auto info = store_->Authenticate(*w);
  ASSERT_TRUE(info.ok());
  EXPECT_EQ(info->scope, TokenScope::kWrite);
  EXPECT_EQ(*info->ns, "org");
  EXPECT_EQ(store_->Authenticate("mega_bogus").status().code(), StatusCode::kUnauthenticated);
  EXPECT_EQ(store_->Authenticate("").status().code(), StatusCode::kUnauthenticated);
}

TEST_F(HubStoreTest, GarbageCollectionKeepsReferencedContent) {
  ASSERT_TRUE(store_->CreateRepo({RepoType::kModel, "org", "m"}).ok());
  std::string kept = Bytes(200000, 7), dropped = Bytes(200000, 8);
  FileEntry ek = Upload(kept), ed = Upload(dropped);
  CommitRequest req;
  req.repo = "org/m";
  req.ops = {Add("k", ek)};
  ASSERT_TRUE(store_->Commit(req).ok());
  // Within the grace period staged content is kept.
  auto r0 = store_->CollectGarbage(3600);
  ASSERT_TRUE(r0.ok()) << r0.status().ToString();
  EXPECT_TRUE(*store_->HasContent(ed.xet_hash));
  auto r1 = store_->CollectGarbage(0);
  ASSERT_TRUE(r1.ok()) << r1.status().ToString();
  EXPECT_FALSE(*store_->HasContent(ed.xet_hash));
  EXPECT_TRUE(*store_->HasContent(ek.xet_hash));
  EXPECT_EQ(ReadAll(ek), kept);
  EXPECT_GE(r1->cas.xorbs_deleted, 1u);
}

TEST_F(HubStoreTest, MultipartUpload) {
  ASSERT_TRUE(store_->CreateRepo({RepoType::kModel, "org", "m"}).ok());
  std::string data = Bytes(2500, 9);
  HubStore::MultipartUpload spec;
  spec.repo = "org/m";
  spec.path = "big.bin";
  spec.revision = "main";
  spec.size = data.size();
  spec.sha256 = Sha256Hex(data);
  spec.part_size = 1000;
  auto u = store_->CreateMultipartUpload(spec);
  ASSERT_TRUE(u.ok());
  std::vector<std::pair<int, std::string>> parts;
  for (int n = 1; n <= 3; ++n) {
    std::string part = data.substr((n - 1) * 1000, 1000);
    auto w = store_->BeginUploadPart(u->id, n, part.size());
    ASSERT_TRUE(w.ok()) << w.status().ToString();
    ASSERT_TRUE((*w)->Append(AsBytes(part)).ok());
    auto etag = (*w)->Finish();
    ASSERT_TRUE(etag.ok()) << etag.status().ToString();
    parts.emplace_back(n, *etag);
  }
  auto entry = store_->CompleteMultipartUpload(u->id, parts);
  ASSERT_TRUE(entry.ok()) << entry.status().ToString();
  EXPECT_EQ(entry->sha256, spec.sha256);
  auto found = store_->FindBySha256(spec.sha256);
  ASSERT_TRUE(found.ok() && found->has_value());
  EXPECT_EQ(ReadAll(**found), data);
  EXPECT_EQ(store_->GetMultipartUpload(u->id).status().code(), StatusCode::kNotFound);
}

// A SHA-256 only claimed by its uploader (a Xet shard's metadata, recorded
// unverified) answers FindBySha256 only for the namespace the upload was
// granted to; a verified SHA-256 answers everyone.
TEST_F(HubStoreTest, ClaimedSha256AnswersOnlyTheUploadersNamespace) {
  std::string data = Bytes(5000, 3);
  auto up = store_->cas().Upload(AsBytes(data));
  ASSERT_TRUE(up.ok()) << up.status().ToString();
  FileEntry claimed;
  claimed.size = data.size();
  claimed.xet_hash = up->file_hash.ToHex();
  claimed.sha256 = std::string(64, 'c');  // a claim the hub never checked
  ASSERT_TRUE(store_->RecordContent(claimed, /*sha256_verified=*/false, "org").ok());
  auto none = store_->FindBySha256(claimed.sha256);
  ASSERT_TRUE(none.ok());
  EXPECT_FALSE(none->has_value());
  auto other = store_->FindBySha256(claimed.sha256, {}, "evil");
  ASSERT_TRUE(other.ok());
  EXPECT_FALSE(other->has_value());
  auto mine = store_->FindBySha256(claimed.sha256, {}, "org");
  ASSERT_TRUE(mine.ok());
  ASSERT_TRUE(mine->has_value());
  EXPECT_EQ((*mine)->xet_hash, claimed.xet_hash);
  EXPECT_EQ((*mine)->size, data.size());
  // Verified content answers without a namespace, and wins over a claim.
  FileEntry verified = Upload(data + "x");
  FileEntry claim2 = verified;
  auto up2 = store_->cas().Upload(AsBytes(data + "y"));
  ASSERT_TRUE(up2.ok());
  claim2.xet_hash = up2->file_hash.ToHex();
  ASSERT_TRUE(store_->RecordContent(claim2, /*sha256_verified=*/false, "org").ok());
  auto best = store_->FindBySha256(verified.sha256, {}, "org");
  ASSERT_TRUE(best.ok() && best->has_value());
  EXPECT_EQ((*best)->xet_hash, verified.xet_hash);
}

// Global dedup answers name the other xorbs of the files that use the
// queried chunk's xorb, only of files the caller may read, and GC drops the
// index rows of collected files.
TEST_F(HubStoreTest, DedupCompanionXorbsAreTheOtherXorbsOfReadableFiles) {
  HubStoreOptions opts;
  opts.sync = false;
  opts.cas.max_xorb_bytes = 256 << 10;  // a 2 MB file spans several xorbs
  auto s = HubStore::Open(root_.path() + "/small", opts);
  ASSERT_TRUE(s.ok()) << s.status().ToString();
  HubStore& store = **s;
  auto up = store.BeginUpload("f", "org");
  ASSERT_TRUE(up.ok());
  ASSERT_TRUE((*up)->Append(AsBytes(Bytes(2'000'000, 4))).ok());
  ASSERT_TRUE((*up)->Close().ok());
  FileEntry e = (*up)->entry();
  auto recon = store.cas().GetReconstruction(*cas::MerkleHash::FromHex(e.xet_hash));
  ASSERT_TRUE(recon.ok());
  std::set<cas::MerkleHash> xorbs;
  for (const auto& t : recon->terms) xorbs.insert(t.xorb_hash);
  ASSERT_GE(xorbs.size(), 4u);
  const cas::MerkleHash first = recon->terms.front().xorb_hash;
  auto all = store.DedupCompanionXorbs(first, {}, 1000);
  ASSERT_TRUE(all.ok()) << all.status().ToString();
  std::set<cas::MerkleHash> got(all->begin(), all->end());
  std::set<cas::MerkleHash> want = xorbs;
  want.erase(first);
  EXPECT_EQ(got, want);
  EXPECT_EQ(store.DedupCompanionXorbs(first, {}, 2)->size(), 2u);
  // Uploaded under a grant to "org": readable by org, not by another namespace.
  EXPECT_EQ(store.DedupCompanionXorbs(first, {std::string("org")}, 1000)->size(), want.size());
  EXPECT_TRUE(store.DedupCompanionXorbs(first, {std::string("evil")}, 1000)->empty());
  // Uncommitted and past the grace period: collected, and the index forgets it.
  ASSERT_TRUE(store.CollectGarbage(0).ok());
  EXPECT_TRUE(store.DedupCompanionXorbs(first, {}, 1000)->empty());
}

// Several writers (separate HubStore instances = separate SQLite connections,
// as separate processes would have) race on one branch with parent checks.
// Exactly the winners' commits are in the history; nothing is lost or torn.
TEST_F(HubStoreTest, ConcurrentWritersSerialize) {
  ASSERT_TRUE(store_->CreateRepo({RepoType::kModel, "org", "m"}).ok());
  constexpr int kWriters = 4, kRounds = 6;
  std::atomic<int> wins{0}, conflicts{0};
  std::vector<std::thread> threads;
  for (int w = 0; w < kWriters; ++w) {
    threads.emplace_back([&, w] {
      HubStoreOptions o;
      o.sync = false;
      auto s = HubStore::Open(root_.path(), o);
      ASSERT_TRUE(s.ok());
      for (int r = 0; r < kRounds; ++r) {
        auto up = (*s)->BeginUpload("w");
        ASSERT_TRUE(up.ok());
        std::string data = "writer " + std::to_string(w) + " round " + std::to_string(r);
        ASSERT_TRUE((*up)->Append(AsBytes(data)).ok());
        ASSERT_TRUE((*up)->Close().ok());
        CommitRequest req;
        req.repo = "org/m";
        req.parent = *(*s)->ResolveRevision("org/m", "main");
        req.ops = {Add("w" + std::to_string(w) + "/r" + std::to_string(r), (*up)->entry())};
        auto c = (*s)->Commit(req);
        if (c.ok()) {
          ++wins;
        } else {
          ASSERT_EQ(c.status().code(), StatusCode::kAborted) << c.status().ToString();
          ++conflicts;
        }
      }
    });
  }
  for (auto& t : threads) t.join();
  EXPECT_EQ(wins + conflicts, kWriters * kRounds);
  EXPECT_GE(wins.load(), 1);
  auto history = store_->ListCommits("org/m", "main", 0, 1000);
  ASSERT_TRUE(history.ok());
  EXPECT_EQ(static_cast<int>(history->size()), wins.load() + 1);  // + initial commit
  auto files = store_->ListFiles("org/m", history->front().id);
  EXPECT_EQ(static_cast<int>(files->size()), wins.load());
}

// Connections opened at once on a database file nobody has opened yet (a
// fresh hub root opened by several CLI processes): each one's switch to WAL
// needs the file's exclusive lock, and SQLite answers one side of that race
// with SQLITE_BUSY at once, without waiting out the busy timeout. Every open
// must still succeed.
TEST(SqliteDbTest, ConcurrentOpensOfANewDatabaseAllSucceed) {
  TempRoot root;
  constexpr int kRounds = 30, kThreads = 6;
  for (int round = 0; round < kRounds; ++round) {
    const std::string path = root.path() + "/db" + std::to_string(round) + ".sqlite";
    std::atomic<int> ready{0};
    std::vector<Status> opened(kThreads);
    std::vector<std::thread> threads;
    for (int t = 0; t < kThreads; ++t) {
      threads.emplace_back([&, t] {
        ready.fetch_add(1);
        while (ready.load() < kThreads) std::this_thread::yield();
        opened[t] = SqliteDb::Open(path).status();
      });
    }
    for (auto& th : threads) th.join();
    for (int t = 0; t < kThreads; ++t)
      ASSERT_TRUE(opened[t].ok()) << "round " << round << " thread " << t << ": "
                                  << opened[t].ToString();
  }
}

}  // namespace
}  // namespace megackpt::hub
