// Internal: the architecture of each known model as a layer list (one .cc per model: mlp.cc, cnn.cc,
// convnet.cc, cifar10.cc) and its training defaults. Used by model.cc's registry; not part of the public API.
//
// Thread-safety: plain functions without state.
#ifndef DTRAIN_WORKER_MODELS_MODEL_DEFS_H_
#define DTRAIN_WORKER_MODELS_MODEL_DEFS_H_

#include <vector>

#include "worker/models/layers.h"
#include "worker/models/model.h"

namespace dtrain::models {

struct ModelDef {
  const char* name;
  // The layer list for the options' input geometry and class count (shape errors surface later, in
  // InferShapes).
  std::vector<LayerSpec> (*layers)(const ModelOptions& options);
  ModelDefaults defaults;
};

const ModelDef& MlpDef();      // mlp.cc
const ModelDef& CnnDef();      // cnn.cc
const ModelDef& ConvnetDef();  // convnet.cc
const ModelDef& Cifar10Def();  // cifar10.cc

}  // namespace dtrain::models

#endif  // DTRAIN_WORKER_MODELS_MODEL_DEFS_H_
