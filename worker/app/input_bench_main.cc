// dtrain_input_bench: the input pipeline alone: how many training examples per second a worker's BatchStream
// reads, decodes, augments and normalizes (image folders: RandomResizedCrop + flip; arrays as stored), with no
// model. scripts/compare_input_pipeline.py runs it beside a PyTorch DataLoader with torchvision's transforms.
//
//   dtrain_input_bench --data_dir=DIR --input_threads=2 --batch_size=32 --image_size=224
//       --input_mean=0.485,0.456,0.406 --input_std=0.229,0.224,0.225
//
// Prints one line per timing window and "dtrain_input_bench: ... examples/sec median=M min=A max=B". Exit codes:
// 0, 2 for bad flags or data, 1 otherwise.
#include <algorithm>
#include <cstdio>
#include <string>
#include <vector>

#include <glog/logging.h>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/flags/usage.h"
#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "common/malloc_tuning.h"
#include "worker/app/model_flags.h"
#include "worker/data/dataset.h"

ABSL_FLAG(std::string, data_dir, "", "The data set (an image folder, arrays, ...)");
ABSL_FLAG(int, batch_size, 32, "Examples per batch");
ABSL_FLAG(int, warmup_batches, 4, "Batches read before timing");
ABSL_FLAG(int, batches_per_window, 10, "Batches per timing window");
ABSL_FLAG(int, windows, 5, "Timing windows");
ABSL_FLAG(int, prefetch, 4, "Batches read ahead");
ABSL_FLAG(uint64_t, seed, 1, "Shuffling and augmentation seed");

namespace {

int Fail(const absl::Status& s, int code) {
  std::fprintf(stderr, "dtrain_input_bench: %s\n", std::string(s.message()).c_str());
  return code;
}

}  // namespace

int main(int argc, char** argv) {
  absl::SetProgramUsageMessage("dtrain_input_bench: times a worker's input pipeline alone (examples/sec)");
  absl::ParseCommandLine(argc, argv);
  dtrain::TuneMallocForLargeReusedBuffers();  // as dtrain_worker, whose input pipeline this times
  FLAGS_logtostderr = true;
  google::InitGoogleLogging(argv[0]);
  using namespace dtrain;  // NOLINT
  absl::StatusOr<data::DataFormat> format = worker::DataFormatFromFlags();
  if (!format.ok()) return Fail(format.status(), 2);
  absl::StatusOr<worker::InputPipeline> input = worker::InputPipelineFromFlags();
  if (!input.ok()) return Fail(input.status(), 2);
  absl::StatusOr<data::Normalization> normalize = worker::InputNormalizationFromFlags();
  if (!normalize.ok()) return Fail(normalize.status(), 2);
  const int batch = absl::GetFlag(FLAGS_batch_size), per_window = absl::GetFlag(FLAGS_batches_per_window),
            windows = absl::GetFlag(FLAGS_windows);
  if (batch <= 0 || per_window <= 0 || windows <= 0 || absl::GetFlag(FLAGS_warmup_batches) < 0) {
    return Fail(absl::InvalidArgumentError("--batch_size, --batches_per_window and --windows must be > 0"), 2);
  }
  absl::StatusOr<data::DatasetPair> d = data::LoadDataset(absl::GetFlag(FLAGS_data_dir), *format, input->load);
  if (!d.ok()) return Fail(d.status(), 2);
  data::BatchStreamOptions o;
  o.batch_size = batch;
  o.seed = absl::GetFlag(FLAGS_seed);
  o.prefetch = absl::GetFlag(FLAGS_prefetch);
  o.threads = input->threads;
  o.augment = input->augment;
  o.bad_examples = input->bad_images;
  o.normalize = *normalize;
  absl::StatusOr<std::unique_ptr<data::BatchStream>> stream = data::BatchStream::Create(d->train, o);
  if (!stream.ok()) return Fail(stream.status(), 2);
  auto next = [&]() -> absl::Status {
    const data::Batch& b = (*stream)->Next();
    if (b.batch == 0) return (*stream)->status();
    return absl::OkStatus();
  };
  for (int i = 0; i < absl::GetFlag(FLAGS_warmup_batches); ++i) {
    if (absl::Status s = next(); !s.ok()) return Fail(s, 1);
  }
  std::vector<double> rates;
  for (int w = 0; w < windows; ++w) {
    const absl::Time start = absl::Now();
    for (int i = 0; i < per_window; ++i) {
      if (absl::Status s = next(); !s.ok()) return Fail(s, 1);
    }
    const double secs = absl::ToDoubleSeconds(absl::Now() - start);
    rates.push_back(per_window * batch / secs);
    std::printf("window %d: %.1f examples/sec\n", w, rates.back());
  }
  std::vector<double> sorted = rates;
  std::sort(sorted.begin(), sorted.end());
  std::printf("dtrain_input_bench: %s %s, batch %d, %d input thread(s), %dx%dx%d examples: examples/sec median=%.1f "
              "min=%.1f max=%.1f\n",
              d->format.c_str(), absl::GetFlag(FLAGS_data_dir).c_str(), batch, input->threads, d->train.height,
              d->train.width, d->train.channels, sorted[sorted.size() / 2], sorted.front(), sorted.back());
  return 0;
}
