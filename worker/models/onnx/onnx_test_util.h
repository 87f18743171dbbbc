// Test helper: ONNX models written in C++ (what PyTorch's exporter would write), for the importer's and the
// exporter's tests.
//
//   OnnxBuilder b;                                   // ai.onnx opset 14, IR 7, producer "pytorch"
//   b.Input("x", {-1, 784});                         // -1: the dynamic batch axis "N"
//   b.Initializer("fc.weight", {10, 784}, values);
//   b.Node("Gemm", {"x", "fc.weight"}, {"logits"}, {IntAttr("transB", 1)});
//   b.Output("logits", {-1, 10});
//   absl::StatusOr<ModelRef> spec = ImportModelFromBytes(b.Bytes(), "mlp.onnx");
#ifndef DTRAIN_WORKER_MODELS_ONNX_ONNX_TEST_UTIL_H_
#define DTRAIN_WORKER_MODELS_ONNX_ONNX_TEST_UTIL_H_

#include <cstdint>
#include <fstream>
#include <string>
#include <utility>
#include <vector>

#include "onnx/onnx_pb.h"

namespace dtrain::models::onnx::testing {

inline ::onnx::AttributeProto IntAttr(const std::string& name, int64_t v) {
  ::onnx::AttributeProto a;
  a.set_name(name);
  a.set_type(::onnx::AttributeProto::INT);
  a.set_i(v);
  return a;
}
inline ::onnx::AttributeProto FloatAttr(const std::string& name, float v) {
  ::onnx::AttributeProto a;
  a.set_name(name);
  a.set_type(::onnx::AttributeProto::FLOAT);
  a.set_f(v);
  return a;
}
inline ::onnx::AttributeProto IntsAttr(const std::string& name, const std::vector<int64_t>& v) {
  ::onnx::AttributeProto a;
  a.set_name(name);
  a.set_type(::onnx::AttributeProto::INTS);
  for (int64_t x : v) a.add_ints(x);
  return a;
}
inline ::onnx::AttributeProto StringAttr(const std::string& name, const std::string& v) {
  ::onnx::AttributeProto a;
  a.set_name(name);
  a.set_type(::onnx::AttributeProto::STRING);
  a.set_s(v);
  return a;
}

inline ::onnx::TensorProto FloatTensor(const std::string& name, const std::vector<int64_t>& dims,
                                       const std::vector<float>& values, bool raw = true) {
  ::onnx::TensorProto t;
  t.set_name(name);
  t.set_data_type(::onnx::TensorProto::FLOAT);
  for (int64_t d : dims) t.add_dims(d);
  if (raw) {
    t.set_raw_data(std::string(reinterpret_cast<const char*>(values.data()), values.size() * sizeof(float)));
  } else {
    for (float v : values) t.add_float_data(v);
  }
  return t;
}
inline ::onnx::TensorProto IntTensor(const std::string& name, const std::vector<int64_t>& dims,
                                     const std::vector<int64_t>& values) {
  ::onnx::TensorProto t;
  t.set_name(name);
  t.set_data_type(::onnx::TensorProto::INT64);
  for (int64_t d : dims) t.add_dims(d);
  for (int64_t v : values) t.add_int64_data(v);
  return t;
}

// 0.01 * (i % 17 - 8): small, varied, reproducible values.
inline std::vector<float> Ramp(int64_t n, float scale = 0.01f) {
  std::vector<float> v(n);
  for (int64_t i = 0; i < n; ++i) v[i] = scale * static_cast<float>(i % 17 - 8);
  return v;
}

// A float tensor type of these dims (-1: the symbolic batch axis "N").
inline void SetTensorType(::onnx::TypeProto* type, const std::vector<int64_t>& dims,
                          int elem_type = ::onnx::TensorProto::FLOAT) {
  auto* t = type->mutable_tensor_type();
  t->set_elem_type(elem_type);
  for (int64_t d : dims) {
    auto* dim = t->mutable_shape()->add_dim();
    if (d < 0) {
      dim->set_dim_param("N");
    } else {
      dim->set_dim_value(d);
    }
  }
}

class OnnxBuilder {
 public:
  explicit OnnxBuilder(int opset = 14, int ir_version = 7) {
    model_.set_ir_version(ir_version);
    model_.set_producer_name("pytorch");
    model_.set_producer_version("1.13.0");
    auto* o = model_.add_opset_import();
    o->set_domain("");
    o->set_version(opset);
    model_.mutable_graph()->set_name("torch_jit");
  }

