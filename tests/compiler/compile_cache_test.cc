// The compile cache: memory LRU, disk entries shared by processes (one
// compile per key), damaged entries recompiled, explanations of misses.
#include "neuron/compiler/compile_cache.h"

#include <gtest/gtest.h>
#include <sys/stat.h>
#include <unistd.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <random>
#include <iterator>
#include <thread>
#include <vector>

#include "../helpers/mutator.h"
#include "neuron/compiler/graph_text.h"
#include "neuron/compiler/lower.h"
#include "neuron/runtime/device/executable.h"
#include "neuron/runtime/error.h"
#include "neuron/runtime/error.h"

namespace neuron::compiler {
namespace {

using runtime::DeviceSpec;

proto::Graph Graph(int n, const std::string& name = "g") {
  return ParseGraph("graph " + name + "(%x: f32[" + std::to_string(n) +
                    "]) {\n  %0: f32[" + std::to_string(n) +
                    "] = aten.relu(%x)\n  return %0\n}\n");
}

class CompileCacheTest : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = ::testing::TempDir() + "compile_cache_" + std::to_string(::getpid());
    std::filesystem::remove_all(dir_);
  }
  void TearDown() override { std::filesystem::remove_all(dir_); }
  CompileCache::Options Disk(bool explain = false) {
    CompileCache::Options o;
    o.dir = dir_;
    o.explain = explain;
    return o;
  }
  std::function<runtime::proto::Executable()> Compiler(const proto::Graph& g) {
    return [this, g] {
      ++compiles_;
      return Lower(g, device_).executable;
    };
  }
  std::string dir_;
  DeviceSpec device_ = DeviceSpec::Default();
  std::atomic<int> compiles_{0};
};

TEST_F(CompileCacheTest, KeysIgnoreNamesAndSourcesButNotShapesOrOptions) {
  const CacheKey a = MakeCacheKey(Graph(4, "a"), "O2", device_);
  proto::Graph b_graph = Graph(4, "b");
  b_graph.mutable_nodes(0)->set_source("train.py:7");
  EXPECT_EQ(MakeCacheKey(b_graph, "O2", device_).digest, a.digest);
  EXPECT_NE(MakeCacheKey(Graph(8), "O2", device_).digest, a.digest);
  EXPECT_NE(MakeCacheKey(Graph(4), "O1", device_).digest, a.digest);
  EXPECT_EQ(a.digest.size(), 64u);
}

TEST_F(CompileCacheTest, AnEntrySwappedForAnotherKeysIsRecompiledNotRun) {
  const CacheKey k4 = MakeCacheKey(Graph(4), "", device_),
                 k8 = MakeCacheKey(Graph(8), "", device_);
  const auto four = CompileCache(Disk()).GetOrCompile(k4, Compiler(Graph(4)), device_);
  CompileCache(Disk()).GetOrCompile(k8, Compiler(Graph(8)), device_);
  std::filesystem::copy_file(dir_ + "/" + k8.digest + ".nexe", dir_ + "/" + k4.digest + ".nexe",
                             std::filesystem::copy_options::overwrite_existing);
  CompileCache cache(Disk());
  EXPECT_EQ(cache.GetOrCompile(k4, Compiler(Graph(4)), device_)->SerializeAsString(),
            four->SerializeAsString());
  EXPECT_EQ(cache.counters().corrupt, 1u);
  EXPECT_EQ(cache.counters().disk_hits, 0u);
  // The MAC binds the bytes to k8's digest: copying it along does not help.
  EXPECT_NE(cache.last_report().find(".nexe is not authenticated by this user's key"),
            std::string::npos)
      << cache.last_report();
  EXPECT_EQ(compiles_, 3);
}

