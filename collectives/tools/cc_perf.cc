// neuron-cc-perf: collective bandwidth over a size sweep, in the spirit of
// nccl-tests' all_reduce_perf. Run its ranks through neuronrun:
//
//   neuronrun -n 8 build/collectives/neuron-cc-perf --op allreduce -b 1K -e 64M -f 4
//
// Rank 0 prints, per size: count, wall time per operation (the slowest
// rank's average), algbw and busbw (nccl-tests definitions), the modelled
// time and busbw on the simulated Trainium2 fabric, and how many elements
// were wrong when --check verified the result against the closed form
// (with --check, any wrong element makes the exit status 1).
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <iostream>
#include <memory>
#include <string>
#include <vector>

#include "neuron/collectives/communicator.h"
#include "neuron/collectives/half.h"
#include "neuron/collectives/store/prefix_store.h"
#include "neuron/collectives/store/tcp_store.h"
#include "neuron/collectives/transport/shared_buffers.h"
#include "neuron/runtime/config.h"
#include "neuron/runtime/error.h"
#include "neuron/runtime/fabric/collective_cost.h"
#include "neuron/runtime/fabric/collective_schedules.h"
#include "neuron/runtime/fabric/fabric_model.h"
#include "model_table.h"

namespace neuron::collectives {
namespace {

using runtime::CollectiveKind;

struct PerfOptions {
  CollectiveKind op = CollectiveKind::kAllReduce;
  std::size_t min_bytes = 8, max_bytes = 64u << 20;
  std::size_t factor = 2;
  int iterations = 20, warmup = 5;
  bool check = false;
  DataType dtype = DataType::kFloat32;
  Algorithm algorithm = Algorithm::kAuto;
  // The fabric model's algorithm (--model-algo, else NEURON_FABRIC_ALGO).
  runtime::FabricAlgorithm model_algorithm = runtime::FabricAlgorithm::kAuto;
  TransportKind transport = TransportKind::kAuto;
  bool registered = false;  // buffers from SharedBufferPool (nccl-tests' -R)
  // --model-only: the model's table for -N ranks on --nodes nodes, no ranks run.
  bool model_only = false;
  int model_ranks = 0, model_nodes = 1;
  std::string topology_path, device_path;
};

// A whole number 1 to 1,000,000 for `flag`.
int ParseCount(const std::string& flag, const std::string& text) {
  char* end = nullptr;
  const long value = std::strtol(text.c_str(), &end, 10);
  NEURON_CHECK(!text.empty() && *end == '\0' && value >= 1 && value <= 1000000, flag,
               " needs a whole number 1 to 1000000, got '", text, "'");
  return static_cast<int>(value);
}

std::size_t ParseSize(const std::string& text) {
  char* end = nullptr;
  const double value = std::strtod(text.c_str(), &end);
  const std::string unit(end);
  const double scale = unit.empty() ? 1 : unit == "K" ? 1024 : unit == "M" ? 1 << 20
                      : unit == "G" ? 1 << 30 : -1;
  NEURON_CHECK(value >= 0 && scale > 0, "size '", text, "' is not a number with K, M or G");
  return static_cast<std::size_t>(value * scale);
}

DataType ParseDtype(const std::string& name) {
  for (auto t : {DataType::kFloat32, DataType::kFloat64, DataType::kFloat16,
                 DataType::kBFloat16, DataType::kInt32, DataType::kInt64}) {
    if (name == Name(t)) return t;
  }
  NEURON_CHECK(false, "--dtype must be float32, float64, float16, bfloat16, int32 or int64, got '",
               name, "'");
}

CollectiveKind ParseOp(const std::string& name) {
  const auto k = runtime::ParseCollectiveKind(name);
  NEURON_CHECK(k == CollectiveKind::kAllReduce || k == CollectiveKind::kAllGather ||
                   k == CollectiveKind::kReduceScatter || k == CollectiveKind::kBroadcast,
               "--op must be allreduce, allgather, reducescatter or broadcast, got '", name, "'");
  return *k;
}

PerfOptions Parse(int argc, char** argv) {
  PerfOptions o;
  o.model_algorithm = runtime::ConfiguredFabricAlgorithm();
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    auto value = [&]() -> std::string {
      NEURON_CHECK(i + 1 < argc, "option ", a, " needs a value");
      return argv[++i];
    };
    if (a == "--op") o.op = ParseOp(value());
    else if (a == "-b" || a == "--minbytes") o.min_bytes = ParseSize(value());
    else if (a == "-e" || a == "--maxbytes") o.max_bytes = ParseSize(value());
    else if (a == "-f" || a == "--stepfactor") o.factor = std::stoul(value());
    else if (a == "-n" || a == "--iters") o.iterations = std::stoi(value());
    else if (a == "-w" || a == "--warmup_iters") o.warmup = std::stoi(value());
    else if (a == "--check") o.check = true;
    else if (a == "-R" || a == "--registered") o.registered = true;
    else if (a == "--dtype") o.dtype = ParseDtype(value());
    else if (a == "--algo") o.algorithm = ParseAlgorithm(value());
    else if (a == "--model-algo") {
      const std::string name = value();
      const auto parsed = runtime::ParseFabricAlgorithm(name);
      NEURON_CHECK(parsed.has_value(), "--model-algo must be auto, ",
                   runtime::FabricAlgorithmNames(), ", got '", name, "'");
      o.model_algorithm = *parsed;
    }
    else if (a == "--model-only") o.model_only = true;
    else if (a == "-N" || a == "--ranks") o.model_ranks = ParseCount(a, value());
    else if (a == "--nodes") o.model_nodes = ParseCount(a, value());
    else if (a == "--topology") o.topology_path = value();
    else if (a == "--device") o.device_path = value();
    else if (a == "--transport") {
      const std::string t = value();
      NEURON_CHECK(t == "auto" || t == "shm" || t == "tcp",
                   "--transport must be auto, shm or tcp, got '", t, "'");
      o.transport = t == "shm" ? TransportKind::kShm
                  : t == "tcp" ? TransportKind::kTcp : TransportKind::kAuto;
    }
    else if (a == "-h" || a == "--help") {
      std::cout << "usage: neuronrun -n N neuron-cc-perf [--op allreduce|allgather|"
                   "reducescatter|broadcast] [-b MIN] [-e MAX] [-f FACTOR] [-n ITERS]\n"
                   "       [-w WARMUP] [--check] [--dtype float32|float64|float16|bfloat16|"
                   "int32|int64] [--algo auto|ring|recursive_doubling|rabenseifner|direct|hierarchical]\n"
                   "       [--transport auto|shm|tcp] [-R|--registered]\n"
                   "       [--model-algo auto|ring|mesh|rdh|recursive_doubling|hierarchical|tree]\n"
                   "  --algo: the host algorithm that moves the real bytes;\n"
                   "  --model-algo: the fabric model's (default NEURON_FABRIC_ALGO, else auto:\n"
                   "      the topology's rule for the size, else the model's fastest); a size\n"
                   "      it cannot run gets auto's\n"
                   "  -R: buffers registered with the collectives (shared with the peers on\n"
                   "      this host), as nccl-tests' -R: a direct allreduce above 16 KiB works\n"
                   "      in place on them (with --check, one that staged counts as wrong);\n"
                   "      the other operations still stage\n"
                   "       neuron-cc-perf --model-only -N RANKS [--nodes NODES] [--topology FILE]\n"
                   "           [--device FILE] [--op ...] [-b MIN] [-e MAX] [-f FACTOR]\n"
                   "           [--dtype ...]"
                   " [--model-algo ...]\n"
                   "  --model-only: the fabric model's table for RANKS ranks split evenly over\n"
                   "      NODES nodes of the topology (default NEURON_TOPOLOGY_FILE, else\n"
                   "      trn2-node) and device (default NEURON_DEVICE_FILE, else NeuronCore-v3);\n"
                   "      starts no ranks and moves no bytes\n";
      std::exit(0);
    } else NEURON_CHECK(false, "unknown option '", a, "'");
  }
  NEURON_CHECK(o.factor >= 2 && o.min_bytes >= 1 && o.min_bytes <= o.max_bytes &&
                   o.iterations > 0,
               "need -f >= 2, 1 <= -b <= -e and -n > 0");
  return o;
}

int EnvInt(const char* name) {
  const char* v = std::getenv(name);
  NEURON_CHECK(v != nullptr, "$", name, " is not set: run neuron-cc-perf under neuronrun");
  return std::atoi(v);
}

std::shared_ptr<Store> ConnectToJobStore() {
  const auto& reg = runtime::ConfigRegistry::Get();
  const auto endpoint = reg.Find(runtime::ConfigKey::kStoreEndpoint);
  const auto secret = reg.Find(runtime::ConfigKey::kJobSecret);
  NEURON_CHECK(endpoint && secret, "no job store ($NEURON_STORE_ENDPOINT): run neuron-cc-perf "
               "under neuronrun");
  const auto colon = endpoint->rfind(':');
  TcpStoreOptions o;
  o.host = endpoint->substr(0, colon);
  o.port = static_cast<std::uint16_t>(std::stoi(endpoint->substr(colon + 1)));
  o.secret = *secret;
  return std::make_shared<TcpStore>(o);
}

void Fill(DataType type, void* data, std::size_t count, double value) {
  for (std::size_t i = 0; i < count; ++i) {
    switch (type) {
      case DataType::kFloat32: static_cast<float*>(data)[i] = static_cast<float>(value); break;
      case DataType::kFloat64: static_cast<double*>(data)[i] = value; break;
      case DataType::kFloat16: static_cast<std::uint16_t*>(data)[i] = FloatToHalf(static_cast<float>(value)); break;
      case DataType::kBFloat16: static_cast<std::uint16_t*>(data)[i] = FloatToBFloat16(static_cast<float>(value)); break;
      case DataType::kInt32: static_cast<std::int32_t*>(data)[i] = static_cast<std::int32_t>(value); break;
      case DataType::kInt64: static_cast<std::int64_t*>(data)[i] = static_cast<std::int64_t>(value); break;
      default: NEURON_ASSERT(false, "unsupported dtype");
    }
  }
}

double Get(DataType type, const void* data, std::size_t i) {
  switch (type) {
    case DataType::kFloat32: return static_cast<const float*>(data)[i];
    case DataType::kFloat64: return static_cast<const double*>(data)[i];
    case DataType::kFloat16: return HalfToFloat(static_cast<const std::uint16_t*>(data)[i]);
    case DataType::kBFloat16: return BFloat16ToFloat(static_cast<const std::uint16_t*>(data)[i]);
    case DataType::kInt32: return static_cast<const std::int32_t*>(data)[i];
    case DataType::kInt64: return static_cast<double>(static_cast<const std::int64_t*>(data)[i]);
    default: return 0;
  }
}

// A benchmark buffer: ordinary memory, or registered (SharedBufferPool).
class Buffer {
 public:
  Buffer(std::size_t bytes, bool registered) {
    if (registered && bytes > 0) {
      shared_ = static_cast<char*>(transport::SharedBufferPool::Instance().Allocate(bytes));
      NEURON_CHECK(shared_ != nullptr, "cannot allocate ", bytes, " bytes of registered memory");
    } else {
      plain_.resize(bytes);
    }
  }
  ~Buffer() {
    if (shared_ != nullptr) transport::SharedBufferPool::Instance().Free(shared_);
  }
  Buffer(const Buffer&) = delete;
  Buffer& operator=(const Buffer&) = delete;
  char* data() { return shared_ != nullptr ? shared_ : plain_.data(); }
  const char* data() const { return shared_ != nullptr ? shared_ : plain_.data(); }

