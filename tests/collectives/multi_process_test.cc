// The collectives with one process per rank (tests/helpers/cc_rank): a peer
// that is stopped (SIGSTOP) makes the others time out naming it; a peer that
// is killed makes them fail fast naming it; no shared memory is left behind.
#include <gtest/gtest.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <fstream>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "neuron/collectives/store/file_store.h"
#include "shm_segments.h"

namespace {

using Clock = std::chrono::steady_clock;

struct Rank {
  pid_t pid = -1;
  std::string output;  // file with its stdout
  int status = -1;
};

std::string Read(const std::string& path) {
  std::ifstream in(path);
  std::stringstream s;
  s << in.rdbuf();
  return s.str();
}

class Job {
 public:
  // `mode`: "" or "registered" (cc_rank's last argument).
  Job(int size, int timeout_ms, const std::string& mode = "") : dir_(MakeDir()) {
    const std::string store = dir_ + "/store";
    for (int r = 0; r < size; ++r) {
      Rank rank;
      rank.output = dir_ + "/rank" + std::to_string(r);
      rank.pid = ::fork();
      if (rank.pid == 0) {
        std::freopen(rank.output.c_str(), "w", stdout);
        const std::string rs = std::to_string(r), ss = std::to_string(size),
                          ts = std::to_string(timeout_ms);
        ::execl(CC_RANK_PATH, CC_RANK_PATH, store.c_str(), rs.c_str(), ss.c_str(),
                ts.c_str(), mode.empty() ? static_cast<char*>(nullptr) : mode.c_str(),
                static_cast<char*>(nullptr));
        ::_exit(127);
      }
      ranks_.push_back(rank);
    }
  }
  ~Job() {
    for (auto& r : ranks_) {
      if (r.status == -1) {
        ::kill(r.pid, SIGKILL);
        ::waitpid(r.pid, nullptr, 0);
      }
    }
    std::system(("rm -rf " + dir_).c_str());
  }
  bool AllReady(std::chrono::seconds within) {
    const auto end = Clock::now() + within;
    while (Clock::now() < end) {
      bool all = true;
      for (auto& r : ranks_)
        all = all && Read(r.output).find("ready") != std::string::npos;
      if (all) return true;
      std::this_thread::sleep_for(std::chrono::milliseconds(20));
    }
    return false;
  }
  // Waits for rank `r` to exit; false after `within`.
  bool Reap(int r, std::chrono::seconds within) {
    const auto end = Clock::now() + within;
    while (Clock::now() < end) {
      if (::waitpid(ranks_[r].pid, &ranks_[r].status, WNOHANG) == ranks_[r].pid)
        return true;
      std::this_thread::sleep_for(std::chrono::milliseconds(10));
    }
    return false;
  }
  Rank& operator[](int r) { return ranks_[r]; }

  std::string store_path() const { return dir_ + "/store"; }

 private:
  static std::string MakeDir() {
    char tmpl[] = "/tmp/cc_multi_process.XXXXXX";
    return ::mkdtemp(tmpl);
  }
  std::string dir_;
  std::vector<Rank> ranks_;
};

// The job's shared-memory segments in /dev/shm (named by the uid its
// ranks agreed on in their store; segments of tests running alongside do
// not count).
// (The collectives' transport and the point-to-point channel's.)
int NeuronSegments(const std::string& store_path) {
  neuron::collectives::FileStore store(store_path);
  std::vector<std::string> uids;
  for (const char* key : {"shm/uid", "p2p/shm/uid"}) {
    uids.push_back(store.Get(key, std::chrono::seconds(5)));
  }
  return neuron::collectives::testing::ShmSegments(uids);
}

TEST(MultiProcess, AStoppedPeerMakesTheOthersTimeOutNamingIt) {
  Job job(3, 1500);
  ASSERT_TRUE(job.AllReady(std::chrono::seconds(30)));
  std::this_thread::sleep_for(std::chrono::milliseconds(100));
  ::kill(job[2].pid, SIGSTOP);
  const auto stopped = Clock::now();
  int timeouts_naming_it = 0;
  for (int r : {0, 1}) {
    ASSERT_TRUE(job.Reap(r, std::chrono::seconds(20)))
        << "rank " << r << " still running";
    const std::string out = Read(job[r].output);
    EXPECT_EQ(WEXITSTATUS(job[r].status), 3) << out;
    if (out.find("error TimeoutError") != std::string::npos &&
        out.find("have not arrived: 2") != std::string::npos) {
      ++timeouts_naming_it;
    } else {
      // The first to time out aborts the group: the other learns why.
      EXPECT_NE(out.find("error RemoteError"), std::string::npos) << out;
    }
  }
  EXPECT_GE(timeouts_naming_it, 1);
  EXPECT_LT(Clock::now() - stopped, std::chrono::seconds(10));
  ::kill(job[2].pid, SIGKILL);
  ASSERT_TRUE(job.Reap(2, std::chrono::seconds(10)));
}

// The same with registered buffers: each rank's allreduce works in place
// on the others' memory (mapped through /proc), and cc_rank checks that it
// did until the kill.
class KilledPeer : public ::testing::TestWithParam<std::string> {};

INSTANTIATE_TEST_SUITE_P(Buffers, KilledPeer, ::testing::Values("", "registered"),
                         [](const auto& info) {
                           return info.param.empty() ? std::string("ordinary") : info.param;
                         });

TEST_P(KilledPeer, MakesTheOthersFailFastAndLeavesNoSharedMemory) {
  Job job(3, 60000, GetParam());
  ASSERT_TRUE(job.AllReady(std::chrono::seconds(30)));
  std::this_thread::sleep_for(std::chrono::milliseconds(100));
  ::kill(job[1].pid, SIGKILL);
  const auto killed = Clock::now();
  for (int r : {0, 2}) {
    ASSERT_TRUE(job.Reap(r, std::chrono::seconds(20)))
        << "rank " << r << " still running";
    const std::string out = Read(job[r].output);
    EXPECT_EQ(WEXITSTATUS(job[r].status), 3) << out;
    const bool names_it = out.find("rank 1 (pid " + std::to_string(job[1].pid) +
                                   ") died") != std::string::npos;
    EXPECT_TRUE(names_it || out.find("error RemoteError") != std::string::npos) << out;
  }
  // Well within the 60 s timeout: the death is seen, not waited out.
  EXPECT_LT(Clock::now() - killed, std::chrono::seconds(10));
  ASSERT_TRUE(job.Reap(1, std::chrono::seconds(10)));
  EXPECT_EQ(NeuronSegments(job.store_path()), 0);
}

}  // namespace
