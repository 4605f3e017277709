#include "flag_values.h"

#include <cctype>
#include <cerrno>
#include <cmath>
#include <cstdlib>

#include "neuron/runtime/error.h"

namespace neuron::launcher {

std::uint64_t ParseUnsigned(const std::string& flag, const std::string& text, std::uint64_t min,
                            std::uint64_t max) {
  bool digits = !text.empty();
  for (char c : text) digits = digits && std::isdigit(static_cast<unsigned char>(c));
  char* end = nullptr;
  errno = 0;
  const unsigned long long value = digits ? std::strtoull(text.c_str(), &end, 10) : 0;
  NEURON_CHECK(digits && errno == 0, flag, " expects a whole number, got '", text, "'");
  NEURON_CHECK(value >= min && value <= max, flag, " must be between ", min, " and ", max,
               ", got ", value);
  return value;
}

double ParseFinite(const std::string& flag, const std::string& text, double min, double max) {
  char* end = nullptr;
  errno = 0;
  const double value = text.empty() || std::isspace(static_cast<unsigned char>(text[0]))
                           ? NAN
                           : std::strtod(text.c_str(), &end);
  NEURON_CHECK(std::isfinite(value) && end != nullptr && *end == '\0' && errno == 0, flag,
               " expects a number, got '", text, "'");
  NEURON_CHECK(value >= min && value <= max, flag, " must be between ", min, " and ", max,
               ", got ", value);
  return value;
}

}  // namespace neuron::launcher
