// An ONNX file read and checked once (worker/models/onnx/onnx_import.h): the parsed ModelProto, its decoded
// initializers and what the graph mapper (onnx_mapper.h) needs to know about its inputs, outputs and readers.
// Also the one-line refusal every part of the importer gives. Internal to worker/models/onnx.
//
// Thread-safety: an OnnxFile is immutable once read; shared by every build of the graph.
#ifndef DTRAIN_WORKER_MODELS_ONNX_ONNX_FILE_H_
#define DTRAIN_WORKER_MODELS_ONNX_ONNX_FILE_H_

#include <map>
#include <memory>
#include <set>
#include <string>
#include <unordered_map>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "onnx/onnx_pb.h"
#include "worker/models/onnx/onnx_constants.h"

namespace dtrain::models::onnx {

// The supported versions: ai.onnx opsets 11-17, IR versions 3-8 (ONNX 1.12).
inline constexpr int kMinOpset = 11, kMaxOpset = 17, kMinIrVersion = 3, kMaxIrVersion = 8;

// How to export a model dtrain can train; ends every refusal.
extern const char kExportHint[];

struct OnnxFile {
  std::string file;  // the path as given (messages start with it)
  std::string name;  // the file's stem ("resnet20")
  // The file as parsed. Export writes it back with the trained initializers; nothing else changes it (the
  // importer only drops the data of the initializers that became variables: their values live on in
  // `initializers`, and export writes trained ones there).
  std::shared_ptr<::onnx::ModelProto> model;
  int opset = 0;  // the ai.onnx opset
  // Whether some tensor's data came from external data beside the file (onnx_external_data.h; `model` holds it
  // inline now): export then writes the trained weights as external data too.
  bool external_data = false;

  // Every initializer, decoded (the float ones become variables when an op takes them as weights).
  std::unordered_map<std::string, ConstRef> initializers;

  // The float graph input the images or dense features feed: its name, dims without the batch (-1: symbolic)
  // and batch dim (-1: a dynamic axis). Empty for a model that reads only ids.
  std::string data_input;
  std::vector<int64_t> input_dims;
  int64_t input_batch = -1;
  // The int64 graph input of ids that embedding lookups read (the batch's sparse features), [N] or [N, F]:
  // its name (empty: none), dims without the batch ({} or {F}).
  std::string ids_input;
  std::vector<int64_t> ids_dims;
  // Further graph inputs that are not initializers (a loss head's labels).
  std::set<std::string> other_inputs;
  // The initializers that are embedding tables (their rows live on the ps), as the import found them mapping
  // the file's own shapes; export needs trained rows for each (onnx_export.h). Set once, before the file is
  // shared.
  std::set<std::string> tables;

  std::unordered_map<std::string, std::vector<int>> readers;  // value name -> indices of the nodes reading it
  std::vector<std::string> outputs;                             // the graph's outputs, in order
  // ONNX shape inference's dims of each value it could infer (-1: unknown or symbolic), batch included.
  std::unordered_map<std::string, std::vector<int64_t>> inferred;
};

// Parses and checks `bytes` (the contents of `file`), reading the tensors kept in external data from files beside
// `file` (LoadExternalData, onnx_external_data.h: its errors for them). DataLoss when the bytes are not an ONNX
// model; InvalidArgument for bytes over protobuf's 2 GB limit (ModelFileTooLarge), and (one line, with
// kExportHint) for an IR version or opset outside the supported ones, another domain's node, an op dtrain does
// not compute, control flow (nn.EmbeddingBag's Loop or ATen export named as such), no usable input, an integer
// input that is not int64 ids [N] or [N, F] (or a loss head's labels); what ONNX's checker and its shape
// inference (strict) report.
absl::StatusOr<std::shared_ptr<OnnxFile>> ReadOnnxFile(std::string bytes, const std::string& file);

// "<file>: node '<name>' (<op>): <what>; <kExportHint>". Nodes without a name are called "<op>_<index>".
absl::Status NodeRefusal(const OnnxFile& f, int node, absl::string_view what);
std::string NodeName(const ::onnx::NodeProto& n, int index);
// "<file>: <what>; <kExportHint>".
absl::Status FileRefusal(const std::string& file, absl::string_view what);

// The ops the mapper computes (for the refusal of any other), as one line.
const std::string& SupportedOpsText();

}  // namespace dtrain::models::onnx

#endif  // DTRAIN_WORKER_MODELS_ONNX_ONNX_FILE_H_
