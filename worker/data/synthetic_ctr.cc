// The synthetic CTR generator (synthetic_ctr.h): one pass per file, each example drawn from its own
// counter-seeded stream and formatted straight into a write buffer.
#include "worker/data/synthetic_ctr.h"

#include <charconv>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <memory>
#include <string>
#include <system_error>
#include <thread>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "common/status_macros.h"
#include "glog/logging.h"
#include "worker/data/criteo.h"
#include "worker/data/metrics.h"

namespace dtrain::data {
namespace {

constexpr double kPi = 3.14159265358979323846;
constexpr double kBias = -1.9;
constexpr double kIdEffect = 0.5;    // scale of the per-id effects (features f % 3 == 0)
constexpr double kPairEffect = 0.7;  // scale of the features 1 x 2 effect
constexpr size_t kFlushBytes = size_t{4} << 20;

// splitmix64: a stream of 64-bit values from a 64-bit state.
class SplitMix {
 public:
  explicit SplitMix(uint64_t state) : state_(state) {}
  uint64_t Next() { return Mix64(state_ += 0x9e3779b97f4a7c15ULL); }
  double Uniform() { return static_cast<double>(Next() >> 11) * 0x1.0p-53; }  // [0, 1)
  double Normal() {  // Box-Muller, one of the pair
    const double u1 = 1.0 - Uniform(), u2 = Uniform();
    return std::sqrt(-2.0 * std::log(u1)) * std::cos(2.0 * kPi * u2);
  }

