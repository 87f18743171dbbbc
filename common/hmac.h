// HMAC-SHA256 (OpenSSL's libcrypto) and a constant-time check: ps task 0 signs the step decisions that workers
// relay to the other ps tasks with the cluster's token, so a task applies only what ps 0 decided.
//
// Thread-safety: free functions.
#ifndef DTRAIN_COMMON_HMAC_H_
#define DTRAIN_COMMON_HMAC_H_

#include <string>

namespace dtrain {

// The 32-byte MAC of `message` under `key`.
std::string HmacSha256(const std::string& key, const std::string& message);
// Whether `mac` is HmacSha256(key, message), compared in constant time.
bool HmacMatches(const std::string& key, const std::string& message, const std::string& mac);
// a == b in time that depends only on the sizes.
bool ConstantTimeEquals(const std::string& a, const std::string& b);

}  // namespace dtrain

#endif  // DTRAIN_COMMON_HMAC_H_
