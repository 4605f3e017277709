#include "secret.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <sstream>

#include "neuron/collectives/store/auth.h"
#include "neuron/runtime/config.h"
#include "neuron/runtime/error.h"
#include "neuron/runtime/files.h"

namespace neuron::launcher {

namespace {

std::string DefaultSecretPath() {
  const char* home = std::getenv("HOME");
  NEURON_CHECK(home != nullptr && home[0] != '\0',
               "multi-node job: no --rdzv-secret-file, no NEURON_RDZV_SECRET and "
               "no HOME for ~/.config/torchneuron/rdzv-secret");
  return std::string(home) + "/.config/torchneuron/rdzv-secret";
}

// Creates `path` with a new secret unless it exists; O_EXCL makes two agents
// racing on a shared home agree on one file.
void CreateIfMissing(const std::string& path) {
  std::filesystem::create_directories(std::filesystem::path(path).parent_path());
  const int fd = ::open(path.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0600);
  if (fd < 0) {
    NEURON_CHECK(errno == EEXIST, "cannot create rendezvous secret file ", path,
                 ": ", std::strerror(errno));
    return;
  }
  const std::string secret = collectives::auth::GenerateSecret() + "\n";
  const bool ok = ::write(fd, secret.data(), secret.size()) ==
                  static_cast<ssize_t>(secret.size());
  ::close(fd);
  NEURON_CHECK(ok, "cannot write rendezvous secret file ", path);
}

std::string ReadSecretFile(const std::string& path) {
  struct stat st {};
  NEURON_CHECK(::stat(path.c_str(), &st) == 0, "rendezvous secret file ", path,
               " does not exist");
  NEURON_CHECK(!S_ISDIR(st.st_mode), "rendezvous secret file ", path, " is a directory");
  NEURON_CHECK((st.st_mode & 077) == 0, "rendezvous secret file ", path,
               " is readable by other users (chmod 600 it)");
  NEURON_CHECK(S_ISREG(st.st_mode), "rendezvous secret file ", path, " is not a regular file");
  std::string secret;
  try {
    secret = runtime::ReadFile(path, "rendezvous secret", 4096);
  } catch (const IoError& e) {
    throw InvalidUsage(e.what());
  }
  while (!secret.empty() && (secret.back() == '\n' || secret.back() == '\r')) {
    secret.pop_back();
  }
  NEURON_CHECK(!secret.empty(), "rendezvous secret file ", path, " is empty");
  collectives::auth::CheckSecret(secret, "rendezvous secret file " + path);
  return secret;
}

}  // namespace

std::string LoadOrCreateRdzvSecret(const std::string& secret_file) {
  if (!secret_file.empty()) return ReadSecretFile(secret_file);
  if (auto env = runtime::ConfigRegistry::Get().Find(runtime::ConfigKey::kRdzvSecret)) {
    collectives::auth::CheckSecret(*env, "$NEURON_RDZV_SECRET");
    return *env;
  }
  const std::string path = DefaultSecretPath();
  CreateIfMissing(path);
  return ReadSecretFile(path);
}

}  // namespace neuron::launcher
