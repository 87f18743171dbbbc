// dtrain_eval: evaluates a checkpoint written by the ps tasks on the test set, and optionally exports its
// weights as a NumPy .npz.
//
//   dtrain_eval --checkpoint=/ckpt/model.ckpt-2000 --model=cnn --data_dir=/usr/share/datasets/fashion-mnist
//   dtrain_eval --checkpoint=/ckpt --model=cnn --use_moving_averages --export=/tmp/cnn.npz
//
// --checkpoint is a prefix <dir>/model.ckpt-<step> (all its .psI-of-N files are read) or a directory (its
// newest complete, valid step). Prints "checkpoint model.ckpt-<step>: test accuracy = 0.8512 (10000 examples)".
// Exit codes: 0 ok, 1 a failure (unreadable or mismatched checkpoint, data), 2 bad flags.
#include <algorithm>
#include <cstdio>
#include <memory>
#include <string>
#include <vector>

#include <glog/logging.h>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/flags/usage.h"
#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "common/status_macros.h"
#include "kernels/device.h"
#include "common/env.h"
#include "ps/checkpoint/checkpoint_set.h"
#include "worker/data/dataset.h"
#include "worker/models/model.h"
#include "worker/models/registry.h"
#include "worker/npz_writer.h"

ABSL_FLAG(std::string, checkpoint, "", "Checkpoint prefix <dir>/model.ckpt-<step>, or a directory (newest step)");
ABSL_FLAG(std::string, model, "mlp", "Model the checkpoint was trained with: mlp | cnn | convnet | cifar10");
ABSL_FLAG(std::string, data_dir, "/usr/share/datasets/fashion-mnist", "Data set directory (its test split)");
ABSL_FLAG(bool, use_moving_averages, false, "Evaluate the moving averages of the weights instead of the weights");
ABSL_FLAG(std::string, export, "", "Also write the weights to this .npz file (one <variable>.npy per variable)");
ABSL_FLAG(int, batch_size, 500, "Examples per evaluation batch");
ABSL_FLAG(int, threads, 1, "CPU threads for the model's ops");
ABSL_FLAG(bool, skip_eval, false, "Only --export, do not evaluate (the data set is still read for its shape)");

namespace dtrain::worker {
namespace {

struct EvalOptions {
  std::string checkpoint, model, data_dir, export_path;
  bool use_moving_averages = false, skip_eval = false;
  int batch_size = 500, threads = 1;
};

absl::Status RunEval(const EvalOptions& o) {
  ASSIGN_OR_RETURN(std::vector<ps::CheckpointData> parts, ps::ReadCheckpointSet(Env::Default(), o.checkpoint));
  const int64_t step = parts[0].global_step;
  ASSIGN_OR_RETURN(data::DatasetPair dataset, data::LoadDataset(o.data_dir));
  ASSIGN_OR_RETURN(models::ModelRef spec, models::ResolveModel(o.model));
  const models::ModelDefaults& defaults = spec->defaults;

  models::ModelOptions mopt;
  mopt.batch_size = o.batch_size;
  mopt.eval_batch_size = o.batch_size;
  models::SetInputGeometry(defaults, dataset.test.height, dataset.test.width, dataset.test.channels, &mopt);
  mopt.num_classes = dataset.test.num_classes;
  ASSIGN_OR_RETURN(std::vector<models::VariableInfo> vars, models::ModelVariables(*spec, mopt));
  const std::string signature = models::ModelSignature(*spec, vars);
  if (parts[0].model_signature != signature) {
    return absl::FailedPreconditionError(absl::StrCat(
        "the checkpoint is of model '", parts[0].model_signature, "', but --model=", o.model, " on ", o.data_dir,
        " is '", signature, "': pass the --model (and data set) it was trained with"));
  }
  ASSIGN_OR_RETURN(std::vector<float> params,
                   ps::AssembleFlatBuffer(parts, models::TotalSize(vars), o.use_moving_averages));

  if (!o.export_path.empty()) {
    std::vector<NpyArray> arrays;
    const std::vector<int64_t> offsets = models::Offsets(vars);
    for (size_t i = 0; i < vars.size(); ++i) {
      arrays.push_back(NpyArray{NpzNameForVariable(vars[i].name), vars[i].shape,
                                std::vector<float>(params.begin() + offsets[i],
                                                   params.begin() + offsets[i] + vars[i].size())});
    }
    RETURN_IF_ERROR(WriteNpz(o.export_path, arrays));
    std::printf("exported %zu variables of model.ckpt-%lld%s to %s\n", arrays.size(), static_cast<long long>(step),
                o.use_moving_averages ? " (moving averages)" : "", o.export_path.c_str());
  }
  if (o.skip_eval) return absl::OkStatus();

  ASSIGN_OR_RETURN(std::unique_ptr<kernels::Device> device,
                   kernels::CreateDevice(kernels::DeviceSpec::Cpu(o.threads)));
  ASSIGN_OR_RETURN(std::unique_ptr<models::Model> model, models::CreateModel(*spec, mopt, device.get()));
  RETURN_IF_ERROR(model->SetParameters(params.data()));
  const std::vector<data::Batch> batches =
      data::EvalBatches(dataset.test, o.batch_size, defaults.eval_preprocess, mopt.height, mopt.width);
  int64_t correct = 0, total = 0;
  for (const data::Batch& b : batches) {
    const models::HostBatch view{b.batch, b.height, b.width, b.channels, b.images.data(), b.labels.data()};
    ASSIGN_OR_RETURN(int c, model->CountCorrect(view));
    correct += c;
    total += b.batch;
  }
  if (total == 0) return absl::FailedPreconditionError(absl::StrCat("the test set in ", o.data_dir, " is empty"));
  std::printf("checkpoint model.ckpt-%lld%s: test accuracy = %.4f (%lld examples)\n", static_cast<long long>(step),
              o.use_moving_averages ? " (moving averages)" : "", static_cast<double>(correct) / total,
              static_cast<long long>(total));
  return absl::OkStatus();
}

}  // namespace
}  // namespace dtrain::worker

int main(int argc, char** argv) {
  absl::SetProgramUsageMessage("evaluate a dtrain checkpoint: dtrain_eval --checkpoint=DIR/model.ckpt-STEP --model=...");
  absl::ParseCommandLine(argc, argv);
  FLAGS_logtostderr = true;
  google::InitGoogleLogging(argv[0]);
  dtrain::worker::EvalOptions o;
  o.checkpoint = absl::GetFlag(FLAGS_checkpoint);
  o.model = absl::GetFlag(FLAGS_model);
  o.data_dir = absl::GetFlag(FLAGS_data_dir);
  o.export_path = absl::GetFlag(FLAGS_export);
  o.use_moving_averages = absl::GetFlag(FLAGS_use_moving_averages);
  o.skip_eval = absl::GetFlag(FLAGS_skip_eval);
  o.batch_size = absl::GetFlag(FLAGS_batch_size);
  o.threads = absl::GetFlag(FLAGS_threads);
  if (o.checkpoint.empty()) {
    std::fprintf(stderr, "dtrain_eval: --checkpoint is required (<dir>/model.ckpt-<step> or a directory)\n");
    return 2;
  }
  if (o.batch_size <= 0 || o.threads <= 0) {
    std::fprintf(stderr, "dtrain_eval: --batch_size and --threads must be > 0\n");
    return 2;
  }
  const absl::Status s = dtrain::worker::RunEval(o);
  if (!s.ok()) {
    std::fprintf(stderr, "dtrain_eval: %s\n", s.ToString().c_str());
    return 1;
  }
  return 0;
}
