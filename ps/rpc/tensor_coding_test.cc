// The zero-copy coding of tensor messages: round trips of 0, 1, chunk-boundary and 100 MB payloads through
// arbitrary re-slicing (as the network splits them, floats cut in half included), references instead of copies
// on the sending side, byte compatibility with the generated protobuf classes, and malformed input.
#include "ps/rpc/tensor_coding.h"

#include <cstring>
#include <map>
#include <random>
#include <string>
#include <vector>

#include "absl/strings/escaping.h"
#include "dtrain.pb.h"
#include "gtest/gtest.h"

namespace dtrain::ps::coding {
namespace {

// Everything a decode saw.
struct Collected : ChunkHandler {
  std::string header;
  int64_t worker_id = -1;
  std::map<uint32_t, std::vector<char>> data;  // key -> bytes, in element order
  std::map<uint32_t, WireDtype> dtype;
  std::map<uint32_t, int64_t> first_offset;
  int runs = 0;
  absl::Status OnHeader(const std::string& h) override {
    header = h;
    return absl::OkStatus();
  }
  absl::Status OnWorkerId(int64_t id) override {
    worker_id = id;
    return absl::OkStatus();
  }
  std::string trailer;
  absl::Status OnTrailer(const std::string& t) override {
    trailer = t;
    return absl::OkStatus();
  }
  struct Rows {
    uint32_t table;
    int64_t first;  // -1 for gradients
    std::vector<int64_t> ids;
    int dim;
    WireDtype dtype;
    std::string data;
  };
  std::vector<Rows> rows;
  absl::Status OnRows(uint32_t table, int64_t first, int64_t count, int dim, WireDtype dt, const void* p) override {
    rows.push_back(Rows{table, first, {}, dim, dt,
                        std::string(static_cast<const char*>(p), count * dim * DtypeBytes(dt))});
    return absl::OkStatus();
  }
  absl::Status OnRowGradients(uint32_t table, const int64_t* ids, int64_t count, int dim, WireDtype dt,
                              const void* p) override {
    rows.push_back(Rows{table, -1, std::vector<int64_t>(ids, ids + count), dim, dt,
                        std::string(static_cast<const char*>(p), count * dim * DtypeBytes(dt))});
    return absl::OkStatus();
  }
  absl::Status OnData(uint32_t key, int64_t offset, int64_t n, WireDtype dt, const void* p) override {
    std::vector<char>& v = data[key];
    const int el = DtypeBytes(dt);
    const int64_t first = first_offset.try_emplace(key, offset).first->second;
    if (static_cast<int64_t>(v.size()) != (offset - first) * el) {
      return absl::InternalError("run out of order");
    }
    v.insert(v.end(), static_cast<const char*>(p), static_cast<const char*>(p) + n * el);
    dtype[key] = dt;
    ++runs;
    return absl::OkStatus();
  }
};

std::string Flatten(const grpc::ByteBuffer& b) {
  std::vector<grpc::Slice> slices;
  EXPECT_TRUE(b.Dump(&slices).ok());
  std::string out;
  for (const grpc::Slice& s : slices) out.append(reinterpret_cast<const char*>(s.begin()), s.size());
  return out;
}

// The same bytes cut into slices of random sizes (1 byte and up), as a receiver may get them.
grpc::ByteBuffer Reslice(const std::string& bytes, std::mt19937* rng, int max_piece) {
  std::vector<grpc::Slice> slices;
  std::uniform_int_distribution<int> size(1, max_piece);
  for (size_t i = 0; i < bytes.size();) {
    const size_t n = std::min<size_t>(size(*rng), bytes.size() - i);
    slices.emplace_back(bytes.data() + i, n);
    i += n;
  }
  return grpc::ByteBuffer(slices.data(), slices.size());
}

TEST(TensorCodingTest, RoundTripsOfEverySizeThroughAnySlicing) {
  const int64_t per_chunk = kMaxChunkBytes / 4;
  std::mt19937 rng(7);
  for (int64_t n : {int64_t{0}, int64_t{1}, int64_t{2}, per_chunk - 1, per_chunk, per_chunk + 1, 3 * per_chunk}) {
    std::vector<float> values(n);
    for (int64_t i = 0; i < n; ++i) values[i] = static_cast<float>(i) * 0.5f - 3.f;
    SendTracker tracker;
    MessageBuilder b;
    b.SetHeader("hdr");
    b.AddChunkRef(7, 100, WireDtype::kF32, values.data(), n, &tracker);
    const std::string bytes = Flatten(b.Build());
    for (int max_piece : {1, 3, 5, 4096}) {
      Collected got;
      ASSERT_TRUE(DecodeMessage(Reslice(bytes, &rng, max_piece), &got).ok()) << n << " " << max_piece;
      EXPECT_EQ(got.header, "hdr");
      if (n == 0) {
        EXPECT_TRUE(got.data.empty());
        continue;
      }
      // Offsets start at the chunk's: the decoder reports element 100 first. Compare bytes.
      ASSERT_EQ(got.data.size(), 1u);
      ASSERT_EQ(got.data[7].size(), static_cast<size_t>(n) * 4) << n << " " << max_piece;
      EXPECT_EQ(std::memcmp(got.data[7].data(), values.data(), n * 4), 0) << n << " " << max_piece;
    }
  }
}

TEST(TensorCodingTest, HundredMegabytesInManyChunks) {
  const int64_t n = 25'000'000;
  std::vector<float> values(n);
  for (int64_t i = 0; i < n; ++i) values[i] = static_cast<float>(i);
  SendTracker tracker;
  std::vector<char> received(n * 4);
  int messages = 0;
  for (int64_t done = 0; done < n; done += kMaxChunkBytes / 4) {
    const int64_t m = std::min<int64_t>(kMaxChunkBytes / 4, n - done);
    MessageBuilder b;
    b.AddChunkRef(3, done, WireDtype::kF32, values.data() + done, m, &tracker);
    grpc::ByteBuffer message = b.Build();
    struct Into : ChunkHandler {
      char* dst;
      absl::Status OnData(uint32_t key, int64_t offset, int64_t count, WireDtype, const void* p) override {
        std::memcpy(dst + offset * 4, p, count * 4);
        return absl::OkStatus();
      }
    } into;
    into.dst = received.data();
    ASSERT_TRUE(DecodeMessage(message, &into).ok());
    ++messages;
  }
  EXPECT_EQ(messages, (n * 4 + kMaxChunkBytes - 1) / kMaxChunkBytes);
  EXPECT_EQ(std::memcmp(received.data(), values.data(), n * 4), 0);
  EXPECT_TRUE(tracker.WaitIdle(absl::Now()));  // every message is gone, so are the references
}

TEST(TensorCodingTest, SendingReferencesTheCallersMemoryUntilGrpcLetsGo) {
  std::vector<float> values(1000, 2.f);
  SendTracker tracker;
  MessageBuilder b;
  b.AddChunkRef(1, 0, WireDtype::kF32, values.data(), 1000, &tracker);
  {
    grpc::ByteBuffer message = b.Build();
    std::vector<grpc::Slice> slices;
    ASSERT_TRUE(message.Dump(&slices).ok());
    bool referenced = false;
    for (const grpc::Slice& s : slices) {
      referenced = referenced || reinterpret_cast<const float*>(s.begin()) == values.data();
    }
    EXPECT_TRUE(referenced) << "the data slice must point at the caller's floats, not a copy";
    EXPECT_EQ(tracker.outstanding(), 1);
    EXPECT_FALSE(tracker.WaitIdle(absl::Now() + absl::Milliseconds(10)));
  }
  EXPECT_EQ(tracker.outstanding(), 0);
  EXPECT_TRUE(tracker.WaitIdle(absl::Now()));
  // An owned chunk is written by the caller and travels with the message.
  MessageBuilder owned;
  float* dst = static_cast<float*>(owned.AddChunkOwned(2, 5, WireDtype::kF32, 3));
  dst[0] = 1.f;
  dst[1] = 2.f;
  dst[2] = 3.f;
  Collected got;
  ASSERT_TRUE(DecodeMessage(owned.Build(), &got).ok());
  std::vector<float> back(3);
  std::memcpy(back.data(), got.data[2].data(), 12);
  EXPECT_EQ(back, std::vector<float>({1.f, 2.f, 3.f}));
}

TEST(TensorCodingTest, BytesAreTheProtobufEncoding) {
  // What we encode parses with the generated classes...
  std::vector<uint16_t> half = {0x3c00, 0x4000, 0xc000};
  std::vector<float> f = {1.5f, -2.f};
  SendTracker tracker;
  MessageBuilder b;
  dtrain::wire::PushHeader h;
  h.set_worker_id(3);
  h.set_step(17);
  h.set_request_id(99);
  h.set_commit(true);
  b.SetHeader(h.SerializeAsString());
  b.AddChunkRef(4, 10, WireDtype::kF16, half.data(), 3, &tracker);
  b.AddChunkRef(5, 0, WireDtype::kF32, f.data(), 2, &tracker);
  dtrain::wire::PushChunk parsed;
  ASSERT_TRUE(parsed.ParseFromString(Flatten(b.Build())));
  EXPECT_EQ(parsed.header().step(), 17);
  EXPECT_TRUE(parsed.header().commit());
  ASSERT_EQ(parsed.chunks_size(), 2);
  EXPECT_EQ(parsed.chunks(0).key(), 4u);
  EXPECT_EQ(parsed.chunks(0).offset(), 10);
  EXPECT_EQ(parsed.chunks(0).dtype(), dtrain::wire::FP16);
  EXPECT_EQ(parsed.chunks(0).data(), std::string(reinterpret_cast<const char*>(half.data()), 6));
  EXPECT_EQ(parsed.chunks(1).data(), std::string(reinterpret_cast<const char*>(f.data()), 8));

  // ... and what they encode (or any other valid encoding: fields in another order, unknown fields) decodes.
  dtrain::wire::PullChunk pull;
  pull.mutable_header()->set_step(5);
  auto* c = pull.add_chunks();
  c->set_key(8);
  c->set_offset(2);
  c->set_dtype(dtrain::wire::BF16);
  c->set_data(std::string("\x80\x3f\x00\x40", 4));
  std::string bytes = pull.SerializeAsString();
  bytes += std::string("\x98\x06\x2a", 3);  // field 99, varint 42: unknown, skipped
  Collected got;
  std::mt19937 rng(1);
  ASSERT_TRUE(DecodeMessage(Reslice(bytes, &rng, 2), &got).ok());
  dtrain::wire::PullHeader header;
  ASSERT_TRUE(header.ParseFromString(got.header));
  EXPECT_EQ(header.step(), 5);
  EXPECT_EQ(got.dtype[8], WireDtype::kBF16);
  EXPECT_EQ(got.data[8].size(), 4u);
  // data before key, offset and dtype
  std::string reordered;
  reordered += std::string("\x12\x0c", 2);            // field 2 (chunk), 12 bytes
  reordered += std::string("\x22\x04\x00\x00\x80\x3f", 6);  // data: 1.0f
  reordered += std::string("\x08\x09\x10\x03\x18\x00", 6);  // key 9, offset 3, dtype fp32
  reordered += std::string("\x08\x07", 2);            // field 1 varint: worker id 7
  Collected r;
  ASSERT_TRUE(DecodeMessage(Reslice(reordered, &rng, 3), &r).ok());
  EXPECT_EQ(r.worker_id, 7);
  ASSERT_EQ(r.data[9].size(), 4u);
  float one;
  std::memcpy(&one, r.data[9].data(), 4);
  EXPECT_EQ(one, 1.f);
}

// A push's trailer (its gradient norm, after the data) parses with the generated classes and decodes back, cut
// anywhere.
TEST(TensorCodingTest, PushTrailerIsTheProtobufEncoding) {
  dtrain::wire::PushTrailer t;
  t.set_gradient_norm(12.375);
  MessageBuilder b;
  b.SetTrailer(t.SerializeAsString());
  const std::string bytes = Flatten(b.Build());
  dtrain::wire::PushChunk parsed;
  ASSERT_TRUE(parsed.ParseFromString(bytes));
  ASSERT_TRUE(parsed.has_trailer());
  ASSERT_TRUE(parsed.trailer().has_gradient_norm());
  EXPECT_EQ(parsed.trailer().gradient_norm(), 12.375);
  std::mt19937 rng(3);
  for (int piece : {1, 2, 5}) {
    Collected got;
    ASSERT_TRUE(DecodeMessage(Reslice(bytes, &rng, piece), &got).ok());
    dtrain::wire::PushTrailer back;
    ASSERT_TRUE(back.ParseFromString(got.trailer));
    EXPECT_EQ(back.gradient_norm(), 12.375);
  }
  Collected truncated;
  EXPECT_EQ(DecodeMessage(Reslice(bytes.substr(0, bytes.size() - 1), &rng, 4), &truncated).code(),
            absl::StatusCode::kDataLoss);
}

TEST(TensorCodingTest, MalformedMessagesAreDataLossNeverACrash) {
  std::vector<float> values(300, 1.f);
  SendTracker tracker;
  MessageBuilder b;
  b.SetHeader("h");
  b.AddChunkRef(1, 0, WireDtype::kF32, values.data(), 300, &tracker);
  const std::string good = Flatten(b.Build());
  std::mt19937 rng(3);
  const size_t header_field = 3;  // tag, length, "h": a prefix ending there is a valid (shorter) message
  for (size_t len = 0; len < good.size(); ++len) {  // every truncation
    Collected got;
    absl::Status s = DecodeMessage(Reslice(good.substr(0, len), &rng, 7), &got);
    if (len == 0 || len == header_field) {
      EXPECT_TRUE(s.ok()) << len;
    } else {
      EXPECT_EQ(s.code(), absl::StatusCode::kDataLoss) << len;
    }
  }
  Collected got;
  // 5 data bytes in fp32: not whole elements.
  EXPECT_EQ(DecodeMessage(Reslice(std::string("\x12\x0d\x08\x01\x10\x00\x18\x00\x22\x05" "abcde", 15), &rng, 4), &got)
                .code(),
            absl::StatusCode::kDataLoss);
  // Unknown dtype 9.
  EXPECT_EQ(DecodeMessage(Reslice(std::string("\x12\x0c\x08\x01\x10\x00\x18\x09\x22\x04" "abcd", 14), &rng, 4), &got)
                .code(),
            absl::StatusCode::kDataLoss);
  // A varint that never ends.
  EXPECT_EQ(DecodeMessage(Reslice(std::string(12, '\xff'), &rng, 4), &got).code(), absl::StatusCode::kDataLoss);
  // Lengths of 2^63 and more (negative as int64) for the header, a chunk, a chunk's data and an unknown field
  // (found by ps_request_fuzzer: the header's length once reached std::string::reserve).
  const std::string huge("\x80\x80\x80\x80\x80\x80\x80\x80\x80\x01", 10);  // 2^63
  for (const std::string& prefix : {std::string("\x0a"), std::string("\x12"), std::string("\x12\x0c\x22"),
                                    std::string("\x3a")}) {
    EXPECT_EQ(DecodeMessage(Reslice(prefix + huge + "abcd", &rng, 4), &got).code(), absl::StatusCode::kDataLoss)
        << absl::CEscape(prefix);
  }
}

TEST(TensorCodingTest, SparseRowsRoundTripThroughAnySlicingAndParseAsProtobuf) {
  std::mt19937 rng(5);
  const std::vector<int64_t> ids = {7, -1, int64_t{1} << 62, 0, 123456789};
  std::vector<float> grads(ids.size() * 3);
  for (size_t i = 0; i < grads.size(); ++i) grads[i] = 0.5f * static_cast<float>(i) - 2.0f;
  SendTracker tracker;
  MessageBuilder b;
  dtrain::wire::PushHeader h;
  h.set_step(3);
  b.SetHeader(h.SerializeAsString());
  b.AddRowGradientsRef(2, ids.data(), static_cast<int64_t>(ids.size()), 3, WireDtype::kF32, grads.data(), &tracker);
  EXPECT_EQ(b.data_bytes(), static_cast<int64_t>(ids.size() * (8 + 12)));
  const std::string bytes = Flatten(b.Build());
  // Sent without a copy: the message references the ids and the gradients.
  EXPECT_EQ(tracker.outstanding(), 0);  // (Flatten's copy released the buffer)
  dtrain::wire::PushChunk parsed;
  ASSERT_TRUE(parsed.ParseFromString(bytes));
  ASSERT_EQ(parsed.rows_size(), 1);
  EXPECT_EQ(parsed.rows(0).table(), 2u);
  EXPECT_EQ(std::vector<int64_t>(parsed.rows(0).ids().begin(), parsed.rows(0).ids().end()), ids);
  EXPECT_EQ(parsed.rows(0).data(), std::string(reinterpret_cast<const char*>(grads.data()), grads.size() * 4));
  for (int max_piece : {1, 3, 64, 1 << 20}) {
    Collected got;
    ASSERT_TRUE(DecodeMessage(Reslice(bytes, &rng, max_piece), &got).ok()) << max_piece;
    ASSERT_EQ(got.rows.size(), 1u);
    EXPECT_EQ(got.rows[0].first, -1);
    EXPECT_EQ(got.rows[0].ids, ids);
    EXPECT_EQ(got.rows[0].dim, 3);
    EXPECT_EQ(got.rows[0].data, parsed.rows(0).data());
  }
  // A pull's rows (owned), and what the generated classes encode for them.
  MessageBuilder pull;
  void* dst = pull.AddRowsOwned(4, 10, 2, 3, WireDtype::kBF16);
  EncodeFloats(WireDtype::kBF16, grads.data(), 6, dst);
  dtrain::wire::PullChunk chunk;
  ASSERT_TRUE(chunk.ParseFromString(Flatten(pull.Build())));
  ASSERT_EQ(chunk.rows_size(), 1);
  EXPECT_EQ(chunk.rows(0).first(), 10);
  EXPECT_EQ(chunk.rows(0).count(), 2);
  EXPECT_EQ(chunk.rows(0).dtype(), dtrain::wire::BF16);
  Collected got;
  ASSERT_TRUE(DecodeMessage(Reslice(chunk.SerializeAsString(), &rng, 5), &got).ok());
  ASSERT_EQ(got.rows.size(), 1u);
  EXPECT_EQ(got.rows[0].first, 10);
  EXPECT_EQ(got.rows[0].dim, 3);
  EXPECT_EQ(got.rows[0].data, chunk.rows(0).data());
  // Unpacked ids (another valid encoding) decode too.
  dtrain::wire::PushChunk unpacked;
  auto* r = unpacked.add_rows();
  r->add_ids(5);
  r->set_data(std::string(8, '\0'));
  std::string encoded = unpacked.SerializeAsString();
  Collected u;
  ASSERT_TRUE(DecodeMessage(Reslice(encoded, &rng, 2), &u).ok());
  ASSERT_EQ(u.rows.size(), 1u);
  EXPECT_EQ(u.rows[0].ids, std::vector<int64_t>({5}));
  EXPECT_EQ(u.rows[0].dim, 2);
}

TEST(TensorCodingTest, MalformedRowsAreDataLoss) {
  std::mt19937 rng(6);
  auto decode = [&](const dtrain::wire::PushChunk& m) {
    Collected got;
    return DecodeMessage(Reslice(m.SerializeAsString(), &rng, 3), &got).code();
  };
  dtrain::wire::PushChunk m;
  auto* r = m.add_rows();
  r->add_ids(1);
  r->add_ids(2);
  r->set_data(std::string(12, 'x'));  // 3 floats for 2 ids
  EXPECT_EQ(decode(m), absl::StatusCode::kDataLoss);
  r->set_data(std::string(16, 'x'));
  r->set_dtype(static_cast<dtrain::wire::WireDtype>(7));
  EXPECT_EQ(decode(m), absl::StatusCode::kDataLoss);
  r->set_dtype(dtrain::wire::FP32);
  EXPECT_EQ(decode(m), absl::StatusCode::kOk);
  r->clear_ids();
  EXPECT_EQ(decode(m), absl::StatusCode::kDataLoss);  // data without ids
  // Rows wider than kMaxRowDim.
  r->add_ids(1);
  r->set_data(std::string((kMaxRowDim + 1) * 4, 'x'));
  EXPECT_EQ(decode(m), absl::StatusCode::kDataLoss);
  // A pull's rows with a negative count.
  dtrain::wire::PullChunk p;
  auto* rows = p.add_rows();
  rows->set_count(-1);
  rows->set_data("abcd");
  Collected got;
  EXPECT_EQ(DecodeMessage(Reslice(p.SerializeAsString(), &rng, 3), &got).code(), absl::StatusCode::kDataLoss);
  // Every truncation of a good message.
  SendTracker tracker;
  MessageBuilder b;
  const int64_t ids[] = {3, 4};
  const float g[] = {1, 2, 3, 4};
  b.AddRowGradientsRef(0, ids, 2, 2, WireDtype::kF32, g, &tracker);
  const std::string good = Flatten(b.Build());
  for (size_t len = 1; len < good.size(); ++len) {
    Collected c;
    EXPECT_EQ(DecodeMessage(Reslice(good.substr(0, len), &rng, 5), &c).code(), absl::StatusCode::kDataLoss) << len;
  }
}

// Found by ps_request_fuzzer: a rows message of 1 byte whose tag runs on past its end (a continuation bit), naming
// fixed64 ids, at the end of the buffer. The tag is read past the rows' end; the ids' length was then checked
// against a negative space left as if unsigned (huge), and 8 bytes were read past the buffer.
TEST(TensorCodingTest, ATagReadPastTheRowsEndIsDataLossNotAnOverread) {
  std::mt19937 rng(7);
  for (int slices : {1, 2, 4}) {
    Collected got;
    // PushChunk field 3 (rows), 1 byte long: 0x91 (field 2, fixed64, continued), then 0x00 after the rows.
    const std::string bytes("\x1a\x01\x91\x00", 4);
    EXPECT_EQ(DecodeMessage(Reslice(bytes, &rng, slices), &got).code(), absl::StatusCode::kDataLoss) << slices;
  }
}

}  // namespace
}  // namespace dtrain::ps::coding
