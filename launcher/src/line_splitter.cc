#include "line_splitter.h"

namespace neuron::launcher {

void LineSplitter::Feed(std::string_view chunk) {
  while (!chunk.empty()) {
    const auto newline = chunk.find('\n');
    if (newline == std::string_view::npos) {
      partial_.append(chunk);
      while (partial_.size() >= max_line_bytes_) {
        sink_(std::string_view(partial_).substr(0, max_line_bytes_));
        partial_.erase(0, max_line_bytes_);
      }
      return;
    }
    if (partial_.empty()) {
      sink_(chunk.substr(0, newline));
    } else {
      partial_.append(chunk.substr(0, newline));
      sink_(partial_);
      partial_.clear();
    }
    chunk.remove_prefix(newline + 1);
  }
}

void LineSplitter::Finish() {
  if (partial_.empty()) return;
  sink_(partial_);
  partial_.clear();
}

}  // namespace neuron::launcher
