#include "worker/towers.h"

#include <future>
#include <utility>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "common/status_macros.h"

namespace dtrain::worker {

absl::StatusOr<std::vector<kernels::DeviceSpec>> ParseTowers(const std::string& towers, int num_gpus,
                                                             int threads) {
  if (threads < 1) return absl::InvalidArgumentError(absl::StrCat("--threads must be >= 1, got ", threads));
  std::vector<kernels::DeviceSpec> specs;
  if (towers.empty() && num_gpus > 0) {
    for (int i = 0; i < num_gpus; ++i) specs.push_back(kernels::DeviceSpec::Gpu(i));
    return specs;
  }
  int cpu_towers = 0;
  int n = 0;
  if (towers.empty()) {
    cpu_towers = 1;
  } else if (absl::SimpleAtoi(towers, &n)) {
    if (n < 1 || n > 64) return absl::InvalidArgumentError(absl::StrCat("--towers=", towers, ": need 1..64"));
    cpu_towers = n;
  } else {
    for (absl::string_view item : absl::StrSplit(towers, ',')) {
      int index = 0;
      if (item == "cpu") {
        ++cpu_towers;
      } else if (absl::ConsumePrefix(&item, "gpu:") && absl::SimpleAtoi(item, &index) && index >= 0) {
        specs.push_back(kernels::DeviceSpec::Gpu(index));
      } else {
        return absl::InvalidArgumentError(absl::StrCat("--towers=", towers, ": bad tower '", item,
                                                       "' (expected N, cpu, or gpu:INDEX)"));
      }
    }
    if (cpu_towers > 0 && !specs.empty()) {
      return absl::InvalidArgumentError(absl::StrCat("--towers=", towers, ": mix of cpu and gpu towers"));
    }
  }
  for (int i = 0; i < cpu_towers; ++i) {
    // Split the threads: the first (threads % towers) towers get one more.
    const int t = std::max(1, threads / cpu_towers + (i < threads % cpu_towers ? 1 : 0));
    specs.push_back(kernels::DeviceSpec::Cpu(t));
  }
  return specs;
}

absl::StatusOr<std::unique_ptr<Towers>> Towers::Create(const std::string& model_name,
                                                       const models::ModelOptions& options,
                                                       const std::vector<kernels::DeviceSpec>& specs) {
  if (specs.empty()) return absl::InvalidArgumentError("no towers");
  std::unique_ptr<Towers> t(new Towers());
  for (const kernels::DeviceSpec& spec : specs) {
    ASSIGN_OR_RETURN(std::unique_ptr<kernels::Device> dev, kernels::CreateDevice(spec));
    ASSIGN_OR_RETURN(std::unique_ptr<models::Model> model, models::CreateModel(model_name, options, dev.get()));
    t->devices_.push_back(std::move(dev));
    t->models_.push_back(std::move(model));
  }
  for (size_t i = 1; i < specs.size(); ++i) t->tower_grads_.emplace_back(t->num_parameters());
  return t;
}

Towers::~Towers() {
  models_.clear();  // models before the devices that own their memory
  devices_.clear();
}

absl::Status Towers::SetParameters(const float* params) {
  for (auto& m : models_) RETURN_IF_ERROR(m->SetParameters(params));
  return absl::OkStatus();
}

absl::StatusOr<float> Towers::ComputeGradients(const std::vector<models::HostBatch>& batches, int64_t step,
                                               float* grads) {
  if (static_cast<int>(batches.size()) != size()) {
    return absl::InvalidArgumentError(absl::StrCat(batches.size(), " batches for ", size(), " towers"));
  }
  if (size() == 1) return models_[0]->TrainStep(batches[0], step * 64, grads);

  std::vector<std::future<absl::StatusOr<float>>> futures;
  for (int i = 1; i < size(); ++i) {
    futures.push_back(std::async(std::launch::async, [this, &batches, step, i] {
      // Each tower draws its own dropout masks: offset the counter by the tower index.
      return models_[i]->TrainStep(batches[i], step * 64 + i, tower_grads_[i - 1].data());
    }));
  }
  absl::StatusOr<float> loss0 = models_[0]->TrainStep(batches[0], step * 64, grads);
  double loss = 0;
  absl::Status status = loss0.status();
  if (loss0.ok()) loss += *loss0;
  for (auto& f : futures) {
    absl::StatusOr<float> l = f.get();
    if (!l.ok() && status.ok()) status = l.status();
    if (l.ok()) loss += *l;
  }
  if (!status.ok()) return status;
  // Average: grads = (g0 + g1 + ... ) / n.
  const int64_t n = num_parameters();
  const float inv = 1.0f / size();
  for (const auto& g : tower_grads_) {
    const float* __restrict src = g.data();
    float* __restrict dst = grads;
    for (int64_t j = 0; j < n; ++j) dst[j] += src[j];
  }
  for (int64_t j = 0; j < n; ++j) grads[j] *= inv;
  return static_cast<float>(loss / size());
}

}  // namespace dtrain::worker
