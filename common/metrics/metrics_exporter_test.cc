#include "common/metrics/metrics_exporter.h"

#include <arpa/inet.h>
#include <link.h>
#include <netinet/in.h>
#include <prometheus/counter.h>
#include <prometheus/histogram.h>
#include <prometheus/registry.h>
#include <prometheus/text_serializer.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <memory>
#include <string>

#include "absl/base/config.h"
#include "absl/strings/str_cat.h"
#include "common/metrics/scrape_families.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace dtrain::metrics {
namespace {

using ::testing::HasSubstr;
using ::testing::Not;

// A process that links CUDA's libraries holds ~155 KiB of static thread-local storage per thread (cuBLASLt 92
// KiB, glog 30, cuBLAS and NCCL 12 each): more than the 100 KiB stacks CivetWeb (prometheus-cpp's exposer) gives
// its threads, so its pthread_create failed with EINVAL and a CUDA build's dtrain_worker could not serve
// /metrics. This test program holds more than that, so every exporter test below runs as in such a process.
alignas(64) thread_local char g_cuda_sized_tls[192 << 10];

// The size of the main program's PT_TLS segment (its static thread-local storage).
size_t MainProgramTls() {
  size_t size = 0;
  dl_iterate_phdr(
      [](dl_phdr_info* info, size_t, void* out) {
        if (info->dlpi_name != nullptr && info->dlpi_name[0] != '\0') return 0;  // a library
        for (int i = 0; i < info->dlpi_phnum; ++i) {
          if (info->dlpi_phdr[i].p_type == PT_TLS) *static_cast<size_t*>(out) = info->dlpi_phdr[i].p_memsz;
        }
        return 1;
      },
      &size);
  return size;
}

// One HTTP/1.0 request to 127.0.0.1:port; the whole answer (status line, headers, body), or "" when it fails.
std::string HttpRequest(int port, const std::string& request) {
  const int fd = socket(AF_INET, SOCK_STREAM, 0);
  if (fd < 0) return "";
  timeval tv{5, 0};
  setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof(tv));
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_port = htons(static_cast<uint16_t>(port));
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  std::string answer;
  if (connect(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) == 0 &&
      write(fd, request.data(), request.size()) == static_cast<ssize_t>(request.size())) {
    char buf[4096];
    for (ssize_t n; (n = read(fd, buf, sizeof(buf))) > 0;) answer.append(buf, static_cast<size_t>(n));
  }
  close(fd);
  return answer;
}
std::string Get(int port, const std::string& path) {
  return HttpRequest(port, absl::StrCat("GET ", path, " HTTP/1.0\r\nHost: 127.0.0.1\r\n\r\n"));
}

std::string Serialize(const std::vector<prometheus::MetricFamily>& families) {
  return prometheus::TextSerializer().Serialize(families);
}

TEST(ExpositionFormatTest, CounterAndGaugeFamiliesHaveHelpTypeAndLabels) {
  std::vector<prometheus::MetricFamily> f;
  AddSample(&AddFamily(&f, "dtrain_test_pushes_total", "Pushes received.", prometheus::MetricType::Counter),
            {{"transport", "shm"}}, 42);
  AddSample(
      &AddFamily(&f, "dtrain_test_live_workers", "Workers holding a lease.", prometheus::MetricType::Gauge),
      {}, 2);
  const std::string text = Serialize(f);
  EXPECT_THAT(text, HasSubstr("# HELP dtrain_test_pushes_total Pushes received.\n"
                              "# TYPE dtrain_test_pushes_total counter\n"
                              "dtrain_test_pushes_total{transport=\"shm\"} 42\n"));
  EXPECT_THAT(text, HasSubstr("# TYPE dtrain_test_live_workers gauge\ndtrain_test_live_workers 2\n"));
}

TEST(ExpositionFormatTest, LabelValuesAreEscaped) {
  std::vector<prometheus::MetricFamily> f;
  AddSample(&AddFamily(&f, "dtrain_test_rows", "Rows.", prometheus::MetricType::Gauge),
            {{"table", "a\"b\\c\nd"}}, 1);
  EXPECT_THAT(Serialize(f), HasSubstr("dtrain_test_rows{table=\"a\\\"b\\\\c\\nd\"} 1\n"));
}

