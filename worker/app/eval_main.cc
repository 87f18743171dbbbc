// dtrain_eval: evaluates a checkpoint written by the ps tasks on the test set, and optionally exports its
// weights as a NumPy .npz or, for a model imported from ONNX, as an ONNX file.
//
//   dtrain_eval --checkpoint=/ckpt                          # the model and data flags the checkpoint recorded
//   dtrain_eval --checkpoint=/ckpt/model.ckpt-2000 --model=cnn --data_dir=/usr/share/datasets/fashion-mnist
//   dtrain_eval --checkpoint=/ckpt --model=cnn --use_moving_averages --export=/tmp/cnn.npz
//   dtrain_eval --checkpoint=/ckpt --model=lenet5.onnx --export=trained.onnx   # the file, trained
//   dtrain_eval --model=lenet5.onnx                                           # the file's own weights
//   dtrain_eval --checkpoint=/ckpt --model=resnet.onnx --export=infer.onnx --export_for_inference  # onnxruntime
//   dtrain_eval --checkpoint=/ckpt --model=dlrm --data_dir=/data/ctr --table_rows=100000 --export=dlrm.npz
//
// --checkpoint is a prefix <dir>/model.ckpt-<step> (all its .psI-of-N files are read) or a directory (its
// newest complete, valid step); without it, an ONNX model is evaluated with the weights in its file. Prints
// "checkpoint model.ckpt-<step>: test accuracy = 0.8512 (10000 examples)". --export picks the format by the
// extension (.onnx: ONNX, worker/models/onnx/onnx_export.h; anything else: .npz). --logits_out writes the test
// set's logits (array "logits", [examples, classes], and "labels") as an .npz, e.g. to compare with another runtime.
// A model with sparse embedding tables (--model=dlrm, with the shape flags it was trained with) reads every
// table's rows from the checkpoint (worker/eval/checkpoint_tables.h: an id without a row takes its initializer, as on
// the ps), prints "checkpoint model.ckpt-<step>: test log loss = 0.4512, AUC = 0.7840, accuracy = 0.7901 (N
// examples)", and --export=FILE.npz adds per table "<table>/ids" (int64) and "<table>/values" ([n, dim]).
// --follow_deltas serves the model as a cluster trains it: the newest snapshot in --checkpoint (a directory) plus
// the deltas the ps tasks wrote after it (--delta_dir; ps/checkpoint/delta_follower.h), printed as "model at step
// <S> (model.ckpt-<C> + <N> deltas): test log loss = ..." at once and after every delta that moves it, for
// --follow_timeout_secs after the last one (0: once); --logits_out then holds the last state's logits.
// A checkpoint keeps the chief's model and data flags (--model, --data_dir, --data_format, dlrm's shape,
// --input_mean/--input_std: ps::CheckpointData::model_flags): those not given on the command line are taken from
// it, so --checkpoint=DIR alone evaluates a built-in model. Its paths (--data_dir, an ONNX --model) are recorded
// absolute; those not there (moved, or relative in an older checkpoint) are named together in one error (exit 2)
// with the flags that replace them. A --flagfile shared with dtrain_worker may hold its other flags (ignored).
// Exit codes: 0 ok, 1 a failure (unreadable or mismatched checkpoint, data), 2 bad flags or a refused model.
#include <algorithm>
#include <cstdio>
#include <memory>
#include <string>
#include <vector>

#include <glog/logging.h>

#include "absl/flags/flag.h"
#include "absl/flags/usage.h"
#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "common/command_line.h"
#include "common/status_macros.h"
#include "kernels/device.h"
#include "common/env.h"
#include "common/file_util.h"
#include "ps/checkpoint/checkpoint_set.h"
#include "ps/checkpoint/delta_follower.h"
#include "worker/batch/batch_view.h"
#include "worker/eval/checkpoint_tables.h"
#include "worker/data/criteo.h"
#include "worker/data/dataset.h"
#include "worker/eval/evaluation.h"
#include "worker/app/model_flags.h"
#include "absl/strings/match.h"
#include "absl/strings/str_join.h"
#include "worker/models/graph.h"
#include "worker/models/dlrm.h"
#include "worker/models/model.h"
#include "worker/models/onnx/onnx_export.h"
#include "worker/models/registry.h"
#include "worker/eval/npz_writer.h"

