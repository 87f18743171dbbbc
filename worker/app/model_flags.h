// Command-line flags that dtrain_worker, dtrain_eval and dtrain_bench share, defined once so that their names,
// defaults and help agree, and parsed into the values the libraries take. Each getter reads the flags (after
// absl::ParseCommandLine) and returns InvalidArgument naming the flag that is wrong.
//
//   input_flags.cc: --input_mean --input_std                        -> InputNormalizationFromFlags()
//   data_flags.cc:  --data_format and the shape of --model=dlrm      -> DataFormatFromFlags(), DlrmConfigFromFlags()
//                   (--embedding_dim --dlrm_bottom --dlrm_top --table_rows --max_rows --admit_after)
//                   image folders, arrays and CSV                   -> InputPipelineFromFlags()
//                   (--image_size --resize_size --validation_split --label_column --npz_arrays --array_layout
//                    --input_threads --augment --bad_images)
//   thread_flags.cc: --threads (auto or a count)                     -> ThreadsFromFlags()
//                    --compute_dtype (fp32 or bf16)                  -> ComputeDtypeFromFlags()
//
// A binary links the library of the flags it takes (dtrain_input_flags, dtrain_data_flags, dtrain_thread_flags).
#ifndef DTRAIN_WORKER_APP_MODEL_FLAGS_H_
#define DTRAIN_WORKER_APP_MODEL_FLAGS_H_

#include "absl/status/statusor.h"
#include "common/cpu_budget.h"
#include "kernels/device.h"
#include "worker/data/dataset.h"
#include "worker/models/dlrm.h"

namespace dtrain::worker {

absl::StatusOr<data::Normalization> InputNormalizationFromFlags();

// How the data set is read (data::LoadOptions) and how its examples are fed (image folders, arrays).
struct InputPipeline {
  data::LoadOptions load;
  int threads = 0;
  bool augment = true;
  data::BadExamples bad_images = data::BadExamples::kSkip;
};
absl::StatusOr<InputPipeline> InputPipelineFromFlags();
absl::StatusOr<data::DataFormat> DataFormatFromFlags();
absl::StatusOr<models::DlrmConfig> DlrmConfigFromFlags();
// --threads: the explicit count, or what --threads=auto picks for this process (common/cpu_budget.h), with the
// one line to log (a warning when ThreadDecision::exceeds_budget). `known_peers`: other worker processes the
// caller knows run on this host's CPUs (a cluster spec's workers at its own host). InvalidArgument for a value
// that is neither auto nor a whole number from 1 to 4096.
absl::StatusOr<ThreadDecision> ThreadsFromFlags(int known_peers = 0);
// --compute_dtype: InvalidArgument naming the value unless fp32 or bf16.
absl::StatusOr<kernels::ComputeDtype> ComputeDtypeFromFlags();

}  // namespace dtrain::worker

#endif  // DTRAIN_WORKER_APP_MODEL_FLAGS_H_