TEST(ExpositionFormatTest, HistogramBucketsAreCumulativeWithInfSumAndCount) {
  prometheus::Registry registry;
  prometheus::Histogram& h =
      prometheus::BuildHistogram()
          .Name("dtrain_test_step_seconds")
          .Help("Step time.")
          .Register(registry)
          .Add({{"part", "compute"}}, prometheus::Histogram::BucketBoundaries{0.01, 0.1, 1});
  for (double v : {0.005, 0.05, 0.05, 0.5, 5.0}) h.Observe(v);
  const std::string text = Serialize(registry.Collect());
  EXPECT_THAT(text, HasSubstr("# TYPE dtrain_test_step_seconds histogram\n"));
  EXPECT_THAT(text, HasSubstr("dtrain_test_step_seconds_bucket{part=\"compute\",le=\"0.01\"} 1\n"));
  EXPECT_THAT(text, HasSubstr("dtrain_test_step_seconds_bucket{part=\"compute\",le=\"0.1\"} 3\n"));
  EXPECT_THAT(text, HasSubstr("dtrain_test_step_seconds_bucket{part=\"compute\",le=\"1\"} 4\n"));
  EXPECT_THAT(text, HasSubstr("dtrain_test_step_seconds_bucket{part=\"compute\",le=\"+Inf\"} 5\n"));
  EXPECT_THAT(text, HasSubstr("dtrain_test_step_seconds_count{part=\"compute\"} 5\n"));
  EXPECT_THAT(text, HasSubstr("dtrain_test_step_seconds_sum{part=\"compute\"} 5.605\n"));
}

TEST(ProcessFamiliesTest, ResidentMemoryAndCpuArePositive) {
  std::vector<char> touched(8 << 20, 1);  // at least 8 MiB resident
  double rss = -1, cpu = -1, fds = -1;
  for (const prometheus::MetricFamily& f : ProcessFamilies()) {
    if (f.name == "process_resident_memory_bytes") rss = f.metric.at(0).gauge.value;
    if (f.name == "process_cpu_seconds_total") cpu = f.metric.at(0).counter.value;
    if (f.name == "process_open_fds") fds = f.metric.at(0).gauge.value;
  }
  EXPECT_GE(rss, static_cast<double>(touched.size()));
  EXPECT_GE(cpu, 0);
  EXPECT_GE(fds, 3);  // stdin, stdout, stderr
}

// dtrain_heap_bytes follows what the program holds: a block of 16 MiB held shows in "in_use" (and in "held", which
// counts in-use bytes too), and is gone from "in_use" once freed.
TEST(ProcessFamiliesTest, HeapInUseFollowsWhatIsHeld) {
  if (!HeapFiguresAvailable()) GTEST_SKIP() << "glibc's malloc (2.33 on) is needed; not under AddressSanitizer";
  auto heap = [](const std::string& state) {
    for (const prometheus::MetricFamily& f : ProcessFamilies()) {
      if (f.name != "dtrain_heap_bytes") continue;
      for (const prometheus::ClientMetric& m : f.metric) {
        if (m.label.size() == 1 && m.label[0].value == state) return m.gauge.value;
      }
    }
    return -1.0;
  };
  constexpr size_t kBytes = size_t{16} << 20;
  const double before = heap("in_use");
  ASSERT_GE(before, 0);
  char* block = static_cast<char*>(std::malloc(kBytes));
  ASSERT_NE(block, nullptr);
  block[0] = 1;
  const double holding = heap("in_use");
  EXPECT_GE(holding - before, static_cast<double>(kBytes));
  EXPECT_GE(heap("held"), holding);
  std::free(block);
  EXPECT_LT(heap("in_use"), holding - static_cast<double>(kBytes) / 2);
}