// The forgery a frame checksum cannot stop: another key's executable with
// its graph id relabelled and its checksum recomputed (a valid file) is
// not trusted, as its MAC is not this user's key's.
TEST_F(CompileCacheTest, ARelabelledEntryWithARecomputedChecksumIsNotTrusted) {
  const CacheKey k4 = MakeCacheKey(Graph(4), "", device_),
                 k8 = MakeCacheKey(Graph(8), "", device_);
  const auto four = CompileCache(Disk()).GetOrCompile(k4, Compiler(Graph(4)), device_);
  CompileCache(Disk()).GetOrCompile(k8, Compiler(Graph(8)), device_);
  runtime::proto::Executable forged =
      runtime::LoadExecutable(dir_ + "/" + k8.digest + ".nexe", device_);
  forged.set_graph_id(k4.digest);
  runtime::SaveExecutable(forged, dir_ + "/" + k4.digest + ".nexe");
  CompileCache cache(Disk());
  EXPECT_EQ(cache.GetOrCompile(k4, Compiler(Graph(4)), device_)->SerializeAsString(),
            four->SerializeAsString());
  EXPECT_EQ(cache.counters().disk_hits, 0u);
  EXPECT_EQ(cache.counters().corrupt, 1u);
  EXPECT_NE(cache.last_report().find(dir_ + "/" + k4.digest + ".nexe is not authenticated by "
                                     "this user's key (its MAC, " + dir_ + "/" + k4.digest +
                                     ".mac, is wrong)"),
            std::string::npos)
      << cache.last_report();
  EXPECT_EQ(compiles_, 3);
  // Replaced by a compiled, authenticated entry: the next process hits it.
  CompileCache next(Disk());
  next.GetOrCompile(k4, Compiler(Graph(4)), device_);
  EXPECT_EQ(next.counters().disk_hits, 1u);
}

// Fuzzed entries, their frame checksum recomputed when the bytes still
// parse as an executable (a valid file, as a forger would make): none is
// ever served from disk, and every lookup gives the compiled executable.
TEST_F(CompileCacheTest, FuzzedEntriesWithRecomputedChecksumsAreNeverDiskHits) {
  const CacheKey key = MakeCacheKey(Graph(4), "", device_);
  const runtime::proto::Executable exe = Lower(Graph(4), device_).executable;
  const auto compiled = CompileCache(Disk()).GetOrCompile(key, [&] { return exe; }, device_);
  const std::string path = dir_ + "/" + key.digest + ".nexe";
  const std::string original = runtime::ExecutableFileBytes(*compiled);
  std::mt19937_64 rng(0x5eed);
  int reframed = 0;
  for (int i = 0; i < 150; ++i) {
    std::string bytes = neuron::testing::Mutate(original, rng);
    // Every other one: a byte of the executable changed so that it still
    // parses, in a valid frame.
    for (int attempt = 0; i % 2 == 0 && attempt < 20; ++attempt) {
      std::string payload = compiled->SerializeAsString();
      payload[rng() % payload.size()] ^= static_cast<char>(1 + rng() % 255);
      runtime::proto::Executable parsed;
      if (!parsed.ParseFromString(payload)) continue;
      bytes = runtime::ExecutableFileBytes(parsed);
      ++reframed;
      break;
    }
    if (bytes == original) continue;
    std::ofstream(path, std::ios::binary | std::ios::trunc) << bytes;
    CompileCache::Lookup lookup;
    CompileCache cache(Disk());
    const auto got = cache.GetOrCompile(key, [&] { return exe; }, device_, &lookup);
    ASSERT_NE(lookup.kind, CompileCache::Lookup::kDiskHit) << "mutation " << i;
    ASSERT_EQ(got->SerializeAsString(), compiled->SerializeAsString()) << "mutation " << i;
  }
  EXPECT_GT(reframed, 20);
}

