#include "neuron/runtime/files.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <sstream>

#include "neuron/runtime/error.h"

namespace neuron::runtime {

namespace {
constexpr const char* kTemporary = ".tmp.";  // then the writer's pid
}  // namespace

void WriteFileAtomically(const std::string& path, const std::string& bytes) {
  const std::string temp = StrCat(path, kTemporary, ::getpid());
  const int fd = ::open(temp.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (fd < 0) throw IoError(StrCat("cannot write ", temp, ": ", std::strerror(errno)));
  std::size_t done = 0;
  while (done < bytes.size()) {
    const ssize_t n = ::write(fd, bytes.data() + done, bytes.size() - done);
    if (n < 0) {
      const int e = errno;
      ::close(fd);
      std::remove(temp.c_str());
      throw IoError(StrCat("cannot write ", temp, ": ", std::strerror(e)));
    }
    done += static_cast<std::size_t>(n);
  }
  const bool synced = ::fsync(fd) == 0;
  ::close(fd);
  if (!synced || std::rename(temp.c_str(), path.c_str()) != 0) {
    const int e = errno;
    std::remove(temp.c_str());
    throw IoError(StrCat("cannot move ", temp, " to ", path, ": ", std::strerror(e)));
  }
}

bool IsTemporaryOf(const std::string& name, const std::string& target) {
  return name.rfind(target + kTemporary, 0) == 0;
}

void SyncDirectory(const std::string& dir) {
  const int fd = ::open(dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (fd < 0 || ::fsync(fd) != 0) {
    const int e = errno;
    if (fd >= 0) ::close(fd);
    throw IoError(StrCat("cannot sync the directory ", dir, ": ", std::strerror(e)));
  }
  ::close(fd);
}

std::string ReadFile(const std::string& path, const char* what) {
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) {
    throw IoError(StrCat("cannot read ", what, " file ", path, ": ", std::strerror(errno)));
  }
  struct stat st {};
  std::string bytes;
  // One read of the stat'ed size into the result; then whatever else comes
  // (a file that grew, a pipe or /proc, whose size says nothing).
  if (::fstat(fd, &st) == 0 && st.st_size > 0) bytes.reserve(static_cast<std::size_t>(st.st_size) + 1);
  std::size_t used = 0;
  bytes.resize(bytes.capacity() > 0 ? bytes.capacity() : 65536);
  while (true) {
    if (used == bytes.size()) bytes.resize(bytes.size() * 2);
    const ssize_t n = ::read(fd, bytes.data() + used, bytes.size() - used);
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) {
      const int e = errno;
      ::close(fd);
      throw IoError(StrCat("cannot read ", what, " file ", path, ": ", std::strerror(e)));
    }
    if (n == 0) break;
    used += static_cast<std::size_t>(n);
  }
  ::close(fd);
  bytes.resize(used);
  return bytes;
}

}  // namespace neuron::runtime
