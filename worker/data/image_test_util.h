// Test-only helpers for the image readers' tests: JPEG and PNG files encoded with the same libraries the readers
// decode with (libjpeg-turbo's compressor, libspng's encoder), and small synthetic pictures. Header-only.
#ifndef DTRAIN_WORKER_DATA_IMAGE_TEST_UTIL_H_
#define DTRAIN_WORKER_DATA_IMAGE_TEST_UTIL_H_

#include <jpeglib.h>
#include <spng.h>

#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <vector>

#include "gtest/gtest.h"

namespace dtrain::data::test_util {

// A smooth picture with some detail (gradients, a disc, stripes) of width x height x channels bytes, varying with
// `seed`: JPEG-friendly, and different in every corner so that crops and flips show.
inline std::vector<uint8_t> Picture(int width, int height, int channels, int seed = 0) {
  std::vector<uint8_t> p(static_cast<size_t>(width) * height * channels);
  for (int y = 0; y < height; ++y) {
    for (int x = 0; x < width; ++x) {
      const double dx = x - width * 0.6, dy = y - height * 0.4;
      const bool disc = dx * dx + dy * dy < 0.04 * width * height;
      for (int c = 0; c < channels; ++c) {
        double v = 255.0 * x / width * (c == 0) + 255.0 * y / height * (c == 1) + (seed * 37 % 128) * (c == 2) +
                   40 * std::sin((x + 2 * y) * 0.15 + c + seed);
        if (disc) v = 255 - v * 0.5;
        p[(static_cast<size_t>(y) * width + x) * channels + c] = static_cast<uint8_t>(std::fmin(255, std::fmax(0, v)));
      }
    }
  }
  return p;
}

// JPEG of `pixels` (channels 1 or 3), baseline unless `progressive`.
inline std::string EncodeJpeg(const std::vector<uint8_t>& pixels, int width, int height, int channels,
                              int quality = 95, bool progressive = false) {
  jpeg_compress_struct c;
  jpeg_error_mgr err;
  c.err = jpeg_std_error(&err);
  jpeg_create_compress(&c);
  unsigned char* out = nullptr;
  unsigned long size = 0;
  jpeg_mem_dest(&c, &out, &size);
  c.image_width = width;
  c.image_height = height;
  c.input_components = channels;
  c.in_color_space = channels == 1 ? JCS_GRAYSCALE : JCS_RGB;
  jpeg_set_defaults(&c);
  jpeg_set_quality(&c, quality, TRUE);
  if (progressive) jpeg_simple_progression(&c);
  jpeg_start_compress(&c, TRUE);
  while (c.next_scanline < c.image_height) {
    JSAMPROW row = const_cast<JSAMPROW>(pixels.data() + static_cast<size_t>(c.next_scanline) * width * channels);
    jpeg_write_scanlines(&c, &row, 1);
  }
  jpeg_finish_compress(&c);
  jpeg_destroy_compress(&c);
  std::string bytes(reinterpret_cast<char*>(out), size);
  std::free(out);
  return bytes;
}

// PNG of `pixels` with spng's color type (SPNG_COLOR_TYPE_TRUECOLOR, _GRAYSCALE, _TRUECOLOR_ALPHA, ...) and bit
// depth (8 or 16; 16-bit samples in host byte order, as spng's encoder takes them).
inline std::string EncodePng(const std::vector<uint8_t>& pixels, int width, int height, uint8_t color_type,
                             uint8_t bit_depth = 8) {
  spng_ctx* enc = spng_ctx_new(SPNG_CTX_ENCODER);
  spng_set_option(enc, SPNG_ENCODE_TO_BUFFER, 1);
  spng_ihdr ihdr = {};
  ihdr.width = width;
  ihdr.height = height;
  ihdr.bit_depth = bit_depth;
  ihdr.color_type = color_type;
  spng_set_ihdr(enc, &ihdr);
  int e = spng_encode_image(enc, pixels.data(), pixels.size(), SPNG_FMT_PNG, SPNG_ENCODE_FINALIZE);
  EXPECT_EQ(e, 0) << spng_strerror(e);
  size_t size = 0;
  void* png = spng_get_png_buffer(enc, &size, &e);
  std::string bytes(static_cast<char*>(png), size);
  std::free(png);
  spng_ctx_free(enc);
  return bytes;
}

// The mean absolute difference of two byte images of equal size.
inline double MeanAbsDiff(const uint8_t* a, const uint8_t* b, size_t n) {
  double sum = 0;
  for (size_t i = 0; i < n; ++i) sum += std::fabs(static_cast<double>(a[i]) - b[i]);
  return n ? sum / n : 0;
}

}  // namespace dtrain::data::test_util

#endif  // DTRAIN_WORKER_DATA_IMAGE_TEST_UTIL_H_
