// Host memory for the spaces of an executable's plan, kept between runs: a
// run that reuses it neither maps nor faults in fresh pages.
#pragma once

#include <cstdint>
#include <map>
#include <mutex>
#include <vector>

namespace neuron::runtime::detail {

// A memory space (proto::MemorySpace) -> its host bytes.
using Arenas = std::map<int, std::vector<std::uint8_t>>;

// Thread-safe. A run takes a set of arenas and gives it back when it ends;
// concurrent runs hold different sets. At most kKeep idle sets are kept,
// for every executable of the process (Process()). A set's arenas grow to
// the largest extent a plan needed in each space and do not shrink: what a
// process holds between runs is bounded by kKeep times the sum, over the
// spaces, of its plans' largest extent there, however many graphs it
// compiled.
class ArenaPool {
 public:
  static constexpr std::size_t kKeep = 2;

  // The process's pool, which every Executor uses.
  static ArenaPool& Process() {
    static ArenaPool* pool = new ArenaPool();  // never destroyed: runs may end at exit
    return *pool;
  }

  // Owns a set of arenas for one run; returns it to the pool on destruction.
  class Lease {
   public:
    Lease(ArenaPool* pool, Arenas arenas) : pool_(pool), arenas_(std::move(arenas)) {}
    ~Lease() { pool_->Return(std::move(arenas_)); }
    Lease(const Lease&) = delete;
    Lease& operator=(const Lease&) = delete;
    Arenas& arenas() { return arenas_; }

   private:
    ArenaPool* pool_;
    Arenas arenas_;
  };

  // A set with an arena of at least extent[space] bytes for each space. Bytes an
  // earlier run wrote stay: the caller zeroes what its run reads before
  // writing (UnwrittenReads), so a result never depends on an earlier run.
  Lease Take(const std::map<int, std::uint64_t>& extent) {
    Arenas arenas;
    {
      std::lock_guard<std::mutex> lock(mutex_);
      if (!idle_.empty()) {
        arenas = std::move(idle_.back());
        idle_.pop_back();
      }
    }
    for (auto it = arenas.begin(); it != arenas.end();) {
      it = extent.count(it->first) ? std::next(it) : arenas.erase(it);
    }
    // Grown, never shrunk: plans of different sizes take turns with a set
    // without reallocating or zero-filling it each time.
    for (const auto& [space, bytes] : extent) {
      if (arenas[space].size() < bytes) arenas[space].resize(bytes);
    }
    return Lease(this, std::move(arenas));
  }

 private:
  void Return(Arenas arenas) {
    std::lock_guard<std::mutex> lock(mutex_);
    if (idle_.size() < kKeep) idle_.push_back(std::move(arenas));
  }

  std::mutex mutex_;
  std::vector<Arenas> idle_;
};

}  // namespace neuron::runtime::detail
