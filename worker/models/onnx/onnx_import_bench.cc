// onnx_import_bench: how long importing a large ONNX file takes (a benchmark, not a test: the unit test
// onnx_import_test checks that such a file imports correctly, without a clock).
//
//   build/bin/onnx_import_bench [--repeats=5]
//
// Writes a 20.0 M-parameter file (fc layers 784 -> 5000 -> 3200 -> 10, 80 MB) to a temporary directory, imports
// it --repeats times (ImportModel, then ModelVariables as dtrain_worker does) and prints each time and the median:
// "import of 20.0 M parameters (80.1 MB): median 0.412 s over 5 (0.398 .. 0.455)". Exit 1 if an import fails.
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <string>
#include <vector>

#include "common/file_util.h"
#include "worker/models/model.h"
#include "worker/models/onnx/onnx_import.h"
#include "worker/models/onnx/onnx_test_util.h"

namespace {

using dtrain::models::onnx::testing::IntAttr;
using dtrain::models::onnx::testing::OnnxBuilder;

int Run(int repeats) {
  OnnxBuilder b;
  b.Input("x", {-1, 784})
      .Initializer("fc1.weight", {5000, 784}, std::vector<float>(5000 * 784, 0.01f))
      .Initializer("fc1.bias", {5000}, std::vector<float>(5000, 0.0f))
      .Initializer("fc2.weight", {3200, 5000}, std::vector<float>(3200 * 5000, 0.01f))
      .Initializer("fc2.bias", {3200}, std::vector<float>(3200, 0.0f))
      .Initializer("fc3.weight", {10, 3200}, std::vector<float>(32000, 0.01f))
      .Initializer("fc3.bias", {10}, std::vector<float>(10, 0.0f))
      .Node("Gemm", {"x", "fc1.weight", "fc1.bias"}, {"h1"}, {IntAttr("transB", 1)})
      .Node("Relu", {"h1"}, {"r1"})
      .Node("Gemm", {"r1", "fc2.weight", "fc2.bias"}, {"h2"}, {IntAttr("transB", 1)})
      .Node("Relu", {"h2"}, {"r2"})
      .Node("Gemm", {"r2", "fc3.weight", "fc3.bias"}, {"logits"}, {IntAttr("transB", 1)})
      .Output("logits", {-1, 10});
  std::string dir = (std::filesystem::temp_directory_path() / "onnx_import_bench.XXXXXX").string();
  if (mkdtemp(dir.data()) == nullptr) {
    std::fprintf(stderr, "onnx_import_bench: cannot make a temporary directory: %s\n", std::strerror(errno));
    return 1;
  }
  const std::string path = dir + "/big.onnx";
  const std::string bytes = b.Bytes();
  if (absl::Status s = dtrain::WriteFileAtomically(path, bytes); !s.ok()) {
    std::fprintf(stderr, "onnx_import_bench: %s\n", std::string(s.message()).c_str());
    return 1;
  }
  dtrain::models::ModelOptions o;
  o.channels = 1, o.height = 28, o.width = 28, o.num_classes = 10;
  std::vector<double> secs;
  int64_t params = 0;
  int rc = 0;
  for (int r = 0; r < repeats && rc == 0; ++r) {
    const auto start = std::chrono::steady_clock::now();
    absl::StatusOr<dtrain::models::ModelRef> spec = dtrain::models::onnx::ImportModel(path);
    absl::StatusOr<std::vector<dtrain::models::VariableInfo>> vars =
        spec.ok() ? dtrain::models::ModelVariables(**spec, o) : spec.status();
    secs.push_back(std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count());
    if (!vars.ok()) {
      std::fprintf(stderr, "onnx_import_bench: %s\n", std::string(vars.status().message()).c_str());
      rc = 1;
      break;
    }
    params = dtrain::models::TotalSize(*vars);
    std::printf("import %d: %.3f s\n", r + 1, secs.back());
  }
  std::filesystem::remove_all(dir);
  if (rc != 0) return rc;
  std::vector<double> sorted = secs;
  std::sort(sorted.begin(), sorted.end());
  std::printf("import of %.1f M parameters (%.1f MB): median %.3f s over %d (%.3f .. %.3f)\n", params / 1e6,
              bytes.size() / 1e6, sorted[sorted.size() / 2], repeats, sorted.front(), sorted.back());
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  int repeats = 5;
  for (int i = 1; i < argc; ++i) {
    if (std::strncmp(argv[i], "--repeats=", 10) == 0 && std::atoi(argv[i] + 10) > 0) {
      repeats = std::atoi(argv[i] + 10);
    } else {
      std::fprintf(stderr, "usage: onnx_import_bench [--repeats=N]  (N > 0)\n");
      return 2;
    }
  }
  return Run(repeats);
}
