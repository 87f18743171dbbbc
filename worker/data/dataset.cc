// LoadDataset: finds a supported data set in a directory by its file names and reads train and test.
#include <sys/stat.h>

#include <algorithm>
#include <filesystem>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "common/status_macros.h"
#include "glog/logging.h"
#include "worker/data/array_source.h"
#include "worker/data/criteo.h"
#include "worker/data/dataset.h"
#include "worker/data/image_folder.h"

namespace dtrain::data {
namespace {

bool IsRegularFile(const std::string& path) {
  struct stat st;
  return ::stat(path.c_str(), &st) == 0 && S_ISREG(st.st_mode);
}

std::string Join(const std::string& dir, const std::string& name) {
  if (dir.empty() || dir.back() == '/') return dir + name;
  return dir + "/" + name;
}

// The files one format needs, resolved against a directory, plus the names tried (for NotFound).
struct Located {
  bool found = false;
  std::vector<std::string> train, test;
  std::vector<std::string> looked_for;
};

// "name" or "name.gz", preferring whichever exists.
std::string FindMaybeGz(const std::string& dir, const std::string& name, std::vector<std::string>* tried) {
  for (const std::string& candidate : {Join(dir, name), Join(dir, name + ".gz")}) {
    if (IsRegularFile(candidate)) return candidate;
  }
  tried->push_back(Join(dir, name + "[.gz]"));
  return "";
}

Located LocateMnist(const std::string& dir) {
  Located l;
  const std::string names[4] = {"train-images-idx3-ubyte", "train-labels-idx1-ubyte", "t10k-images-idx3-ubyte",
                                "t10k-labels-idx1-ubyte"};
  std::string paths[4];
  for (int i = 0; i < 4; ++i) paths[i] = FindMaybeGz(dir, names[i], &l.looked_for);
  l.found = l.looked_for.empty();
  if (!l.found) {
    // Report every name, not just the missing ones, so the message shows the whole expectation.
    l.looked_for.clear();
    for (const std::string& n : names) l.looked_for.push_back(Join(dir, n + "[.gz]"));
    return l;
  }
  l.train = {paths[0], paths[1]};
  l.test = {paths[2], paths[3]};
  return l;
}

Located LocateCifarIn(const std::string& dir) {
  Located l;
  std::vector<std::string> missing;
  for (int k = 1; k <= 5; ++k) {
    const std::string p = Join(dir, absl::StrCat("data_batch_", k, ".bin"));
    if (IsRegularFile(p)) {
      l.train.push_back(p);
    } else {
      missing.push_back(p);
    }
  }
  const std::string test = Join(dir, "test_batch.bin");
  l.looked_for = {Join(dir, "data_batch_{1..5}.bin"), test};
  l.found = !l.train.empty() && IsRegularFile(test);
  if (l.found) {
    l.test = {test};
    if (!missing.empty()) {
      LOG(WARNING) << "CIFAR-10 in " << dir << ": using " << l.train.size() << " of 5 training batches; missing "
                   << absl::StrJoin(missing, ", ");
    }
  }
  return l;
}

Located LocateCifar(const std::string& dir) {
  Located direct = LocateCifarIn(dir);
  if (direct.found) return direct;
  Located nested = LocateCifarIn(Join(dir, "cifar-10-batches-bin"));
  if (nested.found) return nested;
  direct.looked_for.insert(direct.looked_for.end(), nested.looked_for.begin(), nested.looked_for.end());
  return direct;
}

Located LocateTfRecord(const std::string& dir) {
  Located l;
  const std::string train = Join(dir, "train.tfrecords"), test = Join(dir, "test.tfrecords");
  l.looked_for = {train, test};
  l.found = IsRegularFile(train) && IsRegularFile(test);
  if (l.found) {
    l.train = {train};
    l.test = {test};
  }
  return l;
}

Located LocateCriteo(const std::string& dir) {
  Located l;
  const std::string train = FindMaybeGz(dir, "train.txt", &l.looked_for);
  const std::string test = FindMaybeGz(dir, "test.txt", &l.looked_for);
  l.found = l.looked_for.empty();
  if (l.found) {
    l.train = {train};
    l.test = {test};
  } else {
    l.looked_for = {Join(dir, "train.txt[.gz]"), Join(dir, "test.txt[.gz]")};
  }
  return l;
}

// Train and test must be the same kind of data with the same geometry or features.
absl::Status CheckSameShape(const DatasetPair& p, const Located& l) {
  if (p.train.kind() == DataKind::kCtr || p.test.kind() == DataKind::kCtr) {
    if (p.train.num_dense == p.test.num_dense && p.train.num_sparse == p.test.num_sparse) return absl::OkStatus();
    return absl::InvalidArgumentError(absl::StrCat(
        "train and test examples differ in their features: ", p.train.num_dense, " dense + ", p.train.num_sparse,
        " sparse (", l.train[0], ") vs ", p.test.num_dense, " dense + ", p.test.num_sparse, " sparse (", l.test[0],
        ")"));
  }
  if (p.train.height != p.test.height || p.train.width != p.test.width || p.train.channels != p.test.channels) {
    return absl::InvalidArgumentError(absl::StrCat(
        "train and test images differ in shape: ", p.train.height, "x", p.train.width, "x", p.train.channels,
        " (", l.train[0], ") vs ", p.test.height, "x", p.test.width, "x", p.test.channels, " (", l.test[0], ")"));
  }
  return absl::OkStatus();
}

Located LocateNpy(const std::string& dir) {
  Located l;
  l.looked_for = {Join(dir, "train.npz"), Join(dir, "x_train.npy + y_train.npy"), Join(dir, "*.npz with x_train")};
  l.found = LooksLikeNpy(dir);
  if (l.found) l.train = l.test = {dir};
  return l;
}

Located LocateCsv(const std::string& dir) {
  Located l;
  l.looked_for = {Join(dir, "train.csv[.gz]")};
  l.found = LooksLikeCsv(dir);
  if (l.found) l.train = l.test = {dir};
  return l;
}

Located LocateImageFolder(const std::string& dir) {
  Located l;
  l.looked_for = {Join(dir, "train/<class>/*.jpg|png")};
  l.found = LooksLikeImageFolder(dir);
  if (l.found) l.train = l.test = {dir};
  return l;
}

absl::StatusOr<DatasetPair> Read(DataFormat format, const Located& l, const LoadOptions& o) {
  DatasetPair p;
  switch (format) {
    case DataFormat::kImageFolder: {
      ImageFolderOptions io;
      io.image_size = o.image_size;
      io.resize_size = o.resize_size;
      io.validation_split = o.validation_split;
      ASSIGN_OR_RETURN(p, ReadImageFolder(l.train[0], io));
      break;
    }
    case DataFormat::kNpy: {
      ASSIGN_OR_RETURN(p, ReadNpyDataset(l.train[0], o));
      break;
    }
    case DataFormat::kCsv: {
      ASSIGN_OR_RETURN(p, ReadCsvDataset(l.train[0], o));
      break;
    }
    case DataFormat::kMnistIdx: {
      p.format = "mnist-idx";
      ASSIGN_OR_RETURN(p.train, ReadMnistIdx(l.train[0], l.train[1]));
      ASSIGN_OR_RETURN(p.test, ReadMnistIdx(l.test[0], l.test[1]));
      break;
    }
    case DataFormat::kCifar10Bin: {
      p.format = "cifar10-bin";
      ASSIGN_OR_RETURN(p.train, ReadCifar10Bin(l.train));
      ASSIGN_OR_RETURN(p.test, ReadCifar10Bin(l.test));
      break;
    }
    case DataFormat::kTfRecord: {
      p.format = "tfrecord";
      ASSIGN_OR_RETURN(p.train, ReadTfRecordExamples(l.train[0]));
      ASSIGN_OR_RETURN(p.test, ReadTfRecordExamples(l.test[0]));
      break;
    }
    case DataFormat::kCriteo: {
      p.format = "criteo";
      ASSIGN_OR_RETURN(CriteoLayout layout, ReadCriteoLayout(std::filesystem::path(l.train[0]).parent_path()));
      ASSIGN_OR_RETURN(p.train, ReadCriteo(l.train[0], layout));
      ASSIGN_OR_RETURN(p.test, ReadCriteo(l.test[0], layout));
      break;
    }
    case DataFormat::kAuto:
      return absl::InternalError("Read(kAuto)");
  }
  RETURN_IF_ERROR(CheckSameShape(p, l));
  // One class count for both (a test set may lack the last classes).
  p.train.num_classes = p.test.num_classes = std::max(p.train.num_classes, p.test.num_classes);
  return p;
}

}  // namespace

absl::StatusOr<DatasetPair> LoadDataset(const std::string& dir, DataFormat format, const LoadOptions& options) {
  struct Candidate {
    DataFormat format;
    const char* name;
    Located (*locate)(const std::string&);
  };
  const Candidate candidates[] = {{DataFormat::kMnistIdx, "MNIST IDX", LocateMnist},
                                  {DataFormat::kCifar10Bin, "CIFAR-10 binary", LocateCifar},
                                  {DataFormat::kTfRecord, "TFRecord", LocateTfRecord},
                                  {DataFormat::kCriteo, "Criteo text", LocateCriteo},
                                  {DataFormat::kNpy, "NumPy", LocateNpy},
                                  {DataFormat::kCsv, "CSV", LocateCsv},
                                  {DataFormat::kImageFolder, "image folder", LocateImageFolder}};
  if (format == DataFormat::kImageFolder) {
    // Named explicitly, DIR itself may be the class folders (with a validation split): its reader says what is
    // missing.
    Located l;
    l.found = true;
    l.train = l.test = {dir};
    return Read(format, l, options);
  }
  std::vector<std::string> looked_for;
  for (const Candidate& c : candidates) {
    if (format != DataFormat::kAuto && format != c.format) continue;
    const Located l = c.locate(dir);
    if (l.found) {
      LOG(INFO) << "Loading " << c.name << " data from " << dir;
      return Read(c.format, l, options);
    }
    looked_for.push_back(absl::StrCat(c.name, ": ", absl::StrJoin(l.looked_for, ", ")));
  }
  return absl::NotFoundError(absl::StrCat("no data set found in ", dir, "; looked for ",
                                          absl::StrJoin(looked_for, "; ")));
}

absl::StatusOr<DataFormat> ParseDataFormat(absl::string_view name) {
  const std::pair<const char*, DataFormat> formats[] = {{"auto", DataFormat::kAuto},
                                                        {"mnist-idx", DataFormat::kMnistIdx},
                                                        {"cifar10-bin", DataFormat::kCifar10Bin},
                                                        {"tfrecord", DataFormat::kTfRecord},
                                                        {"criteo", DataFormat::kCriteo},
                                                        {"image_folder", DataFormat::kImageFolder},
                                                        {"image-folder", DataFormat::kImageFolder},
                                                        {"npy", DataFormat::kNpy},
                                                        {"npz", DataFormat::kNpy},
                                                        {"csv", DataFormat::kCsv}};
  std::vector<std::string> names;
  for (const auto& [n, format] : formats) {
    if (name == n) return format;
    if (absl::string_view(n) != "image-folder" && absl::string_view(n) != "npz") names.push_back(n);
  }
  return absl::InvalidArgumentError(
      absl::StrCat("unknown data format \"", name, "\"; expected one of ", absl::StrJoin(names, ", ")));
}

}  // namespace dtrain::data
