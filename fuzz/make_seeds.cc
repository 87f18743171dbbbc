// dtrain_fuzz_seeds OUT_DIR: writes a few small, valid inputs for each fuzz harness into OUT_DIR/<harness>/,
// built with the same encoders the programs use, so the fuzzers start from files that parse (and keep doing
// so when a format changes). scripts/fuzz.sh runs it before fuzzing.
#include <zlib.h>

#include <cstdint>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "dtrain.pb.h"
#include "ps/checkpoint/checkpoint_format.h"
#include "ps/rpc/tensor_coding.h"
#include "ps/shm/shm_frame.h"
#include "ps/tcp/tcp_frame.h"
#include "worker/data/batch_stream_state.h"
#include "worker/data/dataset.h"
#include "worker/data/example_proto.h"
#include "worker/data/image_encode.h"
#include "worker/data/record_io.h"
#include "worker/eval/npz_writer.h"

namespace dtrain {
namespace {

bool Write(const std::string& dir, const std::string& name, const std::string& bytes) {
  std::filesystem::create_directories(dir);
  std::ofstream out(dir + "/" + name, std::ios::binary | std::ios::trunc);
  out.write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
  return static_cast<bool>(out);
}

std::string BigEndian32(uint32_t v) {
  return {static_cast<char>(v >> 24), static_cast<char>(v >> 16), static_cast<char>(v >> 8),
          static_cast<char>(v)};
}

std::string Gzip(const std::string& bytes) {
  z_stream z{};
  deflateInit2(&z, Z_BEST_COMPRESSION, Z_DEFLATED, 16 + MAX_WBITS, 8, Z_DEFAULT_STRATEGY);
  std::string out(deflateBound(&z, bytes.size()) + 32, '\0');
  z.next_in = reinterpret_cast<Bytef*>(const_cast<char*>(bytes.data()));
  z.avail_in = static_cast<uInt>(bytes.size());
  z.next_out = reinterpret_cast<Bytef*>(out.data());
  z.avail_out = static_cast<uInt>(out.size());
  deflate(&z, Z_FINISH);
  out.resize(z.total_out);
  deflateEnd(&z);
  return out;
}

data::Dataset SmallImages(int n, int h, int w, int c) {
  data::Dataset d;
  d.height = h;
  d.width = w;
  d.channels = c;
  for (int i = 0; i < n; ++i) {
    d.labels.push_back(i % 10);
    for (int j = 0; j < h * w * c; ++j) d.pixels.push_back(static_cast<uint8_t>(37 * i + 11 * j));
  }
  return d;
}

// mnist_idx_fuzzer input: u32 big-endian length L of the images file, its L bytes, then the labels file.
std::string IdxPair(const std::string& images, const std::string& labels) {
  return BigEndian32(static_cast<uint32_t>(images.size())) + images + labels;
}

bool MnistSeeds(const std::string& dir) {
  const data::Dataset d = SmallImages(3, 2, 3, 1);
  std::string images = BigEndian32(2051) + BigEndian32(3) + BigEndian32(2) + BigEndian32(3);
  images.append(d.pixels.begin(), d.pixels.end());
  std::string labels = BigEndian32(2049) + BigEndian32(3);
  for (int32_t l : d.labels) labels.push_back(static_cast<char>(l));
  return Write(dir, "raw", IdxPair(images, labels)) &&
         Write(dir, "gzip", IdxPair(Gzip(images), Gzip(labels))) &&
         Write(dir, "gzip_images", IdxPair(Gzip(images), labels));
}

bool CifarSeeds(const std::string& dir) {
  std::string one(3073, '\0');
  for (size_t i = 0; i < one.size(); ++i) one[i] = static_cast<char>(i * 7);
  one[0] = 3;
  std::string two = one + one;
  two[3073] = 9;
  return Write(dir, "one_record", one) && Write(dir, "two_records", two);
}

// tfrecord_fuzzer input: a first byte, even: the rest is a TFRecord file; odd: one serialized
// tf.train.Example.
bool TfRecordSeeds(const std::string& dir) {
  const std::string tmp = dir + "/.tmp.tfrecords";
  std::filesystem::create_directories(dir);
  if (!data::WriteTfRecordExamples(SmallImages(2, 3, 2, 1), tmp).ok()) return false;
  std::ifstream in(tmp, std::ios::binary);
  const std::string file((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  std::filesystem::remove(tmp);
  data::ImageExample e;
  e.image_raw = std::string(16, '\x05');
  e.label = 7;
  e.pixels = 16;  // no height/width/depth: a square single-channel image
  const std::string pixels_only = data::EncodeImageExample(e);
  e.height = 2;
  e.width = 2;
  e.depth = 4;
  const std::string full = data::EncodeImageExample(e);
  return Write(dir, "file", std::string(1, '\0') + file) && Write(dir, "example_full", "\x01" + full) &&
         Write(dir, "example_pixels_only", "\x01" + pixels_only);
}

ps::CheckpointData Checkpoint(int num_slots, bool averages) {
  ps::CheckpointData d;
  d.task_index = 0;
  d.num_ps = 2;
  d.global_step = d.task_step = 40;
  d.model_signature = "mlp/v1/4x3,3";
  d.optimizer = num_slots == 2 ? "adam" : num_slots == 1 ? "momentum" : "sgd";
  d.num_slots = num_slots;
  d.has_moving_averages = averages;
  int64_t offset = 0;
  for (int i = 0; i < 2; ++i) {
    ps::SliceState s;
    s.spec = ps::SliceSpec{static_cast<uint32_t>(i), absl::StrCat("v", i), offset, 3 + i};
    offset += s.spec.length;
    s.values.assign(s.spec.length, 0.5f * (i + 1));
    s.slots.assign(num_slots, std::vector<float>(s.spec.length, 0.25f));
    if (averages) s.moving_average.assign(s.spec.length, -1.0f);
    d.slices.push_back(std::move(s));
  }
  return d;
}

// Version 4: a hash table (rows in blocks of 2) and a fixed-size [6, 2] table, trained with ftrl (2 slots).
ps::CheckpointData CheckpointWithTables() {
  ps::CheckpointData d = Checkpoint(1, false);
  d.sparse_optimizer = "ftrl";
  d.sparse_num_slots = 2;
  for (int t = 0; t < 2; ++t) {
    ps::SparseTableState s;
    s.spec.table = t;
    s.spec.name = t == 0 ? "emb_hash" : "emb_fixed";
    s.spec.dim = 2;
    s.spec.rows = t == 0 ? 0 : 6;
    s.spec.max_rows = t == 0 ? 100 : 0;
    s.spec.admit_after = t == 0 ? 2 : 0;
    s.slots.resize(2);
    for (int64_t id = 0; id < 6; ++id) {
      if (ps::ShardOfId(id, d.num_ps) != d.task_index) continue;
      s.ids.push_back(t == 0 ? id * 1000003 : id);
      s.values.insert(s.values.end(), {0.5f * id, -0.25f});
      s.slots[0].insert(s.slots[0].end(), {0.0f, 1.0f});
      s.slots[1].insert(s.slots[1].end(), {0.1f, 0.2f});
    }
    d.tables.push_back(std::move(s));
  }
  return d;
}

bool CheckpointSeeds(const std::string& dir) {
  return Write(dir, "sgd", ps::SerializeCheckpoint(Checkpoint(0, false))) &&
         Write(dir, "momentum_averages", ps::SerializeCheckpoint(Checkpoint(1, true))) &&
         Write(dir, "adam", ps::SerializeCheckpoint(Checkpoint(2, false))) &&
         Write(dir, "adam_v3", ps::SerializeCheckpoint(Checkpoint(2, false), 3)) &&
         Write(dir, "tables", ps::SerializeCheckpoint(CheckpointWithTables(), ps::kCheckpointFormatVersion, 40));
}

// batch_stream_state_fuzzer restores into a stream of seed 7, shard 1 of 2 (5 examples), batch 3.
bool BatchStreamStateSeeds(const std::string& dir) {
  data::BatchStreamState s;
  s.seed = 7;
  s.shard_index = 1;
  s.num_shards = 2;
  s.shard_size = 5;
  s.batch_size = 3;
  s.preprocess = 0;
  bool ok = true;
  for (int64_t k : {0, 1, 4, 1000003}) {
    s.next_batch = k;
    s.epoch = k * 3 / 5;
    s.offset = k * 3 % 5;
    ok = ok && Write(dir, absl::StrCat("batch_", k), data::EncodeBatchStreamState(s));
  }
  return ok;
}

// ps_request_fuzzer: calls as u8 op | u16 length | payload (see ps/rpc/ps_request_fuzzer.cc), on a task
// holding slices 0 (8 floats) and 1 (3 floats), sparse tables 0 (dim 2) and 1 ([10, 3]), with workers 0 and 1
// registered as sessions 1 and 2.
std::string Call(uint8_t op, const std::string& payload) {
  std::string out(1, static_cast<char>(op));
  out.push_back(static_cast<char>(payload.size() & 0xff));
  out.push_back(static_cast<char>(payload.size() >> 8));
  return out + payload;
}

std::string Message(const grpc::ByteBuffer& buffer) {
  std::vector<grpc::Slice> slices;
  (void)buffer.Dump(&slices);
  std::string bytes;
  for (const grpc::Slice& s : slices) bytes.append(reinterpret_cast<const char*>(s.begin()), s.size());
  std::string out;
  out.push_back(static_cast<char>(bytes.size() & 0xff));
  out.push_back(static_cast<char>(bytes.size() >> 8));
  return out + bytes;
}

std::string PushStream(int worker, int64_t step, bool commit, float value) {
  wire::PushHeader h;
  h.set_worker_id(worker);
  h.set_step(step);
  h.set_request_id(7 + worker);
  h.set_commit(commit);
  h.set_session(worker + 1);
  h.set_input_position("position");
  const std::vector<float> w(8, value), b(3, value);
  ps::coding::MessageBuilder m;
  m.SetHeader(h.SerializeAsString());
  std::string stream = Message(m.Build());
  std::memcpy(m.AddChunkOwned(0, 0, ps::WireDtype::kF32, 8), w.data(), 8 * sizeof(float));
  std::memcpy(m.AddChunkOwned(1, 0, ps::WireDtype::kF32, 3), b.data(), 3 * sizeof(float));
  stream += Message(m.Build());
  // Sparse rows of both tables (ids 1 and 2 of the hash table, 4 of the fixed one; bf16 for the latter).
  const std::vector<int64_t> ids = {1, 2}, fixed_ids = {4};
  const std::vector<float> rows(4, value);
  const std::vector<uint16_t> fixed_rows(3, 0x3f80);
  ps::coding::SendTracker tracker;
  m.AddRowGradientsRef(0, ids.data(), 2, 2, ps::WireDtype::kF32, rows.data(), &tracker);
  m.AddRowGradientsRef(1, fixed_ids.data(), 1, 3, ps::WireDtype::kBF16, fixed_rows.data(), &tracker);
  return stream + Message(m.Build());
}

// dtrain_ctl's commands, the stats between them, then a push: remove a worker, move to another ps set, drain.
std::string ControlSeed() {
  std::string calls;
  const auto control = [&](const std::string& command, int worker, const std::string& address, int ps) {
    wire::ControlRequest c;
    c.set_command(command);
    c.set_worker(worker);
    c.set_address(address);
    c.set_ps(ps);
    c.set_reason("seed");
    calls += Call(9, c.SerializeAsString()) + Call(10, "");
  };
  control("remove-worker", 1, "", -1);
  control("add-ps", -1, "127.0.0.1:9", -1);
  control("remove-ps", -1, "", 0);
  control("retire", -1, "", -1);
  control("drain", -1, "", -1);
  return calls + Call(1, PushStream(0, 0, true, 0.5f));
}

bool PsRequestSeeds(const std::string& dir) {
  wire::PullRequest pull;
  pull.set_worker_id(0);
  pull.set_session(1);
  pull.set_min_step(1);
  auto* sparse = pull.add_sparse();
  sparse->set_table(0);
  for (int64_t id : {1, 2, 5}) sparse->add_ids(id);
  sparse = pull.add_sparse();
  sparse->set_table(1);
  sparse->add_ids(4);
  wire::DoneRequest done;
  done.set_worker_id(1);
  done.set_session(2);
  done.set_completed(true);
  wire::HeartbeatRequest beat;
  beat.set_worker_id(0);
  beat.set_session(1);
  wire::RegisterRequest reg;
  reg.set_worker_id(1);
  wire::ProbeRequest probe;
  return Write(dir, "step", Call(1, PushStream(0, 0, true, 0.5f)) + Call(1, PushStream(1, 0, true, -1.f)) +
                                Call(3, pull.SerializeAsString())) &&
         Write(dir, "done", Call(4, done.SerializeAsString()) + Call(5, beat.SerializeAsString()) +
                                Call(1, PushStream(0, 0, true, 2.f))) &&
         Write(dir, "register", Call(0, reg.SerializeAsString()) + Call(6, probe.SerializeAsString())) &&
         Write(dir, "control", ControlSeed());
}

// shm_frame_fuzzer: one valid frame of each type a lane carries (ps/shm/shm_frame.h).
bool ShmFrameSeeds(const std::string& dir) {
  using namespace ps::shm;  // NOLINT
  ps::PushHeader push;
  push.worker_id = 1;
  push.step = 7;
  push.request_id = 99;
  push.commit = true;
  push.session = 3;
  push.input_position = "pos";
  PullOrder order;
  order.request.worker_id = 1;
  order.request.min_step = 8;
  order.request.decisions.push_back(ps::StepDecision{7, {0, 1}, true, "mac"});
  order.destinations.push_back(Destination{0, Destination::Kind::kInPlace, 2, 4096, 100});
  order.destinations.push_back(Destination{1, Destination::Kind::kStaging, 4, 0, 10});
  order.sparse.push_back(SparseOrder{0, 3, 16, 4, 64, 128});
  ps::PullHeader header;
  header.step = 8;
  header.decisions = order.request.decisions;
  PiecesWritten pieces;
  pieces.slices.push_back(SlicePiece{0, 0, 100, ps::WireDtype::kF32});
  pieces.rows.push_back(RowPiece{0, 0, 3, ps::WireDtype::kBF16});
  PushResult result;
  result.status = absl::AbortedError("register again");
  return Write(dir, "hello", EncodeFrame(FrameType::kHello, EncodeHello(Hello{LaneKind::kPull, 1, "abcd"}))) &&
         Write(dir, "segment", EncodeFrame(FrameType::kSegment, EncodeSegment(SegmentInfo{1, 1 << 20}))) &&
         Write(dir, "push_begin", EncodeFrame(FrameType::kPushBegin, EncodePushHeader(push))) &&
         Write(dir, "push_data",
               EncodeFrame(FrameType::kPushData, EncodeDataRef(DataRef{3, 0, 256, ps::WireDtype::kBF16, 1, 64}))) &&
         Write(dir, "push_rows",
               EncodeFrame(FrameType::kPushRows, EncodeRowsRef(RowsRef{0, 3, 16, ps::WireDtype::kF32, 1, 0, 64}))) &&
         Write(dir, "push_finish", EncodeFrame(FrameType::kPushFinish, "")) &&
         Write(dir, "push_result", EncodeFrame(FrameType::kPushResult, EncodePushResult(result))) &&
         Write(dir, "pull_request", EncodeFrame(FrameType::kPullRequest, EncodePullOrder(order))) &&
         Write(dir, "pull_header", EncodeFrame(FrameType::kPullHeader, EncodePullHeader(header))) &&
         Write(dir, "pull_pieces", EncodeFrame(FrameType::kPullPieces, EncodePieces(pieces)));
}

// tcp_frame_fuzzer: a lane's stream of frames (ps/tcp/tcp_frame.h): an upload, then a pull and its answer, each
// frame with the bulk its payload says.
bool TcpFrameSeeds(const std::string& dir) {
  using namespace ps::tcp;  // NOLINT
  namespace shm = ps::shm;
  auto frame = [](TcpFrameType type, const std::string& payload, const std::string& bulk = "") {
    return EncodeTcpHeader(type, payload, bulk.size()) + payload + bulk;
  };
  ps::PushHeader push;
  push.worker_id = 1;
  push.step = 7;
  push.request_id = 99;
  push.commit = true;
  push.session = 3;
  shm::PullOrder order;
  order.request.worker_id = 1;
  order.request.min_step = 8;
  order.sparse.push_back(shm::SparseOrder{0, 2, 4, 0, 0, 0});
  ps::PullHeader header;
  header.step = 8;
  shm::PushResult result;
  result.status = absl::AbortedError("register again");
  const std::string floats(4 * 16, '\x01');
  const std::string upload =
      frame(TcpFrameType::kHello, shm::EncodeHello(shm::Hello{shm::LaneKind::kPush, 1, "abcd"})) +
      frame(TcpFrameType::kPushBegin, shm::EncodePushHeader(push)) +
      frame(TcpFrameType::kPushData, EncodeSlicePiece(Piece{3, 0, 16, ps::WireDtype::kF32, 0}), floats) +
      frame(TcpFrameType::kPushRows, shm::EncodeRowsRef(shm::RowsRef{0, 2, 4, ps::WireDtype::kBF16, 0, 0, 0}),
            std::string(2 * 8 + 2 * 4 * 2, '\x02')) +
      frame(TcpFrameType::kPushNorm, shm::EncodeNorm(1.5)) + frame(TcpFrameType::kPushFinish, "") +
      frame(TcpFrameType::kPushResult, shm::EncodePushResult(result));
  const std::string pull =
      frame(TcpFrameType::kPullRequest, shm::EncodePullOrder(order), std::string(16, '\x03')) +
      frame(TcpFrameType::kPullHeader, shm::EncodePullHeader(header)) +
      frame(TcpFrameType::kPullData, EncodeSlicePiece(Piece{3, 0, 16, ps::WireDtype::kF32, 0}), floats) +
      frame(TcpFrameType::kPullRows, EncodeRowPiece(Piece{0, 0, 2, ps::WireDtype::kF32, 4}), std::string(32, '\x04')) +
      frame(TcpFrameType::kPullEnd, shm::EncodePushResult(shm::PushResult{}));
  return Write(dir, "upload", upload) && Write(dir, "pull", pull);
}

// image_decode_fuzzer input: 8 bytes of request (image_decode_fuzzer.cc), then a JPEG or PNG of each kind.
bool ImageDecodeSeeds(const std::string& dir) {
  std::vector<uint8_t> rgb(24 * 16 * 3), gray(24 * 16), rgba(24 * 16 * 4);
  for (size_t i = 0; i < rgb.size(); ++i) rgb[i] = static_cast<uint8_t>(i * 7 % 251);
  for (size_t i = 0; i < gray.size(); ++i) gray[i] = static_cast<uint8_t>(i * 3 % 253);
  for (size_t i = 0; i < rgba.size(); ++i) rgba[i] = static_cast<uint8_t>(i * 5 % 249);
  const std::string whole("\x00\x00\x00\x00\x00\x00\x00\x05", 8), cropped("\x01\x20\x30\x80\x60\x08\x01\x87", 8);
  struct Seed {
    const char* name;
    absl::StatusOr<std::string> bytes;
  } seeds[] = {
      {"baseline.jpg", data::EncodeJpeg(rgb, 24, 16, 3)},
      {"progressive.jpg", data::EncodeJpeg(rgb, 24, 16, 3, 80, true)},
      {"gray.jpg", data::EncodeJpeg(gray, 24, 16, 1)},
      {"rgb.png", data::EncodePng(rgb, 24, 16, 2)},
      {"gray.png", data::EncodePng(gray, 24, 16, 0)},
      {"rgba.png", data::EncodePng(rgba, 24, 16, 6)},
  };
  for (const Seed& s : seeds) {
    if (!s.bytes.ok() || !Write(dir, absl::StrCat("whole_", s.name), whole + *s.bytes) ||
        !Write(dir, absl::StrCat("cropped_", s.name), cropped + *s.bytes)) {
      return false;
    }
  }
  return true;
}

// npy_fuzzer input: a byte (odd: a .npy, even: a .npz), then the file.
bool NpySeeds(const std::string& dir) {
  worker::NpyArray x{"x", {3, 2, 2}, {1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12}};
  worker::NpyArray y = worker::Int64NpyArray("y", {3}, {0, 1, 2});
  absl::StatusOr<std::string> npz = worker::EncodeNpz({x, y});
  absl::StatusOr<std::string> npy = worker::EncodeNpy(x);
  return npz.ok() && npy.ok() && Write(dir, "xy.npz", std::string(1, '\0') + *npz) &&
         Write(dir, "x.npy", std::string(1, '\1') + *npy);
}

}  // namespace
}  // namespace dtrain

int main(int argc, char** argv) {
  if (argc != 2) {
    std::fprintf(stderr, "usage: dtrain_fuzz_seeds OUT_DIR\n");
    return 2;
  }
  const std::string out = argv[1];
  const bool ok = dtrain::MnistSeeds(out + "/mnist_idx_fuzzer") &&
                  dtrain::CifarSeeds(out + "/cifar10_fuzzer") &&
                  dtrain::TfRecordSeeds(out + "/tfrecord_fuzzer") &&
                  dtrain::CheckpointSeeds(out + "/checkpoint_fuzzer") &&
                  dtrain::BatchStreamStateSeeds(out + "/batch_stream_state_fuzzer") &&
                  dtrain::PsRequestSeeds(out + "/ps_request_fuzzer") &&
                  dtrain::ShmFrameSeeds(out + "/shm_frame_fuzzer") &&
                  dtrain::TcpFrameSeeds(out + "/tcp_frame_fuzzer") &&
                  dtrain::ImageDecodeSeeds(out + "/image_decode_fuzzer") &&
                  dtrain::NpySeeds(out + "/npy_fuzzer");
  if (!ok) {
    std::fprintf(stderr, "dtrain_fuzz_seeds: cannot write the seeds under %s\n", out.c_str());
    return 1;
  }
  return 0;
}
