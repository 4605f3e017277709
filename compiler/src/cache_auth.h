// Authentication of the compile cache's disk entries (private to the cache).
//
//   CheckCacheDirectory(dir);                    // owned by this user, not open to all
//   const std::string key = CacheMacKey(dir);    // dir/mac-secret, 0600, made once
//   std::string mac = EntryMac(key, digest, bytes);
//   if (!SameMac(mac, stored)) { /* forged or damaged: recompile */ }
//
// An entry is trusted only when its MAC, HMAC-SHA256 under a per-user key
// kept beside the entries, matches: a file planted or relabelled (its
// graph id changed, its frame checksum recomputed) by anyone who cannot read
// the key is a miss, never a result.
#pragma once

#include <string>

namespace neuron::compiler {

// The key's file in the cache directory (no ".key" extension: those are
// the entries' components).
inline constexpr char kCacheMacKeyFile[] = "mac-secret";
inline constexpr std::size_t kCacheMacKeyBytes = 32;

// Throws InvalidUsage naming `dir` when it is not a directory, is not owned
// by this process's effective user, or is writable by others (S_IWOTH)
// without the sticky bit: whoever could replace files there could swap the
// key itself.
void CheckCacheDirectory(const std::string& dir);

// The 32-byte key in `dir`/mac-secret, created (random, mode 0600, by a
// temporary made O_EXCL | O_NOFOLLOW and linked into place, so concurrent
// processes agree on one key) when absent. Throws InvalidUsage naming the
// file when it is a symbolic link, not a regular file, not this user's,
// readable or writable by group or others, or not 32 bytes; IoError when it
// cannot be read or made.
std::string CacheMacKey(const std::string& dir);

// HMAC-SHA256(key, "torchneuron compile cache entry 1" | digest | bytes),
// 32 raw bytes: binds an entry's file bytes to its key's digest.
std::string EntryMac(const std::string& key, const std::string& digest,
                     const std::string& bytes);

// Whether two MACs are equal, in time independent of where they differ.
bool SameMac(const std::string& a, const std::string& b);

}  // namespace neuron::compiler
