#include "neuron/collectives/transport/tcp_transport.h"

#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <gtest/gtest.h>

#include <memory>
#include <thread>

#include "neuron/collectives/store/file_store.h"
#include "neuron/runtime/error.h"
#include "rank_threads.h"
#include "transport_checks.h"

namespace neuron::collectives::transport {
namespace {

using namespace std::chrono_literals;
using collectives::testing::RunRanks;
using testing::ExchangeWithEveryRank;

TEST(TcpTransport, AllPairsStreamsArriveIntact) {
  for (int size : {1, 2, 3, 5}) {
    RunRanks(size, [size](int rank, Store& store) {
      TcpTransport t(store, rank, size);
      // 8 MiB outruns the socket buffers, so sends really wait for receives.
      ExchangeWithEveryRank(t, rank, size, {0, 1, 100003, std::size_t{8} << 20}, 60s);
    });
  }
}

TEST(TcpTransport, StrangersCannotJoinAStream) {
  RunRanks(2, [](int rank, Store& store) {
    if (rank == 1) {
      // Before connecting as rank 1, an intruder knocks with a wrong token.
      const std::string endpoint = store.Get("tcp/addr/0", 10s);
      const auto colon = endpoint.rfind(':');
      sockaddr_in addr{};
      addr.sin_family = AF_INET;
      addr.sin_port = htons(static_cast<std::uint16_t>(std::stoi(endpoint.substr(colon + 1))));
      ::inet_pton(AF_INET, endpoint.substr(0, colon).c_str(), &addr.sin_addr);
      const int fd = ::socket(AF_INET, SOCK_STREAM, 0);
      ASSERT_EQ(::connect(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)), 0);
      const char garbage[36] = {1, 0, 0, 0, 'n', 'o', 't', 'o', 'k'};
      ASSERT_EQ(::send(fd, garbage, sizeof(garbage), 0), static_cast<ssize_t>(sizeof(garbage)));
      std::this_thread::sleep_for(50ms);
      ::close(fd);
    }
    TcpTransport t(store, rank, 2);
    int value = rank == 0 ? 42 : 0;
    const auto id = rank == 0 ? t.Isend(1, &value, sizeof(value)) : t.Irecv(0, &value, sizeof(value));
    t.Wait({id}, Deadline::After(10s), "intruder test");
    EXPECT_EQ(value, 42);
  });
}

// With the job's secret (a store that is not authenticated, as torchrun's),
// the store holds a nonce and no token; the ranks connect with the token
// derived from it, and a member with another secret is refused.
TEST(TcpTransport, WithASecretTheStoreHoldsNoToken) {
  RunRanks(2, [](int rank, Store& store) {
    TcpOptions options;
    options.secret = "a-job-secret-of-32-bytes-or-so..";
    TcpTransport t(store, rank, 2, options);
    int value = rank == 0 ? 42 : 0;
    const auto id = rank == 0 ? t.Isend(1, &value, sizeof(value)) : t.Irecv(0, &value, sizeof(value));
    t.Wait({id}, Deadline::After(10s), "secret test");
    EXPECT_EQ(value, 42);
    EXPECT_TRUE(store.Check({"tcp/nonce"}));
    EXPECT_FALSE(store.Check({"tcp/token"}));
  });
  try {
    RunRanks(2, [](int rank, Store& store) {
      TcpOptions options;
      options.secret = rank == 0 ? "the-right-secret-for-this-job..." : "a-wrong-secret-of-the-same-size.";
      options.setup_timeout = 2s;
      TcpTransport t(store, rank, 2, options);
    });
    FAIL() << "a member with another secret connected";
  } catch (const Error& e) {
    SUCCEED() << e.what();
  }
}

// A connection that never says hello holds up nobody: rank 0 reads the
// hellos side by side, so rank 1, connecting after it, is in at once (not
// after the 30 s setup timeout) while the silent one stays open.
TEST(TcpTransport, ASilentConnectionDoesNotStallTheSetup) {
  int silent = -1;
  RunRanks(2, [&silent](int rank, Store& store) {
    TcpOptions options;
    options.setup_timeout = 30s;
    if (rank == 1) {
      const std::string endpoint = store.Get("tcp/addr/0", 10s);
      const auto colon = endpoint.rfind(':');
      sockaddr_in addr{};
      addr.sin_family = AF_INET;
      addr.sin_port =
          htons(static_cast<std::uint16_t>(std::stoi(endpoint.substr(colon + 1))));
      ::inet_pton(AF_INET, endpoint.substr(0, colon).c_str(), &addr.sin_addr);
      silent = ::socket(AF_INET, SOCK_STREAM, 0);
      ASSERT_EQ(::connect(silent, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)), 0);
      std::this_thread::sleep_for(100ms);  // rank 0 has accepted it
    }
    const auto start = std::chrono::steady_clock::now();
    TcpTransport t(store, rank, 2, options);
    EXPECT_LT(std::chrono::steady_clock::now() - start, 10s) << "rank " << rank;
    int value = rank == 0 ? 42 : 0;
    const auto id =
        rank == 0 ? t.Isend(1, &value, sizeof(value)) : t.Irecv(0, &value, sizeof(value));
    t.Wait({id}, Deadline::After(10s), "silent connection test");
    EXPECT_EQ(value, 42);
  });
  ::close(silent);
}

