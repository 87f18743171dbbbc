// libFuzzer harness for saved input positions (DecodeBatchStreamState, BatchStream::Restore). A state that
// decodes must re-encode to the same bytes (checksum aside: the fuzzing build accepts bad ones), and a stream
// that accepts it must then produce a batch. Input: one state blob. Seeds: dtrain_fuzz_seeds.
#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>

#include "absl/strings/string_view.h"
#include "glog/logging.h"
#include "worker/data/batch_stream_state.h"
#include "worker/data/dataset.h"

namespace {

// The stream every input is restored into: 10 tiny images, seed 7, shard 1 of 2 (5 examples), batch 3,
// built on the calling thread (no prefetch thread per input).
dtrain::data::BatchStream* Stream() {
  static const dtrain::data::Dataset* data = [] {
    auto* d = new dtrain::data::Dataset;
    d->height = d->width = d->channels = 1;
    for (int i = 0; i < 10; ++i) {
      d->pixels.push_back(static_cast<uint8_t>(i));
      d->labels.push_back(i);
    }
    return d;
  }();
  static dtrain::data::BatchStream* stream = [] {
    dtrain::data::BatchStreamOptions o;
    o.batch_size = 3;
    o.shard_index = 1;
    o.num_shards = 2;
    o.seed = 7;
    o.prefetch = 0;
    return dtrain::data::BatchStream::Create(*data, o).value().release();
  }();
  return stream;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace dtrain::data;  // NOLINT
  const absl::string_view bytes(reinterpret_cast<const char*>(data), size);
  absl::StatusOr<BatchStreamState> s = DecodeBatchStreamState(bytes);
  if (s.ok()) {
    const std::string again = EncodeBatchStreamState(*s);
    CHECK_EQ(again.size(), size);
    CHECK(again.substr(0, size - 4) == bytes.substr(0, size - 4)) << "re-encoding differs";
  } else {
    CHECK(absl::IsDataLoss(s.status()) || absl::IsFailedPrecondition(s.status())) << s.status();
  }
  BatchStream* stream = Stream();
  const int64_t before = stream->batches_read();
  const absl::Status restored = stream->Restore(bytes);
  if (!restored.ok()) {
    CHECK_EQ(stream->batches_read(), before);
    return 0;
  }
  CHECK(s.ok());
  CHECK_EQ(stream->batches_read(), s->next_batch);
  const Batch& b = stream->Next();
  CHECK_EQ(b.batch, 3);
  for (float label : b.labels) CHECK(static_cast<int>(label) % 2 == 1) << label;  // shard 1: odd examples
  return 0;
}
