// A rank program for the launcher tests: each mode exercises one behaviour
// of neuronrun from the rank's side.
//
//   rank_helper env                  print the launcher contract, KEY=VALUE
//   rank_helper chatter N            N lines to stdout and stderr, each
//                                    written in pieces with pauses between
//   rank_helper fail RANK CODE       RANK exits with CODE, the others sleep
//   rank_helper selfkill RANK        RANK dies by SIGKILL, the others sleep
//   rank_helper sleep SECONDS        sleep, with a forked grandchild sleeping
//   rank_helper stubborn RANK CODE   like fail, but the others ignore SIGTERM
//                                    and SIGINT
//   rank_helper cascade RANK CODE    RANK exits with CODE at 0.2 s leaving a
//                                    grandchild that holds its pipes open;
//                                    the others fail (code 1) at 0.5 s, as
//                                    ranks that lose a peer do
//   rank_helper restart N            rank 0 fails (code 7) until restart
//                                    count N; then every rank succeeds
#include <signal.h>
#include <sys/types.h>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <thread>

namespace {

int Rank() {
  const char* r = std::getenv("RANK");
  return r ? std::atoi(r) : -1;
}

void WriteRaw(int fd, const std::string& s) {
  ssize_t ignored = ::write(fd, s.data(), s.size());
  (void)ignored;
}

void SleepSeconds(double s) {
  std::this_thread::sleep_for(std::chrono::duration<double>(s));
}

int Env() {
  const char* names[] = {"RANK", "LOCAL_RANK", "WORLD_SIZE", "LOCAL_WORLD_SIZE",
                         "GROUP_RANK", "GROUP_WORLD_SIZE", "ROLE_RANK",
                         "ROLE_WORLD_SIZE", "ROLE_NAME", "MASTER_ADDR", "MASTER_PORT",
                         "TORCHELASTIC_RESTART_COUNT", "TORCHELASTIC_MAX_RESTARTS",
                         "TORCHELASTIC_RUN_ID", "OMP_NUM_THREADS", "NEURON_NODE_INDEX",
                         "NEURON_CHIP_INDEX", "NEURON_CORE_INDEX", "NEURON_RANKS_PER_CHIP",
                         "NEURON_TOPOLOGY_FILE", "NEURON_DEVICE_FILE", "NEURON_STORE_ENDPOINT",
                         "NEURON_JOB_SECRET", "NEURON_RDZV_SECRET", "PYTHONPATH"};
  std::string out;
  for (const char* name : names) {
    const char* v = std::getenv(name);
    out += std::string(name) + "=" + (v ? v : "<unset>") + "\n";
  }
  WriteRaw(STDOUT_FILENO, out);
  return 0;
}

int Chatter(int lines) {
  const std::string r = std::to_string(Rank());
  for (int i = 0; i < lines; ++i) {
    const int fd = (i % 2 == 0) ? STDOUT_FILENO : STDERR_FILENO;
    WriteRaw(fd, "chatter rank=" + r + " ");
    usleep(200);
    WriteRaw(fd, "line=" + std::to_string(i) + " ");
    usleep(100);
    WriteRaw(fd, "end\n");
  }
  WriteRaw(STDOUT_FILENO, "no newline at the end from rank " + r);
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  const std::string mode = argc > 1 ? argv[1] : "";
  if (mode == "env") return Env();
  if (mode == "chatter" && argc > 2) return Chatter(std::atoi(argv[2]));
  if ((mode == "fail" || mode == "stubborn") && argc > 3) {
    if (Rank() == std::atoi(argv[2])) {
      SleepSeconds(0.2);
      WriteRaw(STDERR_FILENO, "rank helper failing on purpose\n");
      return std::atoi(argv[3]);
    }
    if (mode == "stubborn") {
      ::signal(SIGTERM, SIG_IGN);
      ::signal(SIGINT, SIG_IGN);
    }
    SleepSeconds(60);
    return 0;
  }
  if (mode == "cascade" && argc > 3) {
    if (Rank() == std::atoi(argv[2])) {
      SleepSeconds(0.2);
      if (::fork() == 0) {  // keeps the rank's stdout and stderr open
        SleepSeconds(30);
        return 0;
      }
      WriteRaw(STDERR_FILENO, "rank helper failing on purpose\n");
      return std::atoi(argv[3]);
    }
    SleepSeconds(0.5);
    WriteRaw(STDERR_FILENO, "rank helper lost its peer\n");
    return 1;
  }
  if (mode == "selfkill" && argc > 2) {
    if (Rank() == std::atoi(argv[2])) {
      SleepSeconds(0.2);
      ::kill(::getpid(), SIGKILL);
    }
    SleepSeconds(60);
    return 0;
  }
  if (mode == "sleep" && argc > 2) {
    if (::fork() == 0) {  // a grandchild that must not outlive the job
      SleepSeconds(std::atof(argv[2]));
      return 0;
    }
    WriteRaw(STDOUT_FILENO, "sleeping\n");
    SleepSeconds(std::atof(argv[2]));
    return 0;
  }
  if (mode == "restart" && argc > 2) {
    const char* count = std::getenv("TORCHELASTIC_RESTART_COUNT");
    const int n = count ? std::atoi(count) : -1;
    WriteRaw(STDOUT_FILENO, "restart count " + std::to_string(n) + "\n");
    if (n >= std::atoi(argv[2])) return 0;
    if (Rank() != 0) SleepSeconds(60);  // ended by neuronrun when rank 0 fails
    SleepSeconds(0.3);                  // after every rank has printed
    return 7;
  }
  std::fprintf(stderr, "rank_helper: bad arguments\n");
  return 64;
}
