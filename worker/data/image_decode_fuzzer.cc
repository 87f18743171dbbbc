// libFuzzer harness for the image decoders' entry points (ReadImageInfo, DecodeImage): JPEG and PNG bytes, with a
// crop and a target size taken from the input, as the image-folder reader asks for them. Bytes that decode must
// give a consistent image (its pixels and crop inside it); bytes that do not must say so with InvalidArgument.
//
// Input: 8 bytes choosing the request (crop x, y, width, height as fractions of the image; target size;
// whether to decode the crop only), then the file's bytes. Seeds: fuzz/seeds/image_decode_fuzzer/ (small JPEG and
// PNG files of each kind, fuzz/make_seeds.cc).
#include <cstddef>
#include <cstdint>

#include "absl/strings/string_view.h"
#include "glog/logging.h"
#include "worker/data/image_decode.h"
#include "worker/data/image_resample.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace dtrain::data;  // NOLINT
  if (size < 8) return 0;
  const absl::string_view bytes(reinterpret_cast<const char*>(data) + 8, size - 8);
  absl::StatusOr<ImageInfo> info = ReadImageInfo(bytes);
  if (!info.ok()) {
    CHECK(absl::IsInvalidArgument(info.status())) << info.status();
    return 0;
  }
  CHECK_GT(info->width, 0);
  CHECK_GT(info->height, 0);
  DecodeRequest r;
  r.max_pixels = int64_t{1} << 22;  // keeps the fuzzer's memory small; the limit itself is exercised too
  const double W = info->width, H = info->height;
  if (data[0] & 1) {
    r.crop = {W * data[1] / 256.0, H * data[2] / 256.0, W * (data[3] + 1) / 256.0, H * (data[4] + 1) / 256.0};
  }
  r.target_width = r.target_height = data[5] % 64;
  r.decode_crop_only = data[6] & 1;
  absl::StatusOr<DecodedImage> img = DecodeImage(bytes, r);
  if (!img.ok()) {
    CHECK(absl::IsInvalidArgument(img.status())) << img.status();
    return 0;
  }
  CHECK_GT(img->width, 0);
  CHECK_GT(img->height, 0);
  CHECK_EQ(img->rgb.size(), static_cast<size_t>(img->width) * img->height * 3);
  CHECK_EQ(img->info.width, info->width);
  CHECK(img->crop.x >= 0 && img->crop.y >= 0 && img->crop.width > 0 && img->crop.height > 0);
  CHECK_LE(img->crop.x + img->crop.width, img->width + 1e-6);
  CHECK_LE(img->crop.y + img->crop.height, img->height + 1e-6);
  // And resample it, as the reader does: no read outside the image.
  const int out = 1 + data[7] % 16;
  std::vector<float> pixels(static_cast<size_t>(out) * out * 3);
  ResampleRgb(img->rgb.data(), img->width, img->height, img->crop, img->crop, out, out, data[7] & 0x80, pixels.data());
  for (float v : pixels) CHECK(v >= 0 && v <= 1) << v;
  return 0;
}
