// Image folders: the layout torchvision.datasets.ImageFolder reads, one folder per class,
//
//   DIR/train/<class>/**/*.jpg|jpeg|png      (any depth below the class folder; extensions in any case)
//   DIR/val/<class>/...                      (or validation/ or test/; else a validation split of train/)
//
// or DIR/<class>/... itself with a validation split. Classes are train/'s folder names in sorted order (their
// index is the label, as ImageFolder's class_to_idx); files are listed as ImageFolder lists them (folders walked
// in sorted order, symbolic links followed, files sorted by name). The validation folder uses train/'s classes
// (a class it lacks has no examples there; a class train/ lacks is an error). Files of other image types that
// ImageFolder would list (.bmp, .webp, .tif, ...) are not read: the log line counts them.
//
// The examples are decoded when they are read (an ExampleSource, example_source.h): training reads apply
// RandomResizedCrop(image_size) + RandomHorizontalFlip, evaluation reads Resize(resize_size) +
// CenterCrop(image_size); both give image_size x image_size x 3 floats in [0, 1] (grayscale and palette images
// expanded to RGB, alpha dropped). A file that does not decode fails its read with a message naming it.
//
// Thread-safety: ScanImageFolder and ReadImageFolder are re-entrant; the sources are immutable.
#ifndef DTRAIN_WORKER_DATA_IMAGE_FOLDER_H_
#define DTRAIN_WORKER_DATA_IMAGE_FOLDER_H_

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "worker/data/dataset.h"
#include "worker/data/example_source.h"

namespace dtrain::data {

struct ImageFolderOptions {
  int image_size = 224;   // the side of the square images the model takes
  int resize_size = 0;    // evaluation: the shorter side before the centre crop; 0: image_size * 256 / 224
  // No validation folder: this fraction of each class's files (evenly spaced, SplitEvenly) is the test set.
  double validation_split = 0;
  // The JPEG decoder's DCT scaling (image_decode.h); off: every image decoded at full size.
  bool dct_scaling = true;
  int64_t max_pixels = int64_t{1} << 27;  // larger images fail to read
};

// One folder of class folders, listed.
struct ImageFolderIndex {
  std::vector<std::string> classes;  // sorted
  std::vector<std::string> files;    // paths, ImageFolder's order
  std::vector<int32_t> labels;       // index into classes, per file
  int64_t other_images = 0;          // files with an image extension that is not decoded (.bmp, .webp, ...)
};

// Lists `dir`. With `classes` (the training folder's), the folder's class folders must be among them and take
// their labels; without, its own sorted class folders are the classes. NotFound for a missing folder,
// InvalidArgument for one with no class folders or a class folder with no JPEG or PNG file (naming them).
absl::StatusOr<ImageFolderIndex> ScanImageFolder(const std::string& dir,
                                                 const std::vector<std::string>* classes = nullptr);

// The examples of `index` decoded and transformed as the header says. InvalidArgument for sizes <= 0.
absl::StatusOr<std::shared_ptr<const ExampleSource>> MakeImageFolderSource(ImageFolderIndex index,
                                                                           const ImageFolderOptions& o);

// Whether `dir` looks like an image folder (DIR/train/ holding a class folder), for format detection.
bool LooksLikeImageFolder(const std::string& dir);

// Reads DIR as the header says into train and test Datasets with sources (height = width = image_size,
// channels 3, num_classes and class_names from train/). InvalidArgument when there is no validation folder and
// no validation_split (or both), NotFound when DIR holds no image folder.
absl::StatusOr<DatasetPair> ReadImageFolder(const std::string& dir, const ImageFolderOptions& o);

}  // namespace dtrain::data

#endif  // DTRAIN_WORKER_DATA_IMAGE_FOLDER_H_
