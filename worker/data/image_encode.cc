#include "worker/data/image_encode.h"

#include <jpeglib.h>
#include <spng.h>

#include <csetjmp>
#include <cstdlib>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"

namespace dtrain::data {
namespace {

struct JpegErrors {
  jpeg_error_mgr mgr;
  jmp_buf jump;
  char message[JMSG_LENGTH_MAX];
};

void JpegErrorExit(j_common_ptr cinfo) {
  auto* e = reinterpret_cast<JpegErrors*>(cinfo->err);
  (*cinfo->err->format_message)(cinfo, e->message);
  std::longjmp(e->jump, 1);
}

// Compresses into *out (malloc'ed by libjpeg); no object with a destructor lives across the setjmp.
absl::Status Compress(const std::vector<uint8_t>& pixels, int width, int height, int channels, int quality,
                      bool progressive, unsigned char** out, unsigned long* size) {
  jpeg_compress_struct c;
  JpegErrors errors;
  c.err = jpeg_std_error(&errors.mgr);
  errors.mgr.error_exit = JpegErrorExit;
  if (setjmp(errors.jump)) {
    jpeg_destroy_compress(&c);
    return absl::InvalidArgumentError(absl::StrCat("JPEG encoding: ", errors.message));
  }
  jpeg_create_compress(&c);
  jpeg_mem_dest(&c, out, size);
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
  return absl::OkStatus();
}

}  // namespace

absl::StatusOr<std::string> EncodeJpeg(const std::vector<uint8_t>& pixels, int width, int height, int channels,
                                       int quality, bool progressive) {
  if (width <= 0 || height <= 0 || (channels != 1 && channels != 3) ||
      pixels.size() != static_cast<size_t>(width) * height * channels) {
    return absl::InvalidArgumentError(absl::StrCat("JPEG encoding: ", pixels.size(), " bytes for ", width, "x",
                                                   height, "x", channels));
  }
  unsigned char* out = nullptr;
  unsigned long size = 0;
  const absl::Status s = Compress(pixels, width, height, channels, quality, progressive, &out, &size);
  std::string bytes = s.ok() ? std::string(reinterpret_cast<char*>(out), size) : std::string();
  std::free(out);
  if (!s.ok()) return s;
  return bytes;
}

absl::StatusOr<std::string> EncodePng(const std::vector<uint8_t>& pixels, int width, int height, int color_type,
                                      int bit_depth) {
  spng_ctx* enc = spng_ctx_new(SPNG_CTX_ENCODER);
  if (enc == nullptr) return absl::ResourceExhaustedError("spng_ctx_new failed");
  spng_set_option(enc, SPNG_ENCODE_TO_BUFFER, 1);
  spng_ihdr ihdr = {};
  ihdr.width = static_cast<uint32_t>(width);
  ihdr.height = static_cast<uint32_t>(height);
  ihdr.bit_depth = static_cast<uint8_t>(bit_depth);
  ihdr.color_type = static_cast<uint8_t>(color_type);
  int e = spng_set_ihdr(enc, &ihdr);
  if (e == 0) e = spng_encode_image(enc, pixels.data(), pixels.size(), SPNG_FMT_PNG, SPNG_ENCODE_FINALIZE);
  std::string bytes;
  if (e == 0) {
    size_t size = 0;
    void* png = spng_get_png_buffer(enc, &size, &e);
    if (png != nullptr) bytes.assign(static_cast<char*>(png), size);
    std::free(png);
  }
  spng_ctx_free(enc);
  if (e != 0) return absl::InvalidArgumentError(absl::StrCat("PNG encoding: ", spng_strerror(e)));
  return bytes;
}

}  // namespace dtrain::data