 private:
  char* shared_ = nullptr;
  std::vector<char> plain_;
};

// Runs one operation of the benchmark; `count` is per-rank elements as
// nccl-tests counts them (allgather: the gathered total).
class Runner {
 public:
  Runner(Communicator& comm, const PerfOptions& o, std::size_t count)
      : comm_(comm), o_(o), count_(count), esize_(ElementSize(o.dtype)),
        in_(count * esize_, o.registered), out_(count * esize_, o.registered) {
    block_ = o.op == CollectiveKind::kAllGather || o.op == CollectiveKind::kReduceScatter
                 ? count / comm.size() : count;
  }
  void Prepare() { Fill(o_.dtype, in_.data(), count_, comm_.rank() + 1); }
  void Run() {
    switch (o_.op) {
      case CollectiveKind::kAllReduce:
        comm_.AllReduce({in_.data(), count_, o_.dtype, ReduceOp::kSum, o_.algorithm});
        break;
      case CollectiveKind::kAllGather:
        comm_.AllGather({in_.data() + comm_.rank() * block_ * esize_, out_.data(), block_, o_.dtype});
        break;
      case CollectiveKind::kReduceScatter:
        comm_.ReduceScatter({in_.data(), out_.data(), block_, o_.dtype, ReduceOp::kSum});
        break;
      case CollectiveKind::kBroadcast:
        comm_.Broadcast({in_.data(), count_, o_.dtype, 0});
        break;
      default:
        break;
    }
  }
  // Elements that differ from the closed form after one Prepare + Run.
  std::size_t Wrong() const {
    const double n = comm_.size();
    std::size_t wrong = 0;
    auto expect = [&](const void* data, std::size_t elements, double value) {
      for (std::size_t i = 0; i < elements; ++i) wrong += Get(o_.dtype, data, i) != value;
    };
    switch (o_.op) {
      case CollectiveKind::kAllReduce: expect(in_.data(), count_, n * (n + 1) / 2); break;
      case CollectiveKind::kReduceScatter: expect(out_.data(), block_, n * (n + 1) / 2); break;
      case CollectiveKind::kBroadcast: expect(in_.data(), count_, 1); break;
      case CollectiveKind::kAllGather:
        for (int r = 0; r < comm_.size(); ++r) {
          const std::size_t start = r * block_;
          for (std::size_t i = 0; i < block_; ++i) wrong += Get(o_.dtype, out_.data(), start + i) != r + 1;
        }
        break;
      default: break;
    }
    return wrong;
  }

