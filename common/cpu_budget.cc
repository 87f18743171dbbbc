#include "common/cpu_budget.h"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <filesystem>
#include <fstream>
#include <optional>
#include <sstream>
#include <thread>
#include <utility>

#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "absl/strings/strip.h"
#include "common/openmp_wait.h"

namespace dtrain {
namespace {

constexpr int kMaxCpus = 1 << 16;  // a CPU list naming more is malformed
constexpr int kMaxThreads = 4096;

std::optional<std::string> ReadFile(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) return std::nullopt;
  std::ostringstream text;
  text << in.rdbuf();
  if (in.bad()) return std::nullopt;
  return text.str();
}

// The value of "Key:\tvalue" in a /proc/PID/status text.
std::optional<std::string> StatusField(absl::string_view status, absl::string_view key) {
  for (absl::string_view line : absl::StrSplit(status, '\n')) {
    if (absl::ConsumePrefix(&line, key) && absl::ConsumePrefix(&line, ":")) {
      return std::string(absl::StripAsciiWhitespace(line));
    }
  }
  return std::nullopt;
}

// "0-3,5,8-9" -> {0, 1, 2, 3, 5, 8, 9}; nullopt when malformed.
std::optional<std::vector<int>> ParseCpuList(absl::string_view text) {
  std::vector<int> cpus;
  text = absl::StripAsciiWhitespace(text);
  if (text.empty()) return std::nullopt;
  for (absl::string_view part : absl::StrSplit(text, ',')) {
    std::pair<absl::string_view, absl::string_view> range = absl::StrSplit(part, absl::MaxSplits('-', 1));
    int first = 0, last = 0;
    if (!absl::SimpleAtoi(range.first, &first) || first < 0) return std::nullopt;
    last = first;
    if (!range.second.empty() && (!absl::SimpleAtoi(range.second, &last) || last < first))
      return std::nullopt;
    if (last >= kMaxCpus || cpus.size() + (last - first + 1) > static_cast<size_t>(kMaxCpus))
      return std::nullopt;
    for (int c = first; c <= last; ++c) cpus.push_back(c);
  }
  std::sort(cpus.begin(), cpus.end());
  cpus.erase(std::unique(cpus.begin(), cpus.end()), cpus.end());
  return cpus;
}

bool Overlap(const std::vector<int>& a, const std::vector<int>& b) {
  size_t i = 0, j = 0;
  while (i < a.size() && j < b.size()) {
    if (a[i] == b[j]) return true;
    a[i] < b[j] ? ++i : ++j;
  }
  return false;
}

// A process's CPU cgroup, from /proc/PID/cgroup ("ID:CONTROLLERS:PATH" lines): the path in the v1 hierarchy
// that has the cpu controller, and the v2 path ("0::PATH").
struct CgroupPaths {
  std::optional<std::string> v1_cpu;
  std::optional<std::string> v2;
  // What tells two processes' CPU cgroups apart ("" when neither is known).
  std::string Key() const {
    if (v1_cpu) return "v1:" + *v1_cpu;
    if (v2) return "v2:" + *v2;
    return "";
  }
};

CgroupPaths ParseCgroups(absl::string_view text) {
  CgroupPaths p;
  for (absl::string_view line : absl::StrSplit(text, '\n', absl::SkipEmpty())) {
    std::vector<absl::string_view> f = absl::StrSplit(line, absl::MaxSplits(':', 2));
    if (f.size() != 3) continue;
    if (f[0] == "0" && f[1].empty()) {
      p.v2 = std::string(f[2]);
      continue;
    }
    for (absl::string_view c : absl::StrSplit(f[1], ',')) {
      if (c == "cpu") p.v1_cpu = std::string(f[2]);
    }
  }
  return p;
}

// mountinfo escapes blanks and backslashes in paths as \ooo.
std::string Unescape(absl::string_view s) {
  auto octal = [](char c) { return c >= '0' && c <= '7'; };
  std::string out;
  for (size_t i = 0; i < s.size(); ++i) {
    if (s[i] == '\\' && i + 3 < s.size() && octal(s[i + 1]) && octal(s[i + 2]) && octal(s[i + 3])) {
      out.push_back(static_cast<char>((s[i + 1] - '0') * 64 + (s[i + 2] - '0') * 8 + (s[i + 3] - '0')));
      i += 3;
    } else {
      out.push_back(s[i]);
    }
  }
  return out;
}

// Where a cgroup hierarchy is mounted: the mount point and the cgroup path its root shows.
struct CgroupMount {
  std::string root = "/";
  std::string mount_point;
};

// From /proc/self/mountinfo: the v1 hierarchy with the cpu controller and the v2 hierarchy.
void FindCgroupMounts(absl::string_view mountinfo, std::optional<CgroupMount>* v1,
                      std::optional<CgroupMount>* v2) {
  for (absl::string_view line : absl::StrSplit(mountinfo, '\n', absl::SkipEmpty())) {
    std::vector<absl::string_view> f = absl::StrSplit(line, ' ', absl::SkipEmpty());
    auto dash = std::find(f.begin(), f.end(), "-");
    if (f.size() < 5 || dash == f.end() || f.end() - dash < 4) continue;
    const absl::string_view fstype = dash[1], super_options = dash[3];
    CgroupMount m{Unescape(f[3]), Unescape(f[4])};
    if (fstype == "cgroup2" && !v2->has_value()) *v2 = m;
    if (fstype == "cgroup" && !v1->has_value()) {
      for (absl::string_view o : absl::StrSplit(super_options, ',')) {
        if (o == "cpu") *v1 = m;
      }
    }
  }
}

// The directories from the process's cgroup up to the hierarchy's root (inclusive), under `root`.
std::vector<std::string> CgroupDirs(const std::string& root, const CgroupMount& mount, std::string path) {
  // Inside a cgroup namespace or a bind mount, the mount shows the hierarchy from mount.root down.
  if (mount.root != "/" && absl::StartsWith(path, mount.root)) path = path.substr(mount.root.size());
  std::vector<std::string> parts = absl::StrSplit(path, '/', absl::SkipEmpty());
  std::vector<std::string> dirs;
  for (size_t n = parts.size() + 1; n-- > 0;) {
    std::string dir = root + mount.mount_point;
    for (size_t i = 0; i < n; ++i) absl::StrAppend(&dir, "/", parts[i]);
    dirs.push_back(dir);
  }
  return dirs;
}

// One level's quota in cores (v1 files): nullopt for none; a note for a malformed file.
std::optional<double> V1Quota(const std::string& dir, std::vector<std::string>* notes) {
  const std::optional<std::string> quota = ReadFile(dir + "/cpu.cfs_quota_us");
  if (!quota) return std::nullopt;  // not a CPU cgroup directory: no limit here
  int64_t q = 0, p = 0;
  if (!absl::SimpleAtoi(absl::StripAsciiWhitespace(*quota), &q)) {
    notes->push_back(absl::StrCat(dir, "/cpu.cfs_quota_us is malformed ('",
                                  absl::StripAsciiWhitespace(*quota), "'): no quota assumed"));
    return std::nullopt;
  }
  if (q < 0) return std::nullopt;  // -1: unlimited
  const std::optional<std::string> period = ReadFile(dir + "/cpu.cfs_period_us");
  if (!period || !absl::SimpleAtoi(absl::StripAsciiWhitespace(*period), &p) || p <= 0 || q == 0) {
    notes->push_back(absl::StrCat(dir, "/cpu.cfs_period_us is missing or malformed beside a quota of ", q,
                                  " us: no quota assumed"));
    return std::nullopt;
  }
  return static_cast<double>(q) / static_cast<double>(p);
}

// v2: cpu.max holds "QUOTA PERIOD" or "max PERIOD".
std::optional<double> V2Quota(const std::string& dir, std::vector<std::string>* notes) {
  const std::optional<std::string> text = ReadFile(dir + "/cpu.max");
  if (!text) return std::nullopt;
  std::vector<absl::string_view> f =
      absl::StrSplit(absl::StripAsciiWhitespace(*text), ' ', absl::SkipEmpty());
  int64_t q = 0, p = 0;
  if (f.size() == 2 && f[0] == "max" && absl::SimpleAtoi(f[1], &p) && p > 0) return std::nullopt;
  if (f.size() != 2 || !absl::SimpleAtoi(f[0], &q) || !absl::SimpleAtoi(f[1], &p) || q <= 0 || p <= 0) {
    notes->push_back(absl::StrCat(dir, "/cpu.max is malformed ('", absl::StripAsciiWhitespace(*text),
                                  "'; expected \"QUOTA PERIOD\" or \"max PERIOD\"): no quota assumed"));
    return std::nullopt;
  }
  return static_cast<double>(q) / static_cast<double>(p);
}

// The smallest quota along the path from the process's cgroup up (a parent's quota bounds its children).
std::optional<double> CgroupQuota(const std::string& root, const CgroupPaths& self,
                                  std::vector<std::string>* notes) {
  std::optional<CgroupMount> v1, v2;
  if (std::optional<std::string> mountinfo = ReadFile(root + "/proc/self/mountinfo")) {
    FindCgroupMounts(*mountinfo, &v1, &v2);
  }
  // Without mountinfo (or a mount of its own), the usual places.
  if (!v1 && self.v1_cpu) {
    for (const char* dir : {"/sys/fs/cgroup/cpu,cpuacct", "/sys/fs/cgroup/cpu"}) {
      if (std::filesystem::is_directory(root + dir)) {
        v1 = CgroupMount{"/", dir};
        break;
      }
    }
  }
  if (!v2 && self.v2) v2 = CgroupMount{"/", "/sys/fs/cgroup"};
  std::optional<double> least;
  auto take = [&least](std::optional<double> q) {
    if (q && (!least || *q < *least)) least = q;
  };
  if (v1 && self.v1_cpu) {
    for (const std::string& dir : CgroupDirs(root, *v1, *self.v1_cpu)) take(V1Quota(dir, notes));
  }
  if (v2 && self.v2) {
    for (const std::string& dir : CgroupDirs(root, *v2, *self.v2)) take(V2Quota(dir, notes));
  }
  return least;
}

// Other running processes of `programs` whose affinity overlaps `cpus` and whose CPU cgroup is `cgroup_key`
// (any, when "").
int CountCompetitors(const CpuBudgetOptions& o, const std::string& self_pid, const std::vector<int>& cpus,
                     const std::string& cgroup_key) {
  std::error_code ec;
  std::filesystem::directory_iterator it(o.root + "/proc", ec);
  if (ec) return 0;
  int count = 0;
  for (const std::filesystem::directory_entry& entry : it) {
    const std::string pid = entry.path().filename().string();
    if (pid.empty() || pid == self_pid || !std::all_of(pid.begin(), pid.end(), absl::ascii_isdigit)) continue;
    const std::string dir = o.root + "/proc/" + pid;
    const std::optional<std::string> comm = ReadFile(dir + "/comm");
    if (!comm) continue;  // gone meanwhile
    const std::string name(absl::StripAsciiWhitespace(*comm));
    if (std::find(o.competing_programs.begin(), o.competing_programs.end(), name) ==
        o.competing_programs.end()) {
      continue;
    }
    const std::optional<std::string> status = ReadFile(dir + "/status");
    if (!status) continue;
    // Zombies, dead and stopped processes compute nothing.
    const std::optional<std::string> state = StatusField(*status, "State");
    if (!state || state->empty() || std::string("ZXTt").find((*state)[0]) != std::string::npos) continue;
    if (std::optional<std::string> list = StatusField(*status, "Cpus_allowed_list")) {
      std::optional<std::vector<int>> theirs = ParseCpuList(*list);
      if (theirs && !Overlap(*theirs, cpus)) continue;
    }
    if (!cgroup_key.empty()) {
      const std::optional<std::string> cgroup = ReadFile(dir + "/cgroup");
      if (cgroup && ParseCgroups(*cgroup).Key() != cgroup_key) continue;
    }
    ++count;
  }
  return count;
}

std::string Plural(int n, absl::string_view one, absl::string_view many) {
  return absl::StrCat(n, " ", n == 1 ? one : many);
}

}  // namespace

