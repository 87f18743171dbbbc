#include "ps/api/ps_interface.h"

#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
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

constexpr absl::string_view kPsSetChanged = "the job's ps tasks changed (version ";

absl::Status PsSetChangedError(const PsSet& set) {
  return absl::AbortedError(absl::StrCat(kPsSetChanged, set.version, " at step ", set.step,
                                         "): ", absl::StrJoin(set.hosts, ",")));
}

std::optional<PsSet> ParsePsSetChanged(const absl::Status& s) {
  if (s.code() != absl::StatusCode::kAborted) return std::nullopt;
  absl::string_view m = s.message();
  const size_t at = m.find(kPsSetChanged);
  if (at == absl::string_view::npos) return std::nullopt;
  m.remove_prefix(at + kPsSetChanged.size());
  PsSet set;
  const size_t space = m.find(" at step ");
  if (space == absl::string_view::npos || !absl::SimpleAtoi(m.substr(0, space), &set.version)) return std::nullopt;
  m.remove_prefix(space + 9);
  const size_t close = m.find("): ");
  if (close == absl::string_view::npos || !absl::SimpleAtoi(m.substr(0, close), &set.step)) return std::nullopt;
  m.remove_prefix(close + 3);
  // The hosts end at the first character that is no part of a list of host:port (a transport may append text).
  const size_t end = m.find_first_of(" ;\n\t");
  if (end != absl::string_view::npos) m = m.substr(0, end);
  set.hosts = absl::StrSplit(m, ',', absl::SkipEmpty());
  if (set.version < 0 || set.hosts.empty()) return std::nullopt;
  return set;
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
