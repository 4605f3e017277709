// Store semantics, the same for every implementation (parameterized), plus
// what only the TCP store has: authentication, set-on-close, bad input.
#include <gtest/gtest.h>
#include <signal.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <limits>
#include <memory>
#include <mutex>
#include <thread>

#include "neuron/collectives/store/file_store.h"
#include "neuron/collectives/store/hash_store.h"
#include "neuron/collectives/store/prefix_store.h"
#include "neuron/collectives/store/tcp_store.h"
#include "neuron/collectives/store/tcp_store_server.h"
#include "neuron/runtime/error.h"

namespace neuron::collectives {
namespace {

using namespace std::chrono_literals;

constexpr char kSecret[] = "test-secret";

// A store under test plus whatever keeps it alive.
struct StoreFixture {
  std::unique_ptr<TcpStoreServer> server;
  std::function<std::shared_ptr<Store>()> connect;  // a new client each call
  std::string cleanup;                               // a directory to remove
};

StoreFixture MakeFixture(const std::string& kind) {
  StoreFixture f;
  if (kind == "hash") {
    auto store = std::make_shared<HashStore>();
    f.connect = [store] { return store; };
  } else if (kind == "tcp") {
    TcpStoreServerOptions o;
    o.secret = kSecret;
    o.log = [](const std::string&) {};
    f.server = std::make_unique<TcpStoreServer>(o);
    const auto port = f.server->port();
    f.connect = [port] {
      TcpStoreOptions c;
      c.port = port;
      c.secret = kSecret;
      return std::make_shared<TcpStore>(c);
    };
  } else if (kind == "file") {
    char tmpl[] = "/tmp/neuron_file_store_XXXXXX";
    const std::string dir = ::mkdtemp(tmpl);
    f.cleanup = dir;
    // Each client opens the file on its own, like separate processes do.
    f.connect = [dir] { return std::make_shared<FileStore>(dir + "/store"); };
  } else {  // prefix over hash
    auto base = std::make_shared<HashStore>();
    f.connect = [base] { return std::make_shared<PrefixStore>("group/1", base); };
  }
  return f;
}

class StoreTest : public ::testing::TestWithParam<std::string> {
 protected:
  void SetUp() override { fixture_ = MakeFixture(GetParam()); }
  void TearDown() override {
    if (!fixture_.cleanup.empty()) std::system(("rm -rf " + fixture_.cleanup).c_str());
  }
  StoreFixture fixture_;
};

TEST_P(StoreTest, SetGetDeleteCheck) {
  auto s = fixture_.connect();
  s->Set("a", "1");
  s->Set("b", std::string("\0binary\xff", 8));
  EXPECT_EQ(s->Get("a", 1s), "1");
  EXPECT_EQ(s->Get("b", 1s), std::string("\0binary\xff", 8));
  EXPECT_TRUE(s->Check({"a", "b"}));
  EXPECT_FALSE(s->Check({"a", "c"}));
  EXPECT_TRUE(s->Delete("a"));
  EXPECT_FALSE(s->Delete("a"));
  EXPECT_FALSE(s->Check({"a"}));
  EXPECT_GE(s->NumKeys(), 1);
}

TEST_P(StoreTest, AddCountsAndRejectsNonIntegers) {
  auto s = fixture_.connect();
  EXPECT_EQ(s->Add("n", 1), 1);
  EXPECT_EQ(s->Add("n", 5), 6);
  EXPECT_EQ(s->Add("n", -10), -4);
  s->Set("text", "abc");
  EXPECT_THROW(s->Add("text", 1), InvalidUsage);
  EXPECT_EQ(s->Get("n", 1s), "-4");  // the store survives the bad request
}

TEST_P(StoreTest, AddPastTheInt64RangeIsRefusedAndKeepsTheValue) {
  auto s = fixture_.connect();
  const std::int64_t max = std::numeric_limits<std::int64_t>::max();
  EXPECT_EQ(s->Add("big", max), max);
  try {
    s->Add("big", 1);
    FAIL() << "expected InvalidUsage";
  } catch (const InvalidUsage& e) {
    EXPECT_NE(std::string(e.what()).find("past the int64 range"), std::string::npos) << e.what();
  }
  EXPECT_EQ(s->Add("small", std::numeric_limits<std::int64_t>::min()),
            std::numeric_limits<std::int64_t>::min());
  EXPECT_THROW(s->Add("small", -1), InvalidUsage);
  EXPECT_EQ(s->Get("big", 1s), std::to_string(max));
}

TEST_P(StoreTest, HugeTimeoutWaitsInsteadOfTimingOutAtOnce) {
  auto waiter = fixture_.connect();
  auto setter = fixture_.connect();
  std::thread t([&] {
    std::this_thread::sleep_for(100ms);
    setter->Set("late", "1");
  });
  // 1e13 ms: a deadline past the clock's range, which must not wrap.
  EXPECT_EQ(waiter->Get("late", std::chrono::milliseconds(10'000'000'000'000)), "1");
  t.join();
  EXPECT_THROW(waiter->Get("never", std::chrono::milliseconds(-5)), TimeoutError);
}

TEST_P(StoreTest, CompareSetFollowsC10d) {
  auto s = fixture_.connect();
  EXPECT_EQ(s->CompareSet("k", "", "first"), "first");     // absent, expected ""
  EXPECT_EQ(s->CompareSet("k", "wrong", "x"), "first");    // mismatch
  EXPECT_EQ(s->CompareSet("k", "first", "second"), "second");
  EXPECT_EQ(s->CompareSet("missing", "e", "d"), "e");      // absent, expected set
  EXPECT_FALSE(s->Check({"missing"}));
}

TEST_P(StoreTest, WaitTimesOutNamingMissingKeys) {
  auto s = fixture_.connect();
  s->Set("here", "1");
  const auto start = std::chrono::steady_clock::now();
  try {
    s->Wait({"here", "absent"}, 200ms);
    FAIL() << "expected TimeoutError";
  } catch (const TimeoutError& e) {
    EXPECT_NE(std::string(e.what()).find("absent"), std::string::npos) << e.what();
    EXPECT_EQ(std::string(e.what()).find("here,"), std::string::npos) << e.what();
  }
  EXPECT_GE(std::chrono::steady_clock::now() - start, 200ms);
  EXPECT_THROW(s->Get("absent", 50ms), TimeoutError);
  s->Set("after", "ok");  // the connection still works after a timeout
  EXPECT_EQ(s->Get("after", 1s), "ok");
}

TEST_P(StoreTest, WaitWakesWhenAnotherClientSets) {
  auto waiter = fixture_.connect();
  auto setter = fixture_.connect();
  std::thread t([&] {
    std::this_thread::sleep_for(50ms);
    setter->Set("x", "1");
    setter->Add("y", 2);
  });
  waiter->Wait({"x", "y"}, 10s);
  EXPECT_EQ(waiter->Get("y", 1s), "2");
  t.join();
}

TEST_P(StoreTest, ManyClientsCountTogether) {
  constexpr int kClients = 8;
  constexpr int kAdds = 50;
  std::vector<std::thread> threads;
  for (int c = 0; c < kClients; ++c) {
    threads.emplace_back([&] {
      auto s = fixture_.connect();
      for (int i = 0; i < kAdds; ++i) s->Add("count", 1);
    });
  }
  for (auto& t : threads) t.join();
  EXPECT_EQ(fixture_.connect()->Add("count", 0), kClients * kAdds);
}

INSTANTIATE_TEST_SUITE_P(AllStores, StoreTest,
                         ::testing::Values("hash", "tcp", "file", "prefix"));

TEST(FileStore, SeparateProcessesShareTheFile) {
  char tmpl[] = "/tmp/neuron_file_store_XXXXXX";
  const std::string path = std::string(::mkdtemp(tmpl)) + "/store";
  const pid_t child = ::fork();
  if (child == 0) {
    FileStore store(path);
    store.Wait({"parent"}, 10s);
    store.Set("child", "saw " + store.Get("parent", 1s));
    ::_exit(0);
  }
  FileStore store(path);
  std::this_thread::sleep_for(50ms);
  store.Set("parent", "hello");
  EXPECT_EQ(store.Get("child", 10s), "saw hello");
  int status = 0;
  ::waitpid(child, &status, 0);
  EXPECT_EQ(status, 0);
  // A new opener replays the whole log.
  FileStore late(path);
  EXPECT_EQ(late.Get("child", 1s), "saw hello");
  std::system(("rm -rf " + std::string(tmpl)).c_str());
}

TEST(FileStore, CorruptFileIsReportedNotTrusted) {
  char tmpl[] = "/tmp/neuron_file_store_XXXXXX";
  const std::string path = std::string(::mkdtemp(tmpl)) + "/store";
  {
    FileStore store(path);
    store.Set("k", "value");
  }
  ::truncate(path.c_str(), 9);  // cut the record in the middle
  FileStore store(path);
  try {
    store.Check({"k"});
    FAIL() << "a truncated store file was read";
  } catch (const IoError& e) {
    EXPECT_NE(std::string(e.what()).find("truncated or corrupt"), std::string::npos)
        << e.what();
  }
  std::system(("rm -rf " + std::string(tmpl)).c_str());
}

// A value no reader would accept is refused before anything is written:
// the file stays readable for every other process.
TEST(FileStore, AnOversizedValueIsRefusedNotWritten) {
  char tmpl[] = "/tmp/neuron_file_store_XXXXXX";
  const std::string path = std::string(::mkdtemp(tmpl)) + "/store";
  FileStore store(path, /*max_record_bytes=*/1024);
  store.Set("k", "value");
  struct stat before{};
  ASSERT_EQ(::stat(path.c_str(), &before), 0);
  try {
    store.Set("big", std::string(1025, 'x'));
    FAIL() << "a value over the limit was stored";
  } catch (const InvalidUsage& e) {
    EXPECT_NE(
        std::string(e.what()).find("the 1025-byte value of 'big' exceeds the record "
                                   "limit of 1024 bytes"),
        std::string::npos)
        << e.what();
  }
  try {
    store.Add(std::string(1025, 'k'), 1);
    FAIL() << "a key over the limit was stored";
  } catch (const InvalidUsage& e) {
    EXPECT_NE(std::string(e.what()).find("a 1025-byte key"), std::string::npos)
        << e.what();
  }
  struct stat after{};
  ASSERT_EQ(::stat(path.c_str(), &after), 0);
  EXPECT_EQ(after.st_size, before.st_size);
  FileStore other(path, 1024);
  EXPECT_EQ(other.Get("k", 1s), "value");
  EXPECT_FALSE(other.Check({"big"}));
  std::system(("rm -rf " + std::string(tmpl)).c_str());
}

// A record claiming more than a reader's limit is corruption, reported
// before anything that large is allocated.
TEST(FileStore, ARecordOverTheLimitIsCorruption) {
  char tmpl[] = "/tmp/neuron_file_store_XXXXXX";
  const std::string path = std::string(::mkdtemp(tmpl)) + "/store";
  FileStore(path).Set("k", std::string(2048, 'v'));
  try {
    FileStore(path, 1024).Check({"k"});
    FAIL() << "a record over the limit was read";
  } catch (const IoError& e) {
    EXPECT_NE(std::string(e.what()).find("is corrupt"), std::string::npos) << e.what();
  }
  std::system(("rm -rf " + std::string(tmpl)).c_str());
}

// A write that fails half way (here: the file size limit) leaves no partial
// record, and the writer's cache forgets what it did not write.
TEST(FileStore, AFailedWriteLeavesTheFileWhole) {
  char tmpl[] = "/tmp/neuron_file_store_XXXXXX";
  const std::string path = std::string(::mkdtemp(tmpl)) + "/store";
  {
    FileStore(path).Set("k", "value");
  }
  struct stat before{};
  ASSERT_EQ(::stat(path.c_str(), &before), 0);
  const pid_t child = ::fork();
  if (child == 0) {  // exit code: 1 the write passed, 2 the file is cut, 3 the cache lies
    ::signal(SIGXFSZ, SIG_IGN);
    const rlim_t limit = static_cast<rlim_t>(before.st_size) + 16;
    const rlimit fsize{limit, limit};
    ::setrlimit(RLIMIT_FSIZE, &fsize);
    FileStore store(path);
    try {
      store.Set("long", std::string(100, 'x'));
      ::_exit(1);
    } catch (const IoError&) {
    }
    struct stat now{};
    if (::stat(path.c_str(), &now) != 0 || now.st_size != before.st_size) ::_exit(2);
    ::_exit(store.Check({"long"}) || !store.Check({"k"}) ? 3 : 0);
  }
  int status = 0;
  ASSERT_EQ(::waitpid(child, &status, 0), child);
  ASSERT_TRUE(WIFEXITED(status)) << status;
  EXPECT_EQ(WEXITSTATUS(status), 0);
  FileStore store(path);
  EXPECT_EQ(store.Get("k", 1s), "value");
  store.Set("after", "fine");
  EXPECT_EQ(FileStore(path).Get("after", 1s), "fine");
  std::system(("rm -rf " + std::string(tmpl)).c_str());
}

TEST(PrefixStore, KeysLiveUnderThePrefix) {
  auto base = std::make_shared<HashStore>();
  PrefixStore a("a", base), b("b", base);
  a.Set("k", "from a");
  b.Set("k", "from b");
  EXPECT_EQ(base->Get("a/k", 1s), "from a");
  EXPECT_EQ(b.Get("k", 1s), "from b");
  EXPECT_FALSE(a.Check({"other"}));
}

// Lines the server logged; written on the server's thread.
struct ServerLog {
  std::mutex mutex;
  std::vector<std::string> lines;
  std::vector<std::string> Snapshot() {
    std::lock_guard<std::mutex> lock(mutex);
    return lines;
  }
};

TcpStoreServerOptions QuietServer(ServerLog* log = nullptr) {
  TcpStoreServerOptions o;
  o.secret = kSecret;
  o.log = [log](const std::string& line) {
    if (!log) return;
    std::lock_guard<std::mutex> lock(log->mutex);
    log->lines.push_back(line);
  };
  return o;
}

TEST(TcpStore, WrongSecretIsRefusedAndLogged) {
  ServerLog server_log;
  TcpStoreServer server(QuietServer(&server_log));
  TcpStoreOptions c;
  c.port = server.port();
  c.secret = "not-the-secret";
  try {
    TcpStore client(c);
    FAIL() << "a client with the wrong secret was accepted";
  } catch (const RemoteError& e) {
    EXPECT_NE(std::string(e.what()).find("refused"), std::string::npos) << e.what();
  }
  EXPECT_EQ(server.refused_count(), 1u);
  // The log names the refusal and never the secret.
  const auto log = server_log.Snapshot();
  ASSERT_FALSE(log.empty());
  EXPECT_NE(log[0].find("authentication failed"), std::string::npos) << log[0];
  for (const auto& line : log) EXPECT_EQ(line.find(kSecret), std::string::npos);
  // An honest client still gets in.
  c.secret = kSecret;
  TcpStore good(c);
  good.Set("k", "v");
  EXPECT_EQ(good.Get("k", 1s), "v");
}

TEST(TcpStore, ClientRejectsAServerWithoutTheSecret) {
  TcpStoreServerOptions o = QuietServer();
  o.secret = "server-secret";
  TcpStoreServer server(o);
  TcpStoreOptions c;
  c.port = server.port();
  c.secret = "client-secret";
  EXPECT_THROW(TcpStore client(c), RemoteError);
}

TEST(TcpStore, SetOnCloseFiresWhenTheClientGoes) {
  TcpStoreServer server(QuietServer());
  TcpStoreOptions c;
  c.port = server.port();
  c.secret = kSecret;
  TcpStore watcher(c);
  {
    TcpStore agent(c);
    agent.SetOnClose("lost", "agent 1");
  }
  EXPECT_EQ(watcher.Get("lost", 5s), "agent 1");
  {
    TcpStore agent(c);
    agent.SetOnClose("lost2", "x");
    agent.ClearOnClose();
  }
  std::this_thread::sleep_for(100ms);
  EXPECT_FALSE(watcher.Check({"lost2"}));
}

TEST(TcpStore, ClientDyingDuringAWaitFiresItsCloseActionsAtOnce) {
  // The agent-lost signal: a client parked in a long wait is killed.
  TcpStoreServer server(QuietServer());
  const pid_t child = ::fork();
  if (child == 0) {
    TcpStoreOptions c;
    c.port = server.port();
    c.secret = kSecret;
    TcpStore agent(c);
    agent.SetOnClose("lost", "agent 7");
    agent.Set("parked", "");
    agent.Wait({"never"}, std::chrono::hours(1));
    ::_exit(0);
  }
  TcpStoreOptions c;
  c.port = server.port();
  c.secret = kSecret;
  TcpStore watcher(c);
  watcher.Wait({"parked"}, 10s);
  std::this_thread::sleep_for(50ms);
  ::kill(child, SIGKILL);
  ::waitpid(child, nullptr, 0);
  const auto start = std::chrono::steady_clock::now();
  EXPECT_EQ(watcher.Get("lost", 5s), "agent 7");
  EXPECT_LT(std::chrono::steady_clock::now() - start, 2s);
}

TEST(TcpStore, PortInUseIsAClearError) {
  TcpStoreServer first(QuietServer());
  TcpStoreServerOptions o = QuietServer();
  o.port = first.port();
  try {
    TcpStoreServer second(o);
    FAIL() << "bound a port that is in use";
  } catch (const IoError& e) {
    EXPECT_NE(std::string(e.what()).find("already in use"), std::string::npos) << e.what();
  }
}

TEST(TcpStore, ServerThatNeverAnswersTimesOut) {
  std::uint16_t port;
  {
    TcpStoreServer gone(QuietServer());
    port = gone.port();
  }
  TcpStoreOptions c;
  c.port = port;
  c.secret = kSecret;
  c.connect_timeout = 300ms;
  EXPECT_THROW(TcpStore client(c), TimeoutError);
}

TEST(TcpStore, LostServerIsAnIoError) {
  auto server = std::make_unique<TcpStoreServer>(QuietServer());
  TcpStoreOptions c;
  c.port = server->port();
  c.secret = kSecret;
  TcpStore client(c);
  client.Set("k", "v");
  server.reset();
  EXPECT_THROW(client.Set("k", "again"), IoError);
  EXPECT_THROW(client.Get("k", 1s), IoError);  // and stays failed, fast
}

}  // namespace
}  // namespace neuron::collectives
