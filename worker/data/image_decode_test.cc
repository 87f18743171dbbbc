#include "worker/data/image_decode.h"

#include <string>
#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "worker/data/image_test_util.h"

namespace dtrain::data {
namespace {

using ::testing::HasSubstr;
using test_util::EncodeJpeg;
using test_util::EncodePng;
using test_util::MeanAbsDiff;
using test_util::Picture;

TEST(ImageDecodeTest, JpegWholeImageIsCloseToTheOriginal) {
  const std::vector<uint8_t> pixels = Picture(64, 48, 3);
  const std::string jpeg = EncodeJpeg(pixels, 64, 48, 3, 98);
  absl::StatusOr<ImageInfo> info = ReadImageInfo(jpeg);
  ASSERT_TRUE(info.ok()) << info.status();
  EXPECT_EQ(info->codec, ImageCodec::kJpeg);
  EXPECT_EQ(info->width, 64);
  EXPECT_EQ(info->height, 48);
  absl::StatusOr<DecodedImage> img = DecodeImage(jpeg);
  ASSERT_TRUE(img.ok()) << img.status();
  ASSERT_EQ(img->width, 64);
  ASSERT_EQ(img->height, 48);
  ASSERT_EQ(img->rgb.size(), pixels.size());
  EXPECT_LT(MeanAbsDiff(img->rgb.data(), pixels.data(), pixels.size()), 3.0);
  EXPECT_EQ(img->scale_eighths, 8);
  EXPECT_DOUBLE_EQ(img->crop.width, 64);
}

TEST(ImageDecodeTest, JpegDecodesAtTheSmallestDctScaleThatKeepsTheTarget) {
  const std::string jpeg = EncodeJpeg(Picture(256, 192, 3), 256, 192, 3);
  DecodeRequest r;
  r.target_width = r.target_height = 30;  // 1/8: 32x24 is too short
  absl::StatusOr<DecodedImage> img = DecodeImage(jpeg, r);
  ASSERT_TRUE(img.ok()) << img.status();
  EXPECT_EQ(img->scale_eighths, 2);
  EXPECT_EQ(img->width, 64);
  EXPECT_EQ(img->height, 48);
  EXPECT_DOUBLE_EQ(img->crop.width, 64);
  r.target_width = r.target_height = 20;
  img = DecodeImage(jpeg, r);
  ASSERT_TRUE(img.ok());
  EXPECT_EQ(img->scale_eighths, 1);
  EXPECT_EQ(img->width, 32);
  r.target_width = r.target_height = 150;  // larger than half: full scale
  img = DecodeImage(jpeg, r);
  ASSERT_TRUE(img.ok());
  EXPECT_EQ(img->scale_eighths, 8);
  // The downscaled image is the picture, smaller: compare with the full decode's 4x4 block means.
  r.target_width = r.target_height = 40;
  img = DecodeImage(jpeg, r);
  absl::StatusOr<DecodedImage> full = DecodeImage(jpeg);
  ASSERT_TRUE(img.ok() && full.ok());
  ASSERT_EQ(img->scale_eighths, 2);
  double diff = 0;
  for (int y = 0; y < 48; ++y) {
    for (int x = 0; x < 64; ++x) {
      for (int c = 0; c < 3; ++c) {
        double mean = 0;
        for (int k = 0; k < 16; ++k) mean += full->rgb[((4 * y + k / 4) * 256 + 4 * x + k % 4) * 3 + c];
        diff += std::fabs(mean / 16 - img->rgb[(y * 64 + x) * 3 + c]);
      }
    }
  }
  EXPECT_LT(diff / (48 * 64 * 3), 4.0);
}

TEST(ImageDecodeTest, JpegCropDecodesOnlyTheRowsAndColumnsAroundIt) {
  for (bool progressive : {false, true}) {
    SCOPED_TRACE(progressive ? "progressive" : "baseline");
    const std::string jpeg = EncodeJpeg(Picture(160, 120, 3), 160, 120, 3, 95, progressive);
    absl::StatusOr<DecodedImage> full = DecodeImage(jpeg);
    ASSERT_TRUE(full.ok());
    DecodeRequest r;
    r.crop = {50, 40, 60, 30};
    absl::StatusOr<DecodedImage> img = DecodeImage(jpeg, r);
    ASSERT_TRUE(img.ok()) << img.status();
    EXPECT_LT(img->width, 160);
    EXPECT_EQ(img->height, 30);
    EXPECT_GE(img->crop.x, 0);
    EXPECT_LE(img->crop.x + img->crop.width, img->width);
    EXPECT_DOUBLE_EQ(img->crop.y, 0);
    // Inside the crop (away from its edges, where the chroma upsampling sees other neighbours), the same pixels.
    double diff = 0;
    int n = 0;
    for (int y = 2; y < 28; ++y) {
      for (int x = 2; x < 58; ++x) {
        for (int c = 0; c < 3; ++c) {
          const int a = img->rgb[((y) * img->width + static_cast<int>(img->crop.x) + x) * 3 + c];
          const int b = full->rgb[((40 + y) * 160 + 50 + x) * 3 + c];
          diff += std::abs(a - b);
          ++n;
        }
      }
    }
    EXPECT_LT(diff / n, 0.5);
  }
}

TEST(ImageDecodeTest, GrayscaleJpegBecomesRgb) {
  const std::vector<uint8_t> gray = Picture(40, 30, 1);
  absl::StatusOr<DecodedImage> img = DecodeImage(EncodeJpeg(gray, 40, 30, 1, 98));
  ASSERT_TRUE(img.ok()) << img.status();
  ASSERT_EQ(img->rgb.size(), 40u * 30 * 3);
  for (size_t i = 0; i < gray.size(); ++i) {
    EXPECT_EQ(img->rgb[3 * i], img->rgb[3 * i + 1]);
    EXPECT_EQ(img->rgb[3 * i], img->rgb[3 * i + 2]);
    EXPECT_NEAR(img->rgb[3 * i], gray[i], 12);
  }
}

TEST(ImageDecodeTest, PngOfEveryColorTypeDecodesExactly) {
  const int w = 13, h = 7;
  const std::vector<uint8_t> rgb = Picture(w, h, 3);
  const std::vector<uint8_t> rgba = Picture(w, h, 4);
  const std::vector<uint8_t> gray = Picture(w, h, 1);
  std::vector<uint8_t> rgb16(rgb.size() * 2);
  for (size_t i = 0; i < rgb.size(); ++i) rgb16[2 * i + 1] = rgb[i], rgb16[2 * i] = 0x5a;  // host (little) endian
  struct Case {
    const char* name;
    std::string png;
    std::vector<uint8_t> want;
  } cases[] = {
      {"rgb", EncodePng(rgb, w, h, SPNG_COLOR_TYPE_TRUECOLOR), rgb},
      {"rgb16", EncodePng(rgb16, w, h, SPNG_COLOR_TYPE_TRUECOLOR, 16), rgb},
      {"rgba", EncodePng(rgba, w, h, SPNG_COLOR_TYPE_TRUECOLOR_ALPHA), {}},
      {"gray", EncodePng(gray, w, h, SPNG_COLOR_TYPE_GRAYSCALE), {}},
  };
  for (int i = 0; i < w * h; ++i) {
    for (int c = 0; c < 3; ++c) cases[2].want.push_back(rgba[4 * i + c]);  // alpha dropped
    for (int c = 0; c < 3; ++c) cases[3].want.push_back(gray[i]);
  }
  for (const Case& c : cases) {
    SCOPED_TRACE(c.name);
    absl::StatusOr<ImageInfo> info = ReadImageInfo(c.png);
    ASSERT_TRUE(info.ok()) << info.status();
    EXPECT_EQ(info->codec, ImageCodec::kPng);
    EXPECT_EQ(info->width, w);
    absl::StatusOr<DecodedImage> img = DecodeImage(c.png);
    ASSERT_TRUE(img.ok()) << img.status();
    EXPECT_EQ(img->width, w);
    EXPECT_EQ(img->height, h);
    EXPECT_EQ(img->rgb, c.want);
  }
}

TEST(ImageDecodeTest, TheBytesNotTheNameTellTheCodec) {
  // What a reader sees of "photo.jpg" that is really a PNG: it decodes.
  const std::string png = EncodePng(Picture(8, 8, 3), 8, 8, SPNG_COLOR_TYPE_TRUECOLOR);
  absl::StatusOr<DecodedImage> img = DecodeImage(png);
  ASSERT_TRUE(img.ok());
  EXPECT_EQ(img->info.codec, ImageCodec::kPng);
}

TEST(ImageDecodeTest, BadBytesAreInvalidArgumentSayingWhatTheyAre) {
  struct Case {
    std::string bytes;
    const char* says;
  } cases[] = {
      {"", "an empty file"},
      {"hello, I am a text file", "bytes starting 68 65 6c"},
      {"GIF89a\x01\x00\x01\x00", "a GIF image"},
      {"BM\x10\x00\x00\x00", "a BMP image"},
      {std::string("RIFF\0\0\0\0WEBPVP8 ", 16), "a WebP image"},
  };
  for (const Case& c : cases) {
    absl::StatusOr<DecodedImage> img = DecodeImage(c.bytes);
    ASSERT_FALSE(img.ok());
    EXPECT_TRUE(absl::IsInvalidArgument(img.status())) << img.status();
    EXPECT_THAT(std::string(img.status().message()), HasSubstr("not a JPEG or PNG image"));
    EXPECT_THAT(std::string(img.status().message()), HasSubstr(c.says));
  }
}

TEST(ImageDecodeTest, TruncatedOrCorruptImagesFailInsteadOfDecodingGray) {
  const std::string jpeg = EncodeJpeg(Picture(64, 64, 3), 64, 64, 3);
  const std::string png = EncodePng(Picture(64, 64, 3), 64, 64, SPNG_COLOR_TYPE_TRUECOLOR);
  for (const std::string& cut : {jpeg.substr(0, jpeg.size() / 2), jpeg.substr(0, 40), png.substr(0, png.size() / 2),
                                 png.substr(0, 30)}) {
    absl::StatusOr<DecodedImage> img = DecodeImage(cut);
    ASSERT_FALSE(img.ok()) << cut.size();
    EXPECT_TRUE(absl::IsInvalidArgument(img.status())) << img.status();
    EXPECT_THAT(std::string(img.status().message()), HasSubstr("corrupt or truncated"));
  }
  std::string flipped = png;
  flipped[flipped.size() / 2] ^= 0x55;  // a data byte: the chunk's CRC no longer matches
  EXPECT_FALSE(DecodeImage(flipped).ok());
}

TEST(ImageDecodeTest, ImagesOverThePixelLimitAreRefusedFromTheHeader) {
  const std::string jpeg = EncodeJpeg(Picture(64, 64, 3), 64, 64, 3);
  DecodeRequest r;
  r.max_pixels = 64 * 63;
  absl::StatusOr<DecodedImage> img = DecodeImage(jpeg, r);
  ASSERT_FALSE(img.ok());
  EXPECT_THAT(std::string(img.status().message()), HasSubstr("64x64 pixels is larger than the limit"));
  img = DecodeImage(EncodePng(Picture(64, 64, 3), 64, 64, SPNG_COLOR_TYPE_TRUECOLOR), r);
  EXPECT_FALSE(img.ok());
}

}  // namespace
}  // namespace dtrain::data
