// Synthetic click-through-rate data in Criteo text format (criteo.h) with power-law id frequencies and a planted
// signal a model can learn: what `dtrain_convert --synthetic_ctr` writes.
//
// The law (fixed; everything below is a function of the seed and the example's index, so a file is the same
// whatever the machine):
//   Categorical feature f (0-based, of num_sparse): empty with probability 0.3 when f % 6 == 5, else never;
//     otherwise a rank k in 1..V_f drawn from the Zipf law P(k) = k^-s / sum_{i<=V_f} i^-s (s = zipf_exponent,
//     default 1.05, near what Criteo's categorical columns show), written as 8 hex digits that are a fixed
//     bijection of k (so the hex values carry no order). V_f = vocab[f]; by default
//     round(10^(1 + 5 f / (num_sparse - 1))): 10 for the first feature up to 1,000,000 for the last.
//   Integer feature j (of num_dense): empty with probability 0.05 (j % 4) + 0.3 [j % 7 == 0]; otherwise
//     floor(exp(mu_j + sigma_j z)), z standard normal, mu_j = 0.5 + 0.8 (j % 5), sigma_j = 1 + 0.25 (j % 3)
//     (most values small, a long tail), minus 3 for j == 1 (Criteo's I2 goes down to -3).
//   Label: 1 with probability sigmoid(logit), where the hidden logit is
//     -1.9 + sum_j w_j (t_j - mu_j)               t_j = CriteoDense(x_j), w_j = 0.3 ((j % 3) - 1)
//        + sum_{f % 3 == 0} 0.5 g(f, k_f)        a per-id effect on every third feature
//        + 0.7 g'(k_1, k_2)                       a pairwise effect of features 1 and 2 (num_sparse >= 3)
//     with g, g' standard normal values hashed from (seed, feature(s), rank(s)); an empty field adds 0.
// The report gives the planted model's test-set AUC (the Bayes-optimal AUC: no model can beat it on average),
// the AUC of its dense part alone (a baseline a model ignoring the ids could reach), and the log losses.
//
// A stream with drift (stream_parts > 0): examples / stream_parts examples in each of stream/part-00000.txt,
// part-00001.txt, ... (time order: example i of the stream is at time t = i / examples), and test.txt drawn at
// t = 1, the newest data. With drift d, the rank-k value of feature f at time t is the item k + floor(d t V_f): as
// time goes on, the popular values give way to new ones (d = 1: by the end every rank holds an item unseen at
// t = 0). The per-id and pairwise effects belong to the items, so what is learnt about an item holds while it is
// around; a model frozen early has never seen the items of the end. drift 0 keeps the law above (and the files of
// the same seed). Parts are written in order, each renamed into place when complete (a follower never reads a
// half-written part), stream_interval_secs apart (0: at once).
//
// Randomness: example i of a file draws from splitmix64 started at Mix64(seed key ^ i) (criteo.h's Mix64); the
// hidden effects hash the seed too. Files go to "<name>.tmp" first and are renamed when complete.
//
// Thread-safety: the functions are stateless; a ZipfSampler is immutable after construction (Sample is const).
#ifndef DTRAIN_WORKER_DATA_SYNTHETIC_CTR_H_
#define DTRAIN_WORKER_DATA_SYNTHETIC_CTR_H_

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/statusor.h"

namespace dtrain::data {

struct SyntheticCtrOptions {
  int64_t examples = 1000000;  // lines of train.txt (>= 1)
  int64_t test_examples = -1;  // lines of test.txt; -1: max(1, examples / 10)
  uint64_t seed = 1;
  double zipf_exponent = 1.05;  // s > 0
  int num_dense = 13;
  int num_sparse = 26;
  std::vector<int64_t> vocab;  // V_f per sparse feature (1 .. 2^31); empty: the default; one value: every feature
  int stream_parts = 0;        // > 0: a stream of this many parts (see above) instead of train.txt
  double drift = 0;            // d >= 0; (1 + d) V_f must stay below 2^32
  double stream_interval_secs = 0;  // a pause before each part after the first
};

struct SyntheticCtrReport {
  int64_t train_examples = 0, test_examples = 0;
  double train_ctr = 0, test_ctr = 0;  // fraction of label 1
  std::vector<int64_t> vocab;          // V_f used
  // On the test set:
  double bayes_auc = 0;           // AUC of the planted logits
  double dense_only_auc = 0;      // AUC of the planted logit's bias + dense part
  double bayes_log_loss = 0;      // log loss of the planted probabilities
  double constant_log_loss = 0;   // log loss of predicting the test CTR for every example
  double seconds = 0;
  std::vector<std::string> parts;  // the stream's files, in order (stream_parts > 0)
};

// round(10^(1 + 5 f / (num_sparse - 1))) for f < num_sparse (1000 when num_sparse == 1).
std::vector<int64_t> DefaultCtrVocab(int num_sparse);

// Writes dir/train.txt (or with stream_parts dir/stream/part-*.txt and dir/stream/criteo_layout.txt), dir/test.txt
// and dir/criteo_layout.txt (creating the directories). InvalidArgument for bad options, Internal for a failed
// write (naming the file).
absl::StatusOr<SyntheticCtrReport> WriteSyntheticCtr(const SyntheticCtrOptions& o, const std::string& dir);

// Exact Zipf samples over 1..n, P(k) = k^-s / H(n, s), by rejection-inversion (W. Hörmann, G. Derflinger,
// "Rejection-inversion to generate variates from monotone discrete distributions", 1996): O(1) per sample
// for any n, about 1.1 uniforms per sample. Preconditions (CHECKed): n >= 1, s > 0.
class ZipfSampler {
 public:
  ZipfSampler(int64_t n, double s);
  // `uniform` returns doubles in [0, 1).
  template <typename Uniform>
  int64_t Sample(Uniform&& uniform) const {
    while (true) {
      const double u = h_integral_n_ + uniform() * (h_integral_x1_ - h_integral_n_);
      const double x = HIntegralInverse(u);
      int64_t k = static_cast<int64_t>(x + 0.5);
      k = k < 1 ? 1 : k > n_ ? n_ : k;
      if (static_cast<double>(k) - x <= s_ || u >= HIntegral(static_cast<double>(k) + 0.5) - H(static_cast<double>(k))) {
        return k;
      }
    }
  }
  // P(k) (computed by summing the n terms: for tests).
  double Probability(int64_t k) const;

 private:
  double H(double x) const;
  double HIntegral(double x) const;
  double HIntegralInverse(double x) const;

  int64_t n_;
  double exponent_;
  double h_integral_x1_, h_integral_n_, s_;
};

}  // namespace dtrain::data

#endif  // DTRAIN_WORKER_DATA_SYNTHETIC_CTR_H_
