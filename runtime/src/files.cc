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

std::string ReadFile(const std::string& path, const char* what, std::uint64_t max_bytes) {
  // O_NONBLOCK: opening a FIFO must not wait for a writer (it is refused below).
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC | O_NONBLOCK);
  if (fd < 0) {
    throw IoError(StrCat("cannot read ", what, " file ", path, ": ", std::strerror(errno)));
  }
  struct stat st {};
  if (::fstat(fd, &st) != 0 || !S_ISREG(st.st_mode)) {
    ::close(fd);
    throw IoError(StrCat("cannot read ", what, " file ", path, ": not a regular file"));
  }
  const auto size = static_cast<std::uint64_t>(st.st_size);
  if (size > max_bytes) {
    ::close(fd);
    throw IoError(StrCat("cannot read ", what, " file ", path, ": ", size,
                         " bytes, more than the ", max_bytes, " such a file may have"));
  }
  // The stat'ed size, once: a file that grows meanwhile is read as it was.
  std::string bytes(static_cast<std::size_t>(size), '\0');
  std::size_t used = 0;
  while (used < bytes.size()) {
    const ssize_t n = ::read(fd, bytes.data() + used, bytes.size() - used);
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) {
      const int e = errno;
      ::close(fd);
      throw IoError(StrCat("cannot read ", what, " file ", path, ": ", std::strerror(e)));
    }
    if (n == 0) break;  // it shrank
    used += static_cast<std::size_t>(n);
  }
  ::close(fd);
  bytes.resize(used);
  return bytes;
}

}  // namespace neuron::runtime
