// A rank program for the multi-process collectives tests: one process per
// rank, a communicator bootstrapped from a FileStore, allreduces until an
// error (or 60 s).
//
//   cc_rank STORE_FILE RANK SIZE TIMEOUT_MS [registered]
//
// Prints "ready" once the communicator exists, then on the first error
// "error <TimeoutError|IoError|RemoteError|InvalidUsage|Error>: <message>"
// and exits 3; "done" and exit 0 after 60 s without one. With "registered"
// the buffer comes from the SharedBufferPool, and an allreduce that did not
// work in place on it is an error ("error NotRegistered").
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <memory>
#include <string>
#include <vector>

#include "neuron/collectives/communicator.h"
#include "neuron/collectives/store/file_store.h"
#include "neuron/collectives/transport/shared_buffers.h"
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
  const bool registered = argc == 6 && std::string(argv[5]) == "registered";
  if (argc != 5 && !registered) {
    std::fprintf(stderr, "usage: cc_rank STORE_FILE RANK SIZE TIMEOUT_MS [registered]\n");
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
    constexpr std::size_t kCount = 1 << 16;
    std::vector<float> plain(registered ? 0 : kCount);
    float* data = registered ? static_cast<float*>(
                                   collectives::transport::SharedBufferPool::Instance().Allocate(
                                       kCount * sizeof(float)))
                             : plain.data();
    while (std::chrono::steady_clock::now() < end) {
      std::fill(data, data + kCount, 1.0f);
      comm.AllReduce({data, kCount, collectives::DataType::kFloat32});
      if (data[0] != static_cast<float>(size) || data[kCount - 1] != static_cast<float>(size)) {
        std::printf("error WrongResult: %f\n", data[0]);
        return 3;
      }
      if (registered && !comm.records().back().registered) {
        std::printf("error NotRegistered: the allreduce staged\n");
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
