// dtrain_bench_sparse_store: the row store (ps/core/sparse_store.h) on one core, as a ps task's pull and push
// handlers drive it: batches of ids (a step's unique ids of one table) looked up (rows copied out as fp32, as a
// pull sends them), created (first lookups of new ids) and updated (the sparse optimizer). Every figure is a
// median over --repeats passes, timed in the thread's CPU time (so a machine shared with other work still gives
// what one core does); every pass checks what it read (a row that reads back wrong counts in "#wrong",
// and a non-zero count fails the run).
//
//   dtrain_bench_sparse_store [--rows=1000000] [--dim=16] [--batch=4096] [--optimizer=adagrad] [--repeats=5]
//                             [--row_dtype=fp32|fp16|bf16]
//
// Prints, per phase: ids per second (millions), ns per id, and the table's bytes per row; then what a fresh page
// costs on this machine (an insert writes new rows into fresh pages, made resident ahead with MADV_POPULATE_WRITE
// as the store does): the first write to each page after that, against a later one. On a virtual machine with
// shadow page tables the first write still traps to the hypervisor, unseen by the guest's profilers (perf
// puts that time on the store instruction).
#include <algorithm>
#include <sys/mman.h>
#include <time.h>

#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <random>
#include <string>
#include <utility>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/flags/usage.h"
#include "ps/core/sparse_store.h"

ABSL_FLAG(int64_t, rows, 1000000, "Rows in the table (distinct ids inserted, then looked up)");
ABSL_FLAG(int, dim, 16, "Floats per row");
ABSL_FLAG(int, batch, 4096, "Ids per call (a step's unique ids of one table)");
ABSL_FLAG(std::string, optimizer, "adagrad", "Sparse optimizer (its slots are part of each row)");
ABSL_FLAG(int, repeats, 5, "Passes per phase; the median is printed");
ABSL_FLAG(std::string, row_dtype, "fp32", "How the store keeps the rows' values: fp32 | fp16 | bf16");

