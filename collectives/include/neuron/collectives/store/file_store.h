// A Store in one file, shared by the processes that open the same path (one
// host, or a shared file system): the file:// rendezvous.
//
// The file is an append-only log of records; every operation takes an
// exclusive flock, replays the records it has not seen into its cache,
// applies itself (appending a record when it changes something), and
// unlocks. Waiting blocks on inotify for changes of the file (with a short
// poll as a fallback for file systems that do not report them), never
// spinning a core. A key or a value is at most 1 GiB: larger ones are
// refused before they are written, and a record in the file claiming more
// is reported as corruption.
//
// Usage:
//   FileStore store("/tmp/job42.store");
//   store.Set("addr/0", "10.0.0.1:4000");
//   store.Wait({"addr/1"}, std::chrono::seconds(30));
#pragma once

#include <cstdint>
#include <mutex>
#include <string>

#include "neuron/collectives/store/key_value_table.h"
#include "neuron/collectives/store/store.h"

namespace neuron::collectives {

class FileStore : public Store {
 public:
  using Store::Get;
  using Store::Wait;

  // A key or value is at most this long (records claiming more are corrupt).
  static constexpr std::uint64_t kMaxRecordBytes = std::uint64_t{1} << 30;

  // Creates the file when missing. Throws IoError naming the path.
  // `max_record_bytes` (tests) lowers the limit of a key or value.
  explicit FileStore(std::string path, std::uint64_t max_record_bytes = kMaxRecordBytes);
  ~FileStore() override;
  FileStore(const FileStore&) = delete;
  FileStore& operator=(const FileStore&) = delete;

  void Set(const std::string& key, const std::string& value) override;
  std::string Get(const std::string& key, Duration timeout) override;
  std::int64_t Add(const std::string& key, std::int64_t delta) override;
  std::string CompareSet(const std::string& key, const std::string& expected,
                         const std::string& desired) override;
  void Wait(const std::vector<std::string>& keys, Duration timeout) override;
  bool Check(const std::vector<std::string>& keys) override;
  bool Delete(const std::string& key) override;
  std::int64_t NumKeys() override;

  const std::string& path() const { return path_; }

 private:
  class Locked;  // RAII: flock + refresh of the cache
  // Throws InvalidUsage when a key or value exceeds what a reader of the
  // file accepts (max_record_bytes_), before anything is written.
  void CheckRecord(const std::string& key, std::size_t value_bytes) const;
  // Appends under the lock. On a failed write the partial record is cut
  // off and the cache reset, so the next operation replays the file.
  void AppendRecord(const std::string& key, const std::string* value);
  void Refresh();

  std::string path_;
  int fd_ = -1;
  int inotify_fd_ = -1;
  std::mutex mutex_;        // one operation at a time in this process
  KeyValueTable table_;     // the log replayed up to offset_
  std::uint64_t offset_ = 0;
  std::uint64_t max_record_bytes_ = kMaxRecordBytes;
};

}  // namespace neuron::collectives
