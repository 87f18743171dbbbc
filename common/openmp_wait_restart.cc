// The restart of common/openmp_wait.h, from the executable's .preinit_array. Linked into a binary as an
// object (the dtrain_short_openmp_spin object library), never from an archive: nothing refers to it by name.
#include <alloca.h>
#include <string.h>
#include <unistd.h>

#include "common/openmp_wait.h"

namespace dtrain {
namespace {

// Runs before the constructors of every shared library (libgomp's reads its environment) and before libc has
// set up its own view of the environment (so no getenv/setenv, no malloc): it looks at the environment it is
// given and, when neither GOMP_SPINCOUNT nor OMP_WAIT_POLICY is there, executes this program again with the
// same arguments and the environment plus GOMP_SPINCOUNT and the marker. If that fails, the program runs on.
void RestartWithShortOpenMpSpin(int /*argc*/, char** argv, char** envp) {
  if (argv == nullptr || envp == nullptr) return;
  size_t n = 0;
  for (char** e = envp; *e != nullptr; ++e, ++n) {
    if (strncmp(*e, "GOMP_SPINCOUNT=", 15) == 0 || strncmp(*e, "OMP_WAIT_POLICY=", 16) == 0) return;
  }
  // kGompSpinCount and kGompSpinCountSetByDtrain (cpu_budget_test checks what the restarted program sees).
  static char spin[] = "GOMP_SPINCOUNT=1000";
  static char marker[] = "DTRAIN_GOMP_SPINCOUNT_SET=1";
  char** env = static_cast<char**>(alloca((n + 3) * sizeof(char*)));
  memcpy(env, envp, n * sizeof(char*));
  env[n] = spin;
  env[n + 1] = marker;
  env[n + 2] = nullptr;
  execve("/proc/self/exe", argv, env);
}

__attribute__((section(".preinit_array"), used)) void (*const kRestart)(int, char**,
                                                                        char**) = RestartWithShortOpenMpSpin;

}  // namespace
}  // namespace dtrain