namespace dtrain::ps {
namespace {

double Median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

double ThreadCpuSeconds() {
  timespec t;
  clock_gettime(CLOCK_THREAD_CPUTIME_ID, &t);
  return static_cast<double>(t.tv_sec) + 1e-9 * static_cast<double>(t.tv_nsec);
}

// The CPU time of this thread while fn runs: what one core spends, whatever else the machine runs (its wall time
// on a shared machine would count the other processes' turns).
template <typename Fn>
double Seconds(Fn fn) {
  const double start = ThreadCpuSeconds();
  fn();
  return ThreadCpuSeconds() - start;
}

#ifndef MADV_POPULATE_WRITE
#define MADV_POPULATE_WRITE 23  // Linux 5.14
#endif

// Nanoseconds a page (CPU time) of the first and of a second one-byte write to each page of a fresh anonymous
// mapping made resident with MADV_POPULATE_WRITE; {0, 0} when it cannot be mapped.
std::pair<double, double> FreshPageWriteNs() {
  const size_t bytes = size_t{64} << 20, page = 4096;
  void* m = mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  if (m == MAP_FAILED) return {0, 0};
  volatile char* p = static_cast<char*>(m);
  madvise(m, bytes, MADV_POPULATE_WRITE);  // as the store does (a kernel without it: the first write faults)
  const double first = Seconds([&] {
    for (size_t i = 0; i < bytes; i += page) p[i + 64] = 1;
  });
  const double again = Seconds([&] {
    for (size_t i = 0; i < bytes; i += page) p[i + 128] = 2;
  });
  munmap(m, bytes);
  const double pages = static_cast<double>(bytes / page);
  return {1e9 * first / pages, 1e9 * again / pages};
}

int Run() {
  const int64_t rows = absl::GetFlag(FLAGS_rows);
  const int dim = absl::GetFlag(FLAGS_dim);
  const int batch = absl::GetFlag(FLAGS_batch);
  const int repeats = std::max(1, absl::GetFlag(FLAGS_repeats));
  if (rows < batch || dim < 1 || batch < 1) {
    std::fprintf(stderr, "dtrain_bench_sparse_store: need --rows >= --batch >= 1 and --dim >= 1\n");
    return 2;
  }
  SparseTableSpec spec;
  spec.name = "emb";
  spec.dim = dim;
  spec.init_scale = 0.05f;
  spec.init_seed = 3;
  absl::StatusOr<RowDtype> row_dtype = ParseRowDtype(absl::GetFlag(FLAGS_row_dtype));
  if (!row_dtype.ok()) {
    std::fprintf(stderr, "dtrain_bench_sparse_store: %s\n", std::string(row_dtype.status().message()).c_str());
    return 2;
  }
  spec.row_dtype = *row_dtype;
  SparseOptimizerConfig opt;
  opt.name = absl::GetFlag(FLAGS_optimizer);
  std::mt19937_64 rng(1);
  // Distinct ids spread as real ones are (hashed feature values).
  std::vector<int64_t> ids(rows);
  for (int64_t i = 0; i < rows; ++i) ids[i] = static_cast<int64_t>(Mix64(static_cast<uint64_t>(i) + 1) >> 1);
  std::vector<float> out(static_cast<size_t>(batch) * dim), grads(static_cast<size_t>(batch) * dim, 0.01f);
  std::vector<float> expect(dim);
  int64_t wrong = 0;
  // A row read back must equal its initializer (inserts) or its last value (lookups: checked against a first read).
  auto check_initial = [&](const int64_t* b, int n) {
    for (int i = 0; i < n; i += 97) {
      SparseInitialRow(spec, b[i], expect.data());
      for (int k = 0; k < dim; ++k) {
        const float got = out[static_cast<size_t>(i) * dim + k];
        const float tol = spec.row_dtype == RowDtype::kF32 ? 0.0f : 0.01f * std::fabs(expect[k]) + 1e-6f;
        if (std::fabs(got - expect[k]) > tol) {
          ++wrong;
          break;
        }
      }
    }
  };

  std::vector<double> insert_rate, lookup_rate, apply_rate;
  int64_t bytes = 0;
  for (int r = 0; r < repeats; ++r) {
    absl::StatusOr<std::unique_ptr<SparseStore>> made = SparseStore::Create({spec}, opt, {}, {});
    if (!made.ok()) {
      std::fprintf(stderr, "dtrain_bench_sparse_store: %s\n", std::string(made.status().message()).c_str());
      return 2;
    }
    SparseStore& store = **made;
    const double ins = Seconds([&] {
      for (int64_t first = 0; first + batch <= rows; first += batch) {
        store.Lookup(0, ids.data() + first, batch, WireDtype::kF32, out.data());
      }
    });
    // Checked outside the timing: the last batch.
    check_initial(ids.data() + (rows / batch - 1) * batch, batch);
    insert_rate.push_back(static_cast<double>(rows / batch * batch) / ins);
    bytes = store.MemoryBytes();
    // Lookups of existing rows in a random order (a step's ids hit rows anywhere in the table).
    std::vector<int64_t> order(ids.begin(), ids.begin() + rows / batch * batch);
    std::shuffle(order.begin(), order.end(), rng);
    const double look = Seconds([&] {
      for (int64_t first = 0; first + batch <= static_cast<int64_t>(order.size()); first += batch) {
        store.Lookup(0, order.data() + first, batch, WireDtype::kF32, out.data());
      }
    });
    check_initial(order.data() + order.size() - batch, batch);
    lookup_rate.push_back(static_cast<double>(order.size()) / look);
    const double app = Seconds([&] {
      for (int64_t first = 0; first + batch <= static_cast<int64_t>(order.size()); first += batch) {
        store.Apply(0, 1, order.data() + first, batch, grads.data(), 1.0f);
      }
    });
    apply_rate.push_back(static_cast<double>(order.size()) / app);
    const std::vector<SparseTableStats> stats = store.Stats();
    if (stats[0].rows != rows / batch * batch || stats[0].updates != rows / batch * batch) ++wrong;
  }
  const double per_row = static_cast<double>(bytes) / static_cast<double>(rows / batch * batch);
  std::printf("sparse store, one thread (CPU time): %lld rows of dim %d (%s, %s rows), batches of %d, median of %d\n",
              static_cast<long long>(rows), dim, opt.name.c_str(), RowDtypeName(spec.row_dtype), batch, repeats);
  auto line = [](const char* what, double rate) {
    std::printf("  %-28s %8.2f M ids/s  %7.1f ns/id\n", what, rate / 1e6, 1e9 / rate);
  };
  line("inserts (first lookups)", Median(insert_rate));
  line("lookups of existing rows", Median(lookup_rate));
  line("updates (optimizer)", Median(apply_rate));
  std::printf("  table: %.1f bytes per row; #wrong %lld\n", per_row, static_cast<long long>(wrong));
  const auto [first_ns, again_ns] = FreshPageWriteNs();
  std::printf("  fresh pages: first write %.0f ns/page after MADV_POPULATE_WRITE (%.0f ns per %.0f-byte row), "
              "a later write %.0f ns/page\n",
              first_ns, first_ns * per_row / 4096, per_row, again_ns);
  return wrong == 0 ? 0 : 1;
}

}  // namespace
}  // namespace dtrain::ps

int main(int argc, char** argv) {
  absl::SetProgramUsageMessage("benchmark of the ps's sparse row store on one thread");
  absl::ParseCommandLine(argc, argv);
  return dtrain::ps::Run();
}
