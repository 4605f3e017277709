// Splits a byte stream (a rank's pipe) into whole lines.
//
// Feed() takes chunks as they arrive, cut anywhere; every complete line is
// handed to the sink with its trailing '\n' removed. Finish() flushes a last
// line that had no newline. A line longer than max_line_bytes is cut there,
// so a rank that never prints '\n' cannot make neuronrun grow without bound.
#pragma once

#include <cstddef>
#include <functional>
#include <string>
#include <string_view>

namespace neuron::launcher {

class LineSplitter {
 public:
  using Sink = std::function<void(std::string_view line)>;

  explicit LineSplitter(Sink sink, std::size_t max_line_bytes = 1u << 20)
      : sink_(std::move(sink)), max_line_bytes_(max_line_bytes) {}

  void Feed(std::string_view chunk);
  void Finish();

 private:
  Sink sink_;
  std::size_t max_line_bytes_;
  std::string partial_;
};

}  // namespace neuron::launcher