 private:
  Communicator& comm_;
  const PerfOptions& o_;
  std::size_t count_, esize_, block_ = 0;
  Buffer in_, out_;
};

// --model-only: the fabric model's table, no ranks.
int ModelOnly(const PerfOptions& o) {
  ModelTableOptions m;
  m.op = o.op;
  m.min_bytes = o.min_bytes;
  m.max_bytes = o.max_bytes;
  m.factor = o.factor;
  m.element_bytes = ElementSize(o.dtype);
  m.ranks = o.model_ranks;
  m.nodes = o.model_nodes;
  m.topology_path = o.topology_path;
  m.device_path = o.device_path;
  m.algorithm = o.model_algorithm;
  PrintModelTable(m);
  return 0;
}

// Whether allreduces take the direct algorithm (the registered path's).
bool TakesDirect(const PerfOptions& o) {
  const auto forced =
      runtime::ConfigRegistry::Get().Find(runtime::ConfigKey::kCollectiveAlgorithm);
  const Algorithm chosen = o.algorithm != Algorithm::kAuto ? o.algorithm
                           : forced                        ? ParseAlgorithm(*forced)
                                                           : Algorithm::kAuto;
  return chosen == Algorithm::kAuto || chosen == Algorithm::kDirect;
}

// The slowest rank's microseconds per operation, after the warm-up.
double TimeOperations(Communicator& comm, Runner& runner, const PerfOptions& o) {
  runner.Prepare();
  for (int i = 0; i < o.warmup; ++i) runner.Run();
  comm.Barrier();
  const auto start = std::chrono::steady_clock::now();
  for (int i = 0; i < o.iterations; ++i) runner.Run();
  double us = std::chrono::duration<double, std::micro>(std::chrono::steady_clock::now() - start)
                  .count() /
              o.iterations;
  comm.AllReduce({&us, 1, DataType::kFloat64, ReduceOp::kMax});
  return us;
}

// Wrong elements of one checked run, over all ranks. Registered buffers
// must have been used in place where the path applies (a direct allreduce
// above the small-message size): a staged one counts as wrong.
double CountWrong(Communicator& comm, Runner& runner, const PerfOptions& o, std::size_t bytes,
                  std::size_t small_message_bytes) {
  runner.Prepare();
  runner.Run();
  double wrong = static_cast<double>(runner.Wrong());
  if (o.registered && o.op == CollectiveKind::kAllReduce && comm.size() > 1 && TakesDirect(o) &&
      comm.transport_name() == std::string("shm") && bytes > small_message_bytes &&
      !comm.records().back().registered) {
    std::fprintf(stderr, "rank %d: the allreduce of %zu bytes staged its registered buffer\n",
                 comm.rank(), bytes);
    wrong += 1;
  }
  comm.AllReduce({&wrong, 1, DataType::kFloat64, ReduceOp::kSum});
  return wrong;
}

void PrintHeader(const PerfOptions& o, const Communicator& comm,
                 const runtime::Topology& topology) {
  std::printf("# neuron-cc-perf: %s, %d ranks, %s, %s transport%s, %d iterations after %d "
              "warm-up\n", runtime::Name(o.op), comm.size(), Name(o.dtype),
              comm.transport_name(), o.registered ? ", registered buffers" : "", o.iterations,
              o.warmup);
  std::printf("# topology %s; modelled with %s\n", topology.spec().name().c_str(),
              DescribeModelAlgorithm(o.model_algorithm));
  std::printf("%12s %12s %10s %11s %11s %11s %11s %11s %7s\n", "size(B)", "count", "time(us)",
              "algbw(GB/s)", "busbw(GB/s)", "model(us)", "m.algo", "m.busbw", "wrong");
}

int Main(int argc, char** argv) {
  const PerfOptions o = Parse(argc, argv);
  if (o.model_only) return ModelOnly(o);
  NEURON_CHECK(o.model_ranks == 0 && o.model_nodes == 1 && o.topology_path.empty() &&
                   o.device_path.empty(),
               "-N, --nodes, --topology and --device go with --model-only (under neuronrun, "
               "pass --topology to neuronrun)");
  const int rank = EnvInt("RANK"), size = EnvInt("WORLD_SIZE");
  const int local = EnvInt("LOCAL_WORLD_SIZE");
  CommunicatorOptions comm_options;
  comm_options.transport = o.transport;
  auto comm = std::make_unique<Communicator>(
      std::make_shared<PrefixStore>("cc-perf", ConnectToJobStore()), rank, size, comm_options);
  const runtime::Topology topology = runtime::Topology::FromEnvironment();
  const runtime::FabricModel model(
      topology, runtime::PlaceRanks(topology, std::vector<std::uint32_t>(size / local, local)),
      runtime::DeviceSpec::FromEnvironment());
  const double factor = runtime::BusBandwidthFactor(o.op, size);
  if (rank == 0) PrintHeader(o, *comm, topology);
  const std::size_t esize = ElementSize(o.dtype);
  double total_wrong = 0;
  for (std::size_t bytes = o.min_bytes; bytes != 0;
       bytes = NextSize(bytes, o.max_bytes, o.factor)) {
    std::size_t count = std::max<std::size_t>(bytes / esize, 1);
    if (o.op == CollectiveKind::kAllGather || o.op == CollectiveKind::kReduceScatter) {
      count = std::max<std::size_t>(count / size, 1) * size;
    }
    Runner runner(*comm, o, count);
    const double us = TimeOperations(*comm, runner, o);
    const double wrong =
        o.check ? CountWrong(*comm, runner, o, count * esize, comm_options.small_message_bytes)
                : 0;
    total_wrong += wrong;
    const double s = static_cast<double>(count * esize);
    const runtime::CollectiveCost cost = runtime::ModelCollective(
        model, runtime::Name(o.op), s, runtime::AllRanks(size), 0, o.model_algorithm);
    if (rank == 0) {
      const double algbw = s / us / 1e3;
      const double model_busbw = cost.micros > 0 ? s / cost.micros / 1e3 * factor : 0;
      std::printf("%12zu %12zu %10.3f %11.3f %11.3f %11.2f %11s %11.1f %7s\n",
                  static_cast<std::size_t>(s), count, us, algbw, algbw * factor, cost.micros,
                  cost.algorithm, model_busbw,
                  o.check ? std::to_string(static_cast<long>(wrong)).c_str() : "-");
      std::fflush(stdout);
    }
  }
  if (total_wrong > 0) {
    std::fprintf(stderr, "neuron-cc-perf: %.0f wrong elements\n", total_wrong);
    return 1;
  }
  return 0;
}

}  // namespace
}  // namespace neuron::collectives

int main(int argc, char** argv) {
  try {
    return neuron::collectives::Main(argc, argv);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "neuron-cc-perf: error: %s\n", e.what());
    return 1;
  }
}
