#include "neuron/collectives/transport/shm_transport.h"

#include <gtest/gtest.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <mutex>
#include <numeric>
#include <thread>

#include "neuron/collectives/store/file_store.h"
#include "neuron/runtime/error.h"
#include "rank_threads.h"
#include "shm_segments.h"
#include "transport_checks.h"

namespace neuron::collectives::transport {
namespace {

using namespace std::chrono_literals;
using collectives::testing::RunRanks;
using collectives::testing::ShmSegments;  // segments left in /dev/shm, by store uid
using testing::ExchangeWithEveryRank;

// Every rank sends to every rank (itself included) messages of several sizes,
// bigger than the ring, so flow control and wrap-around are exercised.
TEST(ShmTransport, AllPairsStreamsArriveIntact) {
  std::vector<std::string> uids;
  std::mutex mu;
  for (int size : {1, 2, 3, 5}) {
    RunRanks(size, [&, size](int rank, Store& store) {
      ShmTransport t(store, rank, size, {.ring_bytes = 4096});
      if (rank == 0) {
        std::lock_guard<std::mutex> lock(mu);
        uids.push_back(store.Get("shm/uid", 30s));
      }
      ExchangeWithEveryRank(t, rank, size, {0, 1, 4097, 100003}, 30s);
    });
  }
  ASSERT_EQ(uids.size(), 4u);
  for (const auto& uid : uids) EXPECT_EQ(ShmSegments({uid}), 0) << "segments left in /dev/shm";
}

TEST(ShmTransport, MessagesToOnePeerKeepTheirOrder) {
  RunRanks(2, [](int rank, Store& store) {
    ShmTransport t(store, rank, 2, {.ring_bytes = 4096});
    constexpr int kMessages = 50;
    std::vector<std::vector<int>> buffers(kMessages, std::vector<int>(333));
    std::vector<RequestId> ids;
    for (int m = 0; m < kMessages; ++m) {
      if (rank == 0) {
        std::iota(buffers[m].begin(), buffers[m].end(), m * 1000);
        ids.push_back(t.Isend(1, buffers[m].data(), buffers[m].size() * sizeof(int)));
      } else {
        ids.push_back(t.Irecv(0, buffers[m].data(), buffers[m].size() * sizeof(int)));
      }
    }
    t.Wait(ids, Deadline::After(30s), "order test");
    if (rank == 1) {
      for (int m = 0; m < kMessages; ++m) ASSERT_EQ(buffers[m][5], m * 1000 + 5);
    }
  });
}

// Phases ring only sleeping peers (a fence on each side: Dekker). A ping-
// pong in which every wake-up matters: rank 1 sleeps (no spinning) until
// rank 0 raises phase 1 to i, then raises phase 2 to i, for which rank 0
// sleeps; nothing else is published meanwhile. With no periodic check
// before the deadline, one lost wake-up leaves both asleep until it: a
// TimeoutError fails the test.
TEST(ShmTransport, NoWakeUpIsLostBetweenPublishAndSleep) {
  constexpr int kRounds = 3000;
  RunRanks(2, [&](int rank, Store& store) {
    ShmOptions o;
    o.spin_time = 0us;
    o.check_interval = std::chrono::hours(1);
    ShmTransport t(store, rank, 2, o);
    // A wait covers every rank's counter: each rank's own counter of the
    // phase it waits for is set out of the way first.
    t.PublishPhase(rank == 0 ? 2 : 1, kRounds);
    for (int i = 1; i <= kRounds; ++i) {
      if (rank == 0) {
        t.PublishPhase(1, i);
        t.WaitPhase(2, i, Deadline::After(30s), "pong");
      } else {
        t.WaitPhase(1, i, Deadline::After(30s), "ping");
        t.PublishPhase(2, i);
      }
    }
  });
}

TEST(ShmTransport, TimeoutNamesThePendingPeer) {
  try {
    RunRanks(2, [](int rank, Store& store) {
      ShmTransport t(store, rank, 2);
      if (rank == 0) {
        char byte;
        t.Wait({t.Irecv(1, &byte, 1)}, Deadline::After(200ms), "allreduce #7");
      }
    });
    FAIL() << "expected a timeout";
  } catch (const TimeoutError& e) {
    EXPECT_NE(std::string(e.what()).find("allreduce #7 on rank 0 timed out; still pending: "
                                         "receive from rank 1 (0 of 1 bytes)"),
              std::string::npos)
        << e.what();
  }
}

TEST(ShmTransport, AFailedWaitLeavesTheTransportUnusable) {
  // The timed-out receive pointed at a buffer that is gone; nothing may
  // write into it later, and the stream is out of step for good.
  RunRanks(2, [](int rank, Store& store) {
    ShmTransport t(store, rank, 2);
    if (rank == 0) {
      {
        char gone;
        EXPECT_THROW(t.Wait({t.Irecv(1, &gone, 1)}, Deadline::After(100ms), "op"), TimeoutError);
      }
      char byte;
      try {
        t.Irecv(1, &byte, 1);
        FAIL() << "a broken transport accepted a request";
      } catch (const IoError& e) {
        EXPECT_NE(std::string(e.what()).find("unusable after an earlier failure"),
                  std::string::npos)
            << e.what();
      }
    }
  });
}

TEST(ShmTransport, RanksWithDifferentSizesAreRefused) {
  // The rank that maps a peer of another size names the problem; the other
  // may only see the segment vanish.
  std::vector<std::string> errors(2);
  RunRanks(2, [&](int rank, Store& store) {
    ShmOptions o;
    o.ring_bytes = rank == 0 ? 4096 : 8192;
    o.setup_timeout = 5s;
    try {
      ShmTransport t(store, rank, 2, o);
    } catch (const Error& e) {
      errors[rank] = e.what();
    }
  });
  EXPECT_TRUE(errors[0].find("different ring or window sizes") != std::string::npos ||
              errors[1].find("different ring or window sizes") != std::string::npos)
      << errors[0] << " | " << errors[1];
}

TEST(ShmTransport, AbortReachesAWaitingPeer) {
  try {
    RunRanks(3, [](int rank, Store& store) {
      ShmTransport t(store, rank, 3);
      store.Set("ready/" + std::to_string(rank), "");
      store.Wait({"ready/0", "ready/1", "ready/2"});
      if (rank == 2) {
        t.Abort("rank 2 found a size mismatch");
        return;
      }
      char byte;
      t.Wait({t.Irecv(2, &byte, 1)}, Deadline::After(30s), "broadcast #1");
    });
    FAIL() << "expected RemoteError";
  } catch (const RemoteError& e) {
    EXPECT_NE(std::string(e.what()).find("aborted: rank 2 found a size mismatch"),
              std::string::npos)
        << e.what();
  }
}

TEST(ShmTransport, DeadPeerIsNamedWithinTheCheckInterval) {
  char tmpl[] = "/tmp/neuron_shm_test_XXXXXX";
  const std::string path = std::string(::mkdtemp(tmpl)) + "/store";
  const pid_t child = ::fork();
  if (child == 0) {
    FileStore store(path);
    ShmTransport t(store, 1, 2);
    ::_exit(0);  // dies without ever sending
  }
  FileStore store(path);
  ShmTransport t(store, 0, 2);
  const auto start = std::chrono::steady_clock::now();
  char byte;
  try {
    t.Wait({t.Irecv(1, &byte, 1)}, Deadline::After(30s), "barrier #2");
    FAIL() << "expected IoError";
  } catch (const IoError& e) {
    EXPECT_NE(std::string(e.what()).find("barrier #2: rank 1 (pid " + std::to_string(child) +
                                         ") died"),
              std::string::npos)
        << e.what();
  }
  EXPECT_LT(std::chrono::steady_clock::now() - start, 5s);
  ::waitpid(child, nullptr, 0);
  const std::string uid = store.Get("shm/uid", 5s);
  std::system(("rm -rf " + std::string(tmpl)).c_str());
  EXPECT_EQ(ShmSegments({uid}), 0);
}

// In a group of a larger job (a node's ranks 2 and 3 of a two-node job),
// the dead member is named by its job rank with its own pid.
TEST(ShmTransport, DeadMemberOfASubgroupIsNamedByItsJobRank) {
  char tmpl[] = "/tmp/neuron_shm_test_XXXXXX";
  const std::string path = std::string(::mkdtemp(tmpl)) + "/store";
  ShmOptions options;
  options.global_ranks = {2, 3};
  const pid_t child = ::fork();
  if (child == 0) {
    FileStore store(path);
    ShmTransport t(store, 1, 2, options);
    ::_exit(0);
  }
  FileStore store(path);
  ShmTransport t(store, 0, 2, options);
  char byte;
  try {
    t.Wait({t.Irecv(1, &byte, 1)}, Deadline::After(30s), "allreduce #4");
    FAIL() << "expected IoError";
  } catch (const IoError& e) {
    EXPECT_NE(std::string(e.what()).find("allreduce #4: rank 3 (member 1 of this group, pid " +
                                         std::to_string(child) +
                                         ") died; rank 2 (member 0 of this group) was waiting"),
              std::string::npos)
        << e.what();
  }
  ::waitpid(child, nullptr, 0);
  std::system(("rm -rf " + std::string(tmpl)).c_str());
}

// A store through which a rank dies as it is about to say it has mapped
// every segment: the setup's last step.
class DiesBeforeSayingMapped : public FileStore {
 public:
  using FileStore::FileStore;
  void Set(const std::string& key, const std::string& value) override {
    if (key.rfind("shm/mapped/", 0) == 0) ::_exit(7);
    FileStore::Set(key, value);
  }
};

// A peer that dies in the setup is named at once (not at the 30 s setup
// timeout), and its segment, whose name only a finished setup unlinks, is
// removed with the survivor's own.
TEST(ShmTransport, APeerDyingInTheSetupIsNamedAndLeavesNoSegment) {
  char tmpl[] = "/tmp/neuron_shm_test_XXXXXX";
  const std::string path = std::string(::mkdtemp(tmpl)) + "/store";
  ShmOptions options;
  options.setup_timeout = 30s;
  const pid_t child = ::fork();
  if (child == 0) {
    DiesBeforeSayingMapped store(path);
    ShmTransport t(store, 1, 2, options);
    ::_exit(0);
  }
  FileStore store(path);
  const auto start = std::chrono::steady_clock::now();
  try {
    ShmTransport t(store, 0, 2, options);
    FAIL() << "the setup ended without rank 1";
  } catch (const IoError& e) {
    EXPECT_NE(std::string(e.what()).find("rank 1 (pid " + std::to_string(child) +
                                         ") died before it had mapped every segment"),
              std::string::npos)
        << e.what();
  }
  EXPECT_LT(std::chrono::steady_clock::now() - start, 10s);
  int status = 0;
  ::waitpid(child, &status, 0);
  EXPECT_EQ(WEXITSTATUS(status), 7);
  const std::string uid = store.Get("shm/uid", 5s);
  std::system(("rm -rf " + std::string(tmpl)).c_str());
  EXPECT_EQ(ShmSegments({uid}), 0);
}

// Rank 2 never comes, so ranks 0 and 1 wait in the setup with their
// segments made; rank 1 is killed there. Rank 0 fails at its setup timeout
// and removes the dead rank's segment with its own: nothing stays in
// /dev/shm (only a finished setup unlinks the names).
TEST(ShmTransport, ARankKilledInTheSetupLeavesNoSegment) {
  char tmpl[] = "/tmp/neuron_shm_test_XXXXXX";
  const std::string path = std::string(::mkdtemp(tmpl)) + "/store";
  ShmOptions options;
  options.setup_timeout = 3s;
  const pid_t child = ::fork();
  if (child == 0) {
    FileStore store(path);
    ShmTransport t(store, 1, 3, options);
    ::_exit(0);
  }
  FileStore store(path);
  std::thread killer([&] {
    FileStore watcher(path);
    watcher.Wait({"shm/ready/1"}, 30s);  // its segment is made and carries its pid
    ::kill(child, SIGKILL);
  });
  try {
    ShmTransport t(store, 0, 3, options);
    ADD_FAILURE() << "the setup ended without rank 2";
  } catch (const TimeoutError& e) {
    EXPECT_NE(std::string(e.what()).find("shm/ready/2"), std::string::npos) << e.what();
  }
  killer.join();
  ::waitpid(child, nullptr, 0);
  const std::string uid = store.Get("shm/uid", 5s);
  std::system(("rm -rf " + std::string(tmpl)).c_str());
  EXPECT_EQ(ShmSegments({uid}), 0);
}

TEST(ShmTransport, BadArgumentsAreRejected) {
  HashStore store;
  EXPECT_THROW(ShmTransport(store, 2, 2), InvalidUsage);
  EXPECT_THROW(ShmTransport(store, 0, 1, {.ring_bytes = 1000}), InvalidUsage);
  ShmTransport t(store, 0, 1);
  char b;
  EXPECT_THROW(t.Isend(1, &b, 1), InvalidUsage);
}

}  // namespace
}  // namespace neuron::collectives::transport
