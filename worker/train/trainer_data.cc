#include "worker/train/trainer_internal.h"

#include <glog/logging.h>

#include <algorithm>
#include <memory>
#include <utility>

#include "absl/strings/str_cat.h"
#include "common/env.h"
#include "common/status_macros.h"
#include "worker/data/batch_stream_follow.h"
#include "worker/data/batch_stream_state.h"
#include "worker/models/graph.h"
#include "worker/models/registry.h"

namespace dtrain::worker::trainer_internal {

// ---- data ----
absl::Status SetUpData(WorkerOptions* o, bool local, bool chief, TrainingData* d) {
  d->dataset = o->dataset;
  data::BatchStreamOptions sopt;
  sopt.batch_size = o->batch_size;
  // An elastic job's workers read one order of the whole set, the batches ps 0 gives them (SeekBatch below).
  const bool elastic = !local && !o->elastic_batch.empty();
  sopt.shard_index = local || elastic ? 0 : o->worker_id;
  sopt.num_shards = local || elastic ? 1 : o->num_workers;
  sopt.seed = o->seed;
  sopt.shuffle = o->shuffle;
  if (o->follow) {
    // Online: the stream follows the directory; its first file gives the features (no test set).
    data::FollowOptions fo;
    fo.dir = o->data_dir;
    fo.format = o->data_format;
    fo.poll = absl::Seconds(o->follow_poll_secs);
    fo.idle_timeout = o->follow_idle_secs > 0 ? absl::Seconds(o->follow_idle_secs) : absl::InfiniteDuration();
    fo.stop = o->input_stop;
    fo.bad_files = o->bad_records;
    fo.set_aside = &d->set_aside;
    ASSIGN_OR_RETURN(d->stream, data::FollowFiles(fo, sopt, &d->loaded.train));
    d->loaded.test = d->loaded.train;  // no examples: the shape only
    d->loaded.format = "follow";
    d->dataset = &d->loaded;
  } else if (d->dataset == nullptr) {
    ASSIGN_OR_RETURN(d->loaded, data::LoadDataset(o->data_dir, o->data_format, o->data_options));
    d->dataset = &d->loaded;
  }
  const data::Dataset& train = d->dataset->train;
  d->defaults = o->resolved_model->defaults;
  const bool ctr = train.kind() == data::DataKind::kCtr;
  if (ctr != d->defaults.ctr_data) {
    return absl::InvalidArgumentError(absl::StrCat(
        "--model=", o->model, " trains on ", d->defaults.ctr_data ? "click-through-rate data" : "images",
        " but ", o->dataset != nullptr ? std::string("the data set") : o->data_dir, " holds ",
        ctr ? "click-through-rate data (dense and categorical features)" : "images",
        d->defaults.ctr_data ? " (give --data_dir a Criteo-format directory, e.g. one dtrain_convert "
                               "--synthetic_ctr wrote)"
                             : ""));
  }
  models::ModelOptions& mopt = d->model_options;
  mopt.batch_size = o->batch_size;
  // Evaluation batches of up to 500 examples, fewer for large examples (an eval batch's input at most 4 M
  // floats: 26 images of 224 x 224 x 3), never fewer than the training batch.
  const int64_t example_floats = std::max<int64_t>(1, train.kind() == data::DataKind::kCtr
                                                          ? train.num_dense + train.num_sparse
                                                          : train.image_size());
  mopt.eval_batch_size = std::max<int>(o->batch_size, static_cast<int>(std::min<int64_t>(500, (4 << 20) / example_floats)));
  mopt.seed = o->seed;
  if (ctr) {
    mopt.height = mopt.width = 1;  // the dense features, as a 1x1 image of num_dense channels
    mopt.channels = train.num_dense;
    mopt.num_sparse = train.num_sparse;
  } else {
    models::SetInputGeometry(d->defaults, train.height, train.width, train.channels, &mopt);
    if (train.source != nullptr && (mopt.height != train.height || mopt.width != train.width)) {
      // Examples read by a source (image folders) come out at their final size; the model's own crops do not apply.
      return absl::InvalidArgumentError(absl::StrCat("--model=", o->model, " takes ", mopt.height, "x", mopt.width,
                                                     " crops but the data set's examples are ", train.height, "x",
                                                     train.width, " (an image folder: --image_size=", mopt.height, ")"));
    }
  }
  mopt.num_classes = train.num_classes;

  sopt.preprocess = d->defaults.train_preprocess;
  if (!ctr) RETURN_IF_ERROR(data::CheckNormalization(o->input_normalization, train.channels));
  sopt.normalize = o->input_normalization;
  sopt.crop_h = mopt.height;  // the model's input size (the CIFAR modes crop to it)
  sopt.crop_w = mopt.width;
  sopt.threads = o->input_threads;
  sopt.augment = o->augment;
  sopt.bad_examples = o->bad_images;
  if (!o->follow) {
    ASSIGN_OR_RETURN(d->stream, data::BatchStream::Create(train, sopt));
  }
  if (o->decay_steps == 0 && d->defaults.decay_epochs > 0 && !o->follow &&
      (o->lr_schedule == "exponential" || o->lr_schedule == "step")) {  // the model's default schedule
    o->decay_steps = models::DefaultDecaySteps(d->defaults, train.count(), o->batch_size);
    o->decay_rate = d->defaults.decay_rate;
    o->staircase = d->defaults.staircase;
  }
  if (chief && (o->evaluate || o->eval_every > 0) && !o->follow) {
    data::EvalBatchOptions eo;
    eo.batch_size = mopt.eval_batch_size;
    eo.preprocess = d->defaults.eval_preprocess;
    eo.crop_h = mopt.height;
    eo.crop_w = mopt.width;
    eo.normalize = o->input_normalization;
    eo.threads = o->input_threads;
    eo.bad_examples = o->bad_images;
    ASSIGN_OR_RETURN(d->eval_set, data::EvalBatchSet::Create(d->dataset->test, eo));
  }
  return absl::OkStatus();
}

}  // namespace dtrain::worker::trainer_internal
