#include "common/command_line.h"

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <map>
#include <optional>
#include <sstream>
#include <utility>

#include "absl/flags/commandlineflag.h"
#include "absl/flags/reflection.h"
#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "common/exit_codes.h"

namespace dtrain {
namespace {

constexpr int kMaxFlagfileDepth = 8;

// Abseil's own flags (--flagfile, --helpfull, ...) are defined in its sources.
bool IsAbseilFlag(const absl::CommandLineFlag& f) {
  const std::string file = f.Filename();
  return absl::StrContains(file, "absl/") || absl::StartsWith(file, "absl");
}

bool IsBool(const absl::CommandLineFlag& f) { return f.IsOfType<bool>(); }

std::string TypeOf(const absl::CommandLineFlag& f) {
  if (f.IsOfType<bool>()) return "bool";
  if (f.IsOfType<int>() || f.IsOfType<int64_t>() || f.IsOfType<uint64_t>() || f.IsOfType<uint32_t>() ||
      f.IsOfType<int16_t>()) {
    return "int";
  }
  if (f.IsOfType<double>() || f.IsOfType<float>()) return "number";
  if (f.IsOfType<std::string>()) return "string";
  if (f.IsOfType<std::vector<std::string>>()) return "list";
  return "value";
}

// The flag of this binary named `name`, or null (Abseil's own flags count only with `abseil`).
absl::CommandLineFlag* Find(absl::string_view name, bool abseil) {
  absl::CommandLineFlag* f = absl::FindCommandLineFlag(name);
  if (f == nullptr || f->IsRetired()) return nullptr;
  if (!abseil && IsAbseilFlag(*f)) return nullptr;
  return f;
}

int EditDistance(absl::string_view a, absl::string_view b) {
  std::vector<int> row(b.size() + 1);
  for (size_t j = 0; j <= b.size(); ++j) row[j] = static_cast<int>(j);
  for (size_t i = 1; i <= a.size(); ++i) {
    int diagonal = row[0];
    row[0] = static_cast<int>(i);
    for (size_t j = 1; j <= b.size(); ++j) {
      const int up = row[j];
      row[j] = std::min({row[j] + 1, row[j - 1] + 1, diagonal + (a[i - 1] == b[j - 1] ? 0 : 1)});
      diagonal = up;
    }
  }
  return row[b.size()];
}

// One argument and where it came from ("" = the command line, else the flagfile's path).
struct Arg {
  std::string text;
  std::string source;
};

absl::Status ReadFlagfile(const std::string& path, int depth, std::vector<Arg>* out) {
  if (depth > kMaxFlagfileDepth) {
    return absl::InvalidArgumentError(absl::StrCat("--flagfile=", path, ": flagfiles nested more than ",
                                                   kMaxFlagfileDepth, " deep (does one name itself?)"));
  }
  std::ifstream in(path);
  if (!in) return absl::InvalidArgumentError(absl::StrCat("--flagfile=", path, ": cannot read the file"));
  std::string line;
  int number = 0;
  while (std::getline(in, line)) {
    ++number;
    const absl::string_view text = absl::StripAsciiWhitespace(line);
    if (text.empty() || text[0] == '#') continue;
    if (text[0] != '-') {
      return absl::InvalidArgumentError(absl::StrCat("--flagfile=", path, " line ", number, ": '", text,
                                                     "' is not a flag (one --name=value a line)"));
    }
    out->push_back({std::string(text), path});
  }
  return absl::OkStatus();
}

std::string Where(const Arg& a) {
  return a.source.empty() ? "" : absl::StrCat(" (in --flagfile=", a.source, ")");
}

// Word-wraps `text` at `width` columns, each line indented by `indent`.
std::string Wrap(absl::string_view text, int indent, int width) {
  std::string out, line;
  const std::string pad(indent, ' ');
  for (absl::string_view word : absl::StrSplit(text, ' ', absl::SkipEmpty())) {
    if (!line.empty() && static_cast<int>(line.size() + 1 + word.size()) + indent > width) {
      absl::StrAppend(&out, pad, line, "\n");
      line.clear();
    }
    absl::StrAppend(&line, line.empty() ? "" : " ", word);
  }
  if (!line.empty()) absl::StrAppend(&out, pad, line, "\n");
  return out;
}

// ---- groups -----------------------------------------------------------------------------------------------

struct GroupRule {
  const char* group;
  bool (*matches)(absl::string_view name, absl::string_view file);
};

bool HasAny(absl::string_view s, std::initializer_list<absl::string_view> parts) {
  for (absl::string_view p : parts) {
    if (absl::StrContains(s, p)) return true;
  }
  return false;
}
bool StartsAny(absl::string_view s, std::initializer_list<absl::string_view> prefixes) {
  for (absl::string_view p : prefixes) {
    if (absl::StartsWith(s, p)) return true;
  }
  return false;
}
bool IsAny(absl::string_view s, std::initializer_list<absl::string_view> names) {
  for (absl::string_view n : names) {
    if (s == n) return true;
  }
  return false;
}

// First match wins: the order settles names that fit several (checkpoint_dir is about checkpoints, not data).
const GroupRule kGroupRules[] = {
    {"Security",
     [](absl::string_view n, absl::string_view) {
       return StartsAny(n, {"auth_", "tls_"});
     }},
    {"Checkpoints",
     [](absl::string_view n, absl::string_view) {
       return HasAny(n, {"checkpoint"}) || IsAny(n, {"journal_applied", "push_journal_dir"});
     }},
    {"Optimizer and schedule",
     [](absl::string_view n, absl::string_view f) {
       return IsAny(n, {"optimizer", "learning_rate", "momentum", "beta1", "beta2", "epsilon", "rho", "centered",
                        "nesterov", "initial_accumulator", "weight_decay", "clip_norm", "lr_schedule",
                        "min_learning_rate", "staircase", "sparse_optimizer", "sparse_learning_rate"}) ||
              StartsAny(n, {"decay_", "adam_", "ftrl_", "adagrad_"}) ||
              (StartsAny(n, {"warmup"}) && !HasAny(f, {"bench"}));  // a benchmark's warm-up is before timing
     }},
    {"Online and deltas",
     [](absl::string_view n, absl::string_view) {
       return StartsAny(n, {"follow", "delta_", "row_ttl", "admit_"}) || IsAny(n, {"bad_records"});
     }},
    {"Cluster",
     [](absl::string_view n, absl::string_view) {
       return IsAny(n, {"job_name", "task_index", "cluster_spec", "listen_address", "num_ps", "ps_binary",
                        "allow_degraded", "max_run_secs", "join", "max_workers", "apply_early", "tcp_port",
                        "shm_spin_us", "rpc_retry_secs", "max_push_rows", "max_pull_rows"}) ||
              absl::EndsWith(n, "_hosts") ||
              StartsAny(n, {"transport", "channel", "wire_", "max_inflight", "stop_", "chief_grace"}) ||
              HasAny(n, {"timeout", "wait_secs", "channels"});
     }},
    {"Model",
     [](absl::string_view n, absl::string_view) {
       return IsAny(n, {"model", "table_rows", "max_rows", "dim", "embedding_dim", "sparse_rows",
                        "dense_floats"}) ||
              StartsAny(n, {"dlrm_", "embedding", "sparse_", "bn_", "max_model", "row_"});
     }},
    {"Data",
     [](absl::string_view n, absl::string_view f) {
       return StartsAny(n, {"data_", "input_", "synthetic", "num_dense", "num_sparse", "vocab", "zipf",
                            "test_examples", "examples", "output_dir", "format"}) ||
              IsAny(n, {"shuffle"}) || absl::EndsWith(f, "data_flags.cc") ||
              absl::EndsWith(f, "input_flags.cc");
     }},
    {"Output",  // before Training: --trace_steps names steps to record, not steps to train
     [](absl::string_view n, absl::string_view) { return StartsAny(n, {"trace_"}); }},
    {"Training",
     [](absl::string_view n, absl::string_view) {
       return IsAny(n, {"mode", "seed", "batch_size", "nonfinite", "ids_per_step", "elastic_batch",
                        "global_batch"}) ||
              StartsAny(n, {"train_", "replicas_", "total_num_", "max_staleness", "moving_average", "steps",
                            "window", "warmup"}) ||
              absl::EndsWith(n, "_steps");
     }},
    {"Compute",
     [](absl::string_view n, absl::string_view) {
       return StartsAny(n, {"tower", "num_gpus", "threads", "cuda", "device", "malloc_", "gpu", "compute_"});
     }},
    {"Output",
     [](absl::string_view n, absl::string_view) {
       return StartsAny(n, {"log", "eval_", "summary_", "metrics_", "export", "out", "bytes", "hold_",
                            "skip_", "use_"}) ||
              absl::EndsWith(n, "_out") || absl::EndsWith(n, "_every");
     }},
};

const char* const kGroupOrder[] = {"Cluster",     "Model",  "Data",     "Training", "Optimizer and schedule",
                                   "Online and deltas", "Compute", "Checkpoints", "Output", "Security",
                                   "Other",   "Abseil"};

}  // namespace

std::string FlagGroupOf(absl::string_view name, absl::string_view file) {
  for (const GroupRule& r : kGroupRules) {
    if (r.matches(name, file)) return r.group;
  }
  return "Other";
}

std::vector<std::string> ClosestFlags(absl::string_view name, const std::vector<std::string>& known, int max) {
  // By edit distance; one name containing the other (a prefix left out, a word added) comes after every close
  // spelling, and only when the shorter is at least half the longer ("out" in "output_dri" is no match).
  std::vector<std::pair<int, std::string>> scored;
  const int limit = std::max<int>(2, static_cast<int>(name.size()) / 4);
  for (const std::string& k : known) {
    const int d = EditDistance(name, k);
    const size_t shorter = std::min(name.size(), k.size()), longer = std::max(name.size(), k.size());
    const bool contains =
        shorter >= 3 && 2 * shorter >= longer && (absl::StrContains(k, name) || absl::StrContains(name, k));
    if (d <= limit) {
      scored.push_back({d, k});
    } else if (contains) {
      scored.push_back({limit + 1, k});
    }
  }
  std::sort(scored.begin(), scored.end());
  std::vector<std::string> out;
  for (size_t i = 0; i < scored.size() && static_cast<int>(i) < max; ++i) out.push_back(scored[i].second);
  return out;
}

std::vector<std::string> OwnFlagNames() {
  std::vector<std::string> names;
  for (const auto& [name, flag] : absl::GetAllFlags()) {
    if (!flag->IsRetired() && !IsAbseilFlag(*flag)) names.emplace_back(name);
  }
  std::sort(names.begin(), names.end());
  return names;
}

absl::StatusOr<ParsedCommandLine> ParseCommandLineArgs(const std::vector<std::string>& args,
                                                       const CommandLineSpec& spec) {
  ParsedCommandLine parsed;
  std::set<std::string> undefok;
  std::set<std::string> peer(spec.peer_flags.begin(), spec.peer_flags.end());
  // A work list, flagfiles expanded in place.
  std::vector<Arg> todo;
  for (size_t i = args.size(); i > 1; --i) todo.push_back({args[i - 1], ""});
  std::map<std::string, int> depth;  // flagfile path -> nesting depth it was read at
  bool only_positional = false;
  auto unknown = [&](const std::string& name, const Arg& a) -> absl::Status {
    if (peer.count(name) > 0) {
      if (!a.source.empty()) {
        if (std::find(parsed.ignored.begin(), parsed.ignored.end(), name) == parsed.ignored.end()) {
          parsed.ignored.push_back(name);
        }
        return absl::OkStatus();
      }
      return absl::InvalidArgumentError(
          absl::StrCat("--", name, " is a flag of ", spec.peer_program, ", not of ", spec.program,
                       " (in a --flagfile the processes share, ", spec.program, " ignores it)"));
    }
    if (undefok.count(name) > 0) return absl::OkStatus();
    std::string message = absl::StrCat("unknown flag --", name, Where(a));
    const std::vector<std::string> close = ClosestFlags(name, OwnFlagNames());
    const std::vector<std::string> close_peer =
        close.empty() ? ClosestFlags(name, spec.peer_flags) : std::vector<std::string>();
    if (!close.empty()) {
      absl::StrAppend(&message, "; did you mean --", absl::StrJoin(close, ", --"), "?");
    } else if (!close_peer.empty()) {  // a misspelt flag of the other binary (a shared flagfile, or a mix-up)
      absl::StrAppend(&message, "; did you mean --", absl::StrJoin(close_peer, ", --"), "? (",
                      close_peer.size() == 1 ? "a flag" : "flags", " of ", spec.peer_program, ", not of ",
                      spec.program, ")");
    } else {
      absl::StrAppend(&message, "; ", spec.program, " --help lists its flags");
    }
    return absl::InvalidArgumentError(message);
  };
  while (!todo.empty()) {
    Arg a = std::move(todo.back());
    todo.pop_back();
    if (only_positional || a.text.empty() || a.text[0] != '-' || a.text == "-") {
      parsed.positional.push_back(a.text);
      continue;
    }
    if (a.text == "--") {
      only_positional = true;
      continue;
    }
    absl::string_view body = a.text;
    body.remove_prefix(absl::StartsWith(body, "--") ? 2 : 1);
    const size_t eq = body.find('=');
    const std::string name(body.substr(0, eq));
    std::optional<std::string> value;
    if (eq != absl::string_view::npos) value = std::string(body.substr(eq + 1));
    // A flag's value may be the next argument ("--model mlp"), from the same source.
    auto next_value = [&]() -> absl::StatusOr<std::string> {
      if (value) return *value;
      if (todo.empty() || todo.back().source != a.source || todo.back().text == "--") {
        return absl::InvalidArgumentError(absl::StrCat("--", name, " needs a value", Where(a)));
      }
      std::string v = todo.back().text;
      todo.pop_back();
      return v;
    };
    if (name == "help" || name == "h" || name == "helpshort" || name == "?" || name == "helpfull") {
      if (value && (*value == "false" || *value == "0")) continue;
      (name == "helpfull" ? parsed.helpfull : parsed.help) = true;
      continue;
    }
    if (name == "flagfile") {
      absl::StatusOr<std::string> files = next_value();
      if (!files.ok()) return files.status();
      std::vector<Arg> lines;
      const int d = a.source.empty() ? 1 : depth[a.source] + 1;
      for (absl::string_view path : absl::StrSplit(*files, ',', absl::SkipEmpty())) {
        const std::string p(path);
        if (absl::Status s = ReadFlagfile(p, d, &lines); !s.ok()) return s;
        depth[p] = d;
      }
      for (size_t i = lines.size(); i > 0; --i) todo.push_back(std::move(lines[i - 1]));
      parsed.specified.insert("flagfile");
      continue;
    }
    if (name == "undefok") {
      absl::StatusOr<std::string> names = next_value();
      if (!names.ok()) return names.status();
      for (absl::string_view n : absl::StrSplit(*names, ',', absl::SkipEmpty()))
        undefok.insert(std::string(n));
      continue;
    }
    absl::CommandLineFlag* flag = Find(name, /*abseil=*/false);
    std::string flag_name = name;
    if (flag == nullptr && absl::StartsWith(name, "no") && !value) {
      absl::CommandLineFlag* negated = Find(name.substr(2), false);
      if (negated != nullptr && IsBool(*negated)) {
        flag = negated;
        flag_name = name.substr(2);
        value = "false";
      }
    }
    if (flag == nullptr) {
      if (absl::Status s = unknown(name, a); !s.ok()) return s;
      // An ignored peer flag's separate value ("--mode sync") goes with it.
      if (!value && !todo.empty() && todo.back().source == a.source && !todo.back().text.empty() &&
          todo.back().text[0] != '-') {
        todo.pop_back();
      }
      continue;
    }
    std::string v;
    if (IsBool(*flag) && !value) {
      v = "true";
    } else {
      absl::StatusOr<std::string> given = next_value();
      if (!given.ok()) return given.status();
      v = *given;
    }
    std::string error;
    if (!flag->ParseFrom(v, &error)) {
      return absl::InvalidArgumentError(absl::StrCat("--", flag_name, "=", v, Where(a), ": ", error));
    }
    parsed.specified.insert(flag_name);
  }
  if (!spec.positional_args && !parsed.positional.empty()) {
    return absl::InvalidArgumentError(absl::StrCat("unexpected argument '", parsed.positional[0], "' (",
                                                   spec.program, " takes only --flags; --help lists them)"));
  }
  if (!parsed.ignored.empty()) {
    parsed.note = absl::StrCat("ignoring ", parsed.ignored.size(), " flag",
                               parsed.ignored.size() > 1 ? "s" : "", " of ", spec.peer_program,
                               " from the shared --flagfile: --", absl::StrJoin(parsed.ignored, ", --"));
  }
  return parsed;
}

std::string FormatHelp(const CommandLineSpec& spec, bool all) {
  std::map<std::string, std::vector<absl::CommandLineFlag*>> groups;
  for (const auto& [name, flag] : absl::GetAllFlags()) {
    if (flag->IsRetired()) continue;
    const bool abseil = IsAbseilFlag(*flag);
    if (abseil && !all) continue;
    groups[abseil ? "Abseil" : FlagGroupOf(name, flag->Filename())].push_back(flag);
  }
  std::string out =
      absl::StrCat(spec.program, ": ", spec.summary, "\n\nUsage: ", spec.program,
                   " --flag=value ...   (--flagfile=FILE reads flags from a file, one a line)\n");
  for (const char* group : kGroupOrder) {
    auto it = groups.find(group);
    if (it == groups.end()) continue;
    std::vector<absl::CommandLineFlag*>& flags = it->second;
    std::sort(flags.begin(), flags.end(), [](const absl::CommandLineFlag* a, const absl::CommandLineFlag* b) {
      return a->Name() < b->Name();
    });
    absl::StrAppend(&out, "\n", group, ":\n");
    for (const absl::CommandLineFlag* f : flags) {
      const std::string type = TypeOf(*f);
      std::string def = f->DefaultValue();
      if (type == "string" || type == "list") def = absl::StrCat("\"", def, "\"");
      // A number with six significant digits, as written by hand (1/3: 0.333333, not 0.33333333333333331).
      if (double d = 0; type == "number" && absl::SimpleAtod(def, &d)) def = absl::StrCat(d);
      absl::StrAppend(&out, "  --", f->Name(), " (", type, ", default ", def, ")\n", Wrap(f->Help(), 6, 110));
    }
  }
  if (!spec.epilogue.empty())
    absl::StrAppend(&out, "\n", spec.epilogue, spec.epilogue.back() == '\n' ? "" : "\n");
  return out;
}

ParsedCommandLine ParseCommandLineOrExit(int argc, char** argv, const CommandLineSpec& spec) {
  std::vector<std::string> args(argv, argv + argc);
  absl::StatusOr<ParsedCommandLine> parsed = ParseCommandLineArgs(args, spec);
  if (!parsed.ok()) {
    std::fprintf(stderr, "%s: %s\n", spec.program.c_str(), std::string(parsed.status().message()).c_str());
    std::exit(kExitConfigRefused);
  }
  if (parsed->help || parsed->helpfull) {
    std::fputs(FormatHelp(spec, parsed->helpfull).c_str(), stdout);
    std::fflush(stdout);
    std::exit(kExitComplete);
  }
  if (!parsed->note.empty()) std::fprintf(stderr, "%s: %s\n", spec.program.c_str(), parsed->note.c_str());
  return *std::move(parsed);
}

std::vector<std::string> FlagValues(const std::vector<std::string>& files,
                                    const std::vector<std::string>& names) {
  std::vector<std::string> lines;
  for (const auto& [name, flag] : absl::GetAllFlags()) {
    if (flag->IsRetired() || IsAbseilFlag(*flag)) continue;
    bool wanted = std::find(names.begin(), names.end(), std::string(name)) != names.end();
    for (const std::string& f : files) wanted = wanted || absl::EndsWith(flag->Filename(), f);
    if (wanted) lines.push_back(absl::StrCat(name, "=", flag->CurrentValue()));
  }
  std::sort(lines.begin(), lines.end());
  return lines;
}

absl::Status SetFlagValues(const std::vector<std::string>& lines, const std::set<std::string>& keep) {
  for (const std::string& line : lines) {
    const size_t eq = line.find('=');
    if (eq == std::string::npos)
      return absl::InvalidArgumentError(absl::StrCat("'", line, "' is not name=value"));
    const std::string name = line.substr(0, eq);
    if (keep.count(name) > 0) continue;
    absl::CommandLineFlag* flag = Find(name, false);
    if (flag == nullptr) continue;  // another binary's (a newer worker's): not this one's business
    std::string error;
    if (!flag->ParseFrom(line.substr(eq + 1), &error)) {
      return absl::InvalidArgumentError(absl::StrCat("--", line, ": ", error));
    }
  }
  return absl::OkStatus();
}

}  // namespace dtrain
