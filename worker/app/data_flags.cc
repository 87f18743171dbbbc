// --data_format and --model=dlrm's shape (worker/app/model_flags.h).
#include "absl/flags/flag.h"
#include "worker/app/model_flags.h"

ABSL_FLAG(std::string, data_format, "auto",
          "auto | mnist-idx | cifar10-bin | tfrecord | criteo (auto: by the file names in --data_dir)");
ABSL_FLAG(int, embedding_dim, 16, "--model=dlrm: floats per embedding row (and the bottom MLP's output)");
ABSL_FLAG(std::string, dlrm_bottom, "64", "--model=dlrm: hidden widths of the bottom MLP (comma-separated)");
ABSL_FLAG(std::string, dlrm_top, "128,64", "--model=dlrm: hidden widths of the top MLP (comma-separated)");
ABSL_FLAG(int64_t, table_rows, 0,
          "--model=dlrm: rows per table, ids taken modulo it (0: hash tables keyed by the id, rows made on first touch)");
ABSL_FLAG(int64_t, max_rows, 0, "--model=dlrm: rows per table and ps task beyond which the least recently used "
                                "are evicted (0: no bound)");
ABSL_FLAG(int, admit_after, 0, "--model=dlrm: give an id a row once it was looked up this many times (0: at once)");

namespace dtrain::worker {

absl::StatusOr<data::DataFormat> DataFormatFromFlags() {
  return data::ParseDataFormat(absl::GetFlag(FLAGS_data_format));
}

absl::StatusOr<models::DlrmConfig> DlrmConfigFromFlags() {
  return models::ParseDlrmConfig(absl::GetFlag(FLAGS_embedding_dim), absl::GetFlag(FLAGS_dlrm_bottom),
                                 absl::GetFlag(FLAGS_dlrm_top), absl::GetFlag(FLAGS_table_rows),
                                 absl::GetFlag(FLAGS_max_rows), absl::GetFlag(FLAGS_admit_after));
}

}  // namespace dtrain::worker
