// Arrays as data sets: NumPy arrays (memory-mapped .npy / .npz) and CSV tables, read through an ExampleSource
// (example_source.h) so that only the labels are held in memory.
//
// NumPy, in a directory (the first layout found):
//   train.npz [+ test.npz]                       arrays named LoadOptions::x_name / y_name ("x", "y")
//   x_train.npy + y_train.npy [+ x_test.npy + y_test.npy]
//   one other *.npz with x_train, y_train [, x_test, y_test]   (Keras's mnist.npz)
// x: [N, ...] of uint8 (pixels: read as value / 255), float16, float32 or float64 (read as stored), or another
// numeric type (converted). Its shape beyond N becomes the examples' H x W x C: [N] 1x1x1, [N, F] 1x1xF (a
// table: what a flat [N, F] model input takes), [N, H, W] HxWx1, [N, a, b, c] NHWC or NCHW (ArrayLayout; NCHW is
// transposed as it is read), higher ranks 1x1x(product) in C order. y: [N] or [N, 1] integer class indices >= 0
// (integral floats accepted). A .npy or a stored .npz member is used in place (memory-mapped); a deflated one
// (np.savez_compressed) is inflated into memory.
//
// CSV, in a directory: train.csv [+ test.csv or val.csv] (each possibly .gz). One label column
// (LoadOptions::label_column: a header name, or a 0-based index, negative from the end); every other column is a
// numeric feature, and each row becomes a 1x1xF example. A first line with a value that is not a number is the
// header (required to find the label column by name). Labels: integers >= 0, or names (strings), which become
// classes 0, 1, ... in the sorted order of the training file's names. An empty or non-numeric feature is an
// error naming the line and column.
//
// Without test files, LoadOptions::validation_split holds out evenly spaced examples (SplitEvenly).
//
// Thread-safety: the functions are re-entrant; the sources are immutable.
#ifndef DTRAIN_WORKER_DATA_ARRAY_SOURCE_H_
#define DTRAIN_WORKER_DATA_ARRAY_SOURCE_H_

#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "worker/data/dataset.h"
#include "worker/data/npy_file.h"

namespace dtrain::data {

// Whether `dir` holds one of the NumPy / CSV layouts above (by file names), for format detection.
bool LooksLikeNpy(const std::string& dir);
bool LooksLikeCsv(const std::string& dir);

// Reads the layouts above. NotFound naming every layout looked for; DataLoss / InvalidArgument naming the file
// for bad contents (x and y of different lengths, a label that is not a class index, ...).
absl::StatusOr<DatasetPair> ReadNpyDataset(const std::string& dir, const LoadOptions& o);
absl::StatusOr<DatasetPair> ReadCsvDataset(const std::string& dir, const LoadOptions& o);

// A Dataset over arrays x and y (as above; num_classes = the largest label + 1). `keep` holds the memory x points
// into for as long as the source lives. `name` names the arrays in messages.
absl::StatusOr<Dataset> ArrayDataset(const NpyArray& x, const NpyArray& y, std::shared_ptr<const void> keep,
                                     ArrayLayout layout, const std::string& name);

// A CSV table's text as a Dataset (features in memory, behind a source). `classes`: in, the training file's class
// names to label with (null or empty: integers, or the names found, sorted); out (when not null and labels are
// names), the names used.
absl::StatusOr<Dataset> ParseCsv(absl::string_view text, const std::string& name, const std::string& label_column,
                                 std::vector<std::string>* classes = nullptr);

}  // namespace dtrain::data

#endif  // DTRAIN_WORKER_DATA_ARRAY_SOURCE_H_
