#include "worker/data/image_folder.h"

#include <dirent.h>
#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <set>
#include <utility>

#include "absl/status/status.h"
#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "common/status_macros.h"
#include "glog/logging.h"
#include "worker/data/image_decode.h"
#include "worker/data/image_resample.h"
#include "worker/data/preprocess.h"

namespace dtrain::data {
namespace {

std::string Join(const std::string& dir, const std::string& name) {
  if (dir.empty() || dir.back() == '/') return dir + name;
  return dir + "/" + name;
}

bool IsDirectory(const std::string& path) {
  struct stat st;
  return ::stat(path.c_str(), &st) == 0 && S_ISDIR(st.st_mode);
}

enum class FileKind { kDecoded, kOtherImage, kOther };

// ImageFolder's IMG_EXTENSIONS, lower-cased comparison: the ones decoded here and the others.
FileKind KindOf(const std::string& name) {
  const std::string lower = absl::AsciiStrToLower(name);
  for (const char* ext : {".jpg", ".jpeg", ".png"}) {
    if (absl::EndsWith(lower, ext)) return FileKind::kDecoded;
  }
  for (const char* ext : {".ppm", ".bmp", ".pgm", ".tif", ".tiff", ".webp"}) {
    if (absl::EndsWith(lower, ext)) return FileKind::kOtherImage;
  }
  return FileKind::kOther;
}

absl::Status ErrnoStatus(int err, const std::string& what) {
  const std::string message = absl::StrCat(what, ": ", std::strerror(err));
  if (err == ENOENT || err == ENOTDIR) return absl::NotFoundError(message);
  if (err == EACCES || err == EPERM) return absl::PermissionDeniedError(message);
  return absl::DataLossError(message);
}

// Names in `dir` (without . and ..), and whether each is a directory (following links).
absl::Status ListDirectory(const std::string& dir, std::vector<std::string>* dirs, std::vector<std::string>* files) {
  DIR* d = ::opendir(dir.c_str());
  if (d == nullptr) return ErrnoStatus(errno, absl::StrCat("cannot list ", dir));
  while (dirent* e = ::readdir(d)) {
    const std::string name = e->d_name;
    if (name == "." || name == "..") continue;
    const std::string path = Join(dir, name);
    struct stat st;
    if (::stat(path.c_str(), &st) != 0) {
      // A dangling link: os.walk lists it as a file; reading it will say what is wrong.
      files->push_back(name);
      continue;
    }
    (S_ISDIR(st.st_mode) ? dirs : files)->push_back(name);
  }
  ::closedir(d);
  std::sort(dirs->begin(), dirs->end());
  std::sort(files->begin(), files->end());
  return absl::OkStatus();
}

// Every directory below (and including) `root`, following links, each once (a link cycle is not followed).
absl::Status WalkDirectories(const std::string& root, std::vector<std::string>* out) {
  std::set<std::pair<dev_t, ino_t>> seen;
  std::vector<std::string> stack = {root};
  while (!stack.empty()) {
    const std::string dir = stack.back();
    stack.pop_back();
    struct stat st;
    if (::stat(dir.c_str(), &st) != 0) return ErrnoStatus(errno, absl::StrCat("cannot read ", dir));
    if (!seen.insert({st.st_dev, st.st_ino}).second) continue;
    out->push_back(dir);
    std::vector<std::string> dirs, files;
    RETURN_IF_ERROR(ListDirectory(dir, &dirs, &files));
    for (const std::string& d : dirs) stack.push_back(Join(dir, d));
  }
  // os.walk's results sorted by their root path, as ImageFolder sorts them.
  std::sort(out->begin(), out->end());
  return absl::OkStatus();
}

// Reads a whole file.
absl::Status ReadWholeFile(const std::string& path, std::string* bytes) {
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) return ErrnoStatus(errno, absl::StrCat("cannot open ", path));
  struct stat st;
  if (::fstat(fd, &st) != 0) {
    const int err = errno;
    ::close(fd);
    return ErrnoStatus(err, absl::StrCat("cannot read ", path));
  }
  bytes->resize(static_cast<size_t>(std::max<off_t>(st.st_size, 0)));
  size_t done = 0;
  while (done < bytes->size()) {
    const ssize_t n = ::read(fd, bytes->data() + done, bytes->size() - done);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) {
      const int err = n < 0 ? errno : 0;
      ::close(fd);
      if (err != 0) return ErrnoStatus(err, absl::StrCat("cannot read ", path));
      bytes->resize(done);  // shrank while being read
      break;
    }
    done += static_cast<size_t>(n);
  }
  ::close(fd);
  return absl::OkStatus();
}

class ImageFolderSource : public ExampleSource {
 public:
  ImageFolderSource(ImageFolderIndex index, const ImageFolderOptions& o) : index_(std::move(index)), o_(o) {}

  int64_t size() const override { return static_cast<int64_t>(index_.files.size()); }
  bool bytes() const override { return true; }
  bool can_fail() const override { return true; }
  std::string Name(int64_t i) const override { return index_.files[i]; }