// The key: made once, 0600, 32 bytes, shared by every instance; one that
// others could read, a link, or another size is refused naming the file. A
// new key (the old one deleted) makes the entries misses, not errors.
TEST_F(CompileCacheTest, TheMacKeyIsPrivateAndSharedAndCheckedWhenRead) {
  const CacheKey key = MakeCacheKey(Graph(4), "", device_);
  CompileCache(Disk()).GetOrCompile(key, Compiler(Graph(4)), device_);
  const std::string secret = dir_ + "/mac-secret";
  struct stat st {};
  ASSERT_EQ(::stat(secret.c_str(), &st), 0);
  EXPECT_EQ(st.st_mode & 0777, 0600u);
  EXPECT_EQ(st.st_size, 32);
  CompileCache second(Disk());
  second.GetOrCompile(key, Compiler(Graph(4)), device_);
  EXPECT_EQ(second.counters().disk_hits, 1u);
  auto refused = [&](const std::string& why) {
    try {
      CompileCache cache(Disk());
      ADD_FAILURE() << "accepted a key file that is " << why;
    } catch (const InvalidUsage& e) {
      EXPECT_NE(std::string(e.what()).find("key file " + secret + ": " + why),
                std::string::npos)
          << e.what();
    }
  };
  ::chmod(secret.c_str(), 0644);
  refused("mode 0644: others may read or write it");
  ::chmod(secret.c_str(), 0600);
  std::filesystem::resize_file(secret, 16);
  refused("16 bytes, a key has 32");
  std::filesystem::remove(secret);
  std::filesystem::create_symlink(dir_ + "/elsewhere", secret);
  refused("it is a symbolic link, not followed");
  EXPECT_FALSE(std::filesystem::exists(dir_ + "/elsewhere"));
  std::filesystem::remove(secret);
  CompileCache renewed(Disk());
  renewed.GetOrCompile(key, Compiler(Graph(4)), device_);
  EXPECT_EQ(renewed.counters().corrupt, 1u);
  EXPECT_EQ(compiles_, 2);
}

// A directory others can fill (world-writable without the sticky bit) or
// another user's is refused, naming it and the fix; with the sticky bit it
// is used. A new one is made 0700 whatever the umask.
TEST_F(CompileCacheTest, ADirectoryOthersControlIsRefused) {
  const mode_t umask = ::umask(0);
  CompileCache made(Disk());
  ::umask(umask);
  struct stat st {};
  ASSERT_EQ(::stat(dir_.c_str(), &st), 0);
  EXPECT_EQ(st.st_mode & 07777, 0700u);
  auto refused = [&](const std::string& why) {
    try {
      CompileCache cache(Disk());
      ADD_FAILURE() << "used a cache directory " << why;
    } catch (const InvalidUsage& e) {
      EXPECT_NE(std::string(e.what()).find("compile cache: directory " + dir_ + why),
                std::string::npos)
          << e.what();
      EXPECT_NE(std::string(e.what()).find("set NEURON_CACHE_DIR"), std::string::npos);
    }
  };
  ::chmod(dir_.c_str(), 0777);
  refused(" (mode 0777) is writable by others without the sticky bit");
  ::chmod(dir_.c_str(), 01777);
  CompileCache sticky(Disk());
  ::chmod(dir_.c_str(), 0700);
  if (::geteuid() != 0) GTEST_SKIP() << "giving the directory away needs root";
  ASSERT_EQ(::chown(dir_.c_str(), 65534, static_cast<gid_t>(-1)), 0);
  refused(" is owned by uid 65534, not by this user (uid 0)");
}

TEST_F(CompileCacheTest, MemoryHitsAndLeastRecentlyUsedEviction) {
  CompileCache::Options o;
  o.memory_entries = 1;
  CompileCache cache(o);
  const CacheKey k4 = MakeCacheKey(Graph(4), "", device_),
                 k8 = MakeCacheKey(Graph(8), "", device_);
  cache.GetOrCompile(k4, Compiler(Graph(4)), device_);
  cache.GetOrCompile(k4, Compiler(Graph(4)), device_);
  cache.GetOrCompile(k8, Compiler(Graph(8)), device_);  // evicts k4
  cache.GetOrCompile(k4, Compiler(Graph(4)), device_);
  const auto c = cache.counters();
  EXPECT_EQ(c.misses, 3u);
  EXPECT_EQ(c.memory_hits, 1u);
  EXPECT_EQ(c.evictions, 2u);
  EXPECT_EQ(compiles_, 3);
}

