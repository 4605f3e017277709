#include "neuron/collectives/store/file_store.h"

#include <fcntl.h>
#include <poll.h>
#include <sys/file.h>
#include <sys/inotify.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>

#include "neuron/runtime/error.h"

namespace neuron::collectives {

namespace {

// Record: u32 key length, key, i64 value length (-1: deleted), value.
// Little-endian as written by this host; the file is host-local scratch.
constexpr std::int64_t kDeleted = -1;

void WriteAll(int fd, const std::string& data, const std::string& path) {
  std::size_t done = 0;
  while (done < data.size()) {
    const ssize_t n = ::write(fd, data.data() + done, data.size() - done);
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) throw IoError(StrCat("cannot write store file ", path, ": ", std::strerror(errno)));
    done += static_cast<std::size_t>(n);
  }
}

}  // namespace

class FileStore::Locked {
 public:
  explicit Locked(FileStore& store) : store_(store), lock_(store.mutex_) {
    while (::flock(store_.fd_, LOCK_EX) != 0) {
      if (errno != EINTR) {
        throw IoError(StrCat("cannot lock store file ", store_.path_, ": ",
                             std::strerror(errno)));
      }
    }
    store_.Refresh();
  }
  ~Locked() { ::flock(store_.fd_, LOCK_UN); }

 private:
  FileStore& store_;
  std::lock_guard<std::mutex> lock_;
};

FileStore::FileStore(std::string path, std::uint64_t max_record_bytes)
    : path_(std::move(path)), max_record_bytes_(max_record_bytes) {
  fd_ = ::open(path_.c_str(), O_RDWR | O_CREAT | O_CLOEXEC, 0600);
  if (fd_ < 0) {
    throw IoError(StrCat("cannot open store file ", path_, ": ", std::strerror(errno)));
  }
  inotify_fd_ = ::inotify_init1(IN_NONBLOCK | IN_CLOEXEC);
  if (inotify_fd_ >= 0 && ::inotify_add_watch(inotify_fd_, path_.c_str(), IN_MODIFY) < 0) {
    ::close(inotify_fd_);
    inotify_fd_ = -1;  // fall back to polling
  }
}

FileStore::~FileStore() {
  if (inotify_fd_ >= 0) ::close(inotify_fd_);
  if (fd_ >= 0) ::close(fd_);
}

void FileStore::Refresh() {
  struct stat st {};
  if (::fstat(fd_, &st) != 0) {
    throw IoError(StrCat("cannot stat store file ", path_, ": ", std::strerror(errno)));
  }
  const auto size = static_cast<std::uint64_t>(st.st_size);
  // One record at a time: nothing is allocated for a length the file does
  // not hold, so a corrupt length is an error, not a huge allocation.
  std::uint64_t pos = offset_;
  auto take = [&](void* out, std::uint64_t n) {
    if (n > size - pos ||
        ::pread(fd_, out, n, static_cast<off_t>(pos)) != static_cast<ssize_t>(n)) {
      throw IoError(
          StrCat("store file ", path_, " is truncated or corrupt at byte ", pos));
    }
    pos += n;
  };
  while (pos < size) {
    std::uint32_t key_len = 0;
    std::int64_t value_len = 0;
    take(&key_len, sizeof(key_len));
    if (key_len > max_record_bytes_) throw IoError("store file " + path_ + " is corrupt");
    std::string key(std::min<std::uint64_t>(key_len, size - pos), '\0');
    take(key.data(), key_len);
    take(&value_len, sizeof(value_len));
    if (value_len == kDeleted) {
      table_.Delete(key);
      continue;
    }
    if (value_len < 0 || static_cast<std::uint64_t>(value_len) > max_record_bytes_) {
      throw IoError("store file " + path_ + " is corrupt");
    }
    std::string value(std::min<std::uint64_t>(value_len, size - pos), '\0');
    take(value.data(), static_cast<std::uint64_t>(value_len));
    table_.Set(key, value);
  }
  offset_ = std::max(offset_, size);
}

void FileStore::CheckRecord(const std::string& key, std::size_t value_bytes) const {
  if (key.size() > max_record_bytes_) {
    throw InvalidUsage(StrCat("store file ", path_, ": a ", key.size(), "-byte key ('",
                              key.substr(0, 64), "...') exceeds the record limit of ",
                              max_record_bytes_, " bytes"));
  }
  if (value_bytes > max_record_bytes_) {
    throw InvalidUsage(StrCat("store file ", path_, ": the ", value_bytes,
                              "-byte value of '", key.substr(0, 64),
                              "' exceeds the record limit of ", max_record_bytes_,
                              " bytes"));
  }
}

