// neuronrun --preload MODULES: a Python interpreter that has imported
// MODULES once and forks each rank from there (python/neuronrun_zygote.py
// holds its side and the protocol), so a rank does not spend seconds of CPU
// on `import torch`. A rank it forks is re-parented to neuronrun (a child
// subreaper) before its pid is returned: from then on it is waited for,
// signalled and read exactly like a rank Spawn() started.
//
// Usage:
//   Zygote zygote(python, env_of_rank_0, {"torch"});   // throws if an import fails
//   SpawnedChild child = zygote.Spawn(request);         // as launcher::Spawn
//
// Owned by the agent's thread; not thread-safe.
#pragma once

#include <sys/types.h>

#include <chrono>
#include <string>
#include <vector>

#include "child_process.h"

namespace neuron::launcher {

class Zygote {
 public:
  // Starts `python -m neuronrun_zygote` with `env` (the entries common to
  // the ranks' environments; its stdout and stderr
  // are neuronrun's stderr) and waits until it imported `modules`. Throws
  // IoError with the zygote's reason (an import that failed, a thread one
  // started) or when it cannot start, or when this process is not a child
  // subreaper (its ranks would not become its children).
  Zygote(const std::string& python, const std::vector<std::string>& env,
         const std::vector<std::string>& modules);
  ~Zygote();  // ends the zygote (not the ranks it forked) and reaps it
  Zygote(const Zygote&) = delete;
  Zygote& operator=(const Zygote&) = delete;

  // Forks a rank running request.argv[1..] (SCRIPT ARGS or -m MODULE ARGS)
  // with request.env, request.cpu and its stdout/stderr on new pipes or
  // request.output_file. Same contract as launcher::Spawn; throws IoError
  // naming the program when the zygote refuses, does not answer or is
  // gone, and ends the zygote then (every later call throws).
  SpawnedChild Spawn(const SpawnRequest& request);

  pid_t pid() const { return pid_; }

 private:
  std::string Receive(std::chrono::seconds timeout);  // one datagram
  void Close();

  pid_t pid_ = -1;
  int socket_ = -1;
};

// The modules named by --preload / NEURON_PRELOAD (`source`) as
// "torch,torchneuron": each a dotted Python name; throws InvalidUsage
// naming a bad one.
std::vector<std::string> ParsePreload(const std::string& list, const char* source);

}  // namespace neuron::launcher
