// Import of ONNX models (ai.onnx domain, opsets 11-17, IR version <= 8): the file becomes a Graph
// (worker/models/graph.h) whose variables are its float initializers, under their ONNX names and starting from
// the file's values. See docs/models.md for what is supported and how to export from
// PyTorch.
//
// What the spec holds:
//   name       the file's stem ("resnet20"); path: the file as given
//   defaults   adam, learning rate 0.001, batch 100; pixels scaled to [0, 1] (--input_mean/--input_std
//              normalize them further); the data geometry of the file's input (benchmarks' synthetic data). A
//              model with an int64 ids input trains on click-through-rate data (ctr_data), its embedding
//              tables with lazy Adam (sparse_optimizer "adam") at the dense learning rate
//   build_graph  maps the file for the options' images: a (C, H, W) input must have their sizes, a flat
//              [N, F] input needs C*H*W = F (a Reshape in channels-first order goes in front); the output must
//              give num_classes logits, or one logit (sigmoid cross-entropy) for 2 classes. Click-through-rate
//              data: the float input takes the dense features, the ids input [N] or [N, num_sparse] the
//              categorical ones. InvalidArgument naming both shapes otherwise.
//   structure  a hash of the nodes (ops, attributes, wiring), so that a ps refuses a worker with another file
//   source     the parsed file, for export (worker/models/onnx/onnx_export.h)
//
// Usage:
//   ASSIGN_OR_RETURN(models::ModelRef spec, models::onnx::ImportModel("lenet5.onnx"));
//   ASSIGN_OR_RETURN(auto model, models::CreateModel(*spec, options, device));
//
// Thread-safety: plain functions; the spec is immutable and may be shared.
#ifndef DTRAIN_WORKER_MODELS_ONNX_ONNX_IMPORT_H_
#define DTRAIN_WORKER_MODELS_ONNX_ONNX_IMPORT_H_

#include <string>

#include "absl/status/statusor.h"
#include "worker/models/model.h"

namespace dtrain::models::onnx {

struct ImportOptions {
  // BatchNormalization's running_var update: unbiased batch variance (PyTorch) or biased (ONNX's reference).
  bool bn_unbiased_running_var = true;
  // Forward-only use (the operator tests): the graph's first output as it is, of any shape, with no loss head
  // (Loss::kNone: GraphNetwork runs it, CreateModel refuses it); Softmax and friends are then refused.
  bool forward_only = false;
};

// Reads and checks `path`, folds the constant shape arithmetic exporters emit, and maps every node onto the
// graph's ops. The spec's build_graph checks the data set's geometry and classes against the model's input and
// output; its `source` holds the parsed file for export (worker/models/onnx/onnx_export.h).
// Tensors kept in external data (files beside `path`, as torch.onnx.export writes a model over 2 GB) are read
// from there (onnx_external_data.h).
// Errors: NotFound (no such file, or no such external data file), DataLoss (not an ONNX protobuf),
// InvalidArgument for a file over protobuf's 2 GB limit, bad external data (naming the data file, the tensor and
// what is wrong), and with one line naming the node, its op and the attribute that is not supported, what is,
// and how to export instead.
absl::StatusOr<ModelRef> ImportModel(const std::string& path, const ImportOptions& options = {});

// The same from a file's contents in memory; `file` stands for its path (messages, the spec's name and path,
// and the directory external data locations are relative to).
absl::StatusOr<ModelRef> ImportModelFromBytes(std::string bytes, const std::string& file,
                                              const ImportOptions& options = {});

}  // namespace dtrain::models::onnx

#endif  // DTRAIN_WORKER_MODELS_ONNX_ONNX_IMPORT_H_
