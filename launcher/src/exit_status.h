// Describing how a rank ended, for summaries and neuronrun's exit code.
#pragma once

#include <string>

namespace neuron::launcher {

// "SIGSEGV" for 11; "signal 64" for numbers without a name.
std::string SignalName(int sig);

// The code a shell would report: the exit code, or 128 + signal.
int ShellExitCode(int wait_status);

// "exited with code 3", "was killed by SIGSEGV (signal 11)",
// "was killed by SIGKILL (signal 9) from outside, possibly out of memory".
// `killed_by_us` says whether neuronrun itself sent the fatal signal.
std::string DescribeExit(int wait_status, bool killed_by_us);

// True for exit code 0.
bool Succeeded(int wait_status);

}  // namespace neuron::launcher