ABSL_FLAG(std::string, checkpoint, "", "Checkpoint prefix <dir>/model.ckpt-<step>, or a directory (newest step)");
ABSL_FLAG(std::string, model, "mlp",
          "Model the checkpoint was trained with: mlp | cnn | convnet | cifar10 | dlrm, or PATH.onnx (default: the "
          "one the checkpoint recorded, else mlp)");
ABSL_FLAG(std::string, data_dir, "/usr/share/datasets/fashion-mnist",
          "Data set directory (its test split; default: the one the checkpoint recorded)");
ABSL_FLAG(bool, use_moving_averages, false, "Evaluate the moving averages of the weights instead of the weights");
ABSL_FLAG(std::string, export, "",
          "Also write the weights to this file: FILE.onnx (a model imported from ONNX: the file with its "
          "initializers trained) or an .npz (one <variable>.npy per variable)");
ABSL_FLAG(bool, export_for_inference, false,
          "With --export=FILE.onnx: BatchNormalization in inference mode (the running statistics) and Dropout off, "
          "for inference runtimes such as onnxruntime (default: the training graph as imported)");
ABSL_FLAG(std::string, logits_out, "", "Also write the test set's logits and labels to this .npz file");
ABSL_FLAG(int, batch_size, 500, "Examples per evaluation batch");
ABSL_FLAG(bool, skip_eval, false, "Only --export, do not evaluate (the data set is still read for its shape)");
ABSL_FLAG(bool, follow_deltas, false,
          "Serve the model as it trains: the newest snapshot in --checkpoint (a directory) and the deltas the ps tasks "
          "wrote after it (--delta_dir), evaluated at once and again after every new delta, until none came for "
          "--follow_timeout_secs (0: evaluate the newest state once)");
ABSL_FLAG(std::string, delta_dir, "", "--follow_deltas: the directory of the deltas (default: --checkpoint)");
ABSL_FLAG(double, follow_poll_secs, 1, "--follow_deltas: how often to look for new deltas");
ABSL_FLAG(double, follow_timeout_secs, 0, "--follow_deltas: stop after this long without a new delta (0: at once)");
ABSL_FLAG(int64_t, until_step, -1, "--follow_deltas: the state of this step (-1: the newest)");