TEST_F(CompileCacheTest, DiskEntriesServeOtherInstancesAndDamageIsRecompiled) {
  const CacheKey key = MakeCacheKey(Graph(4), "", device_);
  const auto first = CompileCache(Disk()).GetOrCompile(key, Compiler(Graph(4)), device_);
  CompileCache second(Disk());
  EXPECT_EQ(second.GetOrCompile(key, Compiler(Graph(4)), device_)->SerializeAsString(),
            first->SerializeAsString());
  EXPECT_EQ(second.counters().disk_hits, 1u);
  EXPECT_EQ(compiles_, 1);
  // Damage the entry: detected, reported, recompiled, replaced.
  const std::string path = dir_ + "/" + key.digest + ".nexe";
  std::filesystem::resize_file(path, std::filesystem::file_size(path) - 3);
  CompileCache third(Disk());
  EXPECT_EQ(third.GetOrCompile(key, Compiler(Graph(4)), device_)->SerializeAsString(),
            first->SerializeAsString());
  EXPECT_EQ(third.counters().corrupt, 1u);
  EXPECT_NE(third.last_report().find("damaged entry recompiled"), std::string::npos);
  EXPECT_NE(third.last_report().find(".mac, is wrong): damaged"), std::string::npos)
      << third.last_report();
  EXPECT_EQ(compiles_, 2);
  CompileCache fourth(Disk());
  fourth.GetOrCompile(key, Compiler(Graph(4)), device_);
  EXPECT_EQ(fourth.counters().disk_hits, 1u);
}

// Links planted at an entry's lock, or where its temporaries had
// predictable names (<digest>.nexe.tmp.<pid>, .key.tmp.<pid>), are never
// followed: the lock is an error naming it, the victims stay untouched.
TEST_F(CompileCacheTest, PlantedLinksAreNotFollowed) {
  const CacheKey key = MakeCacheKey(Graph(4), "", device_);
  std::filesystem::create_directories(dir_);
  const std::string victim = dir_ + "/victim", created = dir_ + "/created-through-lock";
  std::ofstream(victim) << "precious";
  const std::string base = dir_ + "/" + key.digest;
  const std::string pid = std::to_string(::getpid());
  std::filesystem::create_symlink(victim, base + ".nexe.tmp." + pid);
  std::filesystem::create_symlink(victim, base + ".key.tmp." + pid);
  std::filesystem::create_symlink(created, base + ".lock");
  try {
    CompileCache(Disk()).GetOrCompile(key, Compiler(Graph(4)), device_);
    ADD_FAILURE() << "compiled through a planted lock link";
  } catch (const IoError& e) {
    EXPECT_NE(std::string(e.what()).find("lock file " + base +
                                         ".lock: it is a symbolic link, not followed"),
              std::string::npos)
        << e.what();
  }
  EXPECT_FALSE(std::filesystem::exists(created));
  std::filesystem::remove(base + ".lock");
  CompileCache(Disk()).GetOrCompile(key, Compiler(Graph(4)), device_);
  EXPECT_EQ(compiles_, 1);
  std::ifstream in(victim);
  EXPECT_EQ(std::string(std::istreambuf_iterator<char>(in), {}), "precious");
  EXPECT_TRUE(std::filesystem::is_regular_file(base + ".nexe"));
}

