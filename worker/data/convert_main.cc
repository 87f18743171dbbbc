// dtrain_convert: reads a data set in any supported format and writes train.tfrecords and
// test.tfrecords of tf.train.Example, as TensorFlow's MNIST convert_to_records.py does (CTR data: the CTR
// examples of example_proto.h). With --synthetic_ctr it writes synthetic click-through-rate data in Criteo text
// format instead (synthetic_ctr.h).
//
//   dtrain_convert --input_dir=/usr/share/datasets/fashion-mnist --output_dir=/tmp/fmnist-tfr
//   dtrain_convert --input_dir=/data/criteo --input_format=criteo --output_dir=/tmp/criteo-tfr
//   dtrain_convert --input_dir=/data/flowers --input_format=image_folder --image_size=224 --output_dir=/tmp/f-tfr
//   dtrain_convert --input_dir=/data/table --input_format=csv --label_column=species --output_dir=/tmp/t-tfr
//
// Image folders are written as their evaluation reads them (Resize(--resize_size) + CenterCrop(--image_size), as
// image_raw bytes); float arrays and CSV rows as image_float lists (dtrain reads both back).
//   dtrain_convert --synthetic_ctr --examples=1000000 --out=/tmp/ctr
//
// Exit codes: 0 success, 1 bad flags, 2 bad input or a failed write (one line on stderr).
#include <cstdio>
#include <filesystem>
#include <iostream>
#include <string>
#include <system_error>
#include <vector>

#include "absl/flags/flag.h"
#include "common/command_line.h"
#include "absl/flags/usage.h"
#include "absl/status/status.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "glog/logging.h"
#include "worker/data/dataset.h"
#include "worker/data/synthetic_ctr.h"

ABSL_FLAG(std::string, input_dir, "/usr/share/datasets/fashion-mnist", "Directory holding the source data set");
ABSL_FLAG(std::string, input_format, "auto",
          "Source format: auto, mnist-idx, cifar10-bin, tfrecord, criteo, image_folder, npy or csv");
// How image folders, arrays and CSV are read: as dtrain_worker's flags of the same names (worker/app/data_flags.cc).
ABSL_FLAG(int, image_size, 224, "Image folders: the side of the square images written (Resize + CenterCrop)");
ABSL_FLAG(int, resize_size, 0, "Image folders: the shorter side before the centre crop (0: image_size * 256 / 224)");
ABSL_FLAG(double, validation_split, 0,
          "A data set without a test part: this fraction of the training examples is written as the test set");
ABSL_FLAG(std::string, label_column, "label", "CSV: the label column, by header name or 0-based index");
ABSL_FLAG(std::string, npz_arrays, "x,y", "NumPy train.npz / test.npz: the names of the examples' and labels' arrays");
ABSL_FLAG(std::string, array_layout, "auto", "NumPy arrays [N, a, b, c]: nhwc | nchw | auto");
ABSL_FLAG(std::string, bad_images, "skip", "An image that cannot be decoded: skip (leave it out, logged) | fail");
ABSL_FLAG(std::string, output_dir, "", "Directory to write train.tfrecords and test.tfrecords into");
ABSL_FLAG(std::string, format, "tfrecord", "Output format (only tfrecord)");

ABSL_FLAG(bool, synthetic_ctr, false,
          "Write synthetic click-through-rate data (Criteo text: train.txt, test.txt) to --out instead of converting");
ABSL_FLAG(std::string, out, "", "--synthetic_ctr: the directory to write (default: --output_dir)");
ABSL_FLAG(int64_t, examples, 1000000, "--synthetic_ctr: training examples");
ABSL_FLAG(int64_t, test_examples, -1, "--synthetic_ctr: test examples (-1: examples / 10)");
ABSL_FLAG(uint64_t, seed, 1, "--synthetic_ctr: the seed (the files are a function of it)");
ABSL_FLAG(double, zipf_exponent, 1.05, "--synthetic_ctr: s of the ids' Zipf law P(rank k) ~ k^-s");
ABSL_FLAG(int32_t, num_dense, 13, "--synthetic_ctr: integer features per example");
ABSL_FLAG(int32_t, num_sparse, 26, "--synthetic_ctr: categorical features per example");
ABSL_FLAG(int32_t, stream_parts, 0,
          "--synthetic_ctr: write a time-ordered stream of this many parts (stream/part-00000.txt, ...) instead of "
          "train.txt; test.txt is drawn at the stream's end");
