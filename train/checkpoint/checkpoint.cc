#include "train/checkpoint/checkpoint.h"

#include <fcntl.h>
#include <google/protobuf/io/coded_stream.h>
#include <google/protobuf/io/zero_copy_stream_impl_lite.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <filesystem>
#include <set>
#include <vector>

#include "train/checkpoint/checkpoint.pb.h"
#include "core/crc32c.h"

// Tensor bytes are written as they lie in memory, so files move between
// little-endian hosts only (every host loom builds for).
static_assert(__BYTE_ORDER__ == __ORDER_LITTLE_ENDIAN__, "checkpoint files assume a little-endian host");

namespace loom {

namespace {

// File layout (docs/checkpoints.md):
//   prelude  32 bytes: magic "LOOMCKPT", version u32, flags u32 (0),
//            header bytes u64, data bytes u64 (all little-endian)
//   header   a serialized proto::CheckpointHeader
//   padding  zeros up to a multiple of kAlignment
//   data     the tensors' raw bytes, each at a multiple of kAlignment
//   trailer  CRC32C (u32) of every byte before it
constexpr char kMagic[8] = {'L', 'O', 'O', 'M', 'C', 'K', 'P', 'T'};
constexpr uint64_t kPreludeBytes = 32;
constexpr uint64_t kTrailerBytes = 4;
constexpr uint64_t kAlignment = 64;
// Reads, writes and checksums go in pieces of this size, so the CRC reads
// bytes that are still in cache.
constexpr size_t kChunkBytes = size_t{8} << 20;

uint64_t AlignUp(uint64_t n) { return (n + kAlignment - 1) / kAlignment * kAlignment; }

void PutLittleEndian(char* p, uint64_t v, int bytes) {
  for (int i = 0; i < bytes; ++i) p[i] = static_cast<char>(v >> (8 * i));
}

uint64_t GetLittleEndian(const char* p, int bytes) {
  uint64_t v = 0;
  for (int i = 0; i < bytes; ++i) v |= uint64_t{static_cast<unsigned char>(p[i])} << (8 * i);
  return v;
}

std::string Hex32(uint32_t v) {
  char s[11];
  std::snprintf(s, sizeof(s), "0x%08x", v);
  return s;
}

Status IoError(const std::string& what, const std::string& path, int err) {
  std::string message = StrCat("cannot ", what, " checkpoint '", path, "': ", std::strerror(err));
  if (err == ENOENT) return Status(StatusCode::kNotFound, message);
  if (err == ENOSPC || err == EDQUOT) return Status(StatusCode::kResourceExhausted, message);
  return Status(StatusCode::kFailedPrecondition, message);
}

// Writes a temporary sibling of `path` and checksums what goes through
// Write. Commit() appends the CRC, syncs and renames the file into place;
// an uncommitted writer removes its temporary, so a failed save leaves
// nothing behind.
class AtomicWriter {
 public:
  explicit AtomicWriter(std::string path) : path_(std::move(path)) {}
  ~AtomicWriter() {
    if (fd_ >= 0) ::close(fd_);
    if (!tmp_.empty()) ::unlink(tmp_.c_str());
  }
  AtomicWriter(const AtomicWriter&) = delete;
  AtomicWriter& operator=(const AtomicWriter&) = delete;

  Status Open() {
    static std::atomic<int> counter{0};
    std::string tmp = StrCat(path_, ".tmp-", ::getpid(), "-", counter++);
    fd_ = ::open(tmp.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0644);
    if (fd_ < 0) return IoError("create a temporary file for", path_, errno);
    tmp_ = std::move(tmp);
    return Status::Ok();
  }

  Status Write(const void* data, size_t n) {
    const char* p = static_cast<const char*>(data);
    while (n > 0) {
      size_t piece = std::min(n, kChunkBytes);
      crc_ = Crc32cExtend(crc_, p, piece);
      LOOM_RETURN_IF_ERROR(WriteAll(p, piece));
      p += piece;
      n -= piece;
      written_ += piece;
    }
    return Status::Ok();
  }

