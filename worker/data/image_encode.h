// JPEG and PNG encoding (libjpeg-turbo, libspng), the inverse of image_decode.h: for test fixtures, fuzz seeds and
// conversions that write images.
//
// Thread-safety: stateless.
#ifndef DTRAIN_WORKER_DATA_IMAGE_ENCODE_H_
#define DTRAIN_WORKER_DATA_IMAGE_ENCODE_H_

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/statusor.h"

namespace dtrain::data {

// A JPEG of `pixels` (height rows of width * channels bytes; channels 1 or 3), baseline unless `progressive`.
// InvalidArgument for bad sizes.
absl::StatusOr<std::string> EncodeJpeg(const std::vector<uint8_t>& pixels, int width, int height, int channels,
                                       int quality = 95, bool progressive = false);

// A PNG of `pixels` with libspng's color type (SPNG_COLOR_TYPE_TRUECOLOR = 2, _GRAYSCALE = 0,
// _TRUECOLOR_ALPHA = 6, ...) and bit depth (8 or 16; 16-bit samples in host byte order, as spng takes them).
// InvalidArgument with spng's message for what it refuses.
absl::StatusOr<std::string> EncodePng(const std::vector<uint8_t>& pixels, int width, int height, int color_type,
                                      int bit_depth = 8);

}  // namespace dtrain::data

#endif  // DTRAIN_WORKER_DATA_IMAGE_ENCODE_H_
