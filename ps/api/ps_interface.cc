#include "ps/api/ps_interface.h"

#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/strip.h"

namespace dtrain::ps {
namespace {

constexpr absl::string_view kJobEnded = "the run ended early: ";
constexpr absl::string_view kRunOver = "the run is over (";

constexpr struct {
  RunOutcome kind;
  absl::string_view word;
} kOutcomeWords[] = {{RunOutcome::kComplete, "complete"},
                     {RunOutcome::kDegraded, "degraded"},
                     {RunOutcome::kRefused, "refused"},
                     {RunOutcome::kEndedEarly, "ended early"}};

}  // namespace

constexpr absl::string_view kRemoved = "removed from the job: ";

absl::Status RemovedError(absl::string_view why) {
  return absl::FailedPreconditionError(absl::StrCat(kRemoved, why));
}

bool IsRemoved(const absl::Status& s) {
  return s.code() == absl::StatusCode::kFailedPrecondition && absl::StrContains(s.message(), kRemoved);
}

std::string RemovedReason(const absl::Status& s) {
  const absl::string_view m = s.message();
  const size_t at = m.find(kRemoved);
  return std::string(at == absl::string_view::npos ? m : m.substr(at + kRemoved.size()));
}

absl::Status JobEndedError(absl::string_view why) {
  return absl::OutOfRangeError(absl::StrCat(kJobEnded, why));
}

bool IsJobEnded(const absl::Status& s) {
  return s.code() == absl::StatusCode::kOutOfRange && absl::StrContains(s.message(), kJobEnded) &&
         !ParseRunOver(s).has_value();
}

std::string JobEndedReason(const absl::Status& s) {
  const absl::string_view m = s.message();
  const size_t at = m.find(kJobEnded);
  return std::string(at == absl::string_view::npos ? m : m.substr(at + kJobEnded.size()));
}

absl::Status RunOverError(RunOutcome kind, int64_t global_step, absl::string_view line) {
  absl::string_view word = "ended early";
  for (const auto& w : kOutcomeWords) {
    if (w.kind == kind) word = w.word;
  }
  return absl::OutOfRangeError(absl::StrCat(kRunOver, word, " at step ", global_step, "): ", line));
}

std::optional<RunOver> ParseRunOver(const absl::Status& s) {
  if (s.code() != absl::StatusCode::kOutOfRange) return std::nullopt;
  absl::string_view m = s.message();
  const size_t at = m.find(kRunOver);
  if (at == absl::string_view::npos) return std::nullopt;
  m.remove_prefix(at + kRunOver.size());
  RunOver over;
  bool known = false;
  for (const auto& w : kOutcomeWords) {
    if (absl::ConsumePrefix(&m, w.word)) {
      over.kind = w.kind;
      known = true;
      break;
    }
  }
  if (!known || !absl::ConsumePrefix(&m, " at step ")) return std::nullopt;
  const size_t close = m.find("): ");
  if (close == absl::string_view::npos || !absl::SimpleAtoi(m.substr(0, close), &over.global_step)) {
    return std::nullopt;
  }
  over.line = std::string(m.substr(close + 3));
  return over;
}

}  // namespace dtrain::ps
