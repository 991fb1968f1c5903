// Shared error type and checks. Every user-facing failure (bad file, bad flag,
// unsupported combination) is a runlm::Error with a message that names the
// thing at fault; main() turns it into "error: ..." and exit code 1.
#pragma once

#include <cstdarg>
#include <cstdint>
#include <stdexcept>
#include <string>

namespace runlm {

class Error : public std::runtime_error {
 public:
  explicit Error(const std::string& msg) : std::runtime_error(msg) {}
};

// printf-style formatting into a std::string.
std::string strfmt(const char* fmt, ...) __attribute__((format(printf, 1, 2)));

[[noreturn]] void fail(const char* fmt, ...) __attribute__((format(printf, 1, 2)));

#define RUNLM_CHECK(cond, ...)         \
  do {                                 \
    if (!(cond)) ::runlm::fail(__VA_ARGS__); \
  } while (0)

// Overflow-checked size arithmetic for sizes read from untrusted files.
inline bool mul_overflows(uint64_t a, uint64_t b, uint64_t* out) {
  return __builtin_mul_overflow(a, b, out);
}
inline bool add_overflows(uint64_t a, uint64_t b, uint64_t* out) {
  return __builtin_add_overflow(a, b, out);
}

}  // namespace runlm
