#include "common/metrics/scrape_families.h"

#include <dirent.h>
#include <malloc.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include <cstdio>
#include <cstring>
#include <fstream>
#include <sstream>

#include "absl/base/config.h"

namespace dtrain::metrics {

prometheus::MetricFamily Family(std::string name, std::string help, prometheus::MetricType type) {
  prometheus::MetricFamily f;
  f.name = std::move(name);
  f.help = std::move(help);
  f.type = type;
  return f;
}

prometheus::MetricFamily& AddFamily(std::vector<prometheus::MetricFamily>* out, std::string name,
                                    std::string help, prometheus::MetricType type) {
  out->push_back(Family(std::move(name), std::move(help), type));
  return out->back();
}

void AddSample(prometheus::MetricFamily* family, const LabelPairs& labels, double value) {
  prometheus::ClientMetric m;
  for (const auto& [name, v] : labels) m.label.push_back({name, v});
  switch (family->type) {
    case prometheus::MetricType::Counter:
      m.counter.value = value;
      break;
    case prometheus::MetricType::Gauge:
      m.gauge.value = value;
      break;
    default:
      m.untyped.value = value;
      break;
  }
  family->metric.push_back(std::move(m));
}

namespace {

// Fields of /proc/self/stat after the command (which may hold spaces and parentheses: read past the last
// ')').
bool ReadProcStat(std::vector<std::string>* fields) {
  std::ifstream in("/proc/self/stat");
  std::string line;
  if (!std::getline(in, line)) return false;
  const size_t close = line.rfind(')');
  if (close == std::string::npos) return false;
  std::istringstream rest(line.substr(close + 1));
  fields->clear();
  for (std::string f; rest >> f;) fields->push_back(f);
  return fields->size() > 20;
}

int CountOpenFds() {
  DIR* d = opendir("/proc/self/fd");
  if (d == nullptr) return -1;
  int n = 0;
  while (dirent* e = readdir(d)) {
    if (e->d_name[0] != '.') ++n;
  }
  closedir(d);
  return n - 1;  // the descriptor opendir holds
}

double BootTimeSeconds() {
  std::ifstream in("/proc/stat");
  std::string key;
  double value = 0;
  while (in >> key) {
    if (key == "btime" && (in >> value)) return value;
    in.ignore(1 << 20, '\n');
  }
  return -1;
}

}  // namespace

// glibc's mallinfo2 (2.33 on); under AddressSanitizer malloc is not glibc's: no such figures.
#if defined(__GLIBC__) && (__GLIBC__ > 2 || (__GLIBC__ == 2 && __GLIBC_MINOR__ >= 33)) && \
    !defined(ABSL_HAVE_ADDRESS_SANITIZER)
#define DTRAIN_HEAP_FIGURES 1
#else
#define DTRAIN_HEAP_FIGURES 0
#endif

bool HeapFiguresAvailable() { return DTRAIN_HEAP_FIGURES != 0; }

std::vector<prometheus::MetricFamily> ProcessFamilies() {
  std::vector<prometheus::MetricFamily> out;
  const long page = sysconf(_SC_PAGESIZE);
  const long ticks = sysconf(_SC_CLK_TCK);
  std::vector<std::string> f;
  if (ReadProcStat(&f)) {
    // After the command: [0] state, [11] utime, [12] stime, [17] num_threads, [19] starttime, [20] vsize,
    // [21] rss (proc(5)'s fields 3.. shifted by 3).
    const double utime = std::strtod(f[11].c_str(), nullptr), stime = std::strtod(f[12].c_str(), nullptr);
    AddSample(&AddFamily(&out, "process_cpu_seconds_total", "User and system CPU time spent in seconds.",
                         prometheus::MetricType::Counter),
              {}, (utime + stime) / static_cast<double>(ticks));
    AddSample(&AddFamily(&out, "process_threads", "Number of OS threads in the process.",
                         prometheus::MetricType::Gauge),
              {}, std::strtod(f[17].c_str(), nullptr));
    AddSample(&AddFamily(&out, "process_virtual_memory_bytes", "Virtual memory size in bytes.",
                         prometheus::MetricType::Gauge),
              {}, std::strtod(f[20].c_str(), nullptr));
    AddSample(&AddFamily(&out, "process_resident_memory_bytes", "Resident memory size in bytes.",
                         prometheus::MetricType::Gauge),
              {}, std::strtod(f[21].c_str(), nullptr) * static_cast<double>(page));
    const double boot = BootTimeSeconds();
    if (boot >= 0) {
      AddSample(
          &AddFamily(&out, "process_start_time_seconds",
                     "Start time of the process since unix epoch in seconds.", prometheus::MetricType::Gauge),
          {}, boot + std::strtod(f[19].c_str(), nullptr) / static_cast<double>(ticks));
    }
  }
#if DTRAIN_HEAP_FIGURES
  {
    // glibc's heap: what the program holds (in use) and what the allocator holds from the system (held: what is
    // in use plus free chunks it keeps). A rise of the first is memory kept by the program; of the second alone,
    // fragmentation. mallinfo2 walks the free lists of every arena (a scrape's cost, not the hot path's).
    const struct mallinfo2 mi = mallinfo2();
    prometheus::MetricFamily& heap =
        AddFamily(&out, "dtrain_heap_bytes",
                  "glibc's malloc heap: bytes in use by the process, and held by the allocator (in use + free)",
                  prometheus::MetricType::Gauge);
    AddSample(&heap, {{"state", "in_use"}}, static_cast<double>(mi.uordblks + mi.hblkhd));
    AddSample(&heap, {{"state", "held"}}, static_cast<double>(mi.arena + mi.hblkhd));
  }
#endif
  const int fds = CountOpenFds();
  if (fds >= 0) {
    AddSample(&AddFamily(&out, "process_open_fds", "Number of open file descriptors.",
                         prometheus::MetricType::Gauge),
              {}, fds);
  }
  return out;
}

double NewestFileAgeSeconds(const std::string& dir,
                            const std::function<bool(const std::string& name)>& match) {
  if (dir.empty()) return -1;
  DIR* d = opendir(dir.c_str());
  if (d == nullptr) return -1;
  timespec newest{0, 0};
  bool found = false;
  while (dirent* e = readdir(d)) {
    const std::string name = e->d_name;
    if (name == "." || name == ".." || !match(name)) continue;
    struct stat st;
    if (fstatat(dirfd(d), e->d_name, &st, 0) != 0 || !S_ISREG(st.st_mode)) continue;
    if (!found || st.st_mtim.tv_sec > newest.tv_sec ||
        (st.st_mtim.tv_sec == newest.tv_sec && st.st_mtim.tv_nsec > newest.tv_nsec)) {
      newest = st.st_mtim;
      found = true;
    }
  }
  closedir(d);
  if (!found) return -1;
  timespec now;
  clock_gettime(CLOCK_REALTIME, &now);
  const double age = static_cast<double>(now.tv_sec - newest.tv_sec) +
                     1e-9 * static_cast<double>(now.tv_nsec - newest.tv_nsec);
  return age < 0 ? 0 : age;
}

}  // namespace dtrain::metrics
