#include "worker/towers.h"

#include <algorithm>
#include <future>
#include <utility>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "common/status_macros.h"
#include "kernels/gradient_averager.h"

namespace dtrain::worker {

struct Towers::DeviceAverager {
  std::unique_ptr<kernels::GradientAverager> reducer;
};

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
  const bool all_gpu = std::all_of(specs.begin(), specs.end(),
                                   [](const kernels::DeviceSpec& s) { return s.kind == kernels::DeviceSpec::Kind::kGpu; });
  if (specs.size() > 1) {
    std::vector<kernels::Device*> devs;
    for (auto& d : t->devices_) devs.push_back(d.get());
    t->device_averager_ = std::make_unique<DeviceAverager>();
    ASSIGN_OR_RETURN(
        t->device_averager_->reducer,
        kernels::CreateGradientAverager(devs, t->num_parameters(), kernels::AverageTarget::kFirstTower));
  }
  ASSIGN_OR_RETURN(t->host_params_, t->devices_[0]->AllocHostPinned(t->num_parameters()));
  ASSIGN_OR_RETURN(t->host_grads_, t->devices_[0]->AllocHostPinned(t->num_parameters()));
  if (!all_gpu) {
    for (size_t i = 1; i < specs.size(); ++i) t->tower_grads_.emplace_back(t->num_parameters());
  }
  return t;
}

Towers::~Towers() {
  if (!devices_.empty()) {
    if (host_params_ != nullptr) devices_[0]->FreeHostPinned(host_params_);
    if (host_grads_ != nullptr) devices_[0]->FreeHostPinned(host_grads_);
  }
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
  if (devices_[0]->spec().kind == kernels::DeviceSpec::Kind::kGpu)
    return ComputeOnDevices(batches, step, grads);

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
  std::vector<float*> buffers = {grads};
  for (auto& g : tower_grads_) buffers.push_back(g.data());
  RETURN_IF_ERROR(device_averager_->reducer->AverageInPlace(buffers));
  return static_cast<float>(loss / size());
}

absl::StatusOr<float> Towers::ComputeOnDevices(const std::vector<models::HostBatch>& batches, int64_t step,
                                               float* grads) {
  std::vector<std::future<absl::StatusOr<float>>> futures;
  for (int i = 0; i < size(); ++i) {
    futures.push_back(std::async(std::launch::async, [this, &batches, step, i] {
      return models_[i]->ComputeGradients(batches[i], step * 64 + i);
    }));
  }
  double loss = 0;
  absl::Status status;
  for (auto& f : futures) {
    absl::StatusOr<float> l = f.get();
    if (!l.ok() && status.ok()) status = l.status();
    if (l.ok()) loss += *l;
  }
  if (!status.ok()) return status;
  std::vector<float*> buffers;
  for (auto& m : models_) buffers.push_back(m->device_gradients());
  RETURN_IF_ERROR(device_averager_->reducer->AverageInPlace(buffers));
  RETURN_IF_ERROR(devices_[0]->CopyToHost(models_[0]->device_gradients(), grads, num_parameters()));
  return static_cast<float>(loss / size());
}

}  // namespace dtrain::worker
