// The model registry: resolves --model once, a built-in name (mlp, cnn, convnet, cifar10) or the path of an ONNX
// file, into the ModelSpec that every part of the worker then uses (worker/models/model.h).
//
// Example:
//   ASSIGN_OR_RETURN(models::ModelRef model, models::ResolveModel(flags.model));
//   ASSIGN_OR_RETURN(auto tower, models::CreateModel(*model, options, device));
//
// Thread-safety: plain functions; the returned spec is immutable.
#ifndef DTRAIN_WORKER_MODELS_REGISTRY_H_
#define DTRAIN_WORKER_MODELS_REGISTRY_H_

#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "worker/models/dlrm.h"
#include "worker/models/model.h"

namespace dtrain::models {

struct ResolveOptions {
  // Imported BatchNormalization: update running_var with the unbiased batch variance (PyTorch's rule; the
  // default, since exported models come from PyTorch) or the biased one (ONNX's reference implementation).
  bool bn_unbiased_running_var = true;
  // --model=dlrm: its layer widths and tables (worker/models/dlrm.h).
  DlrmConfig dlrm;
};

// A name without ".onnx" is a built-in model; anything ending in ".onnx" (or naming an existing file) is
// imported. InvalidArgument: an unknown name (listing the known ones), or a file the importer refuses (its
// message names the node, op and attribute); NotFound / DataLoss for a missing or unreadable file.
absl::StatusOr<ModelRef> ResolveModel(const std::string& model, const ResolveOptions& options = {});

// "mlp", "cnn", "convnet", "cifar10", "dlrm".
std::vector<std::string> BuiltinModelNames();

}  // namespace dtrain::models

#endif  // DTRAIN_WORKER_MODELS_REGISTRY_H_
