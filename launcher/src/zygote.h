// neuronrun --preload MODULES: a Python interpreter that has imported
// MODULES once and forks each rank from there (python/neuronrun_zygote.py
// holds its side and the protocol), so a rank does not spend seconds of CPU
// on `import torch`. A rank it forks is re-parented to neuronrun (a child
// subreaper) before its pid is returned: from then on it is waited for,
// signalled and read exactly like a rank Spawn() started.
//
// Shared: one zygote serves several jobs. `neuronrun matrix` hands each
// cell's neuronrun a connection (Connect(), NEURON_ZYGOTE_FD); `neuronrun
// zygote -- COMMAND` listens on a socket (NEURON_ZYGOTE) that the jobs
// COMMAND starts connect to (ConnectTo). Such a neuronrun is the zygote's
// client: the zygote first tells it the modules it imported and the
// environment it imported them with, and the client uses it only if
// Refusal() finds nothing against its job. A client's rank is not the
// client's child: it is signalled and read as any rank, and its wait
// status comes on SpawnedChild::status_fd.
//
// Usage:
//   Zygote zygote(python, env_of_rank_0, {"torch"});   // throws if an import fails
//   SpawnedChild child = zygote.Spawn(request);         // as launcher::Spawn
//   int fd = zygote.Connect();                          // for a client's process
//   Zygote client(fd);                                  // in that process
//
// Owned by one thread; not thread-safe.
#pragma once

#include <sys/types.h>

#include <chrono>
#include <map>
#include <memory>
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
  // started) or when it cannot start.
  // With `listen_path`, the zygote also accepts clients on a Unix socket
  // there (of this user only: SO_PEERCRED).
  Zygote(const std::string& python, const std::vector<std::string>& env,
         const std::vector<std::string>& modules, const std::string& listen_path = "");
  // A client of a shared zygote over `connected_socket` (its end of a
  // Connect(), owned from now on). Throws InvalidUsage when it is not a
  // SOCK_SEQPACKET socket, IoError when the zygote does not say hello.
  explicit Zygote(int connected_socket);
  // A client of the shared zygote listening at `path`; throws IoError.
  static std::unique_ptr<Zygote> ConnectTo(const std::string& path);

  // Why this client's zygote cannot serve a job preloading `modules` with
  // `job_env` (a rank's environment): other namespaces than this
  // process's (a network namespace: `ip netns exec`), a module it did not
  // import, or a variable that shapes imports (ShapesImports, rank_env.h)
  // with another value; empty when it can.
  std::string Refusal(const std::vector<std::string>& modules,
                      const std::vector<std::string>& job_env) const;
  ~Zygote();  // ends the zygote (a client: its connection), not the ranks it forked
  Zygote(const Zygote&) = delete;
  Zygote& operator=(const Zygote&) = delete;

  // Forks a rank running request.argv[1..] (SCRIPT ARGS or -m MODULE ARGS)
  // with request.env, request.cpu and its stdout/stderr on new pipes or
  // request.output_file. Same contract as launcher::Spawn, and a client's
  // rank has a status_fd; throws IoError naming the program when the zygote
  // refuses, does not answer or is gone, and ends the zygote then (every
  // later call throws), and when a zygote this process started would fork
  // for a process that is not a child subreaper (the rank would not become
  // its child).
  SpawnedChild Spawn(const SpawnRequest& request);

  // A new client's end of a connection to this zygote (close-on-exec; the
  // caller owns it and passes it on, e.g. SpawnRequest::pass_fd). Not for a
  // client. Throws IoError when the zygote is gone.
  int Connect();

  pid_t pid() const { return pid_; }  // -1 for a client

 private:
  // One datagram of at most `max_bytes`.
  std::string Receive(std::chrono::seconds timeout, std::size_t max_bytes = 4096);
  std::string Name() const;  // for messages
  void Close();

  pid_t pid_ = -1;
  int socket_ = -1;
  bool client_ = false;
  std::vector<std::string> modules_;  // a client's: what its zygote imported,
  std::string namespaces_;            // where it runs,
  std::map<std::string, std::string> import_env_;  // and with what environment,
  std::map<std::string, std::string> set_by_imports_;  // which they set these in
};

// What a shared zygote imports by default: NEURON_PRELOAD's list when it is
// set (even empty: none), else the trainers' (NEURON_TRAINER_MODULES).
std::string SharedZygoteModules();

// Starts a shared zygote of `modules` (accepting clients at `listen_path`
// too, if not empty) with this process's environment as a rank of a job
// without a topology of its own sees it (InterpreterEnvironment, less
// NEURON_TOPOLOGY_FILE and the zygote variables). Throws as the
// constructor does, or InvalidUsage without a Python interpreter.
std::unique_ptr<Zygote> StartSharedZygote(const std::vector<std::string>& modules,
                                          const std::string& listen_path = "");

// The modules named by --preload / NEURON_PRELOAD (`source`) as
// "torch,torchneuron": each a dotted Python name; throws InvalidUsage
// naming a bad one.
std::vector<std::string> ParsePreload(const std::string& list, const char* source);

}  // namespace neuron::launcher
