#include "ps/api/ps_interface.h"

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"

namespace dtrain::ps {
namespace {

constexpr absl::string_view kJobEnded = "the run ended early: ";

}  // namespace

absl::Status JobEndedError(absl::string_view why) {
  return absl::OutOfRangeError(absl::StrCat(kJobEnded, why));
}

bool IsJobEnded(const absl::Status& s) {
  return s.code() == absl::StatusCode::kOutOfRange && absl::StrContains(s.message(), kJobEnded);
}

std::string JobEndedReason(const absl::Status& s) {
  const absl::string_view m = s.message();
  const size_t at = m.find(kJobEnded);
  return std::string(at == absl::string_view::npos ? m : m.substr(at + kJobEnded.size()));
}

}  // namespace dtrain::ps
