// What each collective cost on the two clocks (docs/architecture.md): wall
// time on this CPU and modelled time on the simulated Trainium2 fabric.
#pragma once

#include <cstddef>
#include <cstdint>
#include <iterator>
#include <string>
#include <string_view>
#include <vector>

namespace neuron::collectives {

// The names are views of static strings (string literals).
struct OpRecord {
  std::string_view op;         // "allreduce", ...
  std::uint64_t sequence = 0;
  double bytes = 0;            // nccl-tests size S (see collective_schedules.h)
  double wall_us = 0;          // this rank, handshake to completion
  double modelled_us = 0;      // the fabric model's duration
  std::string_view fabric_algorithm;
  double arrival_us = 0;       // simulated: when this rank reached the call
  double start_us = 0;         // simulated: the latest arrival over the ranks
  double end_us = 0;           // simulated: start + modelled duration
  double algbw_gbps = 0;       // bytes / modelled time
  double busbw_gbps = 0;       // algbw x nccl-tests factor
  // The direct allreduce read and wrote every rank's registered buffer in
  // place (transport/shared_buffers.h): nothing was staged.
  bool registered = false;
};

// The latest records, oldest first: grows to `capacity` (at least 1), then
// each new record overwrites the oldest, so recording allocates nothing
// once the log is full.
class RecordLog {
 public:
  class const_iterator {
   public:
    using iterator_category = std::forward_iterator_tag;
    using value_type = OpRecord;
    using difference_type = std::ptrdiff_t;
    using pointer = const OpRecord*;
    using reference = const OpRecord&;
    const_iterator(const RecordLog* log, std::size_t index) : log_(log), index_(index) {}
    reference operator*() const { return (*log_)[index_]; }
    pointer operator->() const { return &(*log_)[index_]; }
    const_iterator& operator++() { ++index_; return *this; }
    const_iterator operator++(int) { const_iterator old = *this; ++index_; return old; }
    bool operator==(const const_iterator& o) const { return index_ == o.index_; }
    bool operator!=(const const_iterator& o) const { return index_ != o.index_; }

   private:
    const RecordLog* log_;
    std::size_t index_;
  };

  explicit RecordLog(std::size_t capacity) : capacity_(capacity > 0 ? capacity : 1) {}

  std::size_t size() const { return ring_.size(); }
  bool empty() const { return ring_.empty(); }
  // The i-th oldest record.
  const OpRecord& operator[](std::size_t i) const {
    return ring_[start_ + i < ring_.size() ? start_ + i : start_ + i - ring_.size()];
  }
  const OpRecord& back() const { return (*this)[ring_.size() - 1]; }
  const_iterator begin() const { return {this, 0}; }
  const_iterator end() const { return {this, ring_.size()}; }

  // A new newest record, default-valued, to fill in place.
  OpRecord& Append() {
    if (ring_.size() < capacity_) return ring_.emplace_back();
    OpRecord& r = ring_[start_];
    start_ = start_ + 1 == capacity_ ? 0 : start_ + 1;
    r = OpRecord{};
    return r;
  }
  void clear() {
    ring_.clear();
    start_ = 0;
  }

 private:
  std::size_t capacity_;
  std::vector<OpRecord> ring_;
  std::size_t start_ = 0;  // the oldest record's index once the ring is full
};

struct CommunicatorTotals {
  std::uint64_t operations = 0;
  double bytes = 0;
  double wall_us = 0;
  double modelled_us = 0;
  double waited_us = 0;        // simulated time this rank waited for the others
};

}  // namespace neuron::collectives
