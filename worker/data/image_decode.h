// JPEG and PNG decoding for the image-folder reader (image_folder.h): libjpeg-turbo (libjpeg API, which can
// decode a crop of an image at a reduced DCT scale) and libspng. The kind of image is told by its bytes, not by
// its file name, so a PNG named .jpg decodes.
//
//   ASSIGN_OR_RETURN(ImageInfo info, ReadImageInfo(bytes));            // the header only
//   DecodeRequest r{.crop = {x, y, w, h}, .target_width = 224, .target_height = 224};
//   ASSIGN_OR_RETURN(DecodedImage img, DecodeImage(bytes, r));
//   // img.rgb holds img.width x img.height RGB pixels; img.crop is the requested crop in them.
//
// Errors (every one InvalidArgument, naming no file: the caller adds the path): bytes that are neither JPEG nor
// PNG (the message says what the first bytes look like), a corrupt or truncated image, an image larger than
// DecodeRequest::max_pixels.
//
// Thread-safety: stateless; calls from any number of threads at once.
#ifndef DTRAIN_WORKER_DATA_IMAGE_DECODE_H_
#define DTRAIN_WORKER_DATA_IMAGE_DECODE_H_

#include <cstdint>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

namespace dtrain::data {

enum class ImageCodec { kJpeg, kPng };

struct ImageInfo {
  ImageCodec codec = ImageCodec::kJpeg;
  int width = 0, height = 0;
};

// A rectangle in an image's pixel coordinates (x to the right, y down; fractional for the resampler).
struct CropRect {
  double x = 0, y = 0, width = 0, height = 0;
};

struct DecodeRequest {
  // The part of the image wanted, in the image's own pixels (clamped to it); width or height <= 0: all of it.
  CropRect crop;
  // The size the crop will be resampled to. A JPEG is decoded at the smallest DCT scale of 1/8, 1/4, 1/2 or 1
  // that leaves the crop at least this large (the scales libjpeg-turbo decodes fast): decoding a 1024-pixel
  // photo for a 224-pixel crop costs a quarter. 0: full scale.
  int target_width = 0, target_height = 0;
  // Decode only the rows and the iMCU-aligned columns around the crop (JPEG; a PNG is decoded whole).
  bool decode_crop_only = true;
  // Refuse images with more pixels than this (a hostile header cannot make us allocate gigabytes).
  int64_t max_pixels = int64_t{1} << 27;
};

struct DecodedImage {
  int width = 0, height = 0;   // of rgb, which is height rows of width * 3 bytes
  std::vector<uint8_t> rgb;
  CropRect crop;               // the requested crop in rgb's pixels (scaled and shifted like the decode)
  ImageInfo info;              // the file's own size and codec
  int scale_eighths = 8;       // the DCT scale used: 1, 2, 4 or 8 eighths (PNG: 8)
};

// The codec and size from the header. InvalidArgument as above.
absl::StatusOr<ImageInfo> ReadImageInfo(absl::string_view bytes);

// Decodes `bytes` to 8-bit RGB (grayscale and palette expanded, alpha dropped, CMYK converted), as much of it
// as `r` needs.
absl::StatusOr<DecodedImage> DecodeImage(absl::string_view bytes, const DecodeRequest& r = {});

}  // namespace dtrain::data

#endif  // DTRAIN_WORKER_DATA_IMAGE_DECODE_H_
