#include "neuron/runtime/files.h"

#include <fcntl.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <sstream>

#include "neuron/runtime/error.h"

namespace neuron::runtime {

void WriteFileAtomically(const std::string& path, const std::string& bytes) {
  const std::string temp = StrCat(path, ".tmp.", ::getpid());
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

std::string ReadFile(const std::string& path, const char* what) {
  std::ifstream in(path, std::ios::binary | std::ios::ate);
  if (!in.good()) {
    throw IoError(StrCat("cannot read ", what, " file ", path, ": ", std::strerror(errno)));
  }
  const std::streamoff size = in.tellg();
  std::string bytes;
  if (size > 0) {  // one read into the result; else (a pipe, /proc) read what comes
    bytes.resize(static_cast<std::size_t>(size));
    in.seekg(0);
    in.read(bytes.data(), size);
    if (in.gcount() == size) return bytes;
    in.clear();
    in.seekg(0);
  }
  std::stringstream all;
  all << in.rdbuf();
  return all.str();
}

}  // namespace neuron::runtime
