#include "rank_group.h"

#include <fcntl.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <array>
#include <cerrno>
#include <cstring>
#include <filesystem>

#include "neuron/runtime/error.h"
#include "neuron/runtime/files.h"

namespace neuron::launcher {

namespace asio = boost::asio;

namespace {

// Writes all of `data` to `fd`; a closed console (EPIPE) is not an error the
// job should die of, so write errors end the attempt silently.
void WriteAll(int fd, const std::string& data) {
  std::size_t done = 0;
  while (done < data.size()) {
    const ssize_t n = ::write(fd, data.data() + done, data.size() - done);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) return;
    done += static_cast<std::size_t>(n);
  }
}

// A log file's descriptor, closed with it.
struct LogFile {
  LogFile() = default;
  LogFile(const LogFile&) = delete;
  LogFile& operator=(const LogFile&) = delete;
  ~LogFile() {
    if (fd >= 0) ::close(fd);
  }
  int fd = -1;
};

// How long a rank's pipes may stay open after it exited (held by a
// grandchild) before neuronrun kills its process group and stops reading.
constexpr std::chrono::milliseconds kDrainTimeout(1000);

}  // namespace

struct RankGroup::Rank {
  Rank(asio::io_context& io, RankLaunch l)
      : launch(std::move(l)), out(io), err(io), drain_timer(io), status(io) {}

  RankLaunch launch;
  pid_t pid = -1;
  asio::posix::stream_descriptor out;
  asio::posix::stream_descriptor err;
  std::unique_ptr<LineSplitter> out_lines;
  std::unique_ptr<LineSplitter> err_lines;
  std::array<char, 65536> out_buffer{};
  std::array<char, 65536> err_buffer{};
  LogFile out_file;  // --log-dir's rank_G.stdout
  LogFile err_file;
  std::deque<std::string> tail;
  asio::steady_timer drain_timer;
  // A shared zygote's rank (not our child): its wait status comes here.
  asio::posix::stream_descriptor status;
  std::array<char, sizeof(int)> status_buffer{};
  bool exited = false;
  bool finished = false;   // exited and drained
  bool delivered = false;  // on_exit has seen it
  bool killed_by_us = false;
  int wait_status = 0;
  std::string prefix;
  // What torch.distributed's excepthook puts before each line of an uncaught
  // exception's traceback ("[rank3]: "): dropped on the console and in the
  // failure summary, which say the rank already.
  std::string torch_prefix;
};

RankGroup::RankGroup(asio::io_context& io, ProcessGuard& guard, OutputOptions output,
                     std::vector<RankLaunch> ranks, ExitCallback on_exit, Spawner spawn)
    : io_(io), guard_(guard), output_(std::move(output)), on_exit_(std::move(on_exit)),
      spawn_(std::move(spawn)), kill_timer_(io) {
  for (auto& launch : ranks) {
    ranks_.push_back(std::make_unique<Rank>(io_, std::move(launch)));
  }
}

RankGroup::~RankGroup() {
  // Whatever happened, no rank outlives its group.
  for (auto& rank : ranks_) {
    if (rank->pid > 0 && !rank->exited) {
      ::kill(-rank->pid, SIGKILL);
      // Not our child (a shared zygote's): its keeper reaps it.
      if (!rank->status.is_open()) ::waitpid(rank->pid, nullptr, 0);
    }
    if (rank->pid > 0 && !rank->finished) guard_.Unregister(rank->pid);
  }
}

