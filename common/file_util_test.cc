#include "common/file_util.h"

#include <dirent.h>
#include <stdlib.h>
#include <sys/stat.h>
#include <unistd.h>

#include <string>
#include <vector>

#include "gtest/gtest.h"

namespace dtrain {
namespace {

class FileUtilTest : public ::testing::Test {
 protected:
  void SetUp() override {
    std::string tmpl = ::testing::TempDir() + "/file_util_test.XXXXXX";
    ASSERT_NE(::mkdtemp(tmpl.data()), nullptr);
    dir_ = tmpl;
  }
  void TearDown() override {
    for (const std::string& name : ListDir()) ::unlink((dir_ + "/" + name).c_str());
    ::rmdir(dir_.c_str());
  }
  std::vector<std::string> ListDir() {
    std::vector<std::string> names;
    DIR* d = ::opendir(dir_.c_str());
    if (d == nullptr) return names;
    while (struct dirent* e = ::readdir(d)) {
      std::string name = e->d_name;
      if (name != "." && name != "..") names.push_back(name);
    }
    ::closedir(d);
    return names;
  }
  std::string dir_;
};

TEST_F(FileUtilTest, WriteThenReadRoundTripsBinaryData) {
  std::string data;
  for (int i = 0; i < 200000; ++i) data.push_back(static_cast<char>((i * 131) & 0xff));
  const std::string path = dir_ + "/blob";
  ASSERT_TRUE(WriteFileAtomically(path, data).ok());
  absl::StatusOr<std::string> read = ReadFileToString(path);
  ASSERT_TRUE(read.ok()) << read.status();
  EXPECT_EQ(*read, data);
  // No temporary file is left behind.
  EXPECT_EQ(ListDir(), std::vector<std::string>{"blob"});
}

TEST_F(FileUtilTest, OverwriteReplacesWholeContent) {
  const std::string path = dir_ + "/latest";
  ASSERT_TRUE(WriteFileAtomically(path, "a much longer first version\n").ok());
  ASSERT_TRUE(WriteFileAtomically(path, "v2").ok());
  absl::StatusOr<std::string> read = ReadFileToString(path);
  ASSERT_TRUE(read.ok());
  EXPECT_EQ(*read, "v2");
}

TEST_F(FileUtilTest, EmptyFile) {
  const std::string path = dir_ + "/empty";
  ASSERT_TRUE(WriteFileAtomically(path, "").ok());
  absl::StatusOr<std::string> read = ReadFileToString(path);
  ASSERT_TRUE(read.ok());
  EXPECT_EQ(*read, "");
}

TEST_F(FileUtilTest, ReadMissingFileIsNotFoundNamingPath) {
  absl::StatusOr<std::string> read = ReadFileToString(dir_ + "/nope");
  ASSERT_FALSE(read.ok());
  EXPECT_EQ(read.status().code(), absl::StatusCode::kNotFound);
  EXPECT_NE(read.status().message().find(dir_ + "/nope"), std::string::npos) << read.status();
}

TEST_F(FileUtilTest, ReadDirectoryFails) {
  absl::StatusOr<std::string> read = ReadFileToString(dir_);
  ASSERT_FALSE(read.ok());
  EXPECT_EQ(read.status().code(), absl::StatusCode::kFailedPrecondition) << read.status();
}

TEST_F(FileUtilTest, WriteIntoMissingDirectoryFailsAndLeavesNothing) {
  absl::Status s = WriteFileAtomically(dir_ + "/no/such/dir/file", "x");
  ASSERT_FALSE(s.ok());
  EXPECT_EQ(s.code(), absl::StatusCode::kNotFound);
  EXPECT_NE(s.message().find("no/such/dir/file.tmp."), std::string::npos) << s;
  EXPECT_TRUE(ListDir().empty());
}

TEST_F(FileUtilTest, RenameOntoDirectoryFailsAndCleansUpTemporary) {
  const std::string sub = dir_ + "/sub";
  ASSERT_EQ(::mkdir(sub.c_str(), 0755), 0);
  ASSERT_EQ(::mkdir((sub + "/child").c_str(), 0755), 0);  // non-empty: rename over it fails
  absl::Status s = WriteFileAtomically(sub, "x");
  ::rmdir((sub + "/child").c_str());
  ::rmdir(sub.c_str());
  ASSERT_FALSE(s.ok());
  EXPECT_NE(s.message().find("cannot rename"), std::string::npos) << s;
  EXPECT_TRUE(ListDir().empty());
}

TEST(ErrnoToStatusTest, MapsCodesAndKeepsContext) {
  absl::Status s = ErrnoToStatus(ENOSPC, "cannot write '/x'");
  EXPECT_EQ(s.code(), absl::StatusCode::kResourceExhausted);
  EXPECT_NE(s.message().find("cannot write '/x': "), std::string::npos);
  EXPECT_EQ(ErrnoToStatus(EACCES, "c").code(), absl::StatusCode::kPermissionDenied);
  EXPECT_EQ(ErrnoToStatus(EIO, "c").code(), absl::StatusCode::kInternal);
}

TEST(AbsolutePathTest, RelativePathsTakeTheCurrentDirectory) {
  char cwd[4096];
  ASSERT_NE(::getcwd(cwd, sizeof(cwd)), nullptr);
  const std::string here = cwd;
  EXPECT_EQ(AbsolutePath("data/fashion"), (here == "/" ? "" : here) + "/data/fashion");
  EXPECT_EQ(AbsolutePath("./data/../models/lenet5.onnx"), (here == "/" ? "" : here) + "/models/lenet5.onnx");
  EXPECT_EQ(AbsolutePath("/usr/share/datasets/./fashion-mnist"), "/usr/share/datasets/fashion-mnist");
  EXPECT_EQ(AbsolutePath("."), here);
  EXPECT_EQ(AbsolutePath("data/"), (here == "/" ? "" : here) + "/data");
  EXPECT_EQ(AbsolutePath("/"), "/");
  EXPECT_EQ(AbsolutePath(""), "");
}

}  // namespace
}  // namespace dtrain
