// A Store in one file, shared by the processes that open the same path (one
// host, or a shared file system): the file:// rendezvous.
//
// The file is an append-only log of records; every operation takes an
// exclusive flock, replays the records it has not seen into its cache,
// applies itself (appending a record when it changes something), and
// unlocks. Waiting blocks on inotify for changes of the file (with a short
// poll as a fallback for file systems that do not report them), never
// spinning a core.
//
// Usage:
//   FileStore store("/tmp/job42.store");
//   store.Set("addr/0", "10.0.0.1:4000");
//   store.Wait({"addr/1"}, std::chrono::seconds(30));
#pragma once

#include <mutex>
#include <string>

#include "neuron/collectives/store/key_value_table.h"
#include "neuron/collectives/store/store.h"

namespace neuron::collectives {

class FileStore : public Store {
 public:
  using Store::Get;
  using Store::Wait;

  // Creates the file when missing. Throws IoError naming the path.
  explicit FileStore(std::string path);
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
  void AppendRecord(const std::string& key, const std::string* value);
  void Refresh();

  std::string path_;
  int fd_ = -1;
  int inotify_fd_ = -1;
  std::mutex mutex_;        // one operation at a time in this process
  KeyValueTable table_;     // the log replayed up to offset_
  std::uint64_t offset_ = 0;
};

}  // namespace neuron::collectives