  // Zeros up to the next multiple of kAlignment (from the file start).
  Status Pad() {
    static const char kZeros[kAlignment] = {};
    return Write(kZeros, AlignUp(written_) - written_);
  }

  uint64_t written() const { return written_; }

  Status Commit() {
    char trailer[kTrailerBytes];
    PutLittleEndian(trailer, crc_, kTrailerBytes);
    LOOM_RETURN_IF_ERROR(WriteAll(trailer, kTrailerBytes));
    if (::fsync(fd_) != 0) return IoError("sync", path_, errno);
    int fd = fd_;
    fd_ = -1;
    if (::close(fd) != 0) return IoError("write", path_, errno);
    if (::rename(tmp_.c_str(), path_.c_str()) != 0) return IoError("rename a temporary file onto", path_, errno);
    tmp_.clear();
    // The rename itself is durable only once the directory is synced.
    std::string dir = std::filesystem::path(path_).parent_path().string();
    int dir_fd = ::open(dir.empty() ? "." : dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    if (dir_fd < 0) return IoError("open the directory of", path_, errno);
    int sync_result = ::fsync(dir_fd);
    int sync_errno = errno;
    ::close(dir_fd);
    if (sync_result != 0) return IoError("sync the directory of", path_, sync_errno);
    return Status::Ok();
  }

 private:
  Status WriteAll(const char* p, size_t n) {
    while (n > 0) {
      ssize_t done = ::write(fd_, p, n);
      if (done < 0) {
        if (errno == EINTR) continue;
        return IoError("write", path_, errno);
      }
      p += done;
      n -= static_cast<size_t>(done);
    }
    return Status::Ok();
  }

  std::string path_;
  std::string tmp_;  // non-empty while the temporary exists
  int fd_ = -1;
  uint32_t crc_ = 0;
  uint64_t written_ = 0;
};

// Reads a file front to back, checksumming what goes through Read and Skip.
class ChecksummedReader {
 public:
  explicit ChecksummedReader(std::string path) : path_(std::move(path)) {}
  ~ChecksummedReader() {
    if (fd_ >= 0) ::close(fd_);
  }
  ChecksummedReader(const ChecksummedReader&) = delete;
  ChecksummedReader& operator=(const ChecksummedReader&) = delete;

  Status Open() {
    fd_ = ::open(path_.c_str(), O_RDONLY | O_CLOEXEC);
    if (fd_ < 0) return IoError("open", path_, errno);
    struct stat st;
    if (::fstat(fd_, &st) != 0) return IoError("stat", path_, errno);
    if (!S_ISREG(st.st_mode)) return FailedPrecondition("checkpoint '", path_, "' is not a regular file");
    size_ = static_cast<uint64_t>(st.st_size);
    return Status::Ok();
  }

  uint64_t size() const { return size_; }
  uint32_t crc() const { return crc_; }

  Status Read(void* data, uint64_t n) {
    char* p = static_cast<char*>(data);
    while (n > 0) {
      size_t piece = static_cast<size_t>(std::min<uint64_t>(n, kChunkBytes));
      LOOM_RETURN_IF_ERROR(ReadAll(p, piece));
      crc_ = Crc32cExtend(crc_, p, piece);
      p += piece;
      n -= piece;
    }
    return Status::Ok();
  }

  Status Skip(uint64_t n) {
    std::vector<char> scratch(static_cast<size_t>(std::min<uint64_t>(n, kChunkBytes)));
    while (n > 0) {
      size_t piece = static_cast<size_t>(std::min<uint64_t>(n, scratch.size()));
      LOOM_RETURN_IF_ERROR(Read(scratch.data(), piece));
      n -= piece;
    }
    return Status::Ok();
  }

  // Bytes that are not part of the checksum (the trailer).
  Status ReadUnchecked(void* data, size_t n) { return ReadAll(static_cast<char*>(data), n); }

 private:
  Status ReadAll(char* p, size_t n) {
    while (n > 0) {
      ssize_t done = ::read(fd_, p, n);
      if (done < 0) {
        if (errno == EINTR) continue;
        return IoError("read", path_, errno);
      }
      if (done == 0) return DataLoss("checkpoint '", path_, "' was truncated while it was being read");
      p += done;
      n -= static_cast<size_t>(done);
    }
    return Status::Ok();
  }

