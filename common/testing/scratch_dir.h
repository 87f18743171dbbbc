// Test helper: a fresh directory under gtest's TempDir(), removed with everything in it when the object dies.
#ifndef DTRAIN_COMMON_TESTING_SCRATCH_DIR_H_
#define DTRAIN_COMMON_TESTING_SCRATCH_DIR_H_

#include <stdlib.h>

#include <filesystem>
#include <string>
#include <system_error>

#include "glog/logging.h"
#include "gtest/gtest.h"

namespace dtrain::testing {

// ScratchDir("name") makes TempDir()/name.XXXXXX (unique: mkdtemp); CHECK-fails when it cannot.
// Thread-compatible: belongs to one test.
class ScratchDir {
 public:
  explicit ScratchDir(const std::string& name) {
    std::string tmpl = ::testing::TempDir() + "/" + name + ".XXXXXX";
    CHECK(::mkdtemp(tmpl.data()) != nullptr) << "cannot make a scratch directory " << tmpl;
    path_ = tmpl;
  }
  ~ScratchDir() {
    std::error_code ec;
    std::filesystem::remove_all(path_, ec);
  }
  ScratchDir(const ScratchDir&) = delete;
  ScratchDir& operator=(const ScratchDir&) = delete;

  const std::string& path() const { return path_; }

 private:
  std::string path_;
};

}  // namespace dtrain::testing

#endif  // DTRAIN_COMMON_TESTING_SCRATCH_DIR_H_
