// A rank program for the multi-process collectives tests: one process per
// rank, a communicator bootstrapped from a FileStore, allreduces until an
// error (or 60 s).
//
//   cc_rank STORE_FILE RANK SIZE TIMEOUT_MS
//
// Prints "ready" once the communicator exists, then on the first error
// "error <TimeoutError|IoError|RemoteError|InvalidUsage|Error>: <message>"
// and exits 3; "done" and exit 0 after 60 s without one.
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <memory>
#include <string>
#include <vector>

#include "neuron/collectives/communicator.h"
#include "neuron/collectives/store/file_store.h"
#include "neuron/runtime/error.h"

namespace {

using namespace neuron;

const char* ClassOf(const std::exception& e) {
  if (dynamic_cast<const TimeoutError*>(&e)) return "TimeoutError";
  if (dynamic_cast<const IoError*>(&e)) return "IoError";
  if (dynamic_cast<const RemoteError*>(&e)) return "RemoteError";
  if (dynamic_cast<const InvalidUsage*>(&e)) return "InvalidUsage";
  return "Error";
}

}  // namespace

int main(int argc, char** argv) {
  if (argc != 5) {
    std::fprintf(stderr, "usage: cc_rank STORE_FILE RANK SIZE TIMEOUT_MS\n");
    return 2;
  }
  const int rank = std::atoi(argv[2]), size = std::atoi(argv[3]);
  try {
    collectives::CommunicatorOptions options;
    options.timeout = std::chrono::milliseconds(std::atoi(argv[4]));
    collectives::Communicator comm(std::make_shared<collectives::FileStore>(argv[1]),
                                   rank, size, options);
    std::printf("ready\n");
    std::fflush(stdout);
    const auto end = std::chrono::steady_clock::now() + std::chrono::seconds(60);
    std::vector<float> data(1 << 16);
    while (std::chrono::steady_clock::now() < end) {
      std::fill(data.begin(), data.end(), 1.0f);
      comm.AllReduce({data.data(), data.size(), collectives::DataType::kFloat32});
      if (data[0] != static_cast<float>(size)) {
        std::printf("error WrongResult: %f\n", data[0]);
        return 3;
      }
    }
    std::printf("done\n");
    return 0;
  } catch (const std::exception& e) {
    std::printf("error %s: %s\n", ClassOf(e), e.what());
    std::fflush(stdout);
    return 3;
  }
}
