// --data_format, how image folders, arrays and CSV are read, and --model=dlrm's shape (worker/app/model_flags.h).
#include <utility>

#include "absl/flags/flag.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "worker/app/model_flags.h"

ABSL_FLAG(std::string, data_format, "auto",
          "auto | mnist-idx | cifar10-bin | tfrecord | criteo | image_folder | npy | csv (auto: by the file names in "
          "--data_dir)");
ABSL_FLAG(int, image_size, 224,
          "Image folders: the side of the square images the model takes (training: RandomResizedCrop to it; "
          "evaluation: Resize(--resize_size) + CenterCrop to it)");
ABSL_FLAG(int, resize_size, 0, "Image folders, evaluation: the shorter side before the centre crop (0: "
                               "image_size * 256 / 224)");
ABSL_FLAG(double, validation_split, 0,
          "A data set without a test part (an image folder without val/, arrays or CSV without test files): this "
          "fraction of the training examples, evenly spaced (per class for image folders), is the test set");
ABSL_FLAG(std::string, label_column, "label", "CSV: the label column, by header name or 0-based index (-1: the last)");
ABSL_FLAG(std::string, npz_arrays, "x,y", "NumPy train.npz / test.npz: the names of the examples' and labels' arrays");
ABSL_FLAG(std::string, array_layout, "auto",
          "NumPy arrays [N, a, b, c]: nhwc | nchw | auto (NHWC when c is 1, 3 or 4, else NCHW when a is)");
ABSL_FLAG(int, input_threads, 0,
          "Image folders and arrays: threads reading and decoding examples, a few batches ahead of the towers "
          "(0: one per core)");
ABSL_FLAG(bool, augment, true,
          "Image folders, training: random resized crop + horizontal flip (false: evaluation's resize + centre crop)");
ABSL_FLAG(std::string, bad_images, "skip",
          "An image that cannot be read or decoded: skip (log its path once; another image takes its place) | fail "
          "(stop with its path)");
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

absl::StatusOr<InputPipeline> InputPipelineFromFlags() {
  InputPipeline p;
  data::LoadOptions& l = p.load;
  l.image_size = absl::GetFlag(FLAGS_image_size);
  l.resize_size = absl::GetFlag(FLAGS_resize_size);
  l.validation_split = absl::GetFlag(FLAGS_validation_split);
  l.label_column = absl::GetFlag(FLAGS_label_column);
  if (l.image_size <= 0) return absl::InvalidArgumentError("--image_size must be > 0");
  if (l.resize_size < 0) return absl::InvalidArgumentError("--resize_size must be >= 0");
  if (l.resize_size > 0 && l.resize_size < l.image_size) {
    return absl::InvalidArgumentError(absl::StrCat("--resize_size=", l.resize_size, " is smaller than --image_size=",
                                                   l.image_size, ", which is cropped from it"));
  }
  if (!(l.validation_split >= 0 && l.validation_split < 1)) {
    return absl::InvalidArgumentError("--validation_split must be in [0, 1)");
  }
  const std::vector<std::string> names = absl::StrSplit(absl::GetFlag(FLAGS_npz_arrays), ',');
  if (names.size() != 2 || names[0].empty() || names[1].empty()) {
    return absl::InvalidArgumentError(absl::StrCat("--npz_arrays=", absl::GetFlag(FLAGS_npz_arrays),
                                                   ": expected two array names, X,Y"));
  }
  l.x_name = names[0];
  l.y_name = names[1];
  absl::StatusOr<data::ArrayLayout> layout = data::ParseArrayLayout(absl::GetFlag(FLAGS_array_layout));
  if (!layout.ok()) return absl::InvalidArgumentError(absl::StrCat("--array_layout: ", layout.status().message()));
  l.layout = *layout;
  p.threads = absl::GetFlag(FLAGS_input_threads);
  if (p.threads < 0) return absl::InvalidArgumentError("--input_threads must be >= 0");
  p.augment = absl::GetFlag(FLAGS_augment);
  absl::StatusOr<data::BadExamples> bad = data::ParseBadExamples(absl::GetFlag(FLAGS_bad_images));
  if (!bad.ok()) return absl::InvalidArgumentError(absl::StrCat("--bad_images: ", bad.status().message()));
  p.bad_images = *bad;
  return p;
}

absl::StatusOr<models::DlrmConfig> DlrmConfigFromFlags() {
  return models::ParseDlrmConfig(absl::GetFlag(FLAGS_embedding_dim), absl::GetFlag(FLAGS_dlrm_bottom),
                                 absl::GetFlag(FLAGS_dlrm_top), absl::GetFlag(FLAGS_table_rows),
                                 absl::GetFlag(FLAGS_max_rows), absl::GetFlag(FLAGS_admit_after));
}

}  // namespace dtrain::worker