  absl::Status Read(int64_t i, bool augment, std::mt19937_64* rng, float* out) const override {
    const std::string& path = index_.files[i];
    thread_local std::string bytes;
    RETURN_IF_ERROR(ReadWholeFile(path, &bytes));
    auto named = [&path](const absl::Status& s) {
      return absl::Status(s.code(), absl::StrCat(path, ": ", s.message()));
    };
    absl::StatusOr<ImageInfo> info = ReadImageInfo(bytes);
    if (!info.ok()) return named(info.status());
    DecodeRequest r;
    r.max_pixels = o_.max_pixels;
    const int size = o_.image_size;
    if (o_.dct_scaling) r.target_width = r.target_height = size;
    bool flip = false;
    if (augment) {
      r.crop = RandomResizedCrop(info->width, info->height, rng);
      flip = Uniform01(rng) < 0.5;
      r.decode_crop_only = true;  // RandomResizedCrop crops before it resizes: nothing outside is read
    } else {
      r.crop = ResizeCenterCrop(info->width, info->height, resize_size(), size);
      r.decode_crop_only = false;  // Resize comes first: the filter reads across the crop's edges
    }
    absl::StatusOr<DecodedImage> image = DecodeImage(bytes, r);
    if (!image.ok()) return named(image.status());
    const CropRect bounds = augment ? image->crop : CropRect{0, 0, static_cast<double>(image->width),
                                                              static_cast<double>(image->height)};
    ResampleRgb(image->rgb.data(), image->width, image->height, image->crop, bounds, size, size, flip, out);
    return absl::OkStatus();
  }

 private:
  int resize_size() const {
    return o_.resize_size > 0 ? o_.resize_size : (o_.image_size * 256 + 112) / 224;
  }

  const ImageFolderIndex index_;
  const ImageFolderOptions o_;
};

// The validation folder of DIR, if any.
std::string FindValidation(const std::string& dir) {
  for (const char* name : {"val", "validation", "test"}) {
    if (IsDirectory(Join(dir, name))) return Join(dir, name);
  }
  return "";
}

Dataset MakeDataset(std::shared_ptr<const ExampleSource> source, std::vector<int32_t> labels,
                    const std::vector<std::string>& classes, int size) {
  Dataset d;
  d.height = d.width = size;
  d.channels = 3;
  d.num_classes = static_cast<int>(classes.size());
  d.class_names = classes;
  d.labels = std::move(labels);
  d.source = std::move(source);
  return d;
}

}  // namespace

absl::StatusOr<ImageFolderIndex> ScanImageFolder(const std::string& dir, const std::vector<std::string>* classes) {
  if (!IsDirectory(dir)) return absl::NotFoundError(absl::StrCat(dir, ": no such folder"));
  std::vector<std::string> class_dirs, top_files;
  RETURN_IF_ERROR(ListDirectory(dir, &class_dirs, &top_files));
  ImageFolderIndex index;
  if (classes == nullptr) {
    if (class_dirs.empty()) {
      return absl::InvalidArgumentError(absl::StrCat(dir, " holds no class folders (an image folder is "
                                                     "DIR/<class>/<image>.jpg, one folder per class)"));
    }
    index.classes = class_dirs;
  } else {
    index.classes = *classes;
    std::vector<std::string> unknown;
    for (const std::string& c : class_dirs) {
      if (!std::binary_search(classes->begin(), classes->end(), c)) unknown.push_back(c);
    }
    if (!unknown.empty()) {
      return absl::InvalidArgumentError(absl::StrCat(dir, " has class folders the training folder lacks: ",
                                                     absl::StrJoin(unknown, ", ")));
    }
  }
  std::vector<std::string> empty;
  for (const std::string& c : class_dirs) {
    const int32_t label = static_cast<int32_t>(
        std::lower_bound(index.classes.begin(), index.classes.end(), c) - index.classes.begin());
    std::vector<std::string> dirs;
    RETURN_IF_ERROR(WalkDirectories(Join(dir, c), &dirs));
    const size_t before = index.files.size();
    for (const std::string& d : dirs) {
      std::vector<std::string> subdirs, files;
      RETURN_IF_ERROR(ListDirectory(d, &subdirs, &files));
      for (const std::string& f : files) {
        const FileKind kind = KindOf(f);
        if (kind == FileKind::kOtherImage) ++index.other_images;
        if (kind != FileKind::kDecoded) continue;
        index.files.push_back(Join(d, f));
        index.labels.push_back(label);
      }
    }
    if (index.files.size() == before) empty.push_back(c);
  }
  if (!empty.empty() && classes == nullptr) {
    return absl::InvalidArgumentError(absl::StrCat(dir, ": no JPEG or PNG file (.jpg, .jpeg, .png) in the class "
                                                   "folder", empty.size() > 1 ? "s " : " ", absl::StrJoin(empty, ", ")));
  }
  if (index.files.empty()) {
    return absl::InvalidArgumentError(absl::StrCat(dir, ": no JPEG or PNG file (.jpg, .jpeg, .png) in any class folder"));
  }
  if (index.other_images > 0) {
    LOG(WARNING) << dir << ": " << index.other_images
                 << " files of other image types (.bmp, .ppm, .pgm, .tif, .webp) are not read: convert them to JPEG "
                    "or PNG to use them";
  }
  return index;
}

