#include "neuron/compiler/compile_cache.h"

#include <fcntl.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <charconv>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <sstream>

#include "cache_auth.h"
#include "neuron/compiler/graph_digest.h"
#include "neuron/compiler/lower.h"
#include "neuron/runtime/config.h"
#include "neuron/runtime/device/executable.h"
#include "neuron/runtime/error.h"
#include "neuron/runtime/files.h"

namespace neuron::compiler {
namespace {

// The device spec's digest, remembered for the last spec seen on this
// thread (a process compiles for one device; hashing it on every lookup
// was a tenth of a cache hit).
const std::string& DeviceDigest(const runtime::DeviceSpec& device) {
  thread_local std::string last_spec, last_digest;
  if (device.serialized() != last_spec) {
    last_digest = Sha256Hex(device.serialized());
    last_spec = device.serialized();
  }
  return last_digest;
}

// Holds an exclusive flock on `path` for its lifetime.
class FileLock {
 public:
  explicit FileLock(const std::string& path) {
    // O_NOFOLLOW: a link planted at the lock's name is refused, not opened
    // (nor its target created).
    fd_ = ::open(path.c_str(), O_RDWR | O_CREAT | O_NOFOLLOW | O_CLOEXEC, 0644);
    if (fd_ < 0) {
      const int e = errno;
      throw IoError(StrCat("compile cache: cannot open lock file ", path, ": ",
                           e == ELOOP ? "it is a symbolic link, not followed"
                                      : std::strerror(e)));
    }
    while (::flock(fd_, LOCK_EX) != 0) {
      if (errno != EINTR) {
        ::close(fd_);
        throw IoError(
            StrCat("compile cache: cannot lock ", path, ": ", std::strerror(errno)));
      }
    }
  }
  ~FileLock() { ::close(fd_); }  // closing releases the lock
  FileLock(const FileLock&) = delete;
  FileLock& operator=(const FileLock&) = delete;

