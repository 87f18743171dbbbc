// Shared helpers of model.h (flat-buffer layout, initialization, signatures) and the model registry.
#include "worker/models/model.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <random>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "common/status_macros.h"
#include "worker/models/graph.h"
#include "worker/models/graph_model.h"

namespace dtrain::models {

int64_t VariableInfo::size() const {
  int64_t n = 1;
  for (int64_t d : shape) n *= d;
  return n;
}

int64_t TotalSize(const std::vector<VariableInfo>& vars) {
  int64_t n = 0;
  for (const VariableInfo& v : vars) n += v.size();
  return n;
}

std::vector<int64_t> Offsets(const std::vector<VariableInfo>& vars) {
  std::vector<int64_t> offsets;
  offsets.reserve(vars.size());
  int64_t n = 0;
  for (const VariableInfo& v : vars) {
    offsets.push_back(n);
    n += v.size();
  }
  return offsets;
}

namespace {

constexpr uint64_t kFnvOffset = 0xcbf29ce484222325ULL, kFnvPrime = 0x100000001b3ULL;

uint64_t Fnv1a(const std::string& s, uint64_t h = kFnvOffset) {
  for (unsigned char c : s) h = (h ^ c) * kFnvPrime;
  return h;
}

uint64_t SplitMix64(uint64_t x) {
  x += 0x9E3779B97F4A7C15ULL;
  x = (x ^ (x >> 30)) * 0xBF58476D1CE4E5B9ULL;
  x = (x ^ (x >> 27)) * 0x94D049BB133111EBULL;
  return x ^ (x >> 31);
}

// Standard normal samples from a 64-bit engine (Box-Muller written out, so the values do not depend on the
// standard library's distribution implementation).
class Normal {
 public:
  explicit Normal(uint64_t seed) : engine_(seed) {}
  double Next() {
    if (has_spare_) {
      has_spare_ = false;
      return spare_;
    }
    // u1 in (0, 1], u2 in [0, 1), 53-bit resolution.
    const double u1 = (static_cast<double>(engine_() >> 11) + 1.0) * 0x1.0p-53;
    const double u2 = static_cast<double>(engine_() >> 11) * 0x1.0p-53;
    const double r = std::sqrt(-2.0 * std::log(u1));
    spare_ = r * std::sin(2.0 * M_PI * u2);
    has_spare_ = true;
    return r * std::cos(2.0 * M_PI * u2);
  }

 private:
  std::mt19937_64 engine_;
  bool has_spare_ = false;
  double spare_ = 0.0;
};

}  // namespace

std::vector<float> InitialParameters(const std::vector<VariableInfo>& vars, uint64_t seed) {
  std::vector<float> params(TotalSize(vars));
  WriteInitialParameters(vars, seed, params.data());
  return params;
}

void WriteInitialParameters(const std::vector<VariableInfo>& vars, uint64_t seed, float* out) {
  for (const VariableInfo& v : vars) {
    const int64_t n = v.size();
    if (v.init.kind == Initializer::Kind::kConstant) {
      std::fill(out, out + n, v.init.value);
    } else if (v.init.kind == Initializer::Kind::kValues) {
      // The list was checked when the model was made (GraphBuilder): exactly n values.
      std::copy(v.init.values->begin(), v.init.values->begin() + n, out);
    } else {
      // One stream per variable, keyed by its name: adding a variable does not change the others' values.
      Normal normal(SplitMix64(seed ^ SplitMix64(Fnv1a(v.name))));
      for (int64_t i = 0; i < n; ++i) {
        double z;
        do {
          z = normal.Next();
        } while (std::fabs(z) > 2.0);  // TensorFlow's truncated_normal: resample beyond two stddevs
        out[i] = static_cast<float>(z * v.init.stddev);
      }
    }
    out += n;
  }
}

std::string Signature(const std::string& model_name, const std::vector<VariableInfo>& vars) {
  std::vector<std::string> shapes;
  uint64_t h = Fnv1a(model_name);
  for (const VariableInfo& v : vars) {
    shapes.push_back(absl::StrJoin(v.shape, "x"));
    h = Fnv1a(v.name + ":" + shapes.back() + ";", h);
  }
  char hash[17];
  std::snprintf(hash, sizeof(hash), "%016llx", static_cast<unsigned long long>(h));
  return absl::StrCat(model_name, "/v1/", absl::StrJoin(shapes, ","), "/", hash);
}

absl::StatusOr<std::vector<VariableInfo>> ModelVariables(const ModelSpec& spec, const ModelOptions& options) {
  ASSIGN_OR_RETURN(Graph graph, spec.build_graph(options));
  return graph.variables;
}

absl::StatusOr<std::unique_ptr<Model>> CreateModel(const ModelSpec& spec, const ModelOptions& options,
                                                   kernels::Device* device) {
  ASSIGN_OR_RETURN(Graph graph, spec.build_graph(options));
  return GraphModel::Create(std::move(graph), options, device);
}

std::string ModelSignature(const ModelSpec& spec, const std::vector<VariableInfo>& vars) {
  // Built-in models keep the signature they always had (checkpoints name it).
  if (!spec.imported()) {
    return Signature(spec.structure.empty() ? spec.name : absl::StrCat(spec.name, ":", spec.structure), vars);
  }
  return Signature(absl::StrCat("onnx:", spec.name, spec.structure.empty() ? "" : ":", spec.structure), vars);
}

void SetInputGeometry(const ModelDefaults& d, int height, int width, int channels, ModelOptions* o) {
  o->height = d.crop_height > 0 ? d.crop_height : height;
  o->width = d.crop_width > 0 ? d.crop_width : width;
  o->channels = channels;
}

int64_t DefaultDecaySteps(const ModelDefaults& d, int64_t examples_per_epoch, int batch_size) {
  if (d.decay_epochs <= 0 || batch_size <= 0) return 0;
  return std::max<int64_t>(1, examples_per_epoch / batch_size) * d.decay_epochs;
}

}  // namespace dtrain::models