  std::string path_;
  int fd_ = -1;
  uint64_t size_ = 0;
  uint32_t crc_ = 0;
};

// One tensor's place in the data section, checked against the header's claims.
struct TensorEntry {
  std::string name;
  DType dtype = DType::kF32;
  Shape shape;
  uint64_t offset = 0;
  uint64_t nbytes = 0;
};

// Checks that the header's tensors are well-formed and lie in order inside a
// data section of `data_bytes`, so reading them allocates no more than the
// file holds. The message says what is wrong (the caller names the file).
Status ParseLayout(const proto::CheckpointHeader& header, uint64_t data_bytes, std::vector<TensorEntry>* entries) {
  std::set<std::string> seen;
  uint64_t end = 0;
  for (const proto::CheckpointTensor& t : header.tensors()) {
    if (t.name().empty()) return DataLoss("a tensor has an empty name");
    if (!seen.insert(t.name()).second) return DataLoss("tensor '", t.name(), "' appears twice");
    TensorEntry e;
    e.name = t.name();
    StatusOr<DType> dtype = ParseDType(t.dtype());
    if (!dtype.ok()) return DataLoss("tensor '", t.name(), "': ", dtype.status().message());
    e.dtype = *dtype;
    uint64_t bytes = DTypeSize(e.dtype);
    for (int64_t d : t.shape()) {
      if (d < 0) return DataLoss("tensor '", t.name(), "' has a negative extent ", d);
      if (__builtin_mul_overflow(bytes, static_cast<uint64_t>(d), &bytes))
        return DataLoss("tensor '", t.name(), "' has a shape too large to address");
    }
    e.shape = Shape(std::vector<int64_t>(t.shape().begin(), t.shape().end()));
    if (bytes != t.nbytes())
      return DataLoss("tensor '", t.name(), "' is ", e.shape.ToString(), " ", DTypeName(e.dtype), " (", bytes,
                      " bytes) but records ", t.nbytes(), " bytes");
    if (t.offset() < end || t.offset() > data_bytes || t.nbytes() > data_bytes - t.offset())
      return DataLoss("tensor '", t.name(), "' at bytes [", t.offset(), ", +", t.nbytes(),
                      ") overlaps the previous tensor or lies outside the ", data_bytes, "-byte data section");
    e.offset = t.offset();
    e.nbytes = t.nbytes();
    end = e.offset + e.nbytes;
    entries->push_back(std::move(e));
  }
  return Status::Ok();
}

StatusOr<std::string> SerializeHeader(const proto::CheckpointHeader& header) {
  std::string bytes;
  {
    // Deterministic map order: the same checkpoint always gives the same file.
    google::protobuf::io::StringOutputStream stream(&bytes);
    google::protobuf::io::CodedOutputStream coded(&stream);
    coded.SetSerializationDeterministic(true);
    if (!header.SerializeToCodedStream(&coded) || coded.HadError())
      return Internal("serializing a checkpoint header failed");
  }  // the coded stream flushes into `bytes` when it goes
  return bytes;
}

}  // namespace

Status SaveCheckpoint(const std::string& path, const Checkpoint& c) {
  proto::CheckpointHeader header;
  proto::TrainingPositionProto* pos = header.mutable_position();
  pos->set_global_step(c.position.global_step);
  pos->set_epoch(c.position.epoch);
  pos->set_batch_in_epoch(c.position.batch_in_epoch);
  pos->set_executor_step(c.position.executor_step);
  header.mutable_seeds()->insert(c.seeds.begin(), c.seeds.end());
  header.mutable_int_values()->insert(c.int_values.begin(), c.int_values.end());
  header.mutable_float_values()->insert(c.float_values.begin(), c.float_values.end());
  header.mutable_string_values()->insert(c.string_values.begin(), c.string_values.end());
  header.set_config_text(c.config_text);
  header.set_model_fingerprint(c.model_fingerprint);
  uint64_t data_bytes = 0;
  for (const auto& [name, t] : c.tensors) {
    if (name.empty()) return InvalidArgument("cannot save checkpoint '", path, "': a tensor has an empty name");
    if (!t.defined()) return InvalidArgument("cannot save checkpoint '", path, "': tensor '", name, "' is undefined");
    proto::CheckpointTensor* e = header.add_tensors();
    e->set_name(name);
    e->set_dtype(DTypeName(t.dtype()));
    for (int64_t d : t.shape().dims()) e->add_shape(d);
    data_bytes = AlignUp(data_bytes);
    e->set_offset(data_bytes);
    e->set_nbytes(t.nbytes());
    data_bytes += t.nbytes();
  }
  StatusOr<std::string> header_bytes = SerializeHeader(header);
  if (!header_bytes.ok()) return header_bytes.status().WithContext("saving checkpoint '" + path + "'");

  char prelude[kPreludeBytes];
  std::memcpy(prelude, kMagic, sizeof(kMagic));
  PutLittleEndian(prelude + 8, kCheckpointFormatVersion, 4);
  PutLittleEndian(prelude + 12, 0, 4);  // flags: none defined
  PutLittleEndian(prelude + 16, header_bytes->size(), 8);
  PutLittleEndian(prelude + 24, data_bytes, 8);

  AtomicWriter out(path);
  LOOM_RETURN_IF_ERROR(out.Open());
  LOOM_RETURN_IF_ERROR(out.Write(prelude, kPreludeBytes));
  LOOM_RETURN_IF_ERROR(out.Write(header_bytes->data(), header_bytes->size()));
  LOOM_RETURN_IF_ERROR(out.Pad());
  const uint64_t data_start = out.written();
  int index = 0;
  for (const auto& [name, t] : c.tensors) {
    LOOM_RETURN_IF_ERROR(out.Pad());
    LOOM_CHECK(out.written() - data_start == header.tensors(index++).offset(), "tensor '", name,
               "' is not where the header places it");
    if (t.device().is_cpu()) {
      LOOM_RETURN_IF_ERROR(out.Write(t.raw_data(), t.nbytes()));
    } else {
      // One host copy at a time bounds the extra memory by the largest tensor.
      StatusOr<Tensor> host = t.To(Device::Cpu());
      if (!host.ok()) return host.status().WithContext("saving tensor '" + name + "' to checkpoint '" + path + "'");
      LOOM_RETURN_IF_ERROR(out.Write(host->raw_data(), host->nbytes()));
    }
  }
  LOOM_CHECK(out.written() - data_start == data_bytes, "checkpoint data section size");
  return out.Commit();
}

StatusOr<Checkpoint> LoadCheckpoint(const std::string& path) {
  ChecksummedReader in(path);
  LOOM_RETURN_IF_ERROR(in.Open());
  const uint64_t size = in.size();

  char prelude[kPreludeBytes];
  const uint64_t head = std::min(size, kPreludeBytes);
  LOOM_RETURN_IF_ERROR(in.Read(prelude, head));
  if (std::memcmp(prelude, kMagic, std::min<uint64_t>(head, sizeof(kMagic))) != 0)
    return DataLoss("'", path, "' is not a loom checkpoint: it does not start with \"LOOMCKPT\"");
  if (size < kPreludeBytes + kTrailerBytes)
    return DataLoss("checkpoint '", path, "' is truncated: ", size, " bytes, fewer than the ",
                    kPreludeBytes + kTrailerBytes, " of an empty checkpoint");
  const uint64_t version = GetLittleEndian(prelude + 8, 4);
  const uint64_t flags = GetLittleEndian(prelude + 12, 4);
  const uint64_t header_bytes = GetLittleEndian(prelude + 16, 8);
  const uint64_t data_bytes = GetLittleEndian(prelude + 24, 8);
  if (version != kCheckpointFormatVersion)
    return FailedPrecondition("checkpoint '", path, "' has format version ", version, "; this build of loom reads version ",
                              kCheckpointFormatVersion, " (a newer or older loom wrote it, or the file is corrupt)");
  if (flags != 0) return DataLoss("checkpoint '", path, "' is corrupt: unknown flags ", Hex32(flags), " in its prelude");
  // Compared before adding, so corrupt sizes cannot overflow the sum.
  const bool fits = header_bytes <= size && data_bytes <= size;
  const uint64_t data_start = fits ? AlignUp(kPreludeBytes + header_bytes) : 0;
  const uint64_t expected = fits ? data_start + data_bytes + kTrailerBytes : 0;
  if (!fits || expected > size)
    return DataLoss("checkpoint '", path, "' is truncated: its prelude describes a ", header_bytes, "-byte header and ",
                    data_bytes, " bytes of tensor data", fits ? StrCat(" (", expected, " bytes in all)") : "",
                    ", the file has ", size, " bytes");
  if (expected < size)
    return DataLoss("checkpoint '", path, "' is corrupt: it has ", size, " bytes, ", size - expected,
                    " more than its prelude describes");

  std::string header_data(header_bytes, '\0');
  LOOM_RETURN_IF_ERROR(in.Read(header_data.data(), header_bytes));
  LOOM_RETURN_IF_ERROR(in.Skip(data_start - kPreludeBytes - header_bytes));

  // The header is not trusted before the checksum over the whole file
  // matches, but it is needed to place the tensors while reading them. A bad
  // header is therefore remembered, the rest only checksummed, and a
  // checksum mismatch reported first: it is the likelier cause.
  proto::CheckpointHeader header;
  std::vector<TensorEntry> entries;
  Status header_status = header.ParseFromString(header_data)
                             ? ParseLayout(header, data_bytes, &entries)
                             : DataLoss("the header does not parse as a CheckpointHeader");
  std::map<std::string, Tensor> tensors;
  uint64_t pos = 0;  // within the data section
  if (header_status.ok()) {
    for (const TensorEntry& e : entries) {
      LOOM_RETURN_IF_ERROR(in.Skip(e.offset - pos));
      StatusOr<Tensor> t = Tensor::Empty(e.shape, e.dtype);
      if (!t.ok()) return t.status().WithContext("loading tensor '" + e.name + "' of checkpoint '" + path + "'");
      LOOM_RETURN_IF_ERROR(in.Read(t->raw_data(), e.nbytes));
      tensors.emplace(e.name, *t);
      pos = e.offset + e.nbytes;
    }
  }
  LOOM_RETURN_IF_ERROR(in.Skip(data_bytes - pos));
  char trailer[kTrailerBytes];
  LOOM_RETURN_IF_ERROR(in.ReadUnchecked(trailer, kTrailerBytes));
  const uint32_t stored = static_cast<uint32_t>(GetLittleEndian(trailer, kTrailerBytes));
  if (stored != in.crc())
    return DataLoss("checkpoint '", path, "' is corrupt: its contents have CRC32C ", Hex32(in.crc()),
                    ", the file records ", Hex32(stored));
  if (!header_status.ok())
    return DataLoss("checkpoint '", path, "' has an inconsistent header: ", header_status.message());

  Checkpoint c;
  c.tensors = std::move(tensors);
  const proto::TrainingPositionProto& p = header.position();
  c.position.global_step = p.global_step();
  c.position.epoch = p.epoch();
  c.position.batch_in_epoch = p.batch_in_epoch();
  c.position.executor_step = p.executor_step();
  c.seeds.insert(header.seeds().begin(), header.seeds().end());
  c.int_values.insert(header.int_values().begin(), header.int_values().end());
  c.float_values.insert(header.float_values().begin(), header.float_values().end());
  c.string_values.insert(header.string_values().begin(), header.string_values().end());
  c.config_text = header.config_text();
  c.model_fingerprint = header.model_fingerprint();
  c.source = path;
  return c;
}

bool StartsLikeCheckpoint(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  char head[sizeof(kMagic)] = {};
  return in.read(head, sizeof(head)) && std::memcmp(head, kMagic, sizeof(kMagic)) == 0;
}

}  // namespace loom
