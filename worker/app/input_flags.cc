// --input_mean, --input_std (worker/app/model_flags.h).
#include "absl/flags/flag.h"
#include "worker/app/model_flags.h"

ABSL_FLAG(std::string, input_mean, "",
          "Per-channel means subtracted from the pixels after scaling them to [0, 1], e.g. 0.4914,0.4822,0.4465 "
          "(for models trained on normalized inputs; one value: every channel; the same in training, evaluation "
          "and benchmarks)");
ABSL_FLAG(std::string, input_std, "", "Per-channel standard deviations the pixels are divided by (after --input_mean)");

namespace dtrain::worker {

absl::StatusOr<data::Normalization> InputNormalizationFromFlags() {
  return data::ParseNormalization(absl::GetFlag(FLAGS_input_mean), absl::GetFlag(FLAGS_input_std));
}

}  // namespace dtrain::worker
