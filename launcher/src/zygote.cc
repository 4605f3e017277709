#include "zygote.h"

#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cctype>
#include <cerrno>
#include <chrono>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <utility>

#include "neuron/runtime/config.h"
#include "neuron/runtime/error.h"
#include "neuron/runtime/files.h"
#include "rank_env.h"

namespace neuron::launcher {

namespace {

// Generous: the zygote imports torch (seconds) on a machine that may be
// running a job's worth of ranks.
constexpr std::chrono::seconds kReadyTimeout(300);
constexpr std::chrono::seconds kReplyTimeout(60);
constexpr std::chrono::seconds kExitTimeout(5);
constexpr std::size_t kMaxReply = 4096;
constexpr std::size_t kMaxHello = 1 << 20;  // a zygote's modules and environment

struct Fd {
  explicit Fd(int f = -1) : fd(f) {}
  Fd(const Fd&) = delete;
  Fd& operator=(const Fd&) = delete;
  ~Fd() {
    if (fd >= 0) ::close(fd);
  }
  int release() { return std::exchange(fd, -1); }
  int fd;
};

// One datagram of `payload` with `fds` attached (SCM_RIGHTS).
void SendWithDescriptors(int socket, const std::string& payload, const std::vector<int>& fds) {
  iovec iov{const_cast<char*>(payload.data()), payload.size()};
  alignas(cmsghdr) char control[CMSG_SPACE(3 * sizeof(int))] = {};
  msghdr msg{};
  msg.msg_iov = &iov;
  msg.msg_iovlen = 1;
  msg.msg_control = control;
  msg.msg_controllen = CMSG_SPACE(fds.size() * sizeof(int));
  cmsghdr* c = CMSG_FIRSTHDR(&msg);
  c->cmsg_level = SOL_SOCKET;
  c->cmsg_type = SCM_RIGHTS;
  c->cmsg_len = CMSG_LEN(fds.size() * sizeof(int));
  std::memcpy(CMSG_DATA(c), fds.data(), fds.size() * sizeof(int));
  ssize_t n;
  do {
    n = ::sendmsg(socket, &msg, MSG_NOSIGNAL);
  } while (n < 0 && errno == EINTR);
  if (n != static_cast<ssize_t>(payload.size())) {
    throw IoError(StrCat("neuronrun --preload: cannot send a request to the zygote: ",
                         n < 0 ? std::strerror(errno) : "short write"));
  }
}

// The rank's request: neuronrun's pid, its CPU, neuronrun's working
// directory (the rank's), its arguments after the interpreter's name, its
// environment.
std::string RequestPayload(const SpawnRequest& request) {
  std::error_code error;
  const std::string cwd = std::filesystem::current_path(error).string();
  std::string p = StrCat(::getpid(), '\0', request.cpu, '\0', cwd, '\0',
                         request.argv.size() - 1, '\0');
  for (std::size_t i = 1; i < request.argv.size(); ++i) p.append(request.argv[i]).push_back('\0');
  for (const auto& e : request.env) p.append(e).push_back('\0');
  if (!p.empty()) p.pop_back();
  return p;
}

struct Pipe {
  Fd read;
  Fd write;
};

void MakePipe(Pipe& p) {
  int fds[2];
  if (::pipe2(fds, O_CLOEXEC) != 0) {
    throw IoError(StrCat("pipe2 failed: ", std::strerror(errno)));
  }
  p.read.fd = fds[0];
  p.write.fd = fds[1];
}

std::vector<std::string> Split(const std::string& text, char separator) {
  std::vector<std::string> parts;
  std::size_t start = 0;
  while (start <= text.size()) {
    const std::size_t end = std::min(text.find(separator, start), text.size());
    parts.push_back(text.substr(start, end - start));
    start = end + 1;
  }
  return parts;
}

// This process's namespaces as the zygote names its own
// (neuronrun_zygote.py, _namespaces): "net:[4026531840],uts:[...],...".
std::string Namespaces() {
  std::vector<std::string> kinds;
  std::error_code error;
  for (const auto& entry : std::filesystem::directory_iterator("/proc/self/ns", error)) {
    kinds.push_back(entry.path().filename().string());
  }
  std::sort(kinds.begin(), kinds.end());
  std::string names;
  for (const auto& kind : kinds) {
    char target[256];
    const ssize_t n = ::readlink(("/proc/self/ns/" + kind).c_str(), target, sizeof(target));
    if (n <= 0) continue;
    names += (names.empty() ? "" : ",") + std::string(target, static_cast<std::size_t>(n));
  }
  return names;
}

}  // namespace

std::string SharedZygoteModules() {
  const auto& config = runtime::ConfigRegistry::Get();
  return config.IsSet(runtime::ConfigKey::kPreload)
             ? config.GetString(runtime::ConfigKey::kPreload)
             : std::string(NEURON_TRAINER_MODULES);
}

std::unique_ptr<Zygote> StartSharedZygote(const std::vector<std::string>& modules,
                                          const std::string& listen_path) {
  using runtime::ConfigKey;
  const std::string python =
      ResolveProgram(runtime::ConfigRegistry::Get().GetString(ConfigKey::kPython));
  NEURON_CHECK(!python.empty(), "no python interpreter (NEURON_PYTHON)");
  // The devices torchneuron finds at import are the embedded topology's.
  Environment env = InterpreterEnvironment(CurrentEnvironment(), NEURON_PYTHON_PACKAGE_DIR);
  for (ConfigKey key : {ConfigKey::kTopologyFile, ConfigKey::kZygote, ConfigKey::kZygoteFd}) {
    env.erase(runtime::VariableName(key));
  }
  return std::make_unique<Zygote>(python, ToEnvp(env), modules, listen_path);
}

std::vector<std::string> ParsePreload(const std::string& list, const char* source) {
  std::vector<std::string> modules;
  std::size_t start = 0;
  while (start <= list.size()) {
    const std::size_t end = std::min(list.find(',', start), list.size());
    const std::string name = list.substr(start, end - start);
    bool ok = !name.empty() && name.front() != '.' && name.back() != '.' &&
              name.find("..") == std::string::npos && !std::isdigit(static_cast<unsigned char>(name.front()));
    for (char c : name) ok &= std::isalnum(static_cast<unsigned char>(c)) || c == '_' || c == '.';
    NEURON_CHECK(ok, source, " '", list, "': '", name,
                 "' is not a Python module name (expected MODULE[,MODULE...])");
    modules.push_back(name);
    start = end + 1;
  }
  return modules;
}

Zygote::Zygote(const std::string& python, const std::vector<std::string>& env,
               const std::vector<std::string>& modules, const std::string& listen_path) {
  int pair[2];
  if (::socketpair(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC, 0, pair) != 0) {
    throw IoError(StrCat("neuronrun --preload: socketpair failed: ", std::strerror(errno)));
  }
  Fd theirs(pair[1]);
  socket_ = pair[0];
  std::string list;
  for (const auto& m : modules) list += (list.empty() ? "" : ",") + m;
  SpawnRequest request;
  request.path = python;
  request.argv = {python, "-m", "neuronrun_zygote", std::to_string(theirs.fd), list};
  if (!listen_path.empty()) request.argv.insert(request.argv.end(), {"--listen", listen_path});
  request.env = env;
  request.inherit_stderr = true;
  request.pass_fd = theirs.fd;
  try {
    pid_ = launcher::Spawn(request).pid;
    const std::string ready = Receive(kReadyTimeout);
    if (ready != "ready") {
      throw IoError(StrCat("neuronrun --preload ", list, ": the zygote (", python, ") ",
                           ready.rfind("error ", 0) == 0 ? ready.substr(6) : "said '" + ready + "'"));
    }
  } catch (...) {
    Close();
    throw;
  }
}

Zygote::Zygote(int connected_socket) : socket_(connected_socket), client_(true) {
  int type = 0;
  socklen_t size = sizeof(type);
  if (::getsockopt(socket_, SOL_SOCKET, SO_TYPE, &type, &size) != 0 || type != SOCK_SEQPACKET) {
    socket_ = -1;  // not ours to close: it is not a connection
    throw InvalidUsage(StrCat("descriptor ", connected_socket,
                              " is not a connection to a shared zygote (a SOCK_SEQPACKET socket)"));
  }
  ::fcntl(socket_, F_SETFD, FD_CLOEXEC);
  try {  // "zygote", modules, namespaces, environment, "", what the imports set
    const std::vector<std::string> hello = Split(Receive(kReplyTimeout, kMaxHello), '\0');
    if (hello.size() < 3 || hello[0] != "zygote") throw IoError("it did not say hello");
    modules_ = Split(hello[1], ',');
    namespaces_ = hello[2];
    auto* env = &import_env_;
    for (std::size_t i = 3; i < hello.size(); ++i) {
      const auto eq = hello[i].find('=');
      if (hello[i].empty()) env = &set_by_imports_;
      if (eq != std::string::npos) (*env)[hello[i].substr(0, eq)] = hello[i].substr(eq + 1);
    }
  } catch (const Error& e) {
    Close();
    throw IoError(StrCat("neuronrun --preload: the shared zygote: ", e.what()));
  }
}

std::unique_ptr<Zygote> Zygote::ConnectTo(const std::string& path) {
  sockaddr_un address{};
  address.sun_family = AF_UNIX;
  NEURON_CHECK(path.size() < sizeof(address.sun_path), "NEURON_ZYGOTE '", path,
               "': longer than a socket path may be");
  std::memcpy(address.sun_path, path.c_str(), path.size() + 1);
  Fd fd(::socket(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC, 0));
  if (fd.fd < 0 || ::connect(fd.fd, reinterpret_cast<sockaddr*>(&address), sizeof(address)) != 0) {
    throw IoError(StrCat("neuronrun --preload: cannot reach the shared zygote at ", path, ": ",
                         std::strerror(errno)));
  }
  return std::make_unique<Zygote>(fd.release());
}

std::string Zygote::Refusal(const std::vector<std::string>& modules,
                            const std::vector<std::string>& job_env) const {
  // Its ranks would run in its namespaces (network, mounts, ...), not ours.
  if (namespaces_ != Namespaces()) return "it runs in other namespaces";
  for (const auto& m : modules) {
    if (std::find(modules_.begin(), modules_.end(), m) == modules_.end()) {
      return StrCat("it did not import ", m);
    }
  }
  const std::map<std::string, std::string> job = [&job_env] {
    std::map<std::string, std::string> m;
    for (const auto& e : job_env) {
      const auto eq = e.find('=');
      if (eq != std::string::npos) m[e.substr(0, eq)] = e.substr(eq + 1);
    }
    return m;
  }();
  for (const auto* side : {&job, &import_env_}) {
    for (const auto& [name, value] : *side) {
      if (!ShapesImports(name)) continue;
      // The job's own zygote would import with the job's value, or set the
      // same one itself.
      const auto a = job.find(name), b = import_env_.find(name), c = set_by_imports_.find(name);
      const bool same = a != job.end() && ((b != import_env_.end() && a->second == b->second) ||
                                           (c != set_by_imports_.end() && a->second == c->second));
      if (!same) return StrCat("it imported with another ", name);
    }
  }
  return "";
}

Zygote::~Zygote() { Close(); }

int Zygote::Connect() {
  NEURON_CHECK(!client_, "a zygote's client cannot connect others");
  if (socket_ < 0) throw IoError("neuronrun --preload: the zygote is gone");
  int pair[2];
  if (::socketpair(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC, 0, pair) != 0) {
    throw IoError(StrCat("neuronrun --preload: socketpair failed: ", std::strerror(errno)));
  }
  Fd ours(pair[0]), theirs(pair[1]);
  try {
    SendWithDescriptors(socket_, "connect", {ours.fd});
  } catch (...) {
    Close();
    throw;
  }
  return theirs.release();
}

void Zygote::Close() {
  if (socket_ >= 0) ::close(socket_);  // end of file: the zygote returns
  socket_ = -1;
  // It exits once its keepers have (a shared zygote's); past kExitTimeout,
  // unless the rank group's reaping took it already (its pid may be
  // another process's by now): its process group, it and any half-made rank.
  const auto deadline = std::chrono::steady_clock::now() + kExitTimeout;
  while (pid_ > 0 && ::waitpid(pid_, nullptr, WNOHANG) == 0) {
    if (std::chrono::steady_clock::now() < deadline) {
      ::usleep(2000);
      continue;
    }
    ::kill(-pid_, SIGKILL);
    ::waitpid(pid_, nullptr, 0);
    break;
  }
  pid_ = -1;
}

std::string Zygote::Name() const {
  return client_ ? std::string("the shared zygote") : StrCat("the zygote (pid ", pid_, ")");
}

std::string Zygote::Receive(std::chrono::seconds timeout, std::size_t max_bytes) {
  pollfd p{socket_, POLLIN, 0};
  int ready;
  do {
    ready = ::poll(&p, 1, static_cast<int>(std::chrono::milliseconds(timeout).count()));
  } while (ready < 0 && errno == EINTR);
  if (ready == 0) {
    throw TimeoutError(StrCat("neuronrun --preload: ", Name(), " did not answer within ",
                              timeout.count(), " s"));
  }
  std::string buffer(max_bytes, '\0');
  ssize_t n;
  do {
    n = ::recv(socket_, buffer.data(), buffer.size(), MSG_TRUNC);
  } while (n < 0 && errno == EINTR);
  if (n > static_cast<ssize_t>(max_bytes)) {
    throw IoError(StrCat("neuronrun --preload: ", Name(), " sent ", n, " bytes, more than ",
                         max_bytes));
  }
  if (n <= 0) {
    throw IoError(StrCat("neuronrun --preload: ", Name(), " exited",
                         n < 0 ? StrCat(": ", std::strerror(errno)) : std::string()));
  }
  buffer.resize(static_cast<std::size_t>(n));
  return buffer;
}

SpawnedChild Zygote::Spawn(const SpawnRequest& request) {
  NEURON_CHECK(request.argv.size() >= 2, "neuronrun --preload: no program to run");
  // A rank forked for this process is re-parented to it only if it is a subreaper.
  int subreaper = 0;
  if (!client_ && (::prctl(PR_GET_CHILD_SUBREAPER, &subreaper) != 0 || subreaper == 0)) {
    throw IoError("neuronrun --preload: this process is not a child subreaper");
  }
  Pipe out, err, status;
  if (client_) MakePipe(status);
  if (request.inherit_stdio) {
    out.write.fd = ::fcntl(STDOUT_FILENO, F_DUPFD_CLOEXEC, 3);
    err.write.fd = ::fcntl(STDERR_FILENO, F_DUPFD_CLOEXEC, 3);
    if (out.write.fd < 0 || err.write.fd < 0) {
      throw IoError(StrCat("dup failed: ", std::strerror(errno)));
    }
  } else if (!request.output_file.empty()) {
    out.write.fd = runtime::OpenForWriting(request.output_file, "output file", O_APPEND);
    err.write.fd = ::fcntl(out.write.fd, F_DUPFD_CLOEXEC, 3);
    if (err.write.fd < 0) throw IoError(StrCat("dup failed: ", std::strerror(errno)));
  } else {
    MakePipe(out);
    MakePipe(err);
  }
  if (socket_ < 0) throw IoError("neuronrun --preload: the zygote is gone");
  std::string reply;
  try {
    std::vector<int> fds = {out.write.fd, err.write.fd};
    if (client_) fds.push_back(status.write.fd);  // the keeper's
    SendWithDescriptors(socket_, RequestPayload(request), fds);
    ::close(out.write.release());  // the rank (and keeper) hold the write ends now
    ::close(err.write.release());
    if (client_) ::close(status.write.release());
    reply = Receive(kReplyTimeout);
  } catch (...) {
    Close();  // a late answer would be taken for the next rank's
    throw;
  }
  const pid_t pid = reply.rfind("pid ", 0) == 0 ? std::atoi(reply.c_str() + 4) : -1;
  if (pid <= 0) {
    Close();
    throw IoError(StrCat("cannot start ", request.argv[1], " through the zygote: ",
                         reply.rfind("error ", 0) == 0 ? reply.substr(6) : reply));
  }
  for (const Fd* fd : {&out.read, &err.read, &status.read}) {
    if (fd->fd >= 0) ::fcntl(fd->fd, F_SETFL, ::fcntl(fd->fd, F_GETFL) | O_NONBLOCK);
  }
  return {pid, out.read.release(), err.read.release(), status.read.release()};
}

}  // namespace neuron::launcher
