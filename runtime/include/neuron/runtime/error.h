// The project's one exception hierarchy and its two check macros.
//
//   neuron::Error            base of everything the project throws
//     InvalidUsage           the caller passed something wrong (bad input)
//     TimeoutError           a wait exceeded its deadline
//     IoError                a socket, pipe, file or peer failed
//     RemoteError            a peer reported a failure of its own
//
// Usage:
//   NEURON_CHECK(n > 0, "-n must be positive, got ", n);   // user input
//   NEURON_ASSERT(fd >= 0, "pipe not open");                // our invariant
//   NEURON_CHECK_EQ(a.size(), b.size(), "op ", op, " size mismatch");
//
// NEURON_CHECK throws InvalidUsage; NEURON_ASSERT throws Error marked as an
// internal bug. Both append the source file and line. Library code never
// calls exit() or abort(): callers at the top (a binary's main, the torch
// boundary) translate these into exit codes or Python/c10d errors.
#pragma once

#include <sstream>
#include <stdexcept>
#include <string>

namespace neuron {

class Error : public std::runtime_error {
 public:
  explicit Error(const std::string& what) : std::runtime_error(what) {}
};

class InvalidUsage : public Error {
 public:
  using Error::Error;
};

class TimeoutError : public Error {
 public:
  using Error::Error;
};

class IoError : public Error {
 public:
  using Error::Error;
};

class RemoteError : public Error {
 public:
  using Error::Error;
};

namespace detail {

template <typename... Args>
std::string StrCat(const Args&... args) {
  std::ostringstream out;
  (out << ... << args);
  return out.str();
}

// Strips the directories from __FILE__ so messages stay short.
constexpr const char* BaseName(const char* path) {
  const char* base = path;
  for (const char* p = path; *p; ++p) {
    if (*p == '/') base = p + 1;
  }
  return base;
}

}  // namespace detail

// Builds a message from any streamable arguments: StrCat("rank ", r, ": ", e).
using detail::StrCat;

}  // namespace neuron

#define NEURON_CHECK(cond, ...)                                          \
  do {                                                                   \
    if (!(cond)) {                                                       \
      throw ::neuron::InvalidUsage(::neuron::StrCat(                     \
          __VA_ARGS__, " (", ::neuron::detail::BaseName(__FILE__), ":",  \
          __LINE__, ")"));                                               \
    }                                                                    \
  } while (0)

#define NEURON_ASSERT(cond, ...)                                             \
  do {                                                                       \
    if (!(cond)) {                                                           \
      throw ::neuron::Error(::neuron::StrCat(                                \
          "internal error: ", #cond, " failed: ", __VA_ARGS__, " (",         \
          ::neuron::detail::BaseName(__FILE__), ":", __LINE__, ")"));        \
    }                                                                        \
  } while (0)

#define NEURON_CHECK_OP_(a, b, op, ...)                                      \
  do {                                                                       \
    const auto& neuron_a_ = (a);                                             \
    const auto& neuron_b_ = (b);                                             \
    NEURON_CHECK(neuron_a_ op neuron_b_, __VA_ARGS__, " (", #a, " = ",       \
                 neuron_a_, ", ", #b, " = ", neuron_b_, ")");                \
  } while (0)

#define NEURON_CHECK_EQ(a, b, ...) NEURON_CHECK_OP_(a, b, ==, __VA_ARGS__)
#define NEURON_CHECK_LT(a, b, ...) NEURON_CHECK_OP_(a, b, <, __VA_ARGS__)
#define NEURON_CHECK_LE(a, b, ...) NEURON_CHECK_OP_(a, b, <=, __VA_ARGS__)
