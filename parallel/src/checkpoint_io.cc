#include "neuron/parallel/checkpoint_io.h"

#include <ATen/ATen.h>
#include <google/protobuf/text_format.h>

#include <signal.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <set>

#include "neuron/collectives/store/auth.h"
#include "neuron/runtime/config.h"
#include "neuron/runtime/dtype_list.h"
#include "neuron/runtime/error.h"
#include "neuron/runtime/files.h"
#include "neuron/runtime/fnv.h"

namespace neuron::parallel {

namespace {

constexpr char kMagic[8] = {'N', 'C', 'K', 'P', 'T', 'v', '1', '\n'};
constexpr const char* kManifest = "manifest.textproto";
constexpr std::uint64_t kMaxManifestBytes = 256 << 20;

constexpr const char* kFirstLine = "# torchneuron sharded checkpoint\n";
constexpr const char* kChecksumLine = "# checksum fnv1a64 ";
constexpr const char* kMacLine = "# mac hmac-sha256 ";
constexpr const char* kKeyVariable = "$NEURON_CHECKPOINT_SECRET";

// A keyed file's MAC binds its name (length-prefixed) and its bytes.
std::string FileMac(const std::string& key, const std::string& name, const std::string& bytes) {
  namespace auth = collectives::auth;
  return auth::Hex(auth::Proof(key, "neuron-checkpoint-file\n", StrCat(name.size(), ":", name),
                               bytes));
}

// The manifest's first two lines: what it is, and the checksum (with a key:
// the MAC) of the text after them (a manifest edited by hand, its step or
// its lists, is refused).
std::string ManifestHeader(const std::string& text, const std::string& key) {
  if (!key.empty()) {
    namespace auth = collectives::auth;
    return StrCat(kFirstLine, kMacLine,
                  auth::Hex(auth::Proof(key, "neuron-checkpoint-manifest\n", text, "")), "\n");
  }
  char hex[17];
  std::snprintf(hex, sizeof(hex), "%016llx",
                static_cast<unsigned long long>(runtime::Fnv1a(text.data(), text.size())));
  return StrCat(kFirstLine, kChecksumLine, hex, "\n");
}

// IoError unless `header` (the manifest's first two lines) is the one its
// text has under `key`: a keyed manifest needs its key, and with a key an
// unkeyed one is refused (a forger would otherwise strip the MACs).
void CheckManifestHeader(const std::string& dir, const std::string& header,
                         const std::string& text, const std::string& key) {
  const std::size_t first = std::strlen(kFirstLine);
  const bool keyed = header.compare(first, std::strlen(kMacLine), kMacLine) == 0;
  if (keyed && key.empty()) {
    throw IoError(StrCat("checkpoint ", dir, ": ", kManifest, " is keyed (HMAC-SHA256): set ",
                         kKeyVariable, " to the secret it was saved with"));
  }
  if (!keyed && !key.empty() &&
      header.compare(first, std::strlen(kChecksumLine), kChecksumLine) == 0) {
    throw IoError(StrCat("checkpoint ", dir, ": ", kManifest, " was saved without a key "
                         "(FNV-1a checksums) and ", kKeyVariable, " is set: with a key only "
                         "keyed checkpoints are trusted; unset it to load this one"));
  }
  if (collectives::auth::ConstantTimeEqual(header, ManifestHeader(text, key))) return;
  if (keyed) {
    throw IoError(StrCat("checkpoint ", dir, ": ", kManifest, " does not carry the MAC of its "
                         "contents under ", kKeyVariable, ": it was changed after it was "
                         "written, or saved with another secret"));
  }
  throw IoError(StrCat("checkpoint ", dir, ": ", kManifest, " does not carry the checksum of "
                       "its contents: it was changed after it was written (or written by "
                       "another program)"));
}

// IoError unless `bytes` are the file `entry` describes.
void CheckFile(const std::string& dir, const proto::ManifestFile& entry,
               const std::string& bytes, const std::string& key) {
  if (!key.empty()) {
    if (bytes.size() == entry.bytes() &&
        collectives::auth::ConstantTimeEqual(FileMac(key, entry.name(), bytes), entry.mac())) {
      return;
    }
    throw IoError(StrCat("checkpoint ", dir, ": ", entry.name(), " does not carry the MAC the "
                         "manifest gives it (it has ", bytes.size(), " bytes, the manifest says ",
                         entry.bytes(), "): the file changed or is truncated"));
  }
  const std::uint64_t checksum = runtime::Fnv1a(bytes.data(), bytes.size());
  if (bytes.size() == entry.bytes() && checksum == entry.checksum()) return;
  throw IoError(StrCat("checkpoint ", dir, ": ", entry.name(), " has ", bytes.size(),
                       " bytes and checksum ", checksum, " but the manifest says ",
                       entry.bytes(), " and ", entry.checksum(),
                       ": the file changed or is truncated"));
}

std::string DtypeName(at::ScalarType t) {
  switch (t) {
#define NEURON_CHECKPOINT_DTYPE(Id, bytes, floating, name, ir, Torch, Device) \
  case at::k##Torch:                                                       \
    return name;
    NEURON_FORALL_DTYPES(NEURON_CHECKPOINT_DTYPE)
#undef NEURON_CHECKPOINT_DTYPE
    default:
      throw InvalidUsage(StrCat("checkpoint: dtype ", t, " is not supported"));
  }
}

at::ScalarType DtypeOf(const std::string& name, const std::string& where) {
#define NEURON_CHECKPOINT_TYPE(Id, bytes, floating, dtype_name, ir, Torch, Device) \
  if (name == dtype_name) return at::k##Torch;
  NEURON_FORALL_DTYPES(NEURON_CHECKPOINT_TYPE)
#undef NEURON_CHECKPOINT_TYPE
  throw InvalidUsage(StrCat(where, ": unknown dtype '", name, "'"));
}

// `name` with bytes other than printable ASCII escaped (\xNN): a name
// from a file, quoted in a message.
std::string Printable(const std::string& name) {
  std::string out;
  for (unsigned char c : name) {
    if (c >= 0x20 && c < 0x7f && c != '\\') {
      out.push_back(static_cast<char>(c));
    } else {
      char hex[5];
      std::snprintf(hex, sizeof(hex), "\\x%02x", c);
      out += hex;
    }
  }
  return out;
}

// A manifest lists plain names of files in the checkpoint's own directory:
// "../other/shard-0.bin" or "/etc/passwd" would load (or, in an error,
// describe) a file outside it. IoError: the manifest was tampered with.
void CheckPlainName(const std::string& dir, const std::string& name) {
  const bool plain = !name.empty() && name != "." && name != ".." && name != kManifest &&
                     name.size() <= 255 && name.find('/') == std::string::npos &&
                     name.find('\0') == std::string::npos;
  if (plain) return;
  throw IoError(StrCat("checkpoint ", dir, ": ", kManifest, " lists the file '",
                       Printable(name), "', not a plain file name in the checkpoint directory "
                       "(the manifest was tampered with, or written by another program)"));
}

}  // namespace

std::string CheckpointKey() {
  const auto key = runtime::ConfigRegistry::Get().Find(runtime::ConfigKey::kCheckpointSecret);
  if (!key) return "";
  collectives::auth::CheckSecret(*key, kKeyVariable);
  return *key;
}

FileDigest WriteShardFile(const std::string& path, const std::vector<TensorPiece>& pieces,
                          const std::string& key) {
  proto::ShardFile file;
  for (const TensorPiece& p : pieces) {
    proto::TensorPiece* out = file.add_pieces();
    out->set_name(p.name);
    for (std::int64_t d : p.full_shape) out->add_full_shape(d);
    out->set_dim(p.dim);
    out->set_begin(p.begin);
    out->set_length(p.dim >= 0 ? p.data.size(p.dim) : 0);
    out->set_dtype(DtypeName(p.data.scalar_type()));
    const at::Tensor c = p.data.detach().contiguous();
    out->set_data(std::string(static_cast<const char*>(c.data_ptr()), c.nbytes()));
  }
  std::string bytes(kMagic, sizeof(kMagic));
  bytes += file.SerializeAsString();
  runtime::WriteFileAtomically(path, bytes);
  const std::string name = std::filesystem::path(path).filename().string();
  return {bytes.size(), runtime::Fnv1a(bytes.data(), bytes.size()),
          key.empty() ? "" : FileMac(key, name, bytes)};
}

std::vector<TensorPiece> ReadShardFile(const std::string& dir, const proto::ManifestFile& entry,
                                       const std::string& key) {
  CheckPlainName(dir, entry.name());
  const std::string path = dir + "/" + entry.name();
  // Not through a link either: the checkpoint's files are its own.
  const std::string bytes =
      runtime::ReadFile(path, "checkpoint", runtime::kMaxFileBytes, runtime::Links::kRefuse);
  CheckFile(dir, entry, bytes, key);
  proto::ShardFile file;
  if (bytes.compare(0, sizeof(kMagic), kMagic, sizeof(kMagic)) != 0 ||
      !file.ParseFromArray(bytes.data() + sizeof(kMagic),
                           static_cast<int>(bytes.size() - sizeof(kMagic)))) {
    throw IoError(StrCat("checkpoint ", dir, ": ", entry.name(), " is not a shard file"));
  }
  std::vector<TensorPiece> pieces;
  for (const proto::TensorPiece& p : file.pieces()) {
    const std::string where = StrCat("checkpoint ", path, ", tensor '", p.name(), "'");
    TensorPiece out;
    out.name = p.name();
    out.full_shape.assign(p.full_shape().begin(), p.full_shape().end());
    out.dim = p.dim();
    out.begin = p.begin();
    std::vector<std::int64_t> shape = out.full_shape;
    NEURON_CHECK(out.dim >= -1 && out.dim < static_cast<int>(shape.size()), where, ": dim ",
                 out.dim, " outside shape");
    if (out.dim >= 0) {
      NEURON_CHECK(p.begin() >= 0 && p.length() >= 0 && p.begin() <= shape[out.dim] &&
                       p.length() <= shape[out.dim] - p.begin(),
                   where, ": rows ", p.begin(), " + ", p.length(), " outside the ",
                   shape[out.dim], " of dim ", out.dim);
      shape[out.dim] = p.length();
    }
    const at::ScalarType dtype = DtypeOf(p.dtype(), where);
    // The shape must describe the data there is before anything is allocated.
    std::uint64_t bytes = c10::elementSize(dtype);
    for (std::int64_t d : shape) {
      NEURON_CHECK(d >= 0 && !__builtin_mul_overflow(bytes, static_cast<std::uint64_t>(d), &bytes),
                   where, ": shape ", at::IntArrayRef(shape), " is not a tensor's");
    }
    NEURON_CHECK(bytes == p.data().size(), where, ": ", p.data().size(),
                 " bytes of data for shape ", at::IntArrayRef(shape));
    out.data = at::empty(shape, at::TensorOptions(dtype));
    std::memcpy(out.data.data_ptr(), p.data().data(), p.data().size());
    pieces.push_back(std::move(out));
  }
  return pieces;
}

void WriteManifest(const std::string& dir, const proto::Manifest& manifest,
                   const std::string& key) {
  std::string text;
  google::protobuf::TextFormat::PrintToString(manifest, &text);
  runtime::WriteFileAtomically(dir + "/" + kManifest, ManifestHeader(text, key) + text);
  // The rename must reach the disk before the previous save's files are
  // removed (RemoveUnlisted).
  runtime::SyncDirectory(dir);
}

proto::Manifest ReadManifest(const std::string& dir, const std::string& key) {
  const std::string path = dir + "/" + kManifest;
  NEURON_CHECK(std::filesystem::exists(path), "no complete checkpoint in ", dir, ": ",
               kManifest, " is missing (a save that did not finish leaves none)");
  RemoveStaleTemporaries(dir);
  const std::string bytes = runtime::ReadFile(path, "checkpoint manifest", kMaxManifestBytes,
                                              runtime::Links::kRefuse);
  // "# torchneuron sharded checkpoint\n# checksum fnv1a64 <hex>\n<text>", or
  // with a key "...\n# mac hmac-sha256 <hex>\n<text>".
  const std::size_t first = bytes.find('\n');
  const std::size_t second = first == std::string::npos ? first : bytes.find('\n', first + 1);
  if (second == std::string::npos || bytes.compare(0, first + 1, kFirstLine) != 0) {
    throw IoError(StrCat("checkpoint ", dir, ": ", kManifest, " does not carry the checksum of "
                         "its contents: it was changed after it was written (or written by "
                         "another program)"));
  }
  const std::string text = bytes.substr(second + 1);
  CheckManifestHeader(dir, bytes.substr(0, second + 1), text, key);
  proto::Manifest manifest;
  NEURON_CHECK(google::protobuf::TextFormat::ParseFromString(text, &manifest), "checkpoint ",
               dir, ": ", kManifest, " does not parse");
  NEURON_CHECK(manifest.version() == 1, "checkpoint ", dir, ": format version ",
               manifest.version(), " is not supported (1 is)");
  for (const auto& f : manifest.files()) CheckPlainName(dir, f.name());
  return manifest;
}

std::vector<std::string> RemoveStaleTemporaries(const std::string& dir) {
  std::vector<std::string> removed;
  std::error_code error;
  std::filesystem::directory_iterator it(dir, error), end;
  for (; !error && it != end; it.increment(error)) {
    const std::string name = it->path().filename().string();
    const long pid = runtime::TemporaryWriterPid(name);
    if (pid <= 0) continue;
    if (::kill(static_cast<pid_t>(pid), 0) == 0 || errno != ESRCH) continue;  // still writing
    std::error_code remove_error;
    if (std::filesystem::remove(it->path(), remove_error)) removed.push_back(name);
  }
  std::sort(removed.begin(), removed.end());
  return removed;
}

std::vector<std::string> RemoveUnlisted(const std::string& dir, const proto::Manifest& manifest) {
  std::set<std::string> listed;
  for (const auto& f : manifest.files()) listed.insert(f.name());
  std::vector<std::string> removed;
  std::error_code error;
  // Best effort, never throwing: the new checkpoint is complete already.
  std::filesystem::directory_iterator it(dir, error), end;
  for (; !error && it != end; it.increment(error)) {
    const std::string name = it->path().filename().string();
    const bool shard_file = name.rfind("shard-", 0) == 0 && name.find(".bin") != std::string::npos;
    const bool manifest_temporary = runtime::IsTemporaryOf(name, kManifest);
    if (!(shard_file || manifest_temporary) || listed.count(name) > 0) continue;
    std::error_code remove_error;
    if (std::filesystem::remove(it->path(), remove_error)) removed.push_back(name);
  }
  std::sort(removed.begin(), removed.end());
  return removed;
}

at::Tensor AssembleFull(const std::string& name, const std::vector<std::int64_t>& full_shape,
                        const std::vector<const TensorPiece*>& pieces,
                        const std::string& checkpoint) {
  const std::string where = StrCat("checkpoint ", checkpoint, ", tensor '", name, "'");
  NEURON_CHECK(!pieces.empty(), where, ": not in the checkpoint");
  at::Tensor full = at::empty(full_shape, pieces[0]->data.options());
  at::Tensor covered = at::zeros(full_shape, at::kInt);
  for (const TensorPiece* p : pieces) {
    NEURON_CHECK(p->full_shape == full_shape, where, ": a piece has full shape ",
                 at::IntArrayRef(p->full_shape), ", another ", at::IntArrayRef(full_shape));
    at::Tensor region = full, mark = covered;
    if (p->dim >= 0) {
      region = full.narrow(p->dim, p->begin, p->data.size(p->dim));
      mark = covered.narrow(p->dim, p->begin, p->data.size(p->dim));
    }
    region.copy_(p->data);
    mark.add_(1);
  }
  NEURON_CHECK(covered.eq(1).all().item<bool>(), where,
               ": its pieces do not cover it exactly once");
  return full;
}

}  // namespace neuron::parallel
