#include "common/env.h"

#include <stdlib.h>
#include <unistd.h>

#include <algorithm>
#include <filesystem>
#include <set>
#include <string>
#include <vector>

#include "absl/strings/match.h"
#include "common/testing/fault_injection_env.h"
#include "common/testing/scratch_dir.h"
#include "gtest/gtest.h"

namespace dtrain {
namespace {

using ::dtrain::testing::FaultInjectionEnv;

class EnvTest : public ::testing::Test {
 protected:

  std::vector<std::string> Names() {
    absl::StatusOr<std::vector<std::string>> names = env_->GetChildren(dir_);
    EXPECT_TRUE(names.ok()) << names.status();
    std::vector<std::string> sorted = names.ok() ? *names : std::vector<std::string>{};
    std::sort(sorted.begin(), sorted.end());
    return sorted;
  }

  Env* env_ = Env::Default();
  ::dtrain::testing::ScratchDir scratch_{"env_test"};
  const std::string dir_ = scratch_.path();
};

TEST_F(EnvTest, PosixOperations) {
  const std::string a = dir_ + "/a", b = dir_ + "/b";
  ASSERT_TRUE(WriteFileAtomically(env_, a, "hello").ok());
  EXPECT_EQ(*env_->ReadFile(a), "hello");
  EXPECT_TRUE(env_->FileExists(a));
  EXPECT_FALSE(env_->IsDirectory(a));
  EXPECT_TRUE(env_->IsDirectory(dir_));
  ASSERT_TRUE(env_->RenameFile(a, b).ok());
  EXPECT_FALSE(env_->FileExists(a));
  EXPECT_EQ(Names(), (std::vector<std::string>{"b"}));
  ASSERT_TRUE(env_->RemoveFile(b).ok());
  EXPECT_EQ(env_->RemoveFile(b).code(), absl::StatusCode::kNotFound);
  EXPECT_EQ(env_->ReadFile(b).status().code(), absl::StatusCode::kNotFound);
  EXPECT_EQ(env_->ReadFile(dir_).status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_EQ(env_->GetChildren(dir_ + "/missing").status().code(), absl::StatusCode::kNotFound);
  ASSERT_TRUE(env_->CreateDirs(dir_ + "/x/y").ok());
  ASSERT_TRUE(env_->CreateDirs(dir_ + "/x/y").ok());  // exists already: fine
  EXPECT_TRUE(env_->IsDirectory(dir_ + "/x/y"));
  EXPECT_TRUE(env_->SyncDir(dir_ + "/x").ok());
  absl::Status s = WriteFileAtomically(env_, dir_ + "/no/such/dir/f", "x");
  EXPECT_EQ(s.code(), absl::StatusCode::kNotFound) << s;
  EXPECT_TRUE(absl::StrContains(s.message(), "no/such/dir/f.tmp.")) << s;
}

TEST_F(EnvTest, WritableFileRefusesUseAfterClose) {
  absl::StatusOr<std::unique_ptr<WritableFile>> f = env_->NewWritableFile(dir_ + "/f");
  ASSERT_TRUE(f.ok());
  ASSERT_TRUE((*f)->Append("abc").ok());
  ASSERT_TRUE((*f)->Close().ok());
  EXPECT_EQ((*f)->Append("x").code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_EQ((*f)->Close().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_EQ(*env_->ReadFile(dir_ + "/f"), "abc");
}

// A direct file (O_DIRECT where the file system has it) holds exactly what was appended, whatever the pieces'
// sizes against its 4 KiB blocks and 4 MiB buffer, with appends after a Sync, and through WriteFileAtomically.
TEST_F(EnvTest, DirectWritableFileKeepsEveryByte) {
  std::string content;
  for (size_t i = 0; i < (size_t{9} << 20) + 123; ++i) content.push_back(static_cast<char>((i * 131 + i / 4099) % 251));
  for (size_t size : {size_t{0}, size_t{1}, size_t{4095}, size_t{4096}, size_t{4097}, (size_t{4} << 20) - 1,
                      size_t{4} << 20, (size_t{4} << 20) + 1, content.size()}) {
    const std::string path = dir_ + "/direct";
    absl::StatusOr<std::unique_ptr<WritableFile>> f = env_->NewDirectWritableFile(path);
    ASSERT_TRUE(f.ok()) << f.status();
    // Pieces of 1, 4096, 12345 and 1 MiB bytes in turn; a Sync after the first third.
    const size_t pieces[] = {1, 4096, 12345, size_t{1} << 20};
    size_t at = 0;
    bool synced = false;
    for (int k = 0; at < size; ++k) {
      const size_t n = std::min(pieces[k % 4], size - at);
      ASSERT_TRUE((*f)->Append(absl::string_view(content.data() + at, n)).ok()) << size;
      at += n;
      if (!synced && at >= size / 3) {
        ASSERT_TRUE((*f)->Sync().ok()) << size;
        EXPECT_EQ(*env_->ReadFile(path), content.substr(0, at)) << size;
        synced = true;
      }
    }
    ASSERT_TRUE((*f)->Sync().ok()) << size;
    ASSERT_TRUE((*f)->Close().ok()) << size;
    EXPECT_EQ(*env_->ReadFile(path), content.substr(0, size)) << size;
  }
  ASSERT_TRUE(WriteFileAtomically(env_, dir_ + "/atomic", content).ok());
  EXPECT_EQ(*env_->ReadFile(dir_ + "/atomic"), content);
  ASSERT_TRUE(WriteFileAtomically(env_, dir_ + "/atomic", content.substr(5, kDirectWriteBytes + 7)).ok());
  EXPECT_EQ(*env_->ReadFile(dir_ + "/atomic"), content.substr(5, kDirectWriteBytes + 7));
}

TEST(TemporaryFileNameTest, UniqueAndRecognized) {
  std::set<std::string> names;
  for (int i = 0; i < 100; ++i) names.insert(TemporaryFileName("/d/model.ckpt-5.ps0-of-1"));
  EXPECT_EQ(names.size(), 100u);
  for (const std::string& n : names) {
    EXPECT_TRUE(absl::StartsWith(n, "/d/model.ckpt-5.ps0-of-1.tmp.")) << n;
    EXPECT_TRUE(IsTemporaryFileName(n.substr(3))) << n;
  }
  for (const char* not_tmp :
       {"model.ckpt-5.ps0-of-1", "x.tmp", "x.tmp.12", "x.tmp.12.", "x.tmp..3", "x.tmp.1a.2"}) {
    EXPECT_FALSE(IsTemporaryFileName(not_tmp)) << not_tmp;
  }
  EXPECT_EQ(ParentDir("a"), ".");
  EXPECT_EQ(ParentDir("/a"), "/");
  EXPECT_EQ(ParentDir("/a/b/c"), "/a/b");
}

// A full disk, a failed rename and a failed fsync each leave the old content and no temporary file behind,
// and the next write succeeds once the fault is gone.
TEST_F(EnvTest, AtomicWriteUnderFaultsKeepsTheOldContent) {
  FaultInjectionEnv env(env_);
  const std::string path = dir_ + "/state";
  ASSERT_TRUE(WriteFileAtomically(&env, path, "old content").ok());

  env.FailWritesAfter(4);
  absl::Status s = WriteFileAtomically(&env, path, "new content, longer");
  EXPECT_EQ(s.code(), absl::StatusCode::kResourceExhausted) << s;
  EXPECT_TRUE(absl::StrContains(s.message(), "No space left on device")) << s;
  EXPECT_TRUE(absl::StrContains(s.message(), path + ".tmp.")) << s;
  EXPECT_EQ(*env.ReadFile(path), "old content");
  EXPECT_EQ(Names(), (std::vector<std::string>{"state"}));

  env.ClearFaults();
  env.FailRenames(1);
  s = WriteFileAtomically(&env, path, "new content");
  EXPECT_EQ(s.code(), absl::StatusCode::kInternal) << s;
  EXPECT_TRUE(absl::StrContains(s.message(), "cannot rename")) << s;
  EXPECT_EQ(*env.ReadFile(path), "old content");
  EXPECT_EQ(Names(), (std::vector<std::string>{"state"}));

  env.FailSyncs(1);
  s = WriteFileAtomically(&env, path, "new content");
  EXPECT_TRUE(absl::StrContains(s.message(), "cannot fsync")) << s;
  EXPECT_EQ(*env.ReadFile(path), "old content");
  EXPECT_EQ(Names(), (std::vector<std::string>{"state"}));

  // The removal of the temporary file failing too is reported, not hidden.
  env.FailRenames(1);
  env.FailRemoves(1);
  s = WriteFileAtomically(&env, path, "new content");
  EXPECT_TRUE(absl::StrContains(s.message(), "the temporary file could not be removed")) << s;
  EXPECT_EQ(*env.ReadFile(path), "old content");

  env.ClearFaults();
  ASSERT_TRUE(WriteFileAtomically(&env, path, "new content").ok());
  EXPECT_EQ(*env.ReadFile(path), "new content");
}

TEST_F(EnvTest, FullDiskKeepsWhatFitsAndCountsAcrossFiles) {
  FaultInjectionEnv env(env_);
  env.FailWritesAfter(10);
  absl::StatusOr<std::unique_ptr<WritableFile>> f = env.NewWritableFile(dir_ + "/f");
  ASSERT_TRUE(f.ok());
  EXPECT_TRUE((*f)->Append("123456").ok());
  EXPECT_EQ((*f)->Append("789abc").code(), absl::StatusCode::kResourceExhausted);
  EXPECT_TRUE((*f)->Close().ok());
  EXPECT_EQ(*env.ReadFile(dir_ + "/f"), "123456789a");
  absl::StatusOr<std::unique_ptr<WritableFile>> g = env.NewWritableFile(dir_ + "/g");
  ASSERT_TRUE(g.ok());
  EXPECT_EQ((*g)->Append("x").code(), absl::StatusCode::kResourceExhausted);
  env.SleepFor(absl::Seconds(3));
  EXPECT_EQ(env.sleeps(), (std::vector<absl::Duration>{absl::Seconds(3)}));
}

}  // namespace
}  // namespace dtrain