  // dims with -1 for the symbolic batch axis "N".
  OnnxBuilder& Input(const std::string& name, const std::vector<int64_t>& dims,
                     int elem_type = ::onnx::TensorProto::FLOAT) {
    auto* in = model_.mutable_graph()->add_input();
    in->set_name(name);
    SetTensorType(in->mutable_type(), dims, elem_type);
    return *this;
  }
  OnnxBuilder& Initializer(const std::string& name, const std::vector<int64_t>& dims, const std::vector<float>& v) {
    *model_.mutable_graph()->add_initializer() = FloatTensor(name, dims, v);
    return *this;
  }
  OnnxBuilder& IntInitializer(const std::string& name, const std::vector<int64_t>& dims,
                              const std::vector<int64_t>& v) {
    *model_.mutable_graph()->add_initializer() = IntTensor(name, dims, v);
    return *this;
  }
  // A node named "/<op>_<k>" like PyTorch's, unless `name` is given.
  OnnxBuilder& Node(const std::string& op, const std::vector<std::string>& inputs,
                    const std::vector<std::string>& outputs, const std::vector<::onnx::AttributeProto>& attrs = {},
                    const std::string& name = "", const std::string& domain = "") {
    auto* n = model_.mutable_graph()->add_node();
    n->set_op_type(op);
    n->set_name(name.empty() ? "/" + op + "_" + std::to_string(model_.graph().node_size() - 1) : name);
    if (!domain.empty()) n->set_domain(domain);
    for (const std::string& i : inputs) n->add_input(i);
    for (const std::string& o : outputs) n->add_output(o);
    for (const auto& a : attrs) *n->add_attribute() = a;
    return *this;
  }
  // A Constant node holding `t` (its output named t.name()).
  OnnxBuilder& Constant(const ::onnx::TensorProto& t) {
    ::onnx::AttributeProto a;
    a.set_name("value");
    a.set_type(::onnx::AttributeProto::TENSOR);
    *a.mutable_t() = t;
    return Node("Constant", {}, {t.name()}, {a});
  }
  // dims with -1 for the batch axis "N".
  OnnxBuilder& Output(const std::string& name, const std::vector<int64_t>& dims) {
    auto* o = model_.mutable_graph()->add_output();
    o->set_name(name);
    SetTensorType(o->mutable_type(), dims);
    return *this;
  }

  ::onnx::ModelProto& model() { return model_; }
  const ::onnx::ModelProto& model() const { return model_; }
  std::string Bytes() const { return model_.SerializeAsString(); }