TEST_F(CompileCacheTest, EachLookupSaysHowItWasServedAndWhatItReported) {
  const CacheKey key = MakeCacheKey(Graph(4), "", device_);
  CompileCache::Lookup lookup;
  CompileCache first(Disk());
  first.GetOrCompile(key, Compiler(Graph(4)), device_, &lookup);
  EXPECT_EQ(lookup.kind, CompileCache::Lookup::kCompiled);
  first.GetOrCompile(key, Compiler(Graph(4)), device_, &lookup);
  EXPECT_EQ(lookup.kind, CompileCache::Lookup::kMemoryHit);
  EXPECT_STREQ(CompileCache::Name(lookup.kind), "memory hit");
  CompileCache(Disk()).GetOrCompile(key, Compiler(Graph(4)), device_, &lookup);
  EXPECT_EQ(lookup.kind, CompileCache::Lookup::kDiskHit);
  EXPECT_EQ(lookup.report, "");
  const std::string path = dir_ + "/" + key.digest + ".nexe";
  std::filesystem::resize_file(path, std::filesystem::file_size(path) - 3);
  CompileCache(Disk()).GetOrCompile(key, Compiler(Graph(4)), device_, &lookup);
  EXPECT_EQ(lookup.kind, CompileCache::Lookup::kCompiled);
  EXPECT_NE(lookup.report.find("damaged entry recompiled"), std::string::npos)
      << lookup.report;
  CompileCache explaining(Disk(/*explain=*/true));
  explaining.GetOrCompile(MakeCacheKey(Graph(4), "O1", device_), Compiler(Graph(4)),
                          device_, &lookup);
  EXPECT_EQ(lookup.kind, CompileCache::Lookup::kCompiled);
  EXPECT_NE(lookup.report.find("differs in: options"), std::string::npos)
      << lookup.report;
  EXPECT_EQ(compiles_, 3);
}

TEST_F(CompileCacheTest, AnEmptyCacheDirectoryVariableMeansMemoryOnly) {
  const char* saved = std::getenv("NEURON_CACHE_DIR");
  const std::string restore = saved != nullptr ? saved : "";
  ::setenv("NEURON_CACHE_DIR", "", 1);
  EXPECT_EQ(CompileCache::Options::FromEnvironment().dir, "");
  ::setenv("NEURON_CACHE_DIR", dir_.c_str(), 1);
  EXPECT_EQ(CompileCache::Options::FromEnvironment().dir, dir_);
  ::unsetenv("NEURON_CACHE_DIR");
  const char* home = std::getenv("HOME");
  if (home != nullptr) {
    EXPECT_EQ(CompileCache::Options::FromEnvironment().dir,
              std::string(home) + "/.cache/torchneuron");
  }
  if (saved != nullptr) ::setenv("NEURON_CACHE_DIR", restore.c_str(), 1);
}

TEST_F(CompileCacheTest, AMissExplainsWhichComponentDiffers) {
  CompileCache(Disk()).GetOrCompile(MakeCacheKey(Graph(4), "O2", device_),
                                    Compiler(Graph(4)), device_);
  CompileCache cache(Disk(/*explain=*/true));
  cache.GetOrCompile(MakeCacheKey(Graph(4), "O1", device_), Compiler(Graph(4)), device_);
  EXPECT_NE(cache.last_report().find("differs in: options"), std::string::npos)
      << cache.last_report();
  cache.GetOrCompile(MakeCacheKey(Graph(6), "O2", device_), Compiler(Graph(6)), device_);
  EXPECT_NE(cache.last_report().find("differs in: graph, inputs"), std::string::npos)
      << cache.last_report();
}

TEST_F(CompileCacheTest, ConcurrentCallersCompileOnce) {
  const CacheKey key = MakeCacheKey(Graph(4), "", device_);
  std::vector<std::thread> threads;
  for (int t = 0; t < 4; ++t) {
    threads.emplace_back([&] {
      CompileCache cache(Disk());  // as separate processes would
      cache.GetOrCompile(
          key,
          [&] {
            std::this_thread::sleep_for(std::chrono::milliseconds(100));
            return Compiler(Graph(4))();
          },
          device_);
    });
  }
  for (auto& t : threads) t.join();
  EXPECT_EQ(compiles_, 1);
}

}  // namespace
}  // namespace neuron::compiler