ABSL_FLAG(double, drift, 0,
          "--synthetic_ctr: how far the ids drift over the stream: at time t in [0, 1] the rank-k value of a feature "
          "with V values is the item k + drift * t * V (0: none; 1: by the end all new)");
ABSL_FLAG(double, stream_interval_secs, 0, "--synthetic_ctr --stream_parts: seconds between two parts (arrival)");
ABSL_FLAG(std::string, vocab, "",
          "--synthetic_ctr: ids per categorical feature: one size for all, or one per feature (comma-separated); "
          "default 10 up to 1,000,000, log-spaced");

namespace {

int Fail(const std::string& line, int exit_code = 2) {
  std::cerr << "dtrain_convert: " << line << "\n";
  return exit_code;
}

int BadFlag(const std::string& line) { return Fail(line, 2); }  // a bad flag: common/exit_codes.h

int WriteSynthetic() {
  dtrain::data::SyntheticCtrOptions o;
  o.examples = absl::GetFlag(FLAGS_examples);
  o.test_examples = absl::GetFlag(FLAGS_test_examples);
  o.seed = absl::GetFlag(FLAGS_seed);
  o.zipf_exponent = absl::GetFlag(FLAGS_zipf_exponent);
  o.num_dense = absl::GetFlag(FLAGS_num_dense);
  o.num_sparse = absl::GetFlag(FLAGS_num_sparse);
  o.stream_parts = absl::GetFlag(FLAGS_stream_parts);
  o.drift = absl::GetFlag(FLAGS_drift);
  o.stream_interval_secs = absl::GetFlag(FLAGS_stream_interval_secs);
  for (absl::string_view v : absl::StrSplit(absl::GetFlag(FLAGS_vocab), ',', absl::SkipWhitespace())) {
    int64_t size;
    if (!absl::SimpleAtoi(v, &size)) return BadFlag("--vocab: \"" + std::string(v) + "\" is not a number");
    o.vocab.push_back(size);
  }
  const std::string out = absl::GetFlag(FLAGS_out).empty() ? absl::GetFlag(FLAGS_output_dir) : absl::GetFlag(FLAGS_out);
  if (out.empty()) return BadFlag("--synthetic_ctr needs --out");
  auto r = dtrain::data::WriteSyntheticCtr(o, out);
  if (!r.ok()) return absl::IsInvalidArgument(r.status()) ? BadFlag(std::string(r.status().message()))
                                                          : Fail(r.status().ToString());
  const std::string train = o.stream_parts > 0 ? absl::StrCat(out, "/stream/part-*.txt (", o.stream_parts, " parts)")
                                              : absl::StrCat(out, "/train.txt");
  std::printf("wrote %lld examples to %s (CTR %.4f) and %lld to %s/test.txt (CTR %.4f) in %.1f s\n",
              static_cast<long long>(r->train_examples), train.c_str(), r->train_ctr,
              static_cast<long long>(r->test_examples), out.c_str(), r->test_ctr, r->seconds);
  if (o.drift > 0) std::printf("drift %g: the test set is drawn at the stream's end\n", o.drift);
  std::printf("law: %d integer features, %d categorical with Zipf exponent %g over vocabularies %s\n", o.num_dense,
              o.num_sparse, o.zipf_exponent, absl::StrJoin(r->vocab, ",").c_str());
  std::printf("planted model on the test set: Bayes-optimal AUC %.4f (log loss %.4f); its dense part alone AUC "
              "%.4f; constant CTR log loss %.4f\n",
              r->bayes_auc, r->bayes_log_loss, r->dense_only_auc, r->constant_log_loss);
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  absl::SetProgramUsageMessage("Converts a data set directory to TFRecord files of tf.train.Example.");
  dtrain::CommandLineSpec spec;
  spec.program = "dtrain_convert";
  spec.summary = "converts a data set directory to TFRecord files of tf.train.Example, or writes synthetic "
                 "click-through-rate data (--synthetic_ctr)";
  spec.epilogue = "Exit codes: 0 written; 1 a failure writing; 2 bad flags or unreadable input.";
  dtrain::ParseCommandLineOrExit(argc, argv, spec);
  FLAGS_logtostderr = true;  // the images skipped, by path
  google::InitGoogleLogging(argv[0]);
  using dtrain::data::DataFormat;

  if (absl::GetFlag(FLAGS_synthetic_ctr)) return WriteSynthetic();
  const std::string in_fmt = absl::GetFlag(FLAGS_input_format);
  const absl::StatusOr<DataFormat> format = dtrain::data::ParseDataFormat(in_fmt);
  if (!format.ok()) {
    std::cerr << "dtrain_convert: unknown --input_format=" << in_fmt << "\n";
    return 2;
  }
  if (absl::GetFlag(FLAGS_format) != "tfrecord") {
    std::cerr << "dtrain_convert: unsupported --format=" << absl::GetFlag(FLAGS_format) << " (only tfrecord)\n";
    return 2;
  }
  const std::string out_dir = absl::GetFlag(FLAGS_output_dir);
  if (out_dir.empty()) {
    std::cerr << "dtrain_convert: --output_dir is required\n";
    return 2;
  }

  dtrain::data::LoadOptions lo;
  lo.image_size = absl::GetFlag(FLAGS_image_size);
  lo.resize_size = absl::GetFlag(FLAGS_resize_size);
  lo.validation_split = absl::GetFlag(FLAGS_validation_split);
  lo.label_column = absl::GetFlag(FLAGS_label_column);
  const std::vector<std::string> arrays = absl::StrSplit(absl::GetFlag(FLAGS_npz_arrays), ',');
  if (arrays.size() != 2) return BadFlag("--npz_arrays: expected two array names, X,Y");
  lo.x_name = arrays[0];
  lo.y_name = arrays[1];
  const absl::StatusOr<dtrain::data::ArrayLayout> layout =
      dtrain::data::ParseArrayLayout(absl::GetFlag(FLAGS_array_layout));
  if (!layout.ok()) return BadFlag(std::string(layout.status().message()));
  lo.layout = *layout;
  const absl::StatusOr<dtrain::data::BadExamples> bad = dtrain::data::ParseBadExamples(absl::GetFlag(FLAGS_bad_images));
  if (!bad.ok()) return BadFlag(std::string(bad.status().message()));
  auto data = dtrain::data::LoadDataset(absl::GetFlag(FLAGS_input_dir), *format, lo);
  if (!data.ok()) return Fail(data.status().ToString());
  std::error_code ec;
  std::filesystem::create_directories(out_dir, ec);
  if (ec) return Fail("cannot create " + out_dir + ": " + ec.message());

  const std::pair<const dtrain::data::Dataset*, const char*> parts[] = {{&data->train, "train.tfrecords"},
                                                                         {&data->test, "test.tfrecords"}};
  for (const auto& [set, name] : parts) {
    const std::string path = (std::filesystem::path(out_dir) / name).string();
    if (absl::Status s = dtrain::data::WriteTfRecordExamples(*set, path, *bad); !s.ok()) return Fail(s.ToString());
    if (set->kind() == dtrain::data::DataKind::kCtr) {
      std::cout << "wrote " << set->count() << " CTR examples of " << set->num_dense << " dense and "
                << set->num_sparse << " sparse features (" << data->format << ") to " << path << "\n";
    } else {
      std::cout << "wrote " << set->count() << " " << set->height << "x" << set->width << "x" << set->channels
                << " examples (" << data->format << ") to " << path << "\n";
    }
  }
  return 0;
}