std::string CpuBudget::Reasons() const {
  std::string s = absl::StrCat(Plural(affinity_cpus, "CPU", "CPUs"), " in the affinity mask, ");
  if (quota_cores > 0) {
    absl::StrAppendFormat(&s, "cgroup quota %g core%s, ", quota_cores, quota_cores > 1 ? "s" : "");
  } else {
    absl::StrAppend(&s, "no cgroup CPU quota, ");
  }
  if (other_processes == 0) {
    absl::StrAppend(&s, "no other dtrain process on these CPUs");
  } else {
    absl::StrAppend(&s, Plural(other_processes, "other dtrain process", "other dtrain processes"),
                    " on these CPUs");
  }
  for (const std::string& note : notes) absl::StrAppend(&s, "; ", note);
  return s;
}

CpuBudget MeasureCpuBudget(const CpuBudgetOptions& o) {
  CpuBudget b;
  // The affinity mask.
  const std::optional<std::string> status = ReadFile(o.root + "/proc/self/status");
  std::optional<std::vector<int>> cpus;
  std::string self_pid;
  if (status) {
    if (std::optional<std::string> list = StatusField(*status, "Cpus_allowed_list"))
      cpus = ParseCpuList(*list);
    if (std::optional<std::string> pid = StatusField(*status, "Pid")) self_pid = *pid;
  }
  if (!cpus || cpus->empty()) {
    int fallback =
        o.fallback_cpus > 0 ? o.fallback_cpus : static_cast<int>(std::thread::hardware_concurrency());
    fallback = std::max(fallback, 1);
    b.notes.push_back(absl::StrCat(o.root, "/proc/self/status has no readable Cpus_allowed_list: ", fallback,
                                   " CPU", fallback == 1 ? "" : "s", " assumed"));
    cpus = std::vector<int>();
    for (int c = 0; c < fallback; ++c) cpus->push_back(c);
  }
  b.affinity_cpus = static_cast<int>(cpus->size());

  // The cgroup's quota, rounded to the nearest whole core. All threads of a cgroup are throttled together
  // once the quota is spent, so a thread beyond the whole cores does not stall its team the way a preempted
  // one does: with half a core or more for it, it adds more work per period than its share of the throttled
  // pauses takes away; with less it mostly adds pauses. Measured (dtrain_bench cnn, 2-core machine, period
  // 100 ms): a quota of 1.5 cores ran 730-1,353 examples/sec with 2 threads against 822-890 with 1; 1.25
  // cores 718-852 with 2 against 871-956 with 1. Never fewer than one thread.
  const std::optional<std::string> cgroup_text = ReadFile(o.root + "/proc/self/cgroup");
  const CgroupPaths self = cgroup_text ? ParseCgroups(*cgroup_text) : CgroupPaths();
  if (!cgroup_text)
    b.notes.push_back(absl::StrCat(o.root, "/proc/self/cgroup is unreadable: no quota assumed"));
  int limit = b.affinity_cpus;
  if (std::optional<double> quota = CgroupQuota(o.root, self, &b.notes)) {
    b.quota_cores = *quota;
    limit = std::min(limit, std::max(1, static_cast<int>(std::floor(*quota + 0.5))));
  }

  // The other dtrain processes sharing these CPUs (and this cgroup): each gets at least its share.
  b.other_processes = std::max(CountCompetitors(o, self_pid, *cpus, self.Key()), std::max(o.known_peers, 0));
  b.threads = std::clamp(limit / (1 + b.other_processes), 1, kMaxThreads);
  return b;
}

