// JPEG (libjpeg-turbo through the libjpeg API: DCT scaling, jpeg_crop_scanline, jpeg_skip_scanlines) and PNG
// (libspng) to RGB bytes.
#include "worker/data/image_decode.h"

#include <jerror.h>
#include <jpeglib.h>
#include <spng.h>

#include <algorithm>
#include <cmath>
#include <csetjmp>
#include <cstdio>
#include <cstring>
#include <string>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"

namespace dtrain::data {
namespace {

constexpr unsigned char kPngMagic[8] = {0x89, 'P', 'N', 'G', '\r', '\n', 0x1a, '\n'};

bool StartsWith(absl::string_view bytes, const void* magic, size_t n) {
  return bytes.size() >= n && std::memcmp(bytes.data(), magic, n) == 0;
}

// What the first bytes of something that is neither JPEG nor PNG look like, for the error message.
std::string Describe(absl::string_view bytes) {
  if (bytes.empty()) return "an empty file";
  if (StartsWith(bytes, "GIF8", 4)) return "a GIF image";
  if (StartsWith(bytes, "BM", 2)) return "a BMP image";
  if (bytes.size() >= 12 && StartsWith(bytes, "RIFF", 4) && bytes.substr(8, 4) == "WEBP") return "a WebP image";
  if (StartsWith(bytes, "II*\0", 4) || StartsWith(bytes, "MM\0*", 4)) return "a TIFF image";
  std::string hex;
  for (size_t i = 0; i < std::min<size_t>(bytes.size(), 8); ++i) {
    absl::StrAppendFormat(&hex, "%s%02x", i ? " " : "", static_cast<unsigned char>(bytes[i]));
  }
  return absl::StrCat("bytes starting ", hex);
}

absl::StatusOr<ImageCodec> Sniff(absl::string_view bytes) {
  if (bytes.size() >= 3 && static_cast<unsigned char>(bytes[0]) == 0xff &&
      static_cast<unsigned char>(bytes[1]) == 0xd8 && static_cast<unsigned char>(bytes[2]) == 0xff) {
    return ImageCodec::kJpeg;
  }
  if (StartsWith(bytes, kPngMagic, sizeof(kPngMagic))) return ImageCodec::kPng;
  return absl::InvalidArgumentError(
      absl::StrCat("not a JPEG or PNG image (", Describe(bytes), "; only JPEG and PNG are decoded)"));
}

absl::Status TooLarge(int64_t w, int64_t h, int64_t max_pixels) {
  return absl::InvalidArgumentError(
      absl::StrCat("image of ", w, "x", h, " pixels is larger than the limit of ", max_pixels, " pixels"));
}

// ---- JPEG ----

// libjpeg reports errors through error_exit, which must not return: it jumps back into the decode call. Warnings
// that mean the data is cut short or corrupt jump back too (libjpeg would fill the rest with gray); harmless
// ones (extraneous bytes before a marker, common in real photos) are ignored.
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

void JpegEmitMessage(j_common_ptr cinfo, int level) {
  if (level >= 0) return;  // trace messages
  const int code = cinfo->err->msg_code;
  if (code == JWRN_JPEG_EOF || code == JWRN_HIT_MARKER || code == JWRN_MUST_RESYNC || code == JWRN_NOT_SEQUENTIAL) {
    auto* e = reinterpret_cast<JpegErrors*>(cinfo->err);
    (*cinfo->err->format_message)(cinfo, e->message);
    std::longjmp(e->jump, 1);
  }
}

void SetUpJpeg(jpeg_decompress_struct* cinfo, JpegErrors* errors, absl::string_view bytes) {
  cinfo->err = jpeg_std_error(&errors->mgr);
  errors->mgr.error_exit = JpegErrorExit;
  errors->mgr.emit_message = JpegEmitMessage;
  errors->message[0] = '\0';
}

// The scale in eighths (1, 2, 4 or 8) at which a crop of crop_w x crop_h stays at least target_w x target_h.
int ChooseScale(double crop_w, double crop_h, int target_w, int target_h) {
  if (target_w <= 0 || target_h <= 0) return 8;
  for (int s : {1, 2, 4}) {
    // libjpeg rounds scaled sizes up; one pixel of margin keeps the resampler downscaling.
    if (crop_w * s / 8 >= target_w + 1 && crop_h * s / 8 >= target_h + 1) return s;
  }
  return 8;
}

// Fills *out; no object with a destructor lives across the setjmp (longjmp would skip it).
absl::Status DecodeJpeg(absl::string_view bytes, const DecodeRequest& r, bool header_only, DecodedImage* out) {
  jpeg_decompress_struct cinfo;
  JpegErrors errors;
  SetUpJpeg(&cinfo, &errors, bytes);
  if (setjmp(errors.jump)) {
    jpeg_destroy_decompress(&cinfo);
    return absl::InvalidArgumentError(absl::StrCat("corrupt or truncated JPEG: ", errors.message));
  }
  jpeg_create_decompress(&cinfo);
  jpeg_mem_src(&cinfo, reinterpret_cast<const unsigned char*>(bytes.data()), static_cast<unsigned long>(bytes.size()));
  jpeg_read_header(&cinfo, TRUE);
  out->info.codec = ImageCodec::kJpeg;
  out->info.width = static_cast<int>(cinfo.image_width);
  out->info.height = static_cast<int>(cinfo.image_height);
  const int64_t pixels = static_cast<int64_t>(cinfo.image_width) * cinfo.image_height;
  if (header_only || pixels > r.max_pixels) {
    jpeg_destroy_decompress(&cinfo);
    return pixels > r.max_pixels ? TooLarge(cinfo.image_width, cinfo.image_height, r.max_pixels) : absl::OkStatus();
  }
  // The crop in the file's pixels, clamped.
  const double W = cinfo.image_width, H = cinfo.image_height;
  double cx = 0, cy = 0, cw = W, ch = H;
  if (r.crop.width > 0 && r.crop.height > 0) {
    cx = std::clamp(r.crop.x, 0.0, W - 1);
    cy = std::clamp(r.crop.y, 0.0, H - 1);
    cw = std::clamp(r.crop.width, 1e-3, W - cx);
    ch = std::clamp(r.crop.height, 1e-3, H - cy);
  }
  const bool cmyk = cinfo.jpeg_color_space == JCS_CMYK || cinfo.jpeg_color_space == JCS_YCCK;
  cinfo.out_color_space = cmyk ? JCS_CMYK : JCS_RGB;
  const int scale = ChooseScale(cw, ch, r.target_width, r.target_height);
  cinfo.scale_num = scale;
  cinfo.scale_denom = 8;
  cinfo.dct_method = JDCT_ISLOW;  // the accurate IDCT (PIL's default too)
  jpeg_start_decompress(&cinfo);
  const double fx = static_cast<double>(cinfo.output_width) / W, fy = static_cast<double>(cinfo.output_height) / H;
  cx *= fx, cw *= fx, cy *= fy, ch *= fy;
  // Whole rows and columns covering the crop.
  JDIMENSION x0 = 0, width = cinfo.output_width;
  JDIMENSION y0 = 0, y1 = cinfo.output_height;
  if (r.decode_crop_only) {
    x0 = static_cast<JDIMENSION>(std::floor(cx));
    const auto x1 = std::min<JDIMENSION>(cinfo.output_width, static_cast<JDIMENSION>(std::ceil(cx + cw)));
    width = std::max<JDIMENSION>(1, x1 - std::min(x0, x1));
    y0 = static_cast<JDIMENSION>(std::floor(cy));
    y1 = std::min<JDIMENSION>(cinfo.output_height, static_cast<JDIMENSION>(std::ceil(cy + ch)));
    if (y1 <= y0) y1 = std::min<JDIMENSION>(cinfo.output_height, y0 + 1);
    if (x0 > 0 || width < cinfo.output_width) jpeg_crop_scanline(&cinfo, &x0, &width);  // aligns x0 down
  }
  const int comps = cinfo.output_components;  // 3, or 4 for CMYK
  out->width = static_cast<int>(width);
  out->height = static_cast<int>(y1 - y0);
  out->rgb.resize(static_cast<size_t>(out->width) * out->height * comps);
  if (y0 > 0) {
    JDIMENSION skipped = jpeg_skip_scanlines(&cinfo, y0);
    if (skipped != y0) {
      jpeg_destroy_decompress(&cinfo);
      return absl::InvalidArgumentError("corrupt or truncated JPEG: could not skip to the crop");
    }
  }
  const size_t stride = static_cast<size_t>(out->width) * comps;
  while (cinfo.output_scanline < y1) {
    JSAMPROW row = out->rgb.data() + (cinfo.output_scanline - y0) * stride;
    if (jpeg_read_scanlines(&cinfo, &row, 1) != 1) {
      jpeg_destroy_decompress(&cinfo);
      return absl::InvalidArgumentError("corrupt or truncated JPEG: no more scanlines");
    }
  }
  jpeg_abort_decompress(&cinfo);  // the rows below the crop are not needed
  jpeg_destroy_decompress(&cinfo);
  if (comps == 4) {
    // Adobe's CMYK JPEGs store inverted values: R = C * K / 255 with the stored (inverted) C and K.
    uint8_t* p = out->rgb.data();
    const size_t n = static_cast<size_t>(out->width) * out->height;
    for (size_t i = 0; i < n; ++i) {
      const int k = p[4 * i + 3];
      for (int c = 0; c < 3; ++c) p[3 * i + c] = static_cast<uint8_t>((p[4 * i + c] * k + 127) / 255);
    }
    out->rgb.resize(n * 3);
  }
  out->crop = {cx - x0, cy - y0, cw, ch};
  out->scale_eighths = scale;
  return absl::OkStatus();
}

// ---- PNG ----

struct SpngContext {
  spng_ctx* ctx = spng_ctx_new(0);
  ~SpngContext() { spng_ctx_free(ctx); }
};

absl::Status SpngError(int code, const char* what) {
  return absl::InvalidArgumentError(absl::StrCat("corrupt or truncated PNG (", what, "): ", spng_strerror(code)));
}

absl::Status DecodePng(absl::string_view bytes, const DecodeRequest& r, bool header_only, DecodedImage* out) {
  SpngContext c;
  if (c.ctx == nullptr) return absl::ResourceExhaustedError("spng_ctx_new failed");
#ifdef FUZZING_BUILD_MODE_UNSAFE_FOR_PRODUCTION
  spng_set_crc_action(c.ctx, SPNG_CRC_USE, SPNG_CRC_USE);  // let the fuzzer past the checksums
#endif
  spng_set_chunk_limits(c.ctx, 1 << 24, 1 << 26);  // ancillary chunks: at most 16 MB each, 64 MB in all
  if (int e = spng_set_png_buffer(c.ctx, bytes.data(), bytes.size()); e != 0) return SpngError(e, "buffer");
  spng_ihdr ihdr;
  if (int e = spng_get_ihdr(c.ctx, &ihdr); e != 0) return SpngError(e, "header");
  out->info.codec = ImageCodec::kPng;
  out->info.width = static_cast<int>(ihdr.width);
  out->info.height = static_cast<int>(ihdr.height);
  const int64_t pixels = static_cast<int64_t>(ihdr.width) * ihdr.height;
  if (pixels > r.max_pixels) return TooLarge(ihdr.width, ihdr.height, r.max_pixels);
  if (header_only) return absl::OkStatus();
  size_t size = 0;
  if (int e = spng_decoded_image_size(c.ctx, SPNG_FMT_RGB8, &size); e != 0) return SpngError(e, "format");
  out->rgb.resize(size);
  if (int e = spng_decode_image(c.ctx, out->rgb.data(), size, SPNG_FMT_RGB8, 0); e != 0) {
    return SpngError(e, "image data");
  }
  out->width = static_cast<int>(ihdr.width);
  out->height = static_cast<int>(ihdr.height);
  const double W = out->width, H = out->height;
  out->crop = {0, 0, W, H};
  if (r.crop.width > 0 && r.crop.height > 0) {
    out->crop.x = std::clamp(r.crop.x, 0.0, W - 1);
    out->crop.y = std::clamp(r.crop.y, 0.0, H - 1);
    out->crop.width = std::clamp(r.crop.width, 1e-3, W - out->crop.x);
    out->crop.height = std::clamp(r.crop.height, 1e-3, H - out->crop.y);
  }
  out->scale_eighths = 8;
  return absl::OkStatus();
}

absl::Status Decode(absl::string_view bytes, const DecodeRequest& r, bool header_only, DecodedImage* out) {
  absl::StatusOr<ImageCodec> codec = Sniff(bytes);
  if (!codec.ok()) return codec.status();
  absl::Status s = *codec == ImageCodec::kJpeg ? DecodeJpeg(bytes, r, header_only, out)
                                               : DecodePng(bytes, r, header_only, out);
  if (s.ok() && !header_only && (out->width <= 0 || out->height <= 0)) {
    return absl::InvalidArgumentError("image has no pixels");
  }
  return s;
}

}  // namespace

absl::StatusOr<ImageInfo> ReadImageInfo(absl::string_view bytes) {
  DecodedImage d;
  DecodeRequest r;
  r.max_pixels = INT64_MAX;
  absl::Status s = Decode(bytes, r, /*header_only=*/true, &d);
  if (!s.ok()) return s;
  return d.info;
}

absl::StatusOr<DecodedImage> DecodeImage(absl::string_view bytes, const DecodeRequest& r) {
  DecodedImage d;
  absl::Status s = Decode(bytes, r, /*header_only=*/false, &d);
  if (!s.ok()) return s;
  return d;
}

}  // namespace dtrain::data
