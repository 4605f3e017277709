// Counting a test's shared-memory segments in /dev/shm (shm_transport_test.cc,
// multi_process_test.cc): the transports name theirs "neuron-<uid>-<rank>"
// with the uid their ranks agreed on, so segments of tests running alongside
// do not count.
#pragma once

#include <dirent.h>

#include <string>
#include <vector>

namespace neuron::collectives::testing {

// Entries of /dev/shm named "neuron-<uid>-..." for any of `uids`.
inline int ShmSegments(const std::vector<std::string>& uids) {
  int n = 0;
  if (DIR* d = ::opendir("/dev/shm")) {
    while (dirent* e = ::readdir(d)) {
      for (const auto& uid : uids) {
        n += std::string(e->d_name).rfind("neuron-" + uid + "-", 0) == 0;
      }
    }
    ::closedir(d);
  }
  return n;
}

}  // namespace neuron::collectives::testing
