// ONNX's external data (onnx/docs/ExternalData.md): tensors whose bytes live in files beside the .onnx, as
// torch.onnx.export writes every model over protobuf's 2 GB limit and onnx.save_model(...,
// save_as_external_data=True) any model. A tensor so stored has data_location EXTERNAL and external_data entries
// "location" (a path relative to the model file's directory), "offset" and "length" (bytes; default 0 and the
// rest of the file) and "checksum" (the SHA-1 of the whole file, hex; optional). Internal to worker/models/onnx.
//
//   RETURN_IF_ERROR(LoadExternalData("models/vit_h_14.onnx", &model, &loaded));  // importer (onnx_file.h)
//   RETURN_IF_ERROR(WriteExternalData(tensors, "trained.onnx.data", data_file.get()));  // export (onnx_export.h)
//
// Thread-safety: plain functions; each works on the objects it is given only.
#ifndef DTRAIN_WORKER_MODELS_ONNX_ONNX_EXTERNAL_DATA_H_
#define DTRAIN_WORKER_MODELS_ONNX_ONNX_EXTERNAL_DATA_H_

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/string_view.h"
#include "common/env.h"
#include "onnx/onnx_pb.h"

namespace dtrain::models::onnx {

// protobuf's limit on one message, so on a whole .onnx file (and on what a reader of one can parse).
inline constexpr int64_t kMaxProtobufBytes = 2147483647;  // INT32_MAX

// The refusal of a model file over kMaxProtobufBytes (`size` bytes): says that no ONNX reader can parse it and
// how to save it with external data instead. InvalidArgument.
absl::Status ModelFileTooLarge(const std::string& file, int64_t size);

// Reads the bytes of every tensor of `model` that keeps them in external data (the graph's initializers and its
// nodes' tensor attributes, as Constant's value) into its raw_data, and drops its external data entries, so that
// the model reads as if saved in one file. Each data file is opened once. `file` is the model's path: locations
// are relative to its directory (ParentDir(file)), and messages start with it. `*loaded` says whether any
// tensor's data was external.
//
// Errors, each "<file>: <tensor> ...: <what>" naming the data file: NotFound when a data file does not exist;
// InvalidArgument for a location that is empty, absolute, has a ".." part or resolves outside the model's
// directory (a symbolic link pointing out; one pointing inside is followed), for a data file that is not a
// regular file, an unknown or repeated key, an offset or length that is not a non-negative integer or runs past
// the end of the file, a length other than the tensor's dims times its element size, a STRING or UNDEFINED
// tensor, a tensor that also holds data inline, external_data entries without data_location EXTERNAL, a checksum
// that is not the file's SHA-1; what open/read report (ErrnoToStatus's codes, common/file_util.h).
absl::Status LoadExternalData(const std::string& file, ::onnx::ModelProto* model, bool* loaded);

// A tensor whose bytes go to a data file: `bytes` (its data as raw_data would hold it) stays valid until
// WriteExternalData returns.
struct ExternalTensor {
  ::onnx::TensorProto* tensor;
  absl::string_view bytes;
};

// Appends each tensor's bytes to `out` (a data file written from its start, named `location` relative to the
// model file's directory) at offsets aligned to kExternalDataAlignment (zeros in between), and points the tensor
// there: data_location EXTERNAL, external_data location/offset/length, its inline data cleared. Errors: what
// `out` reports.
inline constexpr int64_t kExternalDataAlignment = 4096;  // a page: each tensor can be memory-mapped in place
absl::Status WriteExternalData(const std::vector<ExternalTensor>& tensors, const std::string& location,
                               WritableFile* out);

}  // namespace dtrain::models::onnx

#endif  // DTRAIN_WORKER_MODELS_ONNX_ONNX_EXTERNAL_DATA_H_
