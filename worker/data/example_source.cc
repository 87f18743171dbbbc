#include "worker/data/example_source.h"

#include <cmath>
#include <utility>

#include "glog/logging.h"

namespace dtrain::data {
namespace {

class Subset : public ExampleSource {
 public:
  Subset(std::shared_ptr<const ExampleSource> source, std::vector<int64_t> indices)
      : source_(std::move(source)), indices_(std::move(indices)) {
    for (int64_t i : indices_) CHECK(i >= 0 && i < source_->size()) << "SubsetSource: index " << i;
  }
  int64_t size() const override { return static_cast<int64_t>(indices_.size()); }
  absl::Status Read(int64_t i, bool augment, std::mt19937_64* rng, float* out) const override {
    return source_->Read(indices_[i], augment, rng, out);
  }
  bool bytes() const override { return source_->bytes(); }
  bool can_fail() const override { return source_->can_fail(); }
  std::string Name(int64_t i) const override { return source_->Name(indices_[i]); }

 private:
  const std::shared_ptr<const ExampleSource> source_;
  const std::vector<int64_t> indices_;
};

}  // namespace

std::shared_ptr<const ExampleSource> SubsetSource(std::shared_ptr<const ExampleSource> source,
                                                  std::vector<int64_t> indices) {
  return std::make_shared<Subset>(std::move(source), std::move(indices));
}

void SplitEvenly(int64_t n, double fraction, std::vector<int64_t>* kept, std::vector<int64_t>* held) {
  for (int64_t i = 0; i < n; ++i) {
    const bool hold = static_cast<int64_t>(std::floor((i + 1) * fraction)) > static_cast<int64_t>(std::floor(i * fraction));
    (hold ? held : kept)->push_back(i);
  }
}

}  // namespace dtrain::data