namespace dtrain::worker {
namespace {

struct EvalOptions {
  std::string checkpoint, model, data_dir, export_path, logits_path;
  bool follow_deltas = false;
  std::string delta_dir;
  double follow_poll_secs = 1, follow_timeout_secs = 0;
  int64_t until_step = -1;
  data::DataFormat data_format = data::DataFormat::kAuto;
  bool use_moving_averages = false, skip_eval = false, for_inference = false;
  int batch_size = 500, threads = 1;
  dtrain::kernels::ComputeDtype compute_dtype = dtrain::kernels::ComputeDtype::kFp32;  // --compute_dtype
  data::Normalization normalize;
  InputPipeline input;  // image folders, arrays, CSV: as dtrain_worker read them
};

// The logits (`outputs` per example) of every test example under the model's parameters, written as an .npz with
// the labels.
absl::Status WriteLogits(models::Model* model, int64_t outputs, const data::EvalBatchSet& batches,
                         const LoadRowsFn& load_rows, const std::string& path) {
  NpyArray logits{"logits", {0, outputs}, {}}, labels{"labels", {0}, {}};
  RETURN_IF_ERROR(batches.ForEach([&](const data::Batch& b) {
    const size_t at = logits.data.size();
    logits.data.resize(at + b.batch * outputs);
    if (load_rows) RETURN_IF_ERROR(load_rows(View(b)));
    RETURN_IF_ERROR(model->Predict(View(b), logits.data.data() + at));
    labels.data.insert(labels.data.end(), b.labels.begin(), b.labels.end());
    return absl::OkStatus();
  }));
  logits.shape[0] = labels.shape[0] = static_cast<int64_t>(labels.data.size());
  return WriteNpz(path, {logits, labels});
}

// The model's input geometry for the test set: images (cropped as the model wants), or for click-through-rate
// data its dense features as a 1x1 image and its sparse features. InvalidArgument when the model and the data
// set do not fit (images for dlrm, say).
absl::StatusOr<models::ModelOptions> ModelOptionsFor(const EvalOptions& o, const models::ModelSpec& spec,
                                                    const data::Dataset& test) {
  const bool ctr = test.kind() == data::DataKind::kCtr;
  if (ctr != spec.defaults.ctr_data) {
    return absl::InvalidArgumentError(absl::StrCat(
        "--model=", o.model, " evaluates ", spec.defaults.ctr_data ? "click-through-rate data" : "images", " but ",
        o.data_dir, " holds ", ctr ? "click-through-rate data" : "images",
        spec.defaults.ctr_data ? " (give --data_dir the Criteo-format directory it was trained on)" : ""));
  }
  models::ModelOptions mopt;
  mopt.batch_size = o.batch_size;
  mopt.eval_batch_size = o.batch_size;
  mopt.predict_only = true;  // no training network (a deep net's at the evaluation batch would not fit)
  if (ctr) {
    mopt.height = mopt.width = 1;
    mopt.channels = test.num_dense;
    mopt.num_sparse = test.num_sparse;
  } else {
    RETURN_IF_ERROR(data::CheckNormalization(o.normalize, test.channels));
    models::SetInputGeometry(spec.defaults, test.height, test.width, test.channels, &mopt);
  }
  mopt.num_classes = test.num_classes;
  return mopt;
}

// Writes the variables (and the rows of every sparse table) as an .npz.
absl::Status ExportNpz(const EvalOptions& o, const std::vector<models::VariableInfo>& vars,
                       const std::vector<float>& params, const CheckpointTables* tables, const std::string& what) {
  std::vector<NpyArray> arrays;
  const std::vector<int64_t> offsets = models::Offsets(vars);
  for (size_t i = 0; i < vars.size(); ++i) {
    arrays.push_back(NpyArray{NpzNameForVariable(vars[i].name), vars[i].shape,
                              std::vector<float>(params.begin() + offsets[i],
                                                 params.begin() + offsets[i] + vars[i].size())});
  }
  std::string rows;
  if (tables != nullptr) {
    int64_t held = 0;
    for (int t = 0; t < tables->num_tables(); ++t) held += static_cast<int64_t>(tables->table(t).ids.size());
    const std::vector<NpyArray> table_arrays = tables->ExportArrays();
    arrays.insert(arrays.end(), table_arrays.begin(), table_arrays.end());
    rows = absl::StrCat(" and ", tables->num_tables(), " sparse tables (", held, " rows)");
  }
  RETURN_IF_ERROR(WriteNpz(o.export_path, arrays));
  std::printf("exported %zu variables%s of %s%s to %s\n", vars.size(), rows.c_str(), what.c_str(),
              o.use_moving_averages ? " (moving averages)" : "", o.export_path.c_str());
  return absl::OkStatus();
}

// What evaluating a model needs besides its parameters: the data set, the model's geometry, variables and graph,
// the model itself on the CPU and the test batches. Made once; each state (a checkpoint, or the newest state a
// follower of deltas holds) is then evaluated with it.
struct EvalContext {
  data::DatasetPair dataset;
  models::ModelOptions mopt;
  std::vector<models::VariableInfo> vars;
  models::Graph graph;
  std::unique_ptr<kernels::Device> device;
  std::unique_ptr<models::Model> model;
  std::unique_ptr<data::EvalBatchSet> batches;
};

absl::StatusOr<std::unique_ptr<EvalContext>> MakeContext(const EvalOptions& o, const models::ModelRef& spec) {
  auto c = std::make_unique<EvalContext>();
  absl::StatusOr<data::DatasetPair> loaded = data::LoadDataset(o.data_dir, o.data_format, o.input.load);
  const std::string test_txt = o.data_dir + "/test.txt";
  if (absl::IsNotFound(loaded.status()) && Env::Default()->FileExists(test_txt) &&
      (o.data_format == data::DataFormat::kAuto || o.data_format == data::DataFormat::kCriteo)) {
    // Only a test set (the newest data of a stream, dtrain_convert --stream_parts): what evaluation needs.
    ASSIGN_OR_RETURN(const data::CriteoLayout layout, data::ReadCriteoLayout(o.data_dir));
    ASSIGN_OR_RETURN(c->dataset.test, data::ReadCriteo(test_txt, layout));
    c->dataset.format = "criteo";
  } else {
    if (!loaded.ok()) return loaded.status();
    c->dataset = *std::move(loaded);
  }
  ASSIGN_OR_RETURN(c->mopt, ModelOptionsFor(o, *spec, c->dataset.test));
  ASSIGN_OR_RETURN(c->vars, models::ModelVariables(*spec, c->mopt));
  ASSIGN_OR_RETURN(c->graph, spec->build_graph(c->mopt));
  return c;
}

// The model on the CPU and the test batches (when evaluating or writing logits).
absl::Status PrepareModel(const EvalOptions& o, const models::ModelRef& spec, EvalContext* c) {
  ASSIGN_OR_RETURN(c->device, kernels::CreateDevice(kernels::DeviceSpec::Cpu(o.threads, o.compute_dtype)));
  ASSIGN_OR_RETURN(c->model, models::CreateModel(*spec, c->mopt, c->device.get()));
  data::EvalBatchOptions eo;
  eo.batch_size = o.batch_size;
  eo.preprocess = spec->defaults.eval_preprocess;
  eo.crop_h = c->mopt.height;
  eo.crop_w = c->mopt.width;
  eo.normalize = o.normalize;
  eo.threads = o.input.threads;
  eo.bad_examples = o.input.bad_images;
  ASSIGN_OR_RETURN(c->batches, data::EvalBatchSet::Create(c->dataset.test, eo));
  if (c->dataset.test.count() == 0) {
    return absl::FailedPreconditionError(absl::StrCat("the test set in ", o.data_dir, " is empty"));
  }
  return absl::OkStatus();
}

// Evaluates (and exports) one state of the model: the checkpoint's `parts` (empty: an ONNX file's own weights),
// described by `what` in what it prints.
absl::Status EvaluateState(const EvalOptions& o, const models::ModelRef& spec, const std::vector<ps::CheckpointData>& parts,
                           const std::string& what, bool export_files, EvalContext* c) {
  const models::Graph& graph = c->graph;
  // Sparse tables: the model's (Graph::tables) against the checkpoint's, before the signature (which would only
  // say that the models differ).
  std::unique_ptr<CheckpointTables> tables;
  if (!parts.empty()) {
    ASSIGN_OR_RETURN(std::vector<ps::SparseTableRows> rows, ps::ReadSparseTables(parts));
    if (!rows.empty() || !graph.tables.empty()) {
      absl::StatusOr<CheckpointTables> t = CheckpointTables::Create(std::move(rows), graph.tables);
      if (!t.ok()) {
        return absl::Status(t.status().code(), absl::StrCat(what, " and --model=", o.model, " on ", o.data_dir,
                                                            ": ", t.status().message()));
      }
      tables = std::make_unique<CheckpointTables>(*std::move(t));
    }
  } else if (!graph.tables.empty()) {  // no checkpoint: an ONNX file's own rows
    tables = std::make_unique<CheckpointTables>(CheckpointTables::FromModel(graph.tables));
  }
  std::vector<float> params;
  if (parts.empty()) {
    params = models::InitialParameters(c->vars, /*seed=*/1);  // an ONNX file's initializers: its own values
  } else {
    const std::string signature = models::ModelSignature(*spec, c->vars);
    if (parts[0].model_signature != signature) {
      return absl::FailedPreconditionError(absl::StrCat(
          "the checkpoint is of model '", parts[0].model_signature, "', but --model=", o.model, " on ", o.data_dir,
          " is '", signature, "': pass the --model (and data set) it was trained with"));
    }
    ASSIGN_OR_RETURN(params, ps::AssembleFlatBuffer(parts, models::TotalSize(c->vars), o.use_moving_averages));
  }

  if (export_files && absl::EndsWithIgnoreCase(o.export_path, ".onnx")) {
    models::onnx::ExportOptions eo;
    eo.inference = o.for_inference;
    // Embedding tables: the checkpoint's rows, the file's for those it lacks (rows never touched).
    models::onnx::TableRows rows = models::onnx::FileTableRows(graph);
    for (int t = 0; tables != nullptr && t < tables->num_tables(); ++t) {
      const ps::SparseTableRows& held = tables->table(t);
      auto file = rows.find(held.spec.name);
      ASSIGN_OR_RETURN(std::vector<float> all,
                       ps::AssembleFixedTable(held, file == rows.end() ? absl::Span<const float>() : file->second));
      rows[held.spec.name] = std::move(all);
    }
    RETURN_IF_ERROR(models::onnx::ExportOnnx(*spec, c->vars, params.data(), rows, o.export_path, eo));
    std::printf("exported %s%s to %s\n", what.c_str(), o.use_moving_averages ? " (moving averages)" : "",
                o.export_path.c_str());
  } else if (export_files && !o.export_path.empty()) {
    RETURN_IF_ERROR(ExportNpz(o, c->vars, params, tables.get(), what));
  }
  if (o.skip_eval && o.logits_path.empty()) return absl::OkStatus();

  if (c->model == nullptr) RETURN_IF_ERROR(PrepareModel(o, spec, c));
  models::Model* model = c->model.get();
  RETURN_IF_ERROR(model->SetParameters(params.data()));
  // A sparse model reads each batch's rows from the checkpoint (as the ps would serve them).
  LoadRowsFn load_rows;
  SparseBatch rows(graph);
  if (!graph.tables.empty()) {
    load_rows = [&](const models::HostBatch& b) {
      RETURN_IF_ERROR(rows.Prepare({b}));
      tables->FillRows(&rows);
      return model->SetSparseInputs(rows.inputs(0));
    };
  }
  if (!o.logits_path.empty()) {
    RETURN_IF_ERROR(WriteLogits(model, graph.output_shape().size(), *c->batches, load_rows, o.logits_path));
    std::printf("wrote the logits of %lld examples of %s to %s\n", static_cast<long long>(c->dataset.test.count()),
                what.c_str(), o.logits_path.c_str());
  }
  if (o.skip_eval) return absl::OkStatus();
  ASSIGN_OR_RETURN(const Evaluation e, EvaluateBatches(model, *c->batches, load_rows));
  const char* averaged = o.use_moving_averages ? " (moving averages)" : "";
  if (e.binary) {
    std::printf("%s%s: test log loss = %.4f, AUC = %.4f, accuracy = %.4f (%lld examples)\n", what.c_str(), averaged,
                e.log_loss, e.auc, e.accuracy, static_cast<long long>(e.examples));
  } else {
    std::printf("%s%s: test accuracy = %.4f (%lld examples)\n", what.c_str(), averaged, e.accuracy,
                static_cast<long long>(e.examples));
  }
  std::fflush(stdout);
  return absl::OkStatus();
}

// --follow_deltas: the newest snapshot and the deltas after it, evaluated at once and again whenever new deltas
// have moved the model, until none came for --follow_timeout_secs (0: once).
absl::Status FollowDeltas(const EvalOptions& o, const models::ModelRef& spec) {
  ps::DeltaFollowerOptions fo;
  fo.checkpoint_dir = o.checkpoint;
  fo.delta_dir = o.delta_dir;
  fo.until_step = o.until_step;
  ASSIGN_OR_RETURN(std::unique_ptr<ps::DeltaFollower> follower, ps::DeltaFollower::Open(fo));
  ASSIGN_OR_RETURN(std::unique_ptr<EvalContext> c, MakeContext(o, spec));
  auto what = [&] { return absl::StrCat("model at step ", follower->step(), " (", follower->description(), ")"); };
  RETURN_IF_ERROR(EvaluateState(o, spec, follower->parts(), what(), /*export_files=*/false, c.get()));
  absl::Time last_move = absl::Now();
  while (o.follow_timeout_secs > 0 && absl::Now() - last_move < absl::Seconds(o.follow_timeout_secs)) {
    absl::SleepFor(absl::Seconds(o.follow_poll_secs));
    ASSIGN_OR_RETURN(const bool moved, follower->Advance());
    if (!moved) continue;
    last_move = absl::Now();
    RETURN_IF_ERROR(EvaluateState(o, spec, follower->parts(), what(), /*export_files=*/false, c.get()));
  }
  if (!o.export_path.empty()) {
    RETURN_IF_ERROR(EvaluateState(o, spec, follower->parts(), what(), /*export_files=*/true, c.get()));
  }
  return absl::OkStatus();
}

absl::Status RunEval(const EvalOptions& o, const models::ModelRef& spec, std::vector<ps::CheckpointData> parts) {
  if (o.checkpoint.empty() && !spec->imported() && !o.follow_deltas) {
    return absl::InvalidArgumentError(absl::StrCat("--checkpoint is required for the built-in model '", o.model,
                                                   "' (<dir>/model.ckpt-<step> or a directory)"));
  }
  if (absl::EndsWithIgnoreCase(o.export_path, ".onnx") && !spec->imported()) {
    return absl::InvalidArgumentError(absl::StrCat("--export=", o.export_path, " writes ONNX, which needs a model "
                                                   "imported from ONNX (--model=PATH.onnx); '", o.model,
                                                   "' is built in: export an .npz instead"));
  }
  if (o.follow_deltas) return FollowDeltas(o, spec);
  const int64_t step = parts.empty() ? 0 : parts[0].global_step;
  const std::string what = parts.empty() ? absl::StrCat(o.model, " (its own weights)")
                                         : absl::StrCat("checkpoint model.ckpt-", step);
  ASSIGN_OR_RETURN(std::unique_ptr<EvalContext> c, MakeContext(o, spec));
  return EvaluateState(o, spec, parts, what, /*export_files=*/true, c.get());
}

}  // namespace
}  // namespace dtrain::worker

