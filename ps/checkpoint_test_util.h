// Test helpers for the checkpoint tests: a scratch directory removed at the end, and a glog sink that records
// the messages logged while it lives.
//
// Thread-safety: LogCapture may receive messages from any thread; ScratchDir belongs to one test.
#ifndef DTRAIN_PS_CHECKPOINT_TEST_UTIL_H_
#define DTRAIN_PS_CHECKPOINT_TEST_UTIL_H_

#include <unistd.h>

#include <filesystem>
#include <mutex>
#include <string>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "glog/logging.h"
#include "gtest/gtest.h"

namespace dtrain::ps::testing {

class ScratchDir {
 public:
  explicit ScratchDir(const std::string& name)
      : path_(absl::StrCat(::testing::TempDir(), "dtrain_ckpt_", name, "_", getpid())) {
    std::filesystem::remove_all(path_);
    std::filesystem::create_directories(path_);
  }
  ~ScratchDir() {
    std::error_code ec;
    std::filesystem::remove_all(path_, ec);
  }
  const std::string& path() const { return path_; }

 private:
  std::string path_;
};

class LogCapture : public google::LogSink {
 public:
  LogCapture() { google::AddLogSink(this); }
  ~LogCapture() override { google::RemoveLogSink(this); }

  void send(google::LogSeverity severity, const char* /*full_filename*/, const char* /*base_filename*/,
            int /*line*/, const struct ::tm* /*tm_time*/, const char* message, size_t message_len) override {
    std::lock_guard<std::mutex> lock(mu_);
    absl::StrAppend(&text_, google::GetLogSeverityName(severity), ": ", std::string(message, message_len), "\n");
  }
  bool Contains(const std::string& s) {
    std::lock_guard<std::mutex> lock(mu_);
    return absl::StrContains(text_, s);
  }
  std::string text() {
    std::lock_guard<std::mutex> lock(mu_);
    return text_;
  }

 private:
  std::mutex mu_;
  std::string text_;
};

}  // namespace dtrain::ps::testing

#endif  // DTRAIN_PS_CHECKPOINT_TEST_UTIL_H_