 private:
  int fd_ = -1;
};

std::string ToHex(const std::string& raw) {
  static constexpr char kDigits[] = "0123456789abcdef";
  std::string out;
  out.reserve(2 * raw.size());
  for (unsigned char c : raw) out.append({kDigits[c >> 4], kDigits[c & 15]});
  return out;
}

std::string KeyText(const CacheKey& key) {
  std::size_t size = 0;
  for (const auto& [name, value] : key.components) size += name.size() + value.size() + 2;
  std::string text;
  text.reserve(size);
  for (const auto& [name, value] : key.components) {
    text.append(name).append(1, '=').append(value).append(1, '\n');
  }
  return text;
}

// The inputs' dtypes and shapes, "f32[16,256,];f32[256,];": the readable
// component a miss's explanation compares. Built in one string (a
// temporary per number cost a fifth of a key).
std::string InputSignature(const proto::Graph& graph) {
  std::string out;
  out.reserve(static_cast<std::size_t>(graph.inputs_size()) * 16);
  char digits[24];
  for (const auto& v : graph.inputs()) {
    out.append(v.type().dtype()).append(1, '[');
    for (auto d : v.type().shape()) {
      const auto end = std::to_chars(digits, digits + sizeof(digits), d).ptr;
      out.append(digits, end).append(1, ',');
    }
    out.append("];");
  }
  return out;
}

std::map<std::string, std::string> ParseKeyText(const std::string& text) {
  std::map<std::string, std::string> out;
  std::istringstream in(text);
  std::string line;
  while (std::getline(in, line)) {
    const auto eq = line.find('=');
    if (eq != std::string::npos) out[line.substr(0, eq)] = line.substr(eq + 1);
  }
  return out;
}

}  // namespace

CacheKey MakeCacheKey(const proto::Graph& graph, const std::string& options,
                      const runtime::DeviceSpec& device) {
  CacheKey key;
  // The name and source lines are labels, not part of what is compiled.
  key.components["graph"] = GraphDigest(graph);
  key.components["inputs"] = InputSignature(graph);
  key.components["compiler"] = kCompilerVersion;
  key.components["options"] = options;
  key.components["device"] = DeviceDigest(device);
  key.digest = Sha256Hex(KeyText(key));
  return key;
}

CompileCache::Options CompileCache::Options::FromEnvironment() {
  Options o;
  const auto& registry = runtime::ConfigRegistry::Get();
  const char* given = std::getenv(runtime::VariableName(runtime::ConfigKey::kCacheDir));
  if (given != nullptr && given[0] == '\0') {
    // NEURON_CACHE_DIR= (set, empty): memory only.
  } else if (auto dir = registry.Find(runtime::ConfigKey::kCacheDir)) {
    o.dir = *dir;
  } else if (const char* home = std::getenv("HOME")) {
    o.dir = std::string(home) + "/.cache/torchneuron";
  }
  o.explain = registry.Find(runtime::ConfigKey::kCacheExplain).value_or("0") == "1";
  return o;
}

CompileCache::CompileCache(Options options) : options_(std::move(options)) {
  NEURON_CHECK(options_.memory_entries > 0, "compile cache: memory_entries must be > 0");
  if (options_.dir.empty()) return;
  std::error_code error;
  const std::filesystem::path parent = std::filesystem::path(options_.dir).parent_path();
  if (!parent.empty()) std::filesystem::create_directories(parent, error);
  NEURON_CHECK(!error, "compile cache: cannot create ", parent.string(), ": ", error.message());
  // The cache's own directory private to its user (whatever the umask).
  NEURON_CHECK(::mkdir(options_.dir.c_str(), 0700) == 0 || errno == EEXIST,
               "compile cache: cannot create ", options_.dir, ": ", std::strerror(errno));
  CheckCacheDirectory(options_.dir);
  mac_key_ = CacheMacKey(options_.dir);
}

CompileCache::Entry CompileCache::LoadFromDisk(const CacheKey& key, const std::string& base,
                                               const runtime::DeviceSpec& device,
                                               bool* damaged) {
  std::string bytes;
  try {
    bytes = runtime::ReadFile(base + ".nexe", "compile cache entry");
  } catch (const IoError&) {
    return nullptr;  // not there (yet)
  }
  // Only an entry this user's key authenticates is parsed, let alone run: a
  // file planted or relabelled (graph id changed, frame checksum recomputed)
  // is a miss. The MAC is written before the entry, so a whole entry has one.
  std::string mac;
  try {
    mac = runtime::ReadFile(base + ".mac", "compile cache MAC", 1024);
  } catch (const IoError&) {
  }
  std::shared_ptr<const runtime::proto::Executable> entry;
  try {
    NEURON_CHECK(SameMac(mac, ToHex(EntryMac(mac_key_, key.digest, bytes)) + "\n"), base,
                 ".nexe is not authenticated by this user's key (its MAC, ", base,
                 ".mac, is ", mac.empty() ? "missing" : "wrong",
                 "): damaged, written under another key or by an older torchneuron, or forged");
    entry = runtime::ParseExecutableShared(bytes, base + ".nexe", device);
  } catch (const Error& e) {
    *damaged = true;
    ++counters_.corrupt;
    last_report_ = StrCat("compile cache: damaged entry recompiled: ", e.what());
    return nullptr;
  }
  // An entry is bound to its key (the MAC covers the digest, and so does
  // graph_id): a valid executable of another key is a miss, never a wrong result.
  if (entry->graph_id() != key.digest) {
    *damaged = true;
    ++counters_.corrupt;
    last_report_ = StrCat("compile cache: damaged entry recompiled: ", base,
                          ".nexe holds the executable of another key (",
                          entry->graph_id().empty() ? std::string("none") : entry->graph_id(),
                          ")");
    return nullptr;
  }
  ++counters_.disk_hits;
  return Remember(key, std::move(entry));
}

CompileCache::Entry CompileCache::Remember(const CacheKey& key,
                                           runtime::proto::Executable executable) {
  return Remember(key, std::make_shared<const runtime::proto::Executable>(std::move(executable)));
}

CompileCache::Entry CompileCache::Remember(const CacheKey& key, Entry entry) {
  auto it = memory_.find(key.digest);
  if (it != memory_.end()) {
    lru_.erase(it->second.second);
    memory_.erase(it);
  }
  lru_.push_front(key.digest);
  memory_[key.digest] = {entry, lru_.begin()};
  while (memory_.size() > options_.memory_entries) {
    memory_.erase(lru_.back());
    lru_.pop_back();
    ++counters_.evictions;
  }
  return entry;
}

std::string CompileCache::Explain(const CacheKey& key) const {
  std::string nearest;
  std::size_t best = 0;
  std::map<std::string, std::string> best_components;
  std::error_code error;
  for (const auto& entry : std::filesystem::directory_iterator(options_.dir, error)) {
    if (entry.path().extension() != ".key") continue;
    std::string text;
    try {
      text = runtime::ReadFile(entry.path().string(), "compile cache key", 1 << 20);
    } catch (const IoError&) {
      continue;  // not a key file this cache wrote: nothing to compare with
    }
    const auto components = ParseKeyText(text);
    std::size_t same = 0;
    for (const auto& [name, value] : key.components) {
      auto it = components.find(name);
      same += it != components.end() && it->second == value;
    }
    if (nearest.empty() || same > best) {
      nearest = entry.path().stem().string();
      best = same;
      best_components = components;
    }
  }
  if (nearest.empty()) return "compile cache miss: the cache is empty";
  std::string differ;
  for (const auto& [name, value] : key.components) {
    auto it = best_components.find(name);
    if (it == best_components.end() || it->second != value)
      differ += (differ.empty() ? "" : ", ") + name;
  }
  return StrCat("compile cache miss: the nearest entry (", nearest.substr(0, 12),
                ") differs in: ", differ);
}

void CompileCache::ForgetMemory() {
  std::lock_guard<std::mutex> lock(mutex_);
  memory_.clear();
  lru_.clear();
}

const char* CompileCache::Name(Lookup::Kind kind) {
  switch (kind) {
    case Lookup::kMemoryHit:
      return "memory hit";
    case Lookup::kDiskHit:
      return "disk hit";
    case Lookup::kCompiled:
      return "compiled";
  }
  return "?";
}

std::shared_ptr<const runtime::proto::Executable> CompileCache::GetOrCompile(
    const CacheKey& key, const std::function<runtime::proto::Executable()>& compile,
    const runtime::DeviceSpec& device, Lookup* lookup) {
  std::lock_guard<std::mutex> lock(mutex_);
  last_report_.clear();
  Lookup::Kind kind = Lookup::kCompiled;
  Entry entry = Find(key, compile, device, &kind);
  if (lookup != nullptr) *lookup = {kind, last_report_};
  return entry;
}

CompileCache::Entry CompileCache::Find(
    const CacheKey& key, const std::function<runtime::proto::Executable()>& compile,
    const runtime::DeviceSpec& device, Lookup::Kind* kind) {
  if (auto it = memory_.find(key.digest); it != memory_.end()) {
    ++counters_.memory_hits;
    lru_.splice(lru_.begin(), lru_, it->second.second);
    *kind = Lookup::kMemoryHit;
    return it->second.first;
  }
  *kind = Lookup::kCompiled;
  if (options_.dir.empty()) return Compile(key, compile, device, "");
  const std::string base = options_.dir + "/" + key.digest;
  // A hit needs no lock: entries appear whole (written aside, then renamed).
  bool damaged = false;
  *kind = Lookup::kDiskHit;
  if (auto hit = LoadFromDisk(key, base, device, &damaged)) return hit;
  FileLock file_lock(base + ".lock");  // one compile per key across processes
  if (!damaged) {
    // Another process may have compiled it while this one waited for the lock.
    if (auto hit = LoadFromDisk(key, base, device, &damaged)) return hit;
    if (!damaged && options_.explain) last_report_ = Explain(key);
  }
  *kind = Lookup::kCompiled;
  return Compile(key, compile, device, base);
}

CompileCache::Entry CompileCache::Compile(
    const CacheKey& key, const std::function<runtime::proto::Executable()>& compile,
    const runtime::DeviceSpec& device, const std::string& base) {
  ++counters_.misses;
  runtime::proto::Executable executable = compile();
  executable.set_graph_id(key.digest);  // binds a saved entry to its key
  runtime::ValidateExecutable(executable, device);
  if (!base.empty()) {
    // The MAC first: a reader that finds the entry finds its MAC.
    const std::string bytes = runtime::ExecutableFileBytes(executable);
    runtime::WriteFileAtomically(base + ".mac",
                                 ToHex(EntryMac(mac_key_, key.digest, bytes)) + "\n");
    runtime::WriteFileAtomically(base + ".nexe", bytes);
    runtime::WriteFileAtomically(base + ".key", KeyText(key));
  }
  return Remember(key, std::move(executable));
}

CompileCache::Counters CompileCache::counters() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return counters_;
}

std::string CompileCache::last_report() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return last_report_;
}

}  // namespace neuron::compiler