TEST(NewestFileAgeTest, ReadsTheNewestMatchingFile) {
  const std::string dir = ::testing::TempDir() + "/newest_file_age";
  ASSERT_EQ(system(("rm -rf " + dir + " && mkdir -p " + dir).c_str()), 0);
  auto is_ckpt = [](const std::string& n) { return n.rfind("model.ckpt-", 0) == 0; };
  EXPECT_EQ(NewestFileAgeSeconds(dir, is_ckpt), -1);
  EXPECT_EQ(NewestFileAgeSeconds(dir + "/missing", is_ckpt), -1);
  std::ofstream(dir + "/model.ckpt-10.ps0-of-1") << "x";
  const double age = NewestFileAgeSeconds(dir, is_ckpt);
  EXPECT_GE(age, 0);
  EXPECT_LT(age, 60);
  std::ofstream(dir + "/other") << "x";
  ASSERT_EQ(system(("touch -d '2 hours ago' " + dir + "/model.ckpt-10.ps0-of-1").c_str()), 0);
  EXPECT_GT(NewestFileAgeSeconds(dir, is_ckpt), 7000);  // "other" is newer, but not a checkpoint
}

TEST(MetricsFlagsTest, BadPortsAndAddressesNameTheFlag) {
  EXPECT_TRUE(ValidateMetricsFlags(0, "127.0.0.1").ok());
  EXPECT_TRUE(ValidateMetricsFlags(9100, "::1").ok());
  absl::Status s = ValidateMetricsFlags(70000, "127.0.0.1");
  EXPECT_TRUE(absl::IsInvalidArgument(s));
  EXPECT_THAT(std::string(s.message()), HasSubstr("--metrics_port=70000"));
  s = ValidateMetricsFlags(9100, "localhost");
  EXPECT_TRUE(absl::IsInvalidArgument(s));
  EXPECT_THAT(std::string(s.message()), HasSubstr("--metrics_bind_address=localhost"));
  EXPECT_TRUE(IsLoopbackAddress("127.0.0.1"));
  EXPECT_TRUE(IsLoopbackAddress("127.1.2.3"));
  EXPECT_TRUE(IsLoopbackAddress("::1"));
  EXPECT_FALSE(IsLoopbackAddress("0.0.0.0"));
  EXPECT_FALSE(IsLoopbackAddress("10.0.0.1"));
}

TEST(MetricsExporterTest, ServesMetricsAndNothingElse) {
  absl::StatusOr<std::unique_ptr<MetricsExporter>> exporter =
      MetricsExporter::Start(MetricsExporterOptions());
  ASSERT_TRUE(exporter.ok()) << exporter.status();
  const int port = (*exporter)->port();
  ASSERT_GT(port, 0);
  EXPECT_EQ((*exporter)->url(), absl::StrCat("http://127.0.0.1:", port, "/metrics"));
  auto registry = std::make_shared<prometheus::Registry>();
  prometheus::Counter& steps =
      prometheus::BuildCounter().Name("dtrain_test_steps_total").Help("Steps.").Register(*registry).Add({});
  steps.Increment(7);
  (*exporter)->Register(registry);
  int scrapes = 0;
  (*exporter)->Register(std::make_shared<CallbackCollectable>([&scrapes] {
    std::vector<prometheus::MetricFamily> f;
    AddSample(&AddFamily(&f, "dtrain_test_scrapes", "Scrapes.", prometheus::MetricType::Gauge), {},
              ++scrapes);
    return f;
  }));
  std::string answer = Get(port, "/metrics");
  EXPECT_THAT(answer, HasSubstr("HTTP/1.1 200"));
  EXPECT_THAT(answer, HasSubstr("Content-Type: text/plain"));
  EXPECT_THAT(answer, HasSubstr("\ndtrain_test_steps_total 7\n"));
  EXPECT_THAT(answer, HasSubstr("\ndtrain_test_scrapes 1\n"));
  steps.Increment();
  answer = Get(port, "/metrics");
  EXPECT_THAT(answer, HasSubstr("\ndtrain_test_steps_total 8\n"));
  EXPECT_THAT(answer, HasSubstr("\ndtrain_test_scrapes 2\n"));  // read again at each scrape
  answer = Get(port, "/");
  EXPECT_THAT(answer, HasSubstr(" 404 "));
  EXPECT_THAT(answer, Not(HasSubstr("dtrain_test_steps_total")));
  EXPECT_THAT(Get(port, "/etc/passwd"), HasSubstr(" 404 "));
  // A request that never ends is cut off by the server (request_timeout_ms), not held for ever.
  EXPECT_THAT(HttpRequest(port, std::string(64 << 10, 'A')), Not(HasSubstr("200")));
}