void RankGroup::Start() {
  if (!output_.log_dir.empty()) std::filesystem::create_directories(output_.log_dir);
  for (auto& rank : ranks_) {
    const auto g = rank->launch.global_rank;
    rank->prefix = "[rank " + std::to_string(g) + "]: ";
    rank->torch_prefix = "[rank" + std::to_string(g) + "]: ";
    if (!output_.log_dir.empty()) {
      const std::string base = output_.log_dir + "/rank_" + std::to_string(g);
      // A planted link is an IoError naming it, never followed.
      rank->out_file.fd = runtime::OpenForWriting(base + ".stdout", "log file", O_TRUNC);
      rank->err_file.fd = runtime::OpenForWriting(base + ".stderr", "log file", O_TRUNC);
    }
    Rank* r = rank.get();
    rank->out_lines = std::make_unique<LineSplitter>(
        [this, r](std::string_view line) { OnLine(*r, false, line); });
    rank->err_lines = std::make_unique<LineSplitter>(
        [this, r](std::string_view line) { OnLine(*r, true, line); });
    SpawnedChild child;
    try {
      child = spawn_(rank->launch.spawn);
    } catch (const Error&) {
      Kill();
      throw;
    }
    rank->pid = child.pid;
    guard_.Register(child.pid);
    rank->out.assign(child.stdout_fd);
    rank->err.assign(child.stderr_fd);
    StartReading(*rank, false);
    StartReading(*rank, true);
    if (child.status_fd >= 0) AwaitStatus(*rank, child.status_fd);
  }
}

void RankGroup::StartReading(Rank& rank, bool is_stderr) {
  auto& pipe = is_stderr ? rank.err : rank.out;
  auto& buffer = is_stderr ? rank.err_buffer : rank.out_buffer;
  Rank* r = &rank;
  pipe.async_read_some(
      asio::buffer(buffer),
      [this, r, is_stderr](const boost::system::error_code& ec, std::size_t n) {
        auto& splitter = is_stderr ? *r->err_lines : *r->out_lines;
        auto& p = is_stderr ? r->err : r->out;
        if (n > 0) {
          splitter.Feed(std::string_view((is_stderr ? r->err_buffer : r->out_buffer).data(), n));
          FlushConsole();
        }
        if (ec || n == 0) {
          if (ec == asio::error::operation_aborted && !p.is_open()) return;
          splitter.Finish();
          FlushConsole();
          boost::system::error_code ignored;
          p.close(ignored);
          MaybeFinish(*r);
          return;
        }
        StartReading(*r, is_stderr);
      });
}

void RankGroup::OnLine(Rank& rank, bool is_stderr, std::string_view raw) {
  std::string_view line = raw;
  if (is_stderr && line.substr(0, rank.torch_prefix.size()) == rank.torch_prefix) {
    line.remove_prefix(rank.torch_prefix.size());
  }
  if (is_stderr) {
    rank.tail.emplace_back(line);
    if (rank.tail.size() > output_.tail_lines) rank.tail.pop_front();
  }
  if (output_.console) {
    std::string& pending = is_stderr ? console_err_ : console_out_;
    pending.append(rank.prefix).append(line).push_back('\n');
  }
  line = raw;  // log files keep what the rank wrote
  if (!output_.log_dir.empty()) {
    const LogFile& file = is_stderr ? rank.err_file : rank.out_file;
    WriteAll(file.fd, std::string(line).append(1, '\n'));
  }
}

void RankGroup::FlushConsole() {
  // Only this thread writes neuronrun's stdout/stderr, and only whole lines,
  // so no two ranks' halves ever share a line.
  if (!console_out_.empty()) {
    WriteAll(STDOUT_FILENO, console_out_);
    console_out_.clear();
  }
  if (!console_err_.empty()) {
    WriteAll(STDERR_FILENO, console_err_);
    console_err_.clear();
  }
}

void RankGroup::Reap() {
  while (true) {
    int status = 0;
    const pid_t pid = ::waitpid(-1, &status, WNOHANG);
    if (pid <= 0) return;
    for (auto& rank : ranks_) {
      if (rank->pid == pid && !rank->exited && !rank->status.is_open()) Exited(*rank, status);
    }
    // A pid that is no rank is an orphaned grandchild (neuronrun is a
    // child subreaper): reaping it is all there is to do.
  }
}