TEST(TcpTransport, DeadPeerIsNamed) {
  char tmpl[] = "/tmp/neuron_tcp_test_XXXXXX";
  const std::string path = std::string(::mkdtemp(tmpl)) + "/store";
  const pid_t child = ::fork();
  if (child == 0) {
    FileStore store(path);
    TcpTransport t(store, 1, 2);
    ::_exit(0);  // dies without sending
  }
  FileStore store(path);
  TcpTransport t(store, 0, 2);
  char byte;
  try {
    t.Wait({t.Irecv(1, &byte, 1)}, Deadline::After(30s), "allgather #4");
    FAIL() << "expected IoError";
  } catch (const IoError& e) {
    EXPECT_NE(std::string(e.what()).find("allgather #4: rank 1 closed its connection"),
              std::string::npos)
        << e.what();
  }
  ::waitpid(child, nullptr, 0);
  std::system(("rm -rf " + std::string(tmpl)).c_str());
}

// Rank 2 goes; rank 1, its receiver, sees it and gives up; rank 0, which
// waits on rank 1, must name rank 2, not rank 1 whose stream ended after.
TEST(TcpTransport, EverySurvivorNamesThePeerThatWent) {
  std::string errors[2];
  RunRanks(3, [&](int rank, Store& store) {
    auto t = std::make_unique<TcpTransport>(store, rank, 3);
    if (rank == 2) return;  // its sockets close: gone
    char byte;
    try {
      t->Wait({t->Irecv(rank + 1, &byte, 1)}, Deadline::After(30s), "allreduce #3");
    } catch (const Error& e) {
      errors[rank] = e.what();
    }
  });
  EXPECT_NE(errors[1].find("allreduce #3: rank 2 closed its connection"), std::string::npos)
      << errors[1];
  EXPECT_NE(errors[0].find("aborted: rank 2 closed its connection"), std::string::npos)
      << errors[0];
  EXPECT_EQ(errors[0].find("rank 1 closed"), std::string::npos) << errors[0];
}

TEST(TcpTransport, AbortCarriesItsReason) {
  try {
    RunRanks(3, [](int rank, Store& store) {
      TcpTransport t(store, rank, 3);
      if (rank == 2) {
        t.Abort("rank 2 saw a dtype mismatch");
        return;
      }
      char byte;
      t.Wait({t.Irecv(2, &byte, 1)}, Deadline::After(30s), "broadcast #9");
    });
    FAIL() << "expected RemoteError";
  } catch (const RemoteError& e) {
    EXPECT_NE(std::string(e.what()).find("aborted: rank 2 saw a dtype mismatch"),
              std::string::npos)
        << e.what();
  }
}

TEST(TcpTransport, TimeoutNamesThePendingPeer) {
  try {
    RunRanks(2, [](int rank, Store& store) {
      TcpTransport t(store, rank, 2);
      if (rank == 0) {
        char byte;
        t.Wait({t.Irecv(1, &byte, 1)}, Deadline::After(200ms), "reduce #2");
      } else {
        std::this_thread::sleep_for(400ms);  // keep the connection open
      }
    });
    FAIL() << "expected a timeout";
  } catch (const TimeoutError& e) {
    EXPECT_NE(std::string(e.what()).find("reduce #2 on rank 0 timed out; still pending: "
                                         "receive from rank 1 (0 of 1 bytes)"),
              std::string::npos)
        << e.what();
  }
}

}  // namespace
}  // namespace neuron::collectives::transport
