#include "ps/checkpoint/checkpoint_options.h"

#include "absl/strings/str_cat.h"

namespace dtrain::ps {

absl::Status ValidateCheckpointOptions(const CheckpointOptions& o) {
  auto bad = [](absl::string_view what) {
    return absl::InvalidArgumentError(absl::StrCat("checkpoint options: ", what));
  };
  if (o.save_steps < 0) return bad(absl::StrCat("save_steps ", o.save_steps, " must be >= 0"));
  if (!(o.save_secs >= 0)) return bad(absl::StrCat("save_secs ", o.save_secs, " must be >= 0"));
  if (o.keep < 0) return bad(absl::StrCat("keep ", o.keep, " must be >= 0 (0 keeps all)"));
  if (o.max_attempts < 1) return bad(absl::StrCat("max_attempts ", o.max_attempts, " must be >= 1"));
  if (o.initial_backoff < absl::ZeroDuration()) {
    return bad(absl::StrCat("initial_backoff ", absl::FormatDuration(o.initial_backoff), " must be >= 0"));
  }
  if (o.max_backoff < o.initial_backoff) {
    return bad(absl::StrCat("max_backoff ", absl::FormatDuration(o.max_backoff),
                            " must be >= initial_backoff ", absl::FormatDuration(o.initial_backoff)));
  }
  if (o.env == nullptr) return bad("env is null");
  return absl::OkStatus();
}

}  // namespace dtrain::ps