absl::StatusOr<std::shared_ptr<const ExampleSource>> MakeImageFolderSource(ImageFolderIndex index,
                                                                           const ImageFolderOptions& o) {
  if (o.image_size <= 0 || o.resize_size < 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("image size ", o.image_size, " and resize size ", o.resize_size, ": sizes must be > 0"));
  }
  if (o.resize_size > 0 && o.resize_size < o.image_size) {
    return absl::InvalidArgumentError(absl::StrCat("resize size ", o.resize_size, " is smaller than the image size ",
                                                   o.image_size, " it is centre-cropped to"));
  }
  return std::shared_ptr<const ExampleSource>(std::make_shared<ImageFolderSource>(std::move(index), o));
}

bool LooksLikeImageFolder(const std::string& dir) {
  const std::string train = Join(dir, "train");
  if (!IsDirectory(train)) return false;
  std::vector<std::string> dirs, files;
  return ListDirectory(train, &dirs, &files).ok() && !dirs.empty();
}

absl::StatusOr<DatasetPair> ReadImageFolder(const std::string& dir, const ImageFolderOptions& o) {
  if (!IsDirectory(dir)) return absl::NotFoundError(absl::StrCat(dir, ": no such folder"));
  if (!(o.validation_split >= 0 && o.validation_split < 1)) {
    return absl::InvalidArgumentError(absl::StrCat("validation split ", o.validation_split, " is not in [0, 1)"));
  }
  const std::string train_dir = IsDirectory(Join(dir, "train")) ? Join(dir, "train") : dir;
  const std::string val_dir = train_dir == dir ? "" : FindValidation(dir);
  if (!val_dir.empty() && o.validation_split > 0) {
    return absl::InvalidArgumentError(absl::StrCat("a validation split of ", o.validation_split, " was asked for but ",
                                                   val_dir, " exists: use one or the other"));
  }
  if (val_dir.empty() && o.validation_split <= 0) {
    return absl::InvalidArgumentError(absl::StrCat(
        dir, " has no validation folder (", Join(dir, "val"), ", validation/ or test/", train_dir == dir ? ", nor train/" : "",
        "): add one, or hold out part of the training images with a validation split (--validation_split=0.1)"));
  }
  ASSIGN_OR_RETURN(ImageFolderIndex train, ScanImageFolder(train_dir));
  DatasetPair p;
  p.format = "image-folder";
  ImageFolderIndex test;
  if (!val_dir.empty()) {
    ASSIGN_OR_RETURN(test, ScanImageFolder(val_dir, &train.classes));
  } else {
    // Per class, so that the split is stratified; files of one class are contiguous in the index.
    ImageFolderIndex kept;
    kept.classes = test.classes = train.classes;
    size_t begin = 0;
    while (begin < train.files.size()) {
      size_t end = begin;
      while (end < train.files.size() && train.labels[end] == train.labels[begin]) ++end;
      std::vector<int64_t> keep, held;
      SplitEvenly(static_cast<int64_t>(end - begin), o.validation_split, &keep, &held);
      for (int64_t i : keep) {
        kept.files.push_back(train.files[begin + i]);
        kept.labels.push_back(train.labels[begin + i]);
      }
      for (int64_t i : held) {
        test.files.push_back(train.files[begin + i]);
        test.labels.push_back(train.labels[begin + i]);
      }
      begin = end;
    }
    if (test.files.empty() || kept.files.empty()) {
      return absl::InvalidArgumentError(absl::StrCat("a validation split of ", o.validation_split, " of ",
                                                     train.files.size(), " images in ", train_dir,
                                                     " leaves one part empty"));
    }
    train = std::move(kept);
  }
  const std::vector<std::string> classes = train.classes;
  std::vector<int32_t> train_labels = train.labels, test_labels = test.labels;
  const int64_t train_count = static_cast<int64_t>(train.files.size()), test_count = static_cast<int64_t>(test.files.size());
  ASSIGN_OR_RETURN(std::shared_ptr<const ExampleSource> train_source, MakeImageFolderSource(std::move(train), o));
  ASSIGN_OR_RETURN(std::shared_ptr<const ExampleSource> test_source, MakeImageFolderSource(std::move(test), o));
  p.train = MakeDataset(std::move(train_source), std::move(train_labels), classes, o.image_size);
  p.test = MakeDataset(std::move(test_source), std::move(test_labels), classes, o.image_size);
  LOG(INFO) << "Image folder " << dir << ": " << classes.size() << " classes, " << train_count << " training images ("
            << train_dir << "), " << test_count << " test images ("
            << (val_dir.empty() ? absl::StrCat("a ", o.validation_split, " split of them") : val_dir) << "), read as "
            << o.image_size << "x" << o.image_size << "x3";
  return p;
}

}  // namespace dtrain::data
