#include "cache_auth.h"

#include <fcntl.h>
#include <openssl/crypto.h>
#include <openssl/evp.h>
#include <openssl/core_names.h>
#include <openssl/params.h>
#include <sys/random.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstring>

#include "neuron/runtime/error.h"

namespace neuron::compiler {
namespace {

constexpr char kMacLabel[] = "torchneuron compile cache entry 1";

std::string RandomBytes(std::size_t n) {
  std::string out(n, '\0');
  std::size_t got = 0;
  while (got < n) {
    const ssize_t r = ::getrandom(out.data() + got, n - got, 0);
    if (r < 0 && errno == EINTR) continue;
    if (r < 0) throw IoError(StrCat("compile cache: no random bytes: ", std::strerror(errno)));
    got += static_cast<std::size_t>(r);
  }
  return out;
}

std::string Octal(mode_t mode) {
  char text[8];
  std::snprintf(text, sizeof(text), "%04o", static_cast<unsigned>(mode & 07777));
  return text;
}

// Checks what fstat says of the key file `path` (open as `fd`); throws
// InvalidUsage naming it, after closing `fd`.
void CheckKeyFile(int fd, const std::string& path) {
  struct stat st {};
  std::string why;
  if (::fstat(fd, &st) != 0 || !S_ISREG(st.st_mode)) {
    why = "not a regular file";
  } else if (st.st_uid != ::geteuid()) {
    why = StrCat("owned by uid ", st.st_uid, ", not by this user (uid ", ::geteuid(), ")");
  } else if ((st.st_mode & 077) != 0) {
    why = StrCat("mode ", Octal(st.st_mode),
                 ": others may read or write it (chmod 600 it, or delete it to make a "
                 "new key: the entries are then recompiled)");
  }
  if (why.empty()) return;
  ::close(fd);
  throw InvalidUsage(StrCat("compile cache: key file ", path, ": ", why));
}

// The key in `path`, or "" when there is no such file.
std::string ReadKey(const std::string& path) {
  const int fd = ::open(path.c_str(), O_RDONLY | O_NOFOLLOW | O_CLOEXEC | O_NONBLOCK);
  if (fd < 0 && errno == ENOENT) return "";
  if (fd < 0 && errno == ELOOP) {
    throw InvalidUsage(StrCat("compile cache: key file ", path,
                              ": it is a symbolic link, not followed"));
  }
  if (fd < 0) {
    throw IoError(StrCat("compile cache: cannot read key file ", path, ": ",
                         std::strerror(errno)));
  }
  CheckKeyFile(fd, path);
  std::string key(kCacheMacKeyBytes + 1, '\0');
  const ssize_t n = ::read(fd, key.data(), key.size());
  const int e = errno;
  ::close(fd);
  if (n < 0) {
    throw IoError(StrCat("compile cache: cannot read key file ", path, ": ", std::strerror(e)));
  }
  NEURON_CHECK(static_cast<std::size_t>(n) == kCacheMacKeyBytes, "compile cache: key file ",
               path, ": ", n, " bytes, a key has ", kCacheMacKeyBytes,
               " (delete it to make a new key: the entries are then recompiled)");
  key.resize(kCacheMacKeyBytes);
  return key;
}

// Writes a new random key to a temporary made O_EXCL | O_NOFOLLOW (0600)
// and links it to `path`: the first process's key wins, whole.
std::string CreateKey(const std::string& path) {
  const std::string key = RandomBytes(kCacheMacKeyBytes);
  std::string suffix;
  for (unsigned char c : RandomBytes(8)) suffix += "0123456789abcdef"[c & 15];
  const std::string temp = StrCat(path, ".tmp.", ::getpid(), ".", suffix);
  const int fd =
      ::open(temp.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC, 0600);
  if (fd < 0) {
    throw IoError(StrCat("compile cache: cannot create key file ", temp, ": ",
                         std::strerror(errno)));
  }
  const bool written = ::write(fd, key.data(), key.size()) ==
                           static_cast<ssize_t>(key.size()) && ::fsync(fd) == 0;
  ::close(fd);
  const int linked = written ? ::link(temp.c_str(), path.c_str()) : -1;
  const int e = errno;
  ::unlink(temp.c_str());
  if (linked == 0) return key;
  if (written && e == EEXIST) return ReadKey(path);  // another process made it first
  throw IoError(StrCat("compile cache: cannot create key file ", path, ": ",
                       std::strerror(e)));
}

}  // namespace

void CheckCacheDirectory(const std::string& dir) {
  struct stat st {};
  NEURON_CHECK(::stat(dir.c_str(), &st) == 0 && S_ISDIR(st.st_mode), "compile cache: ", dir,
               " is not a directory");
  const char* fix = " (set NEURON_CACHE_DIR to a directory of your own, or to nothing, "
                    "NEURON_CACHE_DIR=, to keep executables in memory only)";
  NEURON_CHECK(st.st_uid == ::geteuid(), "compile cache: directory ", dir,
               " is owned by uid ", st.st_uid, ", not by this user (uid ", ::geteuid(), ")",
               fix);
  NEURON_CHECK((st.st_mode & S_IWOTH) == 0 || (st.st_mode & S_ISVTX) != 0,
               "compile cache: directory ", dir, " (mode ", Octal(st.st_mode),
               ") is writable by others without the sticky bit", fix);
}

std::string CacheMacKey(const std::string& dir) {
  const std::string path = dir + "/" + kCacheMacKeyFile;
  std::string key = ReadKey(path);
  return key.empty() ? CreateKey(path) : key;
}

std::string EntryMac(const std::string& key, const std::string& digest,
                     const std::string& bytes) {
  EVP_MAC* hmac = EVP_MAC_fetch(nullptr, "HMAC", nullptr);
  EVP_MAC_CTX* ctx = hmac != nullptr ? EVP_MAC_CTX_new(hmac) : nullptr;
  char sha256[] = "SHA256";
  const OSSL_PARAM params[] = {
      OSSL_PARAM_construct_utf8_string(OSSL_MAC_PARAM_DIGEST, sha256, 0), OSSL_PARAM_END};
  const auto update = [&](const std::string& s) {
    return EVP_MAC_update(ctx, reinterpret_cast<const unsigned char*>(s.data()), s.size()) == 1;
  };
  unsigned char mac[EVP_MAX_MD_SIZE];
  std::size_t length = 0;
  const bool ok = ctx != nullptr &&
                  EVP_MAC_init(ctx, reinterpret_cast<const unsigned char*>(key.data()),
                               key.size(), params) == 1 &&
                  update(StrCat(kMacLabel, '\0', digest, '\0')) && update(bytes) &&
                  EVP_MAC_final(ctx, mac, &length, sizeof(mac)) == 1;
  EVP_MAC_CTX_free(ctx);
  EVP_MAC_free(hmac);
  if (!ok) throw Error("compile cache: HMAC-SHA256 failed (OpenSSL)");
  return std::string(reinterpret_cast<const char*>(mac), length);
}

bool SameMac(const std::string& a, const std::string& b) {
  return a.size() == b.size() && CRYPTO_memcmp(a.data(), b.data(), a.size()) == 0;
}

}  // namespace neuron::compiler