int main(int argc, char** argv) {
  absl::SetProgramUsageMessage("evaluate a dtrain checkpoint: dtrain_eval --checkpoint=DIR/model.ckpt-STEP --model=...");
  dtrain::CommandLineSpec cli;
  cli.program = "dtrain_eval";
  cli.summary = "evaluates a checkpoint of the ps tasks on the test set and exports its weights (.npz, .onnx)";
  cli.epilogue =
      "The checkpoint records the model and data flags it was trained with: those not given here are taken from it.\n"
      "Exit codes: 0 ok; 1 a failure (unreadable or mismatched checkpoint, data); 2 bad flags or a refused model.";
  cli.peer_program = "dtrain_worker";
  cli.peer_flags = dtrain::DtrainWorkerFlagNames();
  const dtrain::ParsedCommandLine parsed = dtrain::ParseCommandLineOrExit(argc, argv, cli);
  FLAGS_logtostderr = true;
  google::InitGoogleLogging(argv[0]);
  // The checkpoint first: the model and data flags it recorded fill in those not given on the command line.
  std::vector<dtrain::ps::CheckpointData> parts;
  if (!absl::GetFlag(FLAGS_checkpoint).empty() && !absl::GetFlag(FLAGS_follow_deltas)) {
    absl::StatusOr<std::vector<dtrain::ps::CheckpointData>> read =
        dtrain::ps::ReadCheckpointSet(dtrain::Env::Default(), absl::GetFlag(FLAGS_checkpoint));
    if (!read.ok()) {
      std::fprintf(stderr, "dtrain_eval: %s\n", std::string(read.status().message()).c_str());
      return 1;
    }
    parts = *std::move(read);
    const std::vector<std::string>& recorded = parts[0].model_flags;
    std::vector<std::string> taken;
    for (const std::string& line : recorded) {
      const std::string name = line.substr(0, line.find('='));
      if (parsed.specified.count(name) == 0) taken.push_back(line);
    }
    // The paths the checkpoint recorded (an imported model's file, --data_dir) may have moved, or be relative to
    // where an older run started: every one that is not there is named at once, with the flag that replaces it.
    std::vector<std::string> missing, flags;
    for (const std::string& line : taken) {
      const std::string name = line.substr(0, line.find('='));
      const std::string value = line.substr(line.find('=') + 1);
      const bool model_file = name == "model" && (absl::EndsWithIgnoreCase(value, ".onnx") ||
                                                  value.find('/') != std::string::npos);
      if ((model_file || (name == "data_dir" && !value.empty())) && !dtrain::Env::Default()->FileExists(value)) {
        missing.push_back(absl::StrCat("--", line));
        flags.push_back(absl::StrCat("--", name));
      }
    }
    if (!missing.empty()) {
      std::fprintf(stderr, "dtrain_eval: the checkpoint's recorded %s not there (from %s): %s; give %s to use "
                   "another\n", missing.size() == 1 ? "path is" : "paths are",
                   dtrain::AbsolutePath(".").c_str(), absl::StrJoin(missing, ", ").c_str(),
                   absl::StrJoin(flags, " and ").c_str());
      return 2;
    }
    if (absl::Status s = dtrain::SetFlagValues(taken, parsed.specified); !s.ok()) {
      std::fprintf(stderr, "dtrain_eval: the checkpoint's model flags: %s\n", std::string(s.message()).c_str());
      return 1;
    }
    if (!taken.empty()) {
      std::fprintf(stderr, "dtrain_eval: from the checkpoint: --%s\n", absl::StrJoin(taken, " --").c_str());
    }
  }
  dtrain::worker::EvalOptions o;
  o.checkpoint = absl::GetFlag(FLAGS_checkpoint);
  o.model = absl::GetFlag(FLAGS_model);
  o.data_dir = absl::GetFlag(FLAGS_data_dir);
  o.export_path = absl::GetFlag(FLAGS_export);
  o.use_moving_averages = absl::GetFlag(FLAGS_use_moving_averages);
  o.skip_eval = absl::GetFlag(FLAGS_skip_eval);
  o.batch_size = absl::GetFlag(FLAGS_batch_size);
  absl::StatusOr<dtrain::ThreadDecision> threads = dtrain::worker::ThreadsFromFlags();
  if (!threads.ok()) {
    std::fprintf(stderr, "dtrain_eval: %s\n", std::string(threads.status().message()).c_str());
    return 2;
  }
  if (threads->exceeds_budget) {
    LOG(WARNING) << threads->line;
  } else {
    LOG(INFO) << threads->line;
  }
  o.threads = threads->threads;
  absl::StatusOr<dtrain::kernels::ComputeDtype> dtype = dtrain::worker::ComputeDtypeFromFlags();
  if (!dtype.ok()) {
    std::fprintf(stderr, "dtrain_eval: %s\n", std::string(dtype.status().message()).c_str());
    return 2;
  }
  o.compute_dtype = *dtype;
  o.logits_path = absl::GetFlag(FLAGS_logits_out);
  o.for_inference = absl::GetFlag(FLAGS_export_for_inference);
  o.follow_deltas = absl::GetFlag(FLAGS_follow_deltas);
  o.delta_dir = absl::GetFlag(FLAGS_delta_dir);
  o.follow_poll_secs = absl::GetFlag(FLAGS_follow_poll_secs);
  o.follow_timeout_secs = absl::GetFlag(FLAGS_follow_timeout_secs);
  o.until_step = absl::GetFlag(FLAGS_until_step);
  if (o.follow_deltas && (!(o.follow_poll_secs > 0) || !(o.follow_timeout_secs >= 0))) {
    std::fprintf(stderr, "dtrain_eval: --follow_poll_secs must be > 0 and --follow_timeout_secs >= 0\n");
    return 2;
  }
  // --data_format, --model=dlrm's shape and --input_mean/--input_std as dtrain_worker took them (the checkpoint's
  // tables must match): worker/app/model_flags.h.
  absl::StatusOr<dtrain::data::DataFormat> format = dtrain::worker::DataFormatFromFlags();
  absl::StatusOr<dtrain::models::DlrmConfig> dlrm = dtrain::worker::DlrmConfigFromFlags();
  for (const absl::Status& s : {format.status(), dlrm.status()}) {
    if (!s.ok()) {
      std::fprintf(stderr, "dtrain_eval: %s\n", std::string(s.message()).c_str());
      return 2;
    }
  }
  o.data_format = *format;
  absl::StatusOr<dtrain::data::Normalization> n = dtrain::worker::InputNormalizationFromFlags();
  if (!n.ok()) {
    std::fprintf(stderr, "dtrain_eval: %s\n", std::string(n.status().message()).c_str());
    return 2;
  }
  absl::StatusOr<dtrain::worker::InputPipeline> input = dtrain::worker::InputPipelineFromFlags();
  if (!input.ok()) {
    std::fprintf(stderr, "dtrain_eval: %s\n", std::string(input.status().message()).c_str());
    return 2;
  }
  o.input = *std::move(input);
  o.normalize = *std::move(n);
  if (o.batch_size <= 0) {
    std::fprintf(stderr, "dtrain_eval: --batch_size must be > 0\n");
    return 2;
  }
  // The model first: a missing or refused file exits 2 with the importer's one line.
  dtrain::models::ResolveOptions ro;
  ro.dlrm = *dlrm;
  absl::StatusOr<dtrain::models::ModelRef> spec = dtrain::models::ResolveModel(o.model, ro);
  if (!spec.ok()) {
    std::fprintf(stderr, "dtrain_eval: %s\n", std::string(spec.status().message()).c_str());
    return 2;
  }
  const absl::Status s = dtrain::worker::RunEval(o, *spec, std::move(parts));
  if (!s.ok()) {
    // A refused model or flags (InvalidArgument) exit 2 with the one line that says why; other failures 1.
    if (s.code() == absl::StatusCode::kInvalidArgument) {
      std::fprintf(stderr, "dtrain_eval: %s\n", std::string(s.message()).c_str());
      return 2;
    }
    std::fprintf(stderr, "dtrain_eval: %s\n", s.ToString().c_str());
    return 1;
  }
  return 0;
}
