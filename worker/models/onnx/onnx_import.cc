// Placeholder while the importer is written (branch onnx): refuses every file.
#include "worker/models/onnx/onnx_import.h"

#include "absl/strings/str_cat.h"

namespace dtrain::models::onnx {

absl::StatusOr<ModelRef> ImportModel(const std::string& path, const ImportOptions&) {
  return absl::UnimplementedError(absl::StrCat(path, ": ONNX import is not built yet"));
}

}  // namespace dtrain::models::onnx
