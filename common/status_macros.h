// Two tiny macros Debian's Abseil (20220623) lacks. Use them at every fallible boundary.
//
//   absl::Status Load(...) {
//     RETURN_IF_ERROR(OpenFile(path));
//     ASSIGN_OR_RETURN(Header h, ReadHeader(file));
//     ...
//   }
#ifndef DTRAIN_COMMON_STATUS_MACROS_H_
#define DTRAIN_COMMON_STATUS_MACROS_H_

#include "absl/status/status.h"
#include "absl/status/statusor.h"

#define DTRAIN_CONCAT_INNER_(a, b) a##b
#define DTRAIN_CONCAT_(a, b) DTRAIN_CONCAT_INNER_(a, b)

#define RETURN_IF_ERROR(expr)                            \
  do {                                                   \
    ::absl::Status dtrain_status_ = (expr);              \
    if (!dtrain_status_.ok()) return dtrain_status_;     \
  } while (0)

#define ASSIGN_OR_RETURN(lhs, rexpr) \
  ASSIGN_OR_RETURN_IMPL_(DTRAIN_CONCAT_(dtrain_statusor_, __LINE__), lhs, rexpr)

#define ASSIGN_OR_RETURN_IMPL_(statusor, lhs, rexpr) \
  auto statusor = (rexpr);                           \
  if (!statusor.ok()) return statusor.status();      \
  lhs = std::move(statusor).value()

#endif  // DTRAIN_COMMON_STATUS_MACROS_H_