absl::StatusOr<int> ParseThreadCount(absl::string_view text) {
  if (text == "auto") return 0;
  int n = 0;
  if (!absl::SimpleAtoi(text, &n) || n < 1 || n > kMaxThreads) {
    return absl::InvalidArgumentError(
        absl::StrCat("--threads=", text, ": expected auto or a whole number from 1 to ", kMaxThreads));
  }
  return n;
}

ThreadDecision DecideThreads(int requested, const CpuBudget& budget) {
  ThreadDecision d;
  const std::string waits = OpenMpWaitSetting();
  if (requested <= 0) {
    d.threads = budget.threads;
    d.line = absl::StrCat("threads: ", d.threads, " (--threads=auto: ", budget.Reasons(),
                          "; OpenMP waits: ", waits, ")");
    return d;
  }
  d.threads = requested;
  d.exceeds_budget = requested > budget.threads;
  d.line =
      d.exceeds_budget
          ? absl::StrCat("threads: ", requested, " (--threads=", requested, ", more than the ",
                         budget.threads, " of --threads=auto: ", budget.Reasons(),
                         "; the threads will contend for the CPUs; OpenMP waits: ", waits, ")")
          : absl::StrCat("threads: ", requested, " (--threads=", requested, "; OpenMP waits: ", waits, ")");
  return d;
}

}  // namespace dtrain
