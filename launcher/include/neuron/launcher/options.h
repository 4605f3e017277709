// neuronrun's command line: LaunchOptions and the parser that fills it.
//
// Usage:
//   LaunchOptions opts = ParseOptions(argc, argv);   // throws InvalidUsage
//   if (opts.help) { std::cout << HelpText(); }
//
// Parsing stops at the first argument that is not an option (the program);
// everything after it goes to the program unchanged. `--` also ends options.
#pragma once

#include <chrono>
#include <cstdint>
#include <optional>
#include <string>
#include <vector>

namespace neuron::launcher {

struct LaunchOptions {
  std::uint32_t nproc_per_node = 1;
  std::uint32_t nnodes = 1;
  std::uint32_t node_rank = 0;
  std::string rdzv_host;                 // empty: single-node, loopback
  std::uint16_t rdzv_port = 0;
  std::chrono::seconds rdzv_timeout{300};
  std::string rdzv_secret_file;          // multi-node: where the secret is
  std::optional<std::uint16_t> master_port;  // default: a free port
  std::uint32_t max_restarts = 0;
  std::string log_dir;
  bool tee = false;
  bool fallback_report = false;          // sets NEURON_FALLBACK_REPORT=1 for the ranks
  std::string topology_file;             // empty: embedded trn2 node
  std::string device_file;               // empty: the ranks' NEURON_DEVICE_FILE, else v3
  std::string run_id;                    // empty: random
  std::string python;                    // empty: NEURON_PYTHON or default
  // Python modules a zygote imports once, each Python rank forked from it
  // (zygote.h); nullopt: NEURON_PRELOAD's; empty: none.
  std::optional<std::string> preload;
  std::chrono::milliseconds grace_period{5000};
  // Rank placement on this node's CPUs: "core" (rank i on the i-th allowed
  // CPU, modulo), "none", or "auto": core when the ranks fit the CPUs (as
  // Open MPI binds small jobs), else none.
  std::string bind_to = "auto";
  bool help = false;
  // torchrun's: -m/--module runs `python -m PROGRAM`; --no-python runs
  // PROGRAM directly even when it ends in .py; --standalone (one node, a
  // rendezvous of its own) is what a single-node neuronrun job always is.
  bool module = false;
  bool no_python = false;
  bool standalone = false;

  std::string program;                   // SCRIPT.py, EXECUTABLE or MODULE
  std::vector<std::string> program_args;
};

// Parses argv (argv[0] is neuronrun itself). Throws InvalidUsage with a
// one-line message naming the bad option or value.
LaunchOptions ParseOptions(int argc, const char* const* argv);

// Checks what parsing cannot: the program exists and can run, the rendezvous
// options agree with --nnodes. Throws InvalidUsage.
void ValidateOptions(const LaunchOptions& options);

// True when `program` is a Python script (runs under the interpreter with torch).
bool IsPythonScript(const std::string& program);
// True when the ranks run the interpreter with torch: a module (-m), or a
// .py script without --no-python.
bool RunsUnderPython(const LaunchOptions& o);

// The full --help text.
std::string HelpText();

}  // namespace neuron::launcher
