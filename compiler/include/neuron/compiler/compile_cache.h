// The compile cache: executables by key, in memory (LRU) and on disk, so a
// graph is compiled once per node however many ranks and runs need it.
//
// Usage:
//   CacheKey key = MakeCacheKey(graph, "O2", device);
//   CompileCache cache(CompileCache::Options::FromEnvironment());
//   std::shared_ptr<const runtime::proto::Executable> exe =
//       cache.GetOrCompile(key, [&] { return Lower(graph, device, key.digest).executable;
//       },
//                          device);
//   cache.counters().misses;
//
// The key is a SHA-256 over its components: the graph (GraphDigest, which
// covers the input shapes and dtypes), the input shapes and dtypes again in
// readable form, the compiler version, the options and the device spec. Every rank computes the same key for the
// same graph. On disk (NEURON_CACHE_DIR, default ~/.cache/torchneuron) an
// entry is <digest>.nexe (the framed executable file, saved atomically)
// plus <digest>.key (its components, for explanations) and <digest>.mac: an
// entry is trusted only when its HMAC-SHA256 under the per-user key in
// <dir>/mac-secret (0600) matches (cache_auth.h). The directory must be
// this user's and not writable by others without the sticky bit (the
// constructor throws InvalidUsage otherwise). A file lock per key
// makes one process compile while the others wait and then read its
// result. Every executable it hands out was validated against the device
// (compiled ones after compiling, disk ones when loaded). A corrupt or truncated entry is reported (counters, last_report),
// recompiled and replaced, never executed. With NEURON_CACHE_EXPLAIN=1 a
// miss says which components differ from the nearest entry on disk.
// Thread-safe.
#pragma once

#include <cstdint>
#include <functional>
#include <list>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <unordered_map>

#include "neuron/compiler/graph.pb.h"
#include "neuron/runtime/device/device_spec.h"
#include "neuron/runtime/executable.pb.h"

namespace neuron::compiler {

struct CacheKey {
  std::string digest;                             // hex SHA-256
  std::map<std::string, std::string> components;  // name -> hex SHA-256 or value
};

CacheKey MakeCacheKey(const proto::Graph& graph, const std::string& options,
                      const runtime::DeviceSpec& device);

class CompileCache {
 public:
  struct Options {
    std::string dir;  // empty: memory only
    std::size_t memory_entries = 64;
    bool explain = false;
    // NEURON_CACHE_DIR (default ~/.cache/torchneuron; set but empty: no
    // disk cache), NEURON_CACHE_EXPLAIN.
    static Options FromEnvironment();
  };
  struct Counters {
    std::uint64_t memory_hits = 0;
    std::uint64_t disk_hits = 0;
    std::uint64_t misses = 0;  // compiled here
    std::uint64_t evictions = 0;
    std::uint64_t corrupt = 0;  // entries found damaged and recompiled
  };

  // How one lookup was served, and what it reported.
  struct Lookup {
    enum Kind { kMemoryHit, kDiskHit, kCompiled } kind = kCompiled;
    std::string report;  // last_report() of this lookup
  };
  static const char* Name(Lookup::Kind kind);  // "memory hit", "disk hit", "compiled"

  explicit CompileCache(Options options);

  // Shared, never copied: executables carry their constants. `lookup`, when
  // given, says how this call was served (other threads' lookups cannot
  // change it, as they can last_report()).
  std::shared_ptr<const runtime::proto::Executable> GetOrCompile(
      const CacheKey& key, const std::function<runtime::proto::Executable()>& compile,
      const runtime::DeviceSpec& device, Lookup* lookup = nullptr);

  Counters counters() const;
  // Drops the in-memory entries (the disk keeps them): the next lookups
  // load from disk, as a new process would (warm compile time).
  void ForgetMemory();
  // What the last lookup found wrong or explained ("" when nothing).
  std::string last_report() const;

 private:
  using Entry = std::shared_ptr<const runtime::proto::Executable>;
  Entry Remember(const CacheKey& key, runtime::proto::Executable executable);
  Entry Remember(const CacheKey& key, Entry entry);
  // The entry on disk, or null when there is none, or when it is damaged
  // (then *damaged is set, and it is counted and reported in last_report()).
  Entry LoadFromDisk(const CacheKey& key, const std::string& base,
                     const runtime::DeviceSpec& device, bool* damaged);
  // A miss: compiles, validates, saves at `base` (unless empty), remembers.
  Entry Compile(const CacheKey& key, const std::function<runtime::proto::Executable()>& compile,
                const runtime::DeviceSpec& device, const std::string& base);
  std::string Explain(const CacheKey& key) const;
  // GetOrCompile under mutex_; sets *kind.
  Entry Find(const CacheKey& key,
             const std::function<runtime::proto::Executable()>& compile,
             const runtime::DeviceSpec& device, Lookup::Kind* kind);

  Options options_;

 public:
  // The cache's directory; "" when it is memory only.
  const std::string& dir() const { return options_.dir; }
  std::string mac_key_;  // authenticates disk entries (cache_auth.h); "" without a disk
  mutable std::mutex mutex_;
  std::list<std::string> lru_;  // most recent first
  std::unordered_map<std::string, std::pair<Entry, std::list<std::string>::iterator>>
      memory_;
  Counters counters_;
  std::string last_report_;
};

}  // namespace neuron::compiler