TEST(MetricsExporterTest, ServesFromAProcessWithCudaSizedStaticTls) {
  static_cast<volatile char*>(g_cuda_sized_tls)[1] = 1;  // keeps the block
  ASSERT_GE(MainProgramTls(), size_t{192 << 10});
  absl::StatusOr<std::unique_ptr<MetricsExporter>> exporter =
      MetricsExporter::Start(MetricsExporterOptions());
  ASSERT_TRUE(exporter.ok()) << exporter.status();
  std::string answer = Get((*exporter)->port(), "/metrics");
  EXPECT_THAT(answer, HasSubstr("HTTP/1.1 200"));
  EXPECT_THAT(answer, HasSubstr("\nexposer_scrapes_total "));
  EXPECT_THAT(answer, HasSubstr("\n# TYPE exposer_request_latencies summary\n"));
  // HEAD answers the headers alone; another method is refused with the ones allowed.
  answer = HttpRequest((*exporter)->port(), "HEAD /metrics HTTP/1.0\r\n\r\n");
  EXPECT_THAT(answer, HasSubstr("HTTP/1.1 200"));
  EXPECT_THAT(answer, Not(HasSubstr("exposer_scrapes_total")));
  answer = HttpRequest((*exporter)->port(), "POST /metrics HTTP/1.0\r\nContent-Length: 3\r\n\r\nabc");
  EXPECT_THAT(answer, HasSubstr(" 405 "));
  EXPECT_THAT(answer, HasSubstr("Allow: GET, HEAD"));
}

TEST(MetricsExporterTest, PortInUseIsOneClearError) {
  absl::StatusOr<std::unique_ptr<MetricsExporter>> first = MetricsExporter::Start(MetricsExporterOptions());
  ASSERT_TRUE(first.ok()) << first.status();
  MetricsExporterOptions o;
  o.port = (*first)->port();
  absl::StatusOr<std::unique_ptr<MetricsExporter>> second = MetricsExporter::Start(o);
  ASSERT_FALSE(second.ok());
  EXPECT_TRUE(absl::IsUnavailable(second.status()));
  EXPECT_THAT(
      std::string(second.status().message()),
      HasSubstr(absl::StrCat("--metrics_port=", o.port, ": cannot serve /metrics on 127.0.0.1:", o.port)));
  EXPECT_THAT(std::string(second.status().message()), HasSubstr("is the port in use by another process?"));
  o.port = 0;
  o.bind_address = "192.0.2.1";  // TEST-NET-1: an address this host does not have
  second = MetricsExporter::Start(o);
  ASSERT_FALSE(second.ok());
  EXPECT_THAT(std::string(second.status().message()), HasSubstr("does this host have that address?"));
}

TEST(MetricsExporterTest, StopsCleanlyWhileScraped) {
  for (int i = 0; i < 3; ++i) {
    absl::StatusOr<std::unique_ptr<MetricsExporter>> exporter =
        MetricsExporter::Start(MetricsExporterOptions());
    ASSERT_TRUE(exporter.ok()) << exporter.status();
    (*exporter)->Register(std::make_shared<CallbackCollectable>([] { return ProcessFamilies(); }));
    EXPECT_THAT(Get((*exporter)->port(), "/metrics"), HasSubstr("process_resident_memory_bytes"));
    exporter->reset();  // joins the request threads
  }
}

}  // namespace
}  // namespace dtrain::metrics