 private:
  uint64_t state_;
};

// A standard normal value that is a fixed function of the hash h.
double NormalFromHash(uint64_t h) {
  const double u1 = (static_cast<double>(h >> 32) + 0.5) * 0x1.0p-32, u2 = static_cast<double>(h & 0xffffffff) * 0x1.0p-32;
  return std::sqrt(-2.0 * std::log(u1)) * std::cos(2.0 * kPi * u2);
}

uint32_t Fmix32(uint32_t h) {  // MurmurHash3's finalizer: a bijection of the 32-bit integers
  h ^= h >> 16;
  h *= 0x85ebca6bU;
  h ^= h >> 13;
  h *= 0xc2b2ae35U;
  return h ^ (h >> 16);
}

double Sigmoid(double z) { return 1.0 / (1.0 + std::exp(-z)); }

struct Law {
  int num_dense = 0, num_sparse = 0;
  std::vector<double> mu, sigma, dense_missing, w;
  std::vector<double> sparse_missing;
  std::vector<ZipfSampler> zipf;
  std::vector<uint32_t> value_key;  // per sparse feature: the rank -> hex value bijection's key
  uint64_t effect_key = 0, pair_key = 0;
  bool pair = false;
  std::vector<double> drift_per_time;  // per sparse feature: d V_f (the item shift at t = 1)
};

Law MakeLaw(const SyntheticCtrOptions& o, const std::vector<int64_t>& vocab, uint64_t seed_key) {
  Law law;
  law.num_dense = o.num_dense;
  law.num_sparse = o.num_sparse;
  for (int j = 0; j < o.num_dense; ++j) {
    law.mu.push_back(0.5 + 0.8 * (j % 5));
    law.sigma.push_back(1.0 + 0.25 * (j % 3));
    law.dense_missing.push_back(0.05 * (j % 4) + (j % 7 == 0 ? 0.3 : 0.0));
    law.w.push_back(0.3 * ((j % 3) - 1));
  }
  for (int f = 0; f < o.num_sparse; ++f) {
    law.sparse_missing.push_back(f % 6 == 5 ? 0.3 : 0.0);
    law.zipf.emplace_back(vocab[f], o.zipf_exponent);
    law.value_key.push_back(static_cast<uint32_t>(Mix64(seed_key ^ (0x100 + static_cast<uint64_t>(f)))));
    law.drift_per_time.push_back(o.drift * static_cast<double>(vocab[f]));
  }
  law.effect_key = Mix64(seed_key ^ 0x6566666563747300);  // "effects"
  law.pair_key = Mix64(seed_key ^ 0x7061697273000000);    // "pairs"
  law.pair = o.num_sparse >= 3;
  return law;
}

// Appends one example's line (at time t in [0, 1]) to *out; returns its hidden logit and (in *dense_logit) its
// bias + dense part.
double AppendExample(const Law& law, SplitMix& rng, double t, std::string* out, double* dense_logit) {
  char buf[32];
  std::string& s = *out;
  const size_t label_at = s.size();
  s.push_back('0');  // the label, set below
  double logit = kBias;
  for (int j = 0; j < law.num_dense; ++j) {
    s.push_back('\t');
    const double missing = rng.Uniform();
    const double z = rng.Normal();
    if (missing < law.dense_missing[j]) continue;
    auto x = static_cast<int64_t>(std::floor(std::exp(std::min(law.mu[j] + law.sigma[j] * z, 30.0))));
    if (j == 1) x -= 3;
    s.append(buf, std::to_chars(buf, buf + sizeof(buf), x).ptr);
    logit += law.w[j] * (static_cast<double>(CriteoDense(x)) - law.mu[j]);
  }
  *dense_logit = logit;
  int64_t rank1 = 0, rank2 = 0;
  static constexpr char kHexDigits[] = "0123456789abcdef";
  for (int f = 0; f < law.num_sparse; ++f) {
    s.push_back('\t');
    const double missing = rng.Uniform();
    const int64_t rank = law.zipf[f].Sample([&rng] { return rng.Uniform(); });
    if (missing < law.sparse_missing[f]) continue;
    const int64_t k = rank + static_cast<int64_t>(std::floor(law.drift_per_time[f] * t));  // the item
    const uint32_t v = Fmix32(static_cast<uint32_t>(k - 1) ^ law.value_key[f]);
    for (int i = 7; i >= 0; --i) s.push_back(kHexDigits[(v >> (4 * i)) & 0xf]);
    if (f % 3 == 0) {
      logit += kIdEffect * NormalFromHash(Mix64(law.effect_key ^ Mix64((static_cast<uint64_t>(f) << 40) ^ k)));
    }
    if (f == 1) rank1 = k;
    if (f == 2) rank2 = k;
  }
  if (law.pair && rank1 > 0 && rank2 > 0) {
    logit += kPairEffect * NormalFromHash(Mix64(law.pair_key ^ Mix64((static_cast<uint64_t>(rank1) << 32) ^ rank2)));
  }
  s.push_back('\n');
  if (rng.Uniform() < Sigmoid(logit)) s[label_at] = '1';
  return logit;
}

// Writes `count` examples of stream `stream_key` to path; the test file's logits go to the vectors when given.
// Example i is at time t0 + i * dt.
absl::StatusOr<double> WriteFile(const Law& law, uint64_t stream_key, int64_t count, const std::string& path,
                                 double t0, double dt, std::vector<float>* logits, std::vector<float>* dense_logits,
                                 std::vector<float>* labels) {
  const std::string tmp = path + ".tmp";
  std::unique_ptr<FILE, int (*)(FILE*)> f(std::fopen(tmp.c_str(), "wb"), std::fclose);
  if (f == nullptr) return absl::InternalError(absl::StrCat(tmp, ": cannot create"));
  std::string buf;
  buf.reserve(kFlushBytes + 4096);
  int64_t clicks = 0;
  for (int64_t i = 0; i < count; ++i) {
    SplitMix rng(Mix64(stream_key ^ static_cast<uint64_t>(i)));
    const size_t line_at = buf.size();
    double dense_logit = 0;
    const double logit = AppendExample(law, rng, t0 + dt * static_cast<double>(i), &buf, &dense_logit);
    const bool click = buf[line_at] == '1';
    clicks += click;
    if (logits != nullptr) {
      logits->push_back(static_cast<float>(logit));
      dense_logits->push_back(static_cast<float>(dense_logit));
      labels->push_back(click ? 1.0f : 0.0f);
    }
    if (buf.size() >= kFlushBytes || i + 1 == count) {
      if (std::fwrite(buf.data(), 1, buf.size(), f.get()) != buf.size()) {
        return absl::InternalError(absl::StrCat(tmp, ": write failed"));
      }
      buf.clear();
    }
  }
  if (std::fclose(f.release()) != 0) return absl::InternalError(absl::StrCat(tmp, ": write failed"));
  std::error_code ec;
  std::filesystem::rename(tmp, path, ec);
  if (ec) return absl::InternalError(absl::StrCat("cannot rename ", tmp, " to ", path, ": ", ec.message()));
  return static_cast<double>(clicks) / static_cast<double>(count);
}

absl::Status CheckOptions(const SyntheticCtrOptions& o, std::vector<int64_t>* vocab) {
  auto bad = [](auto... what) { return absl::InvalidArgumentError(absl::StrCat("synthetic CTR data: ", what...)); };
  if (o.examples < 1) return bad("--examples=", o.examples, " must be at least 1");
  if (o.test_examples < 1 && o.test_examples != -1) return bad("--test_examples=", o.test_examples, " must be at least 1");
  if (!(o.zipf_exponent > 0) || !std::isfinite(o.zipf_exponent)) {
    return bad("--zipf_exponent=", o.zipf_exponent, " must be a positive number");
  }
  if (o.num_dense < 0 || o.num_sparse < 0 || o.num_dense + o.num_sparse < 1 ||
      o.num_dense + o.num_sparse >= kMaxCriteoFields) {
    return bad("--num_dense=", o.num_dense, " --num_sparse=", o.num_sparse, ": need at least one feature and fewer than ",
               kMaxCriteoFields, " in all");
  }
  if (o.vocab.empty()) {
    *vocab = DefaultCtrVocab(o.num_sparse);
  } else if (o.vocab.size() == 1) {
    vocab->assign(o.num_sparse, o.vocab[0]);
  } else if (static_cast<int>(o.vocab.size()) == o.num_sparse) {
    *vocab = o.vocab;
  } else {
    return bad("--vocab has ", o.vocab.size(), " sizes for ", o.num_sparse, " sparse features (give one or ",
               o.num_sparse, ")");
  }
  for (int64_t v : *vocab) {
    if (v < 1 || v > (int64_t{1} << 31)) return bad("vocabulary size ", v, " is not in [1, 2^31]");
    if (!(o.drift >= 0) || (1 + o.drift) * static_cast<double>(v) >= 4294967295.0) {
      return bad("--drift=", o.drift, " must be >= 0 with (1 + drift) x vocabulary size below 2^32 (vocabulary ", v,
                 ")");
    }
  }
  if (o.stream_parts < 0 || o.stream_parts > 100000 || o.stream_parts > o.examples) {
    return bad("--stream_parts=", o.stream_parts, " must be in [0, min(100000, --examples)]");
  }
  if (!(o.stream_interval_secs >= 0)) return bad("--stream_interval_secs must be >= 0");
  return absl::OkStatus();
}

}  // namespace

std::vector<int64_t> DefaultCtrVocab(int num_sparse) {
  if (num_sparse == 1) return {1000};
  std::vector<int64_t> v;
  for (int f = 0; f < num_sparse; ++f) v.push_back(std::llround(std::pow(10.0, 1.0 + 5.0 * f / (num_sparse - 1))));
  return v;
}

absl::StatusOr<SyntheticCtrReport> WriteSyntheticCtr(const SyntheticCtrOptions& o, const std::string& dir) {
  const auto start = std::chrono::steady_clock::now();
  SyntheticCtrReport r;
  RETURN_IF_ERROR(CheckOptions(o, &r.vocab));
  std::error_code ec;
  std::filesystem::create_directories(dir, ec);
  if (ec) return absl::InternalError(absl::StrCat("cannot create ", dir, ": ", ec.message()));
  RETURN_IF_ERROR(WriteCriteoLayout(dir, CriteoLayout{o.num_dense, o.num_sparse}));

  const uint64_t seed_key = Mix64(o.seed ^ 0x73796e7468637472);  // "synthctr"
  const Law law = MakeLaw(o, r.vocab, seed_key);
  r.train_examples = o.examples;
  r.test_examples = o.test_examples == -1 ? std::max<int64_t>(1, o.examples / 10) : o.test_examples;
  const std::filesystem::path d(dir);
  const double dt = 1.0 / static_cast<double>(r.train_examples);
  std::vector<float> logits, dense_logits, labels;
  logits.reserve(r.test_examples);
  dense_logits.reserve(r.test_examples);
  labels.reserve(r.test_examples);
  // The test set at the end of the stream's time (the newest data), t = 1. Written first: an evaluator
  // following a stream finds it as soon as the first part is there (its draws do not depend on the order).
  ASSIGN_OR_RETURN(r.test_ctr, WriteFile(law, Mix64(seed_key + 2), r.test_examples, (d / "test.txt").string(),
                                         o.drift > 0 ? 1.0 : 0.0, 0.0, &logits, &dense_logits, &labels));
  if (o.stream_parts == 0) {
    ASSIGN_OR_RETURN(r.train_ctr, WriteFile(law, Mix64(seed_key + 1), r.train_examples, (d / "train.txt").string(),
                                            0.0, dt, nullptr, nullptr, nullptr));
  } else {
    const std::filesystem::path stream = d / "stream";
    std::filesystem::create_directories(stream, ec);
    if (ec) return absl::InternalError(absl::StrCat("cannot create ", stream.string(), ": ", ec.message()));
    RETURN_IF_ERROR(WriteCriteoLayout(stream.string(), CriteoLayout{o.num_dense, o.num_sparse}));
    double clicks = 0;
    for (int p = 0; p < o.stream_parts; ++p) {
      if (p > 0 && o.stream_interval_secs > 0) {
        std::this_thread::sleep_for(std::chrono::duration<double>(o.stream_interval_secs));
      }
      const int64_t first = r.train_examples * p / o.stream_parts, end = r.train_examples * (p + 1) / o.stream_parts;
      char name[32];
      std::snprintf(name, sizeof(name), "part-%05d.txt", p);
      // Each part its own random stream (its examples' draws do not depend on how the stream is cut).
      ASSIGN_OR_RETURN(const double ctr, WriteFile(law, Mix64(seed_key + 1) ^ Mix64(0x70617274ULL + p), end - first,
                                                   (stream / name).string(), first * dt, dt, nullptr, nullptr,
                                                   nullptr));
      clicks += ctr * static_cast<double>(end - first);
      r.parts.push_back((stream / name).string());
    }
    r.train_ctr = clicks / static_cast<double>(r.train_examples);
  }
  r.bayes_auc = RocAuc(logits, labels);
  r.dense_only_auc = RocAuc(dense_logits, labels);
  r.bayes_log_loss = MeanLogLoss(logits, labels);
  const double p = r.test_ctr;
  r.constant_log_loss = p <= 0 || p >= 1 ? 0.0 : -(p * std::log(p) + (1 - p) * std::log1p(-p));
  r.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  return r;
}

// ---- ZipfSampler (the helper functions of Apache Commons RNG's RejectionInversionZipfSampler) ----

namespace {

// log(1 + x) / x, continuous at 0.
double Helper1(double x) { return std::abs(x) > 1e-8 ? std::log1p(x) / x : 1 - x * (0.5 - x * (1.0 / 3 - 0.25 * x)); }
// (exp(x) - 1) / x, continuous at 0.
double Helper2(double x) {
  return std::abs(x) > 1e-8 ? std::expm1(x) / x : 1 + x * 0.5 * (1 + x * (1.0 / 3) * (1 + 0.25 * x));
}

}  // namespace

ZipfSampler::ZipfSampler(int64_t n, double s) : n_(n), exponent_(s) {
  CHECK_GE(n, 1) << "ZipfSampler: n";
  CHECK_GT(s, 0) << "ZipfSampler: exponent";
  h_integral_x1_ = HIntegral(1.5) - 1;
  h_integral_n_ = HIntegral(static_cast<double>(n) + 0.5);
  s_ = 2 - HIntegralInverse(HIntegral(2.5) - H(2));
}

double ZipfSampler::H(double x) const { return std::exp(-exponent_ * std::log(x)); }

// The integral of H from 1 to x: (x^(1 - s) - 1) / (1 - s) (log x for s = 1).
double ZipfSampler::HIntegral(double x) const {
  const double log_x = std::log(x);
  return Helper2((1 - exponent_) * log_x) * log_x;
}

double ZipfSampler::HIntegralInverse(double x) const {
  double t = x * (1 - exponent_);
  if (t < -1) t = -1;  // rounding can push it below the domain's edge
  return std::exp(Helper1(t) * x);
}

double ZipfSampler::Probability(int64_t k) const {
  if (k < 1 || k > n_) return 0;
  double sum = 0;
  for (int64_t i = n_; i >= 1; --i) sum += std::pow(static_cast<double>(i), -exponent_);
  return std::pow(static_cast<double>(k), -exponent_) / sum;
}

}  // namespace dtrain::data
