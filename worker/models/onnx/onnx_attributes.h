// Reading a NodeProto's attributes with ONNX's defaults (the checker has already verified their types).
// Internal to worker/models/onnx.
#ifndef DTRAIN_WORKER_MODELS_ONNX_ONNX_ATTRIBUTES_H_
#define DTRAIN_WORKER_MODELS_ONNX_ONNX_ATTRIBUTES_H_

#include <cstdint>
#include <string>
#include <vector>

#include "onnx/onnx_pb.h"

namespace dtrain::models::onnx {

inline const ::onnx::AttributeProto* FindAttr(const ::onnx::NodeProto& n, const std::string& name) {
  for (const ::onnx::AttributeProto& a : n.attribute()) {
    if (a.name() == name) return &a;
  }
  return nullptr;
}

inline int64_t AttrInt(const ::onnx::NodeProto& n, const std::string& name, int64_t fallback) {
  const ::onnx::AttributeProto* a = FindAttr(n, name);
  return a != nullptr ? a->i() : fallback;
}

inline float AttrFloat(const ::onnx::NodeProto& n, const std::string& name, float fallback) {
  const ::onnx::AttributeProto* a = FindAttr(n, name);
  return a != nullptr ? a->f() : fallback;
}

inline std::vector<int64_t> AttrInts(const ::onnx::NodeProto& n, const std::string& name) {
  const ::onnx::AttributeProto* a = FindAttr(n, name);
  if (a == nullptr) return {};
  return std::vector<int64_t>(a->ints().begin(), a->ints().end());
}

inline std::string AttrString(const ::onnx::NodeProto& n, const std::string& name, const std::string& fallback) {
  const ::onnx::AttributeProto* a = FindAttr(n, name);
  return a != nullptr ? a->s() : fallback;
}

// The node's input k, or "" when it is omitted (absent or named "").
inline std::string InputName(const ::onnx::NodeProto& n, int k) {
  return k < n.input_size() ? n.input(k) : std::string();
}

}  // namespace dtrain::models::onnx

#endif  // DTRAIN_WORKER_MODELS_ONNX_ONNX_ATTRIBUTES_H_