void RankGroup::AwaitStatus(Rank& rank, int fd) {
  rank.status.assign(fd);
  Rank* r = &rank;
  asio::async_read(rank.status, asio::buffer(rank.status_buffer),
                   [this, r](const boost::system::error_code& ec, std::size_t n) {
                     if (ec == asio::error::operation_aborted) return;
                     // No status: the keeper died, and the rank with it (PR_SET_PDEATHSIG).
                     int status = SIGKILL;
                     if (!ec && n == sizeof(int)) {
                       std::memcpy(&status, r->status_buffer.data(), sizeof(int));
                     }
                     boost::system::error_code ignored;
                     r->status.close(ignored);
                     if (!r->exited) Exited(*r, status);
                   });
}

void RankGroup::Exited(Rank& rank, int wait_status) {
  rank.exited = true;
  rank.wait_status = wait_status;
  reaped_.push_back(&rank);
  if (rank.out.is_open() || rank.err.is_open()) {
    Rank* r = &rank;
    rank.drain_timer.expires_after(kDrainTimeout);
    rank.drain_timer.async_wait([this, r](const boost::system::error_code& ec) {
      if (ec) return;
      ::kill(-r->pid, SIGKILL);  // a grandchild still holds the pipes
      boost::system::error_code ignored;
      r->out.close(ignored);
      r->err.close(ignored);
      r->out_lines->Finish();
      r->err_lines->Finish();
      FlushConsole();
      MaybeFinish(*r);
    });
  }
  MaybeFinish(rank);
}

std::set<pid_t> RankGroup::process_groups() const {
  std::set<pid_t> groups;
  for (const auto& rank : ranks_) {
    if (rank->pid > 0) groups.insert(rank->pid);
  }
  return groups;
}

void RankGroup::MaybeFinish(Rank& rank) {
  if (rank.finished || !rank.exited || rank.out.is_open() || rank.err.is_open()) {
    return;
  }
  rank.finished = true;
  rank.drain_timer.cancel();
  // Leftovers of the rank's process group (e.g. data loader workers) go too.
  ::kill(-rank.pid, SIGKILL);
  guard_.Unregister(rank.pid);
  DeliverExits();
}

void RankGroup::DeliverExits() {
  // In reap order: a rank that drained quickly waits for one that died
  // before it, so the first failure reported is the first one observed
  // (the root cause), not the first whose pipes emptied.
  while (!reaped_.empty() && reaped_.front()->finished) {
    Rank& rank = *reaped_.front();
    reaped_.pop_front();
    rank.delivered = true;
    RankExit exit;
    exit.global_rank = rank.launch.global_rank;
    exit.local_rank = rank.launch.local_rank;
    exit.pid = rank.pid;
    exit.wait_status = rank.wait_status;
    exit.killed_by_us = rank.killed_by_us;
    exit.stderr_tail.assign(rank.tail.begin(), rank.tail.end());
    on_exit_(exit);
  }
}

void RankGroup::Signal(int sig) {
  for (auto& rank : ranks_) {
    if (rank->pid > 0 && !rank->exited) {
      if (sig == SIGKILL) rank->killed_by_us = true;
      ::kill(-rank->pid, sig);
    }
  }
}

void RankGroup::Stop(std::chrono::milliseconds grace, int sig) {
  Signal(sig);
  kill_timer_.expires_after(grace);
  kill_timer_.async_wait([this](const boost::system::error_code& ec) {
    if (!ec) Kill();
  });
}

void RankGroup::Kill() {
  kill_timer_.cancel();
  Signal(SIGKILL);
}

bool RankGroup::Finished() const {
  for (const auto& rank : ranks_) {
    const bool never_started = rank->pid < 0;  // Start() failed before it
    if (!rank->delivered && !never_started) return false;
  }
  return true;
}

std::size_t RankGroup::running() const {
  std::size_t n = 0;
  for (const auto& rank : ranks_) n += rank->exited ? 0 : 1;
  return n;
}

}  // namespace neuron::launcher