 private:
  ::onnx::ModelProto model_;
};

// Conv(1->4) [BN] ReLU -> Conv(4->4) [BN] + the ReLU's output -> ReLU -> GlobalAveragePool -> Flatten -> Gemm(10),
// what PyTorch exports for a one-block residual net in training mode (28x28x1 images, 10 classes).
inline std::string ResidualNetBytes(bool batch_norm) {
  OnnxBuilder b;
  b.Input("x", {-1, 1, 28, 28});
  const std::vector<::onnx::AttributeProto> conv = {IntsAttr("kernel_shape", {3, 3}), IntsAttr("pads", {1, 1, 1, 1}),
                                                   IntsAttr("strides", {1, 1})};
  b.Initializer("conv1.weight", {4, 1, 3, 3}, Ramp(36, 0.05f));
  b.Initializer("conv2.weight", {4, 4, 3, 3}, Ramp(144, 0.03f));
  std::string h1 = "c1", h2 = "c2";
  if (batch_norm) {
    b.Node("Conv", {"x", "conv1.weight"}, {"c1"}, conv);
    for (const char* bn : {"bn1", "bn2"}) {
      b.Initializer(std::string(bn) + ".weight", {4}, {1.0f, 0.9f, 1.1f, 1.2f});
      b.Initializer(std::string(bn) + ".bias", {4}, {0.0f, 0.1f, -0.1f, 0.05f});
      b.Initializer(std::string(bn) + ".running_mean", {4}, {0, 0, 0, 0});
      b.Initializer(std::string(bn) + ".running_var", {4}, {1, 1, 1, 1});
    }
    const std::vector<::onnx::AttributeProto> bn = {FloatAttr("epsilon", 1e-5f), FloatAttr("momentum", 0.9f),
                                                   IntAttr("training_mode", 1)};
    b.Node("BatchNormalization", {"c1", "bn1.weight", "bn1.bias", "bn1.running_mean", "bn1.running_var"},
           {"b1", "bn1_mean_out", "bn1_var_out"}, bn);
    h1 = "b1";
    b.Node("Relu", {h1}, {"r1"});
    b.Node("Conv", {"r1", "conv2.weight"}, {"c2"}, conv);
    b.Node("BatchNormalization", {"c2", "bn2.weight", "bn2.bias", "bn2.running_mean", "bn2.running_var"},
           {"b2", "bn2_mean_out", "bn2_var_out"}, bn);
    h2 = "b2";
  } else {
    b.Initializer("conv1.bias", {4}, {0.1f, 0.0f, -0.1f, 0.05f});
    b.Initializer("conv2.bias", {4}, {0.0f, 0.02f, 0.0f, -0.02f});
    b.Node("Conv", {"x", "conv1.weight", "conv1.bias"}, {"c1"}, conv);
    b.Node("Relu", {h1}, {"r1"});
    b.Node("Conv", {"r1", "conv2.weight", "conv2.bias"}, {"c2"}, conv);
  }
  b.Node("Add", {h2, "r1"}, {"sum"});
  b.Node("Relu", {"sum"}, {"r2"});
  b.Node("GlobalAveragePool", {"r2"}, {"gap"});
  b.Node("Flatten", {"gap"}, {"flat"}, {IntAttr("axis", 1)});
  b.Initializer("fc.weight", {10, 4}, Ramp(40, 0.1f));
  b.Initializer("fc.bias", {10}, Ramp(10, 0.01f));
  b.Node("Gemm", {"flat", "fc.weight", "fc.bias"}, {"logits"}, {IntAttr("transB", 1)});
  b.Output("logits", {-1, 10});
  return b.Bytes();
}

// Moves the data of the tensors named (initializers, or Constant nodes' values by their output's name) into the
// file `dir`/`location`, one after another at offsets 0, `align`, ... (zeros between), and points each tensor
// there as onnx.save_model(..., save_as_external_data=True) does (location, offset, length). float_data becomes
// raw bytes. Returns false (and writes nothing) when a name is not found.
inline bool MoveToExternalData(::onnx::ModelProto* m, const std::vector<std::string>& names, const std::string& dir,
                               const std::string& location, int64_t align = 16) {
  std::vector<::onnx::TensorProto*> tensors;
  for (const std::string& name : names) {
    ::onnx::TensorProto* found = nullptr;
    for (::onnx::TensorProto& t : *m->mutable_graph()->mutable_initializer()) {
      if (t.name() == name) found = &t;
    }
    for (::onnx::NodeProto& n : *m->mutable_graph()->mutable_node()) {
      if (n.op_type() == "Constant" && n.output(0) == name) found = n.mutable_attribute(0)->mutable_t();
    }
    if (found == nullptr) return false;
    tensors.push_back(found);
  }
  std::string data;
  for (::onnx::TensorProto* t : tensors) {
    if (t->float_data_size() > 0) {
      t->set_raw_data(std::string(reinterpret_cast<const char*>(t->float_data().data()),
                                  t->float_data_size() * sizeof(float)));
      t->clear_float_data();
    }
    if (t->int64_data_size() > 0) {
      t->set_raw_data(std::string(reinterpret_cast<const char*>(t->int64_data().data()),
                                  t->int64_data_size() * sizeof(int64_t)));
      t->clear_int64_data();
    }
    data.resize((data.size() + align - 1) / align * align, '\0');
    const size_t offset = data.size();
    data += t->raw_data();
    t->clear_raw_data();
    t->set_data_location(::onnx::TensorProto::EXTERNAL);
    for (const auto& [key, value] : {std::pair<std::string, std::string>("location", location),
                                     {"offset", std::to_string(offset)},
                                     {"length", std::to_string(data.size() - offset)}}) {
      auto* e = t->add_external_data();
      e->set_key(key);
      e->set_value(value);
    }
  }
  std::ofstream out(dir + "/" + location, std::ios::binary | std::ios::trunc);
  out.write(data.data(), static_cast<std::streamsize>(data.size()));
  return out.good();
}

}  // namespace dtrain::models::onnx::testing

#endif  // DTRAIN_WORKER_MODELS_ONNX_ONNX_TEST_UTIL_H_
