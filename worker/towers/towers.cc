#include "worker/towers/towers.h"

#include <algorithm>
#include <future>
#include <map>
#include <utility>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "absl/synchronization/mutex.h"
#include "common/denormals.h"
#include "common/status_macros.h"
#include "kernels/gradient_averager.h"

namespace dtrain::worker {

absl::StatusOr<std::vector<kernels::DeviceSpec>> ParseTowers(const std::string& towers, int num_gpus, int threads,
                                                             kernels::ComputeDtype dtype) {
  if (threads < 1) return absl::InvalidArgumentError(absl::StrCat("--threads must be >= 1, got ", threads));
  std::vector<kernels::DeviceSpec> specs;
  if (towers.empty() && num_gpus > 0) {
    for (int i = 0; i < num_gpus; ++i) specs.push_back(kernels::DeviceSpec::Gpu(i, dtype));
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
        specs.push_back(kernels::DeviceSpec::Gpu(index, dtype));
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
    specs.push_back(kernels::DeviceSpec::Cpu(t, dtype));
  }
  return specs;
}

absl::StatusOr<std::unique_ptr<Towers>> Towers::Create(const models::ModelSpec& model,
                                                       const models::ModelOptions& options,
                                                       const std::vector<kernels::DeviceSpec>& specs,
                                                       const TowersOptions& towers_options) {
  if (specs.empty()) return absl::InvalidArgumentError("no towers");
  std::unique_ptr<Towers> t(new Towers());
  auto is_gpu = [](const kernels::DeviceSpec& s) { return s.kind == kernels::DeviceSpec::Kind::kGpu; };
  t->gpu_ = std::all_of(specs.begin(), specs.end(), is_gpu);
  t->host_resident_ = std::none_of(specs.begin(), specs.end(), is_gpu) && towers_options.cpu_in_place;
  ASSIGN_OR_RETURN(std::vector<models::VariableInfo> vars, models::ModelVariables(model, options));
  const int64_t n = models::TotalSize(vars);
  for (const kernels::DeviceSpec& spec : specs) {
    ASSIGN_OR_RETURN(std::unique_ptr<kernels::Device> dev, kernels::CreateDevice(spec));
    t->devices_.push_back(std::move(dev));
  }
  if (t->host_resident_ && towers_options.host_memory != nullptr) {
    t->host_memory_ = towers_options.host_memory;
    ASSIGN_OR_RETURN(t->host_params_, t->host_memory_->Allocate(n));
    ASSIGN_OR_RETURN(t->host_grads_, t->host_memory_->Allocate(n));
  } else {
    ASSIGN_OR_RETURN(t->host_params_, t->devices_[0]->AllocHostPinned(n));
    ASSIGN_OR_RETURN(t->host_grads_, t->devices_[0]->AllocHostPinned(n));
  }
  std::fill(t->host_params_, t->host_params_ + n, 0.0f);
  std::fill(t->host_grads_, t->host_grads_ + n, 0.0f);
  for (size_t i = 0; i < specs.size(); ++i) {
    models::ModelOptions o = options;
    if (t->host_resident_) {
      // Every CPU tower reads the one host parameter buffer; tower 0 writes the host gradient buffer.
      o.params_buffer = t->host_params_;
      if (i == 0) {
        o.grads_buffer = t->host_grads_;
      } else {
        ASSIGN_OR_RETURN(o.grads_buffer, t->devices_[i]->Alloc(n));
        t->tower_grads_.push_back(o.grads_buffer);
      }
    }
    ASSIGN_OR_RETURN(std::unique_ptr<models::Model> model,
                     models::CreateModel(model, o, t->devices_[i].get()));
    t->models_.push_back(std::move(model));
  }
  if (specs.size() > 1) {
    std::vector<kernels::Device*> devs;
    for (auto& d : t->devices_) devs.push_back(d.get());
    const kernels::AverageTarget target = !t->host_resident_ && towers_options.replicated
                                              ? kernels::AverageTarget::kEveryTower
                                              : kernels::AverageTarget::kFirstTower;
    ASSIGN_OR_RETURN(t->averager_, kernels::CreateGradientAverager(devs, n, target));
  }
  if (!t->host_resident_) {
    const int64_t image_floats =
        static_cast<int64_t>(options.batch_size) * options.height * options.width * options.channels;
    t->uploaded_.resize(specs.size());
    for (size_t i = 0; i < specs.size(); ++i) {
      kernels::Device* dev = t->devices_[i].get();
      ASSIGN_OR_RETURN(std::unique_ptr<kernels::DeviceCounter> counter, dev->MakeCounter(0));
      t->counters_.push_back(std::move(counter));
      ASSIGN_OR_RETURN(std::unique_ptr<InputStager> stager,
                       InputStager::Create(dev, image_floats, options.batch_size));
      t->stagers_.push_back(std::move(stager));
      ASSIGN_OR_RETURN(std::unique_ptr<kernels::AsyncReadback> reader,
                       kernels::AsyncReadback::Create(dev, 1));
      t->loss_readers_.push_back(std::move(reader));
      ASSIGN_OR_RETURN(std::unique_ptr<kernels::Event> done, dev->MakeEvent());
      t->step_done_.push_back(std::move(done));
    }
  }
  return t;
}

Towers::~Towers() {
  // Copies may still be in flight into the host buffers (a step that ended with an error).
  for (auto& d : devices_) (void)d->Synchronize();
  stagers_.clear();
  loss_readers_.clear();
  uploaded_.clear();
  produced_.clear();
  downloaded_.clear();
  step_done_.clear();
  averager_.reset();
  models_.clear();  // models before the buffers and devices they use
  counters_.clear();
  for (size_t i = 0; i < tower_grads_.size(); ++i) devices_[i + 1]->Free(tower_grads_[i]);
  if (!devices_.empty()) {
    if (host_memory_ != nullptr) {
      host_memory_->Free(host_params_);
      host_memory_->Free(host_grads_);
    } else {
      if (host_params_ != nullptr) devices_[0]->FreeHostPinned(host_params_);
      if (host_grads_ != nullptr) devices_[0]->FreeHostPinned(host_grads_);
    }
  }
  devices_.clear();
}

absl::Status Towers::SetParameters(const float* params) {
  if (host_resident_) {
    if (params != host_params_) std::copy(params, params + num_parameters(), host_params_);
    return absl::OkStatus();
  }
  for (auto& m : models_) RETURN_IF_ERROR(m->SetParameters(params));
  return absl::OkStatus();
}

absl::StatusOr<float> Towers::ComputeGradients(const std::vector<models::HostBatch>& batches, int64_t step,
                                               const models::StepHooks* hooks) {
  if (static_cast<int>(batches.size()) != size()) {
    return absl::InvalidArgumentError(absl::StrCat(batches.size(), " batches for ", size(), " towers"));
  }
  SetFlushDenormals();  // tower 0 computes on the calling thread
  return host_resident_ ? ComputeResident(batches, step, hooks) : ComputeOnDevices(batches, step, hooks);
}

absl::StatusOr<float> Towers::ComputeResident(const std::vector<models::HostBatch>& batches, int64_t step,
                                              const models::StepHooks* hooks) {
  // Each tower draws its own dropout masks: the counter is offset by the tower index.
  if (size() == 1) return models_[0]->ComputeGradients(batches[0], step * 64, hooks);

  // Several towers: a layer's gradients are averaged (into tower 0's, the host buffer) by the tower that
  // finishes the layer last, and only then handed on.
  absl::Mutex mu;
  std::map<int64_t, int> remaining;  // range begin -> towers still computing it
  std::vector<float*> buffers = {host_grads_};
  buffers.insert(buffers.end(), tower_grads_.begin(), tower_grads_.end());
  models::StepHooks tower_hooks;
  if (hooks != nullptr) {
    tower_hooks.before_forward = hooks->before_forward;
    tower_hooks.after_forward = hooks->after_forward;
  }
  tower_hooks.gradients_ready = [&](int64_t begin, int64_t end) -> absl::Status {
    absl::MutexLock lock(&mu);
    auto it = remaining.try_emplace(begin, size()).first;
    if (--it->second > 0) return absl::OkStatus();
    RETURN_IF_ERROR(averager_->AverageRange(buffers, begin, end - begin));
    RETURN_IF_ERROR(averager_->Join());
    if (hooks != nullptr && hooks->gradients_ready) return hooks->gradients_ready(begin, end);
    return absl::OkStatus();
  };
  std::vector<std::future<absl::StatusOr<float>>> futures;
  for (int i = 1; i < size(); ++i) {
    futures.push_back(std::async(std::launch::async, [this, &batches, &tower_hooks, step, i] {
      SetFlushDenormals();
      return models_[i]->ComputeGradients(batches[i], step * 64 + i, &tower_hooks);
    }));
  }
  absl::StatusOr<float> loss0 = models_[0]->ComputeGradients(batches[0], step * 64, &tower_hooks);
  double loss = 0;
  absl::Status status = loss0.status();
  if (loss0.ok()) loss += *loss0;
  for (auto& f : futures) {
    absl::StatusOr<float> l = f.get();
    if (!l.ok() && status.ok()) status = l.status();
    if (l.ok()) loss += *l;
  }
  if (!status.ok()) return status;
  return static_cast<float>(loss / size());
}

}  // namespace dtrain::worker
