// dtrain_convert: reads a data set in any supported format and writes train.tfrecords and
// test.tfrecords of tf.train.Example, as TensorFlow's MNIST convert_to_records.py does.
//
//   dtrain_convert --input_dir=/usr/share/datasets/fashion-mnist --output_dir=/tmp/fmnist-tfr
//
// Exit codes: 0 success, 1 bad flags, 2 bad input or a failed write (one line on stderr).
#include <filesystem>
#include <iostream>
#include <string>
#include <system_error>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/flags/usage.h"
#include "absl/status/status.h"
#include "glog/logging.h"
#include "worker/data/dataset.h"

ABSL_FLAG(std::string, input_dir, "/usr/share/datasets/fashion-mnist", "Directory holding the source data set");
ABSL_FLAG(std::string, input_format, "auto", "Source format: auto, mnist-idx, cifar10-bin or tfrecord");
ABSL_FLAG(std::string, output_dir, "", "Directory to write train.tfrecords and test.tfrecords into");
ABSL_FLAG(std::string, format, "tfrecord", "Output format (only tfrecord)");

namespace {

int Fail(const std::string& line) {
  std::cerr << "dtrain_convert: " << line << "\n";
  return 2;
}

}  // namespace

int main(int argc, char** argv) {
  absl::SetProgramUsageMessage("Converts a data set directory to TFRecord files of tf.train.Example.");
  absl::ParseCommandLine(argc, argv);
  google::InitGoogleLogging(argv[0]);
  using dtrain::data::DataFormat;

  const std::string in_fmt = absl::GetFlag(FLAGS_input_format);
  DataFormat format;
  if (in_fmt == "auto") {
    format = DataFormat::kAuto;
  } else if (in_fmt == "mnist-idx") {
    format = DataFormat::kMnistIdx;
  } else if (in_fmt == "cifar10-bin") {
    format = DataFormat::kCifar10Bin;
  } else if (in_fmt == "tfrecord") {
    format = DataFormat::kTfRecord;
  } else {
    std::cerr << "dtrain_convert: unknown --input_format=" << in_fmt << "\n";
    return 1;
  }
  if (absl::GetFlag(FLAGS_format) != "tfrecord") {
    std::cerr << "dtrain_convert: unsupported --format=" << absl::GetFlag(FLAGS_format) << " (only tfrecord)\n";
    return 1;
  }
  const std::string out_dir = absl::GetFlag(FLAGS_output_dir);
  if (out_dir.empty()) {
    std::cerr << "dtrain_convert: --output_dir is required\n";
    return 1;
  }

  auto data = dtrain::data::LoadDataset(absl::GetFlag(FLAGS_input_dir), format);
  if (!data.ok()) return Fail(data.status().ToString());
  std::error_code ec;
  std::filesystem::create_directories(out_dir, ec);
  if (ec) return Fail("cannot create " + out_dir + ": " + ec.message());

  const std::pair<const dtrain::data::Dataset*, const char*> parts[] = {{&data->train, "train.tfrecords"},
                                                                         {&data->test, "test.tfrecords"}};
  for (const auto& [set, name] : parts) {
    const std::string path = (std::filesystem::path(out_dir) / name).string();
    if (absl::Status s = dtrain::data::WriteTfRecordExamples(*set, path); !s.ok()) return Fail(s.ToString());
    std::cout << "wrote " << set->count() << " " << set->height << "x" << set->width << "x" << set->channels
              << " examples (" << data->format << ") to " << path << "\n";
  }
  return 0;
}
