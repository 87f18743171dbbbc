#include "ps/shm/shm_frame.h"

#include <string>

#include "absl/strings/str_cat.h"
#include "gtest/gtest.h"
#include "ps/api/ps_interface.h"
#include "ps/shm/shm_offer.h"

namespace dtrain::ps::shm {
namespace {

// The shm and TCP servers' ticket comparison (constant time): whole tickets only.
TEST(ShmFrameTest, TicketsAreEqualOnlyWhole) {
  EXPECT_TRUE(TicketsEqual("0123456789abcdef", "0123456789abcdef"));
  EXPECT_FALSE(TicketsEqual("0123456789abcdef", "0123456789abcdeX"));
  EXPECT_FALSE(TicketsEqual("X123456789abcdef", "0123456789abcdef"));
  EXPECT_FALSE(TicketsEqual("0123456789abcdef", "0123456789abcde"));
  EXPECT_FALSE(TicketsEqual("", "0"));
}

TEST(ShmFrameTest, FramesRoundTrip) {
  const std::string payload = EncodeHello(Hello{LaneKind::kPull, 3, "0123456789abcdef"});
  absl::StatusOr<Frame> f = DecodeFrame(EncodeFrame(FrameType::kHello, payload));
  ASSERT_TRUE(f.ok()) << f.status();
  EXPECT_EQ(f->type, FrameType::kHello);
  absl::StatusOr<Hello> h = DecodeHello(f->payload);
  ASSERT_TRUE(h.ok()) << h.status();
  EXPECT_EQ(h->lane, LaneKind::kPull);
  EXPECT_EQ(h->worker_id, 3);
  EXPECT_EQ(h->ticket, "0123456789abcdef");
}

TEST(ShmFrameTest, BadFramesAreDataLossNamingWhatIsWrong) {
  const std::string good = EncodeFrame(FrameType::kPushFinish, "xyz");
  ASSERT_TRUE(DecodeFrame(good).ok());
  struct Case {
    std::string bytes;
    std::string says;
  };
  std::string magic = good, version = good, type = good, crc = good, length = good;
  magic[0] ^= 1;
  version[4] = 9;
  type[6] = 99;
  crc[kFrameHeaderBytes] ^= 1;
  length[8] = 5;
  const Case cases[] = {{good.substr(0, 10), "shorter than its"},
                        {magic, "not a dtrain lane"},
                        {version, "run the same dtrain"},
                        {type, "unknown type"},
                        {crc, "checksum mismatch"},
                        {length, "payload bytes"},
                        {good + "x", "payload bytes"}};
  for (const Case& c : cases) {
    absl::StatusOr<Frame> f = DecodeFrame(c.bytes);
    ASSERT_FALSE(f.ok());
    EXPECT_EQ(f.status().code(), absl::StatusCode::kDataLoss);
    EXPECT_NE(f.status().message().find(c.says), std::string::npos) << f.status();
  }
}

TEST(ShmFrameTest, PayloadsRoundTripAndRefuseGarbage) {
  PullOrder order;
  order.request.worker_id = 2;
  order.request.session = 77;
  order.request.min_step = 5;
  order.request.since_step = 4;
  order.request.decisions = {StepDecision{4, {0, 2}, true, "mac"}};
  order.request.decisions[0].delta = true;
  order.request.timeout_ms = 1234;
  order.request.moving_averages = true;
  order.request.sparse_read_only = true;
  order.request.after_push = 9;
  order.request.wire_dtype = WireDtype::kBF16;
  order.request.elastic_read_ahead = 41;
  order.destinations = {Destination{1, Destination::Kind::kInPlace, 3, 4096, 10},
                        Destination{2, Destination::Kind::kSkip, 0, 0, 5}};
  order.sparse = {SparseOrder{0, 4, 16, 2, 0, 64}};
  const std::string bytes = EncodePullOrder(order);
  absl::StatusOr<PullOrder> back = DecodePullOrder(bytes);
  ASSERT_TRUE(back.ok()) << back.status();
  EXPECT_EQ(back->request.worker_id, 2);
  EXPECT_EQ(back->request.session, 77u);
  EXPECT_EQ(back->request.decisions, order.request.decisions);
  EXPECT_EQ(back->request.wire_dtype, WireDtype::kBF16);
  EXPECT_TRUE(back->request.moving_averages);
  EXPECT_TRUE(back->request.sparse_read_only);
  EXPECT_EQ(back->request.elastic_read_ahead, 41);
  ASSERT_EQ(back->destinations.size(), 2u);
  EXPECT_EQ(back->destinations[0].kind, Destination::Kind::kInPlace);
  EXPECT_EQ(back->destinations[0].at, 4096);
  ASSERT_EQ(back->sparse.size(), 1u);
  EXPECT_EQ(back->sparse[0].rows_at, 64);
  EXPECT_EQ(EncodePullOrder(*back), bytes);
  // Truncated, extended, or with a list count larger than the bytes: DataLoss.
  EXPECT_EQ(DecodePullOrder(bytes.substr(0, bytes.size() - 1)).status().code(), absl::StatusCode::kDataLoss);
  EXPECT_EQ(DecodePullOrder(bytes + "x").status().code(), absl::StatusCode::kDataLoss);
  std::string many = EncodePieces(PiecesWritten{});
  many[0] = '\xff';
  many[1] = '\xff';
  EXPECT_EQ(DecodePieces(many).status().code(), absl::StatusCode::kDataLoss);

  PushResult r;
  r.status = absl::AbortedError("register again");
  r.transport_failure = true;
  r.response.outcome = PushResponse::Outcome::kDroppedBackup;
  r.response.global_step = 12;
  absl::StatusOr<PushResult> rb = DecodePushResult(EncodePushResult(r));
  ASSERT_TRUE(rb.ok());
  EXPECT_EQ(rb->status, r.status);
  EXPECT_TRUE(rb->transport_failure);
  EXPECT_EQ(rb->response.outcome, PushResponse::Outcome::kDroppedBackup);
  EXPECT_EQ(rb->response.global_step, 12);
  std::string bad_dtype = EncodeDataRef(DataRef{1, 0, 4, WireDtype::kF16, 1, 0});
  bad_dtype[20] = 7;  // the dtype byte
  EXPECT_EQ(DecodeDataRef(bad_dtype).status().code(), absl::StatusCode::kDataLoss);
}

TEST(ShmFrameTest, APullHeaderCarriesTheElasticViewAndTheJobsPsSet) {
  PullHeader h;
  h.step = 840;
  h.decisions = {StepDecision{839, {0, 3}, true, ""}};
  h.elastic.version = 4;
  h.elastic.workers = {0, 3};
  h.elastic.aggregating = 2;
  h.elastic.batches = {10, 11};
  h.elastic.unit = 100;
  h.elastic.next_batch = 12;
  h.ps_set.version = 2;
  h.ps_set.step = 840;
  h.ps_set.hosts = {"h0:2222", "h1:2222"};
  h.ps_set.leaving = {"h2:2222"};
  const std::string bytes = EncodePullHeader(h);
  absl::StatusOr<PullHeader> back = DecodePullHeader(bytes);
  ASSERT_TRUE(back.ok()) << back.status();
  EXPECT_EQ(back->elastic, h.elastic);
  EXPECT_EQ(back->ps_set.version, 2);
  EXPECT_EQ(back->ps_set.step, 840);
  EXPECT_EQ(back->ps_set.hosts, h.ps_set.hosts);
  EXPECT_EQ(back->ps_set.leaving, h.ps_set.leaving);
  EXPECT_EQ(EncodePullHeader(*back), bytes);
  EXPECT_EQ(DecodePullHeader(bytes.substr(0, bytes.size() - 3)).status().code(), absl::StatusCode::kDataLoss);
  // The set also crosses any transport inside an error (a worker that missed the change registers with the old one).
  const absl::Status heard = absl::Status(absl::StatusCode::kAborted,
                                          absl::StrCat("gRPC Register: ", PsSetChangedError(h.ps_set).message()));
  const std::optional<PsSet> set = ParsePsSetChanged(heard);
  ASSERT_TRUE(set.has_value()) << heard;
  EXPECT_EQ(set->version, 2);
  EXPECT_EQ(set->step, 840);
  EXPECT_EQ(set->hosts, h.ps_set.hosts);
  EXPECT_FALSE(ParsePsSetChanged(absl::AbortedError("register again")).has_value());
  EXPECT_FALSE(ParsePsSetChanged(absl::UnavailableError(PsSetChangedError(h.ps_set).message())).has_value());
}

TEST(ShmFrameTest, ADataRefSaysWhetherItsFloatsAreLent) {
  for (bool lent : {false, true}) {
    const DataRef ref{7, 128, 4096, WireDtype::kF32, 2, 512, lent};
    absl::StatusOr<DataRef> back = DecodeDataRef(EncodeDataRef(ref));
    ASSERT_TRUE(back.ok()) << back.status();
    EXPECT_EQ(back->key, 7u);
    EXPECT_EQ(back->offset, 128);
    EXPECT_EQ(back->n, 4096);
    EXPECT_EQ(back->segment, 2u);
    EXPECT_EQ(back->at, 512);
    EXPECT_EQ(back->lent, lent);
  }
  std::string bad = EncodeDataRef(DataRef{7, 0, 4, WireDtype::kF32, 2, 0, true});
  bad.back() = 2;  // neither 0 nor 1
  EXPECT_EQ(DecodeDataRef(bad).status().code(), absl::StatusCode::kDataLoss);
}

}  // namespace
}  // namespace dtrain::ps::shm