void FileStore::AppendRecord(const std::string& key, const std::string* value) {
  std::string record;
  const auto key_len = static_cast<std::uint32_t>(key.size());
  const std::int64_t value_len =
      value ? static_cast<std::int64_t>(value->size()) : kDeleted;
  record.append(reinterpret_cast<const char*>(&key_len), sizeof(key_len));
  record.append(key);
  record.append(reinterpret_cast<const char*>(&value_len), sizeof(value_len));
  if (value) record.append(*value);
  const off_t end = ::lseek(fd_, 0, SEEK_END);
  try {
    if (end < 0)
      throw IoError(StrCat("cannot seek store file ", path_, ": ", std::strerror(errno)));
    WriteAll(fd_, record, path_);
  } catch (...) {
    // No partial record stays for others to read as corrupt, and the cache
    // (which the caller already changed) is replayed from the file next time.
    if (end >= 0 && ::ftruncate(fd_, end) != 0) {
      // The partial record stays; readers report the file as corrupt.
    }
    table_ = KeyValueTable();
    offset_ = 0;
    throw;
  }
  // Our own record is already applied to the table by the caller.
  offset_ = static_cast<std::uint64_t>(end) + record.size();
}

void FileStore::Set(const std::string& key, const std::string& value) {
  CheckRecord(key, value.size());
  Locked lock(*this);
  table_.Set(key, value);
  AppendRecord(key, &value);
}

std::int64_t FileStore::Add(const std::string& key, std::int64_t delta) {
  CheckRecord(key, 0);
  Locked lock(*this);
  const std::int64_t result = table_.Add(key, delta);
  const std::string text = std::to_string(result);
  AppendRecord(key, &text);
  return result;
}

std::string FileStore::CompareSet(const std::string& key, const std::string& expected,
                                  const std::string& desired) {
  CheckRecord(key, desired.size());
  Locked lock(*this);
  const auto before = table_.Find(key);
  const std::string result = table_.CompareSet(key, expected, desired);
  if (table_.Find(key) != before) AppendRecord(key, &result);
  return result;
}

bool FileStore::Delete(const std::string& key) {
  CheckRecord(key, 0);
  Locked lock(*this);
  if (!table_.Delete(key)) return false;
  AppendRecord(key, nullptr);
  return true;
}

bool FileStore::Check(const std::vector<std::string>& keys) {
  Locked lock(*this);
  return table_.ContainsAll(keys);
}

std::int64_t FileStore::NumKeys() {
  Locked lock(*this);
  return table_.size();
}

std::string FileStore::Get(const std::string& key, Duration timeout) {
  Wait({key}, timeout);
  Locked lock(*this);
  auto value = table_.Find(key);
  if (!value) {
    throw TimeoutError(StrCat("store get of '", key, "' in ", path_,
                              ": the key was deleted while waiting"));
  }
  return *value;
}

void FileStore::Wait(const std::vector<std::string>& keys, Duration timeout) {
  timeout = Clamp(timeout);
  const auto deadline = std::chrono::steady_clock::now() + timeout;
  while (true) {
    std::string missing;
    {
      Locked lock(*this);
      if (table_.ContainsAll(keys)) return;
      missing = table_.Missing(keys);
    }
    const auto now = std::chrono::steady_clock::now();
    if (now >= deadline) {
      throw TimeoutError(StrCat("store wait on ", path_, " timed out after ",
                                timeout.count(), " ms; missing keys: ", missing));
    }
    // Sleep until the file changes; the 100 ms cap covers file systems
    // without inotify (and changes that raced with the check above).
    pollfd pfd{inotify_fd_, POLLIN, 0};
    const auto left = std::chrono::ceil<std::chrono::milliseconds>(deadline - now);
    const int wait_ms = static_cast<int>(std::min<std::int64_t>(left.count(), 100));
    if (inotify_fd_ >= 0 && ::poll(&pfd, 1, wait_ms) > 0) {
      char drain[4096];
      while (::read(inotify_fd_, drain, sizeof(drain)) > 0) {
      }
    } else if (inotify_fd_ < 0) {
      ::usleep(static_cast<useconds_t>(wait_ms) * 1000);
    }
  }
}

}  // namespace neuron::collectives
