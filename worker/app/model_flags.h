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
//
// A binary links the library of the flags it takes (dtrain_input_flags, dtrain_data_flags).
#ifndef DTRAIN_WORKER_APP_MODEL_FLAGS_H_
#define DTRAIN_WORKER_APP_MODEL_FLAGS_H_

#include "absl/status/statusor.h"
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

}  // namespace dtrain::worker

#endif  // DTRAIN_WORKER_APP_MODEL_FLAGS_H_
