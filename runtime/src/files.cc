#include "neuron/runtime/files.h"

#include <fcntl.h>
#include <sys/random.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <sstream>

#include "neuron/runtime/error.h"

namespace neuron::runtime {

namespace {

constexpr const char* kTemporary = ".tmp.";  // then the writer's pid, '.', random hex

// 16 hex digits from the kernel's random source.
std::string RandomSuffix() {
  unsigned char raw[8];
  std::size_t got = 0;
  while (got < sizeof(raw)) {
    const ssize_t n = ::getrandom(raw + got, sizeof(raw) - got, 0);
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) throw IoError(StrCat("cannot read random bytes: ", std::strerror(errno)));
    got += static_cast<std::size_t>(n);
  }
  static constexpr char kHex[] = "0123456789abcdef";
  std::string out;
  for (unsigned char c : raw) {
    out.push_back(kHex[c >> 4]);
    out.push_back(kHex[c & 15]);
  }
  return out;
}

// Refuses to replace a symbolic link at `path` (rename would not follow it,
// but whoever planted it meant the write for its target).
void CheckNotALink(const std::string& path, const char* what) {
  struct stat st {};
  if (::lstat(path.c_str(), &st) == 0 && S_ISLNK(st.st_mode)) {
    throw IoError(StrCat("cannot write ", what, " ", path,
                         ": it is a symbolic link, not followed"));
  }
}

// Writes all of `bytes` to `fd`; false with errno set on an error.
bool WriteAll(int fd, const std::string& bytes) {
  std::size_t done = 0;
  while (done < bytes.size()) {
    const ssize_t n = ::write(fd, bytes.data() + done, bytes.size() - done);
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) return false;
    done += static_cast<std::size_t>(n);
  }
  return true;
}

}  // namespace

int OpenForWriting(const std::string& path, const char* what, int flags) {
  // O_NONBLOCK: a planted FIFO without a reader fails (ENXIO), not blocks.
  const int fd = ::open(path.c_str(),
                        O_WRONLY | O_CREAT | O_NOFOLLOW | O_CLOEXEC | O_NONBLOCK | flags, 0644);
  if (fd < 0) {
    const int e = errno;
    if (e == ELOOP) {
      throw IoError(StrCat("cannot write ", what, " ", path,
                           ": it is a symbolic link, not followed"));
    }
    throw IoError(StrCat("cannot write ", what, " ", path, ": ", std::strerror(e)));
  }
  struct stat st {};
  if (::fstat(fd, &st) != 0 || !S_ISREG(st.st_mode)) {
    ::close(fd);
    throw IoError(StrCat("cannot write ", what, " ", path, ": not a regular file"));
  }
  ::fcntl(fd, F_SETFL, ::fcntl(fd, F_GETFL) & ~O_NONBLOCK);
  return fd;
}

void WriteFileAtomically(const std::string& path, const std::string& bytes) {
  CheckNotALink(path, "file");
  const std::string temp = StrCat(path, kTemporary, ::getpid(), ".", RandomSuffix());
  const int fd = OpenForWriting(temp, "temporary file", O_EXCL);
  if (!WriteAll(fd, bytes)) {
    const int e = errno;
    ::close(fd);
    std::remove(temp.c_str());
    throw IoError(StrCat("cannot write ", temp, ": ", std::strerror(e)));
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

long TemporaryWriterPid(const std::string& name) {
  const auto at = name.rfind(kTemporary);
  if (at == std::string::npos) return -1;
  const char* digits = name.c_str() + at + std::strlen(kTemporary);
  char* stop = nullptr;
  const long pid = std::strtol(digits, &stop, 10);
  if (stop == digits || pid <= 0 || (*stop != '\0' && *stop != '.')) return -1;
  return pid;
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

std::string ReadFile(const std::string& path, const char* what, std::uint64_t max_bytes,
                     Links links) {
  // O_NONBLOCK: opening a FIFO must not wait for a writer (it is refused below).
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC | O_NONBLOCK |
                                          (links == Links::kRefuse ? O_NOFOLLOW : 0));
  if (fd < 0) {
    throw IoError(StrCat("cannot read ", what, " file ", path, ": ",
                         errno == ELOOP && links == Links::kRefuse
                             ? "it is a symbolic link, not followed"
                             : std::strerror(errno)));
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
