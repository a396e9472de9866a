#include "services/coordinator/journal.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <array>
#include <cerrno>
#include <cstring>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"

namespace tandem::coordinator {
namespace {

// Records larger than this are treated as corruption.
constexpr uint32_t kMaxRecordBytes = 256u << 20;

// CRC-32 (IEEE, reflected), table-driven.
uint32_t Crc32(const char* data, size_t size) {
  static const std::array<uint32_t, 256> table = [] {
    std::array<uint32_t, 256> t{};
    for (uint32_t i = 0; i < 256; ++i) {
      uint32_t c = i;
      for (int k = 0; k < 8; ++k) c = (c & 1) ? 0xedb88320u ^ (c >> 1) : c >> 1;
      t[i] = c;
    }
    return t;
  }();
  uint32_t crc = 0xffffffffu;
  for (size_t i = 0; i < size; ++i) {
    crc = table[(crc ^ static_cast<uint8_t>(data[i])) & 0xff] ^ (crc >> 8);
  }
  return crc ^ 0xffffffffu;
}

void PutU32(uint32_t v, std::string* out) {
  for (int i = 0; i < 4; ++i) out->push_back(static_cast<char>(v >> (8 * i)));
}

uint32_t GetU32(const char* p) {
  uint32_t v = 0;
  for (int i = 0; i < 4; ++i)
    v |= uint32_t{static_cast<uint8_t>(p[i])} << (8 * i);
  return v;
}

absl::Status Errno(const std::string& what, const std::string& path) {
  return absl::InternalError(absl::StrCat("journal: cannot ", what, " ", path,
                                          ": ", std::strerror(errno)));
}

absl::Status WriteAll(int fd, const std::string& data,
                      const std::string& path) {
  size_t done = 0;
  while (done < data.size()) {
    ssize_t n = ::write(fd, data.data() + done, data.size() - done);
    if (n < 0) {
      if (errno == EINTR) continue;
      return Errno("write", path);
    }
    done += static_cast<size_t>(n);
  }
  return absl::OkStatus();
}

}  // namespace

Journal::Journal(std::string dir, std::string path, int fd, uint64_t size)
    : dir_(std::move(dir)),
      path_(std::move(path)),
      fd_(fd),
      file_bytes_(size) {}

Journal::~Journal() {
  if (fd_ >= 0) {
    (void)Flush();
    ::close(fd_);
  }
}

absl::StatusOr<std::unique_ptr<Journal>> Journal::Open(const std::string& dir) {
  if (::mkdir(dir.c_str(), 0755) != 0 && errno != EEXIST) {
    return Errno("create directory", dir);
  }
  const std::string path = dir + "/journal";
  const int fd = ::open(path.c_str(), O_RDWR | O_CREAT | O_CLOEXEC, 0644);
  if (fd < 0) return Errno("open", path);
  struct stat st;
  if (::fstat(fd, &st) != 0) {
    ::close(fd);
    return Errno("stat", path);
  }
  return std::unique_ptr<Journal>(
      new Journal(dir, path, fd, static_cast<uint64_t>(st.st_size)));
}

absl::Status Journal::Replay(
    const std::function<absl::Status(const journal::Record&)>& apply,
    uint64_t* dropped_bytes) {
  *dropped_bytes = 0;
  std::string data(file_bytes_, '\0');
  size_t read = 0;
  while (read < data.size()) {
    ssize_t n = ::pread(fd_, data.data() + read, data.size() - read, read);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) return Errno("read", path_);
    read += static_cast<size_t>(n);
  }
  size_t offset = 0;
  journal::Record record;
  while (offset < data.size()) {
    if (data.size() - offset < 8) break;
    const uint32_t length = GetU32(data.data() + offset);
    const uint32_t crc = GetU32(data.data() + offset + 4);
    if (length > kMaxRecordBytes || data.size() - offset - 8 < length) break;
    const char* payload = data.data() + offset + 8;
    if (Crc32(payload, length) != crc ||
        !record.ParseFromArray(payload, static_cast<int>(length))) {
      break;
    }
    if (absl::Status s = apply(record); !s.ok()) {
      return absl::Status(s.code(), absl::StrCat(path_, " at byte ", offset,
                                                 ": ", s.message()));
    }
    offset += 8 + length;
  }
  if (offset < data.size()) {
    *dropped_bytes = data.size() - offset;
    if (::ftruncate(fd_, static_cast<off_t>(offset)) != 0) {
      return Errno("truncate", path_);
    }
    file_bytes_ = offset;
  }
  return absl::OkStatus();
}

void Journal::Frame(const journal::Record& record, std::string* out) {
  const std::string payload = record.SerializeAsString();
  PutU32(static_cast<uint32_t>(payload.size()), out);
  PutU32(Crc32(payload.data(), payload.size()), out);
  out->append(payload);
}

void Journal::Append(const journal::Record& record) { Frame(record, &buffer_); }

absl::Status Journal::Flush() {
  if (buffer_.empty()) return absl::OkStatus();
  if (::lseek(fd_, static_cast<off_t>(file_bytes_), SEEK_SET) < 0) {
    return Errno("seek", path_);
  }
  absl::Status status = WriteAll(fd_, buffer_, path_);
  if (!status.ok()) return status;
  file_bytes_ += buffer_.size();
  buffer_.clear();
  return absl::OkStatus();
}

absl::Status Journal::Sync() {
  if (absl::Status s = Flush(); !s.ok()) return s;
  const absl::Time start = absl::Now();
  if (::fdatasync(fd_) != 0) return Errno("fsync", path_);
  sync_seconds_ += absl::ToDoubleSeconds(absl::Now() - start);
  ++syncs_;
  return absl::OkStatus();
}

absl::Status Journal::Rewrite(const std::vector<journal::Record>& records) {
  const std::string tmp = path_ + ".tmp";
  std::string data;
  for (const auto& record : records) Frame(record, &data);
  const int fd =
      ::open(tmp.c_str(), O_RDWR | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (fd < 0) return Errno("create", tmp);
  absl::Status status = WriteAll(fd, data, tmp);
  const absl::Time start = absl::Now();
  if (status.ok() && ::fdatasync(fd) != 0) status = Errno("fsync", tmp);
  sync_seconds_ += absl::ToDoubleSeconds(absl::Now() - start);
  if (!status.ok()) {
    ::close(fd);
    return status;
  }
  if (::rename(tmp.c_str(), path_.c_str()) != 0) {
    ::close(fd);
    return Errno("rename over", path_);
  }
  // The rename itself is durable once the directory is synced.
  const int dir_fd = ::open(dir_.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (dir_fd >= 0) {
    ::fsync(dir_fd);
    ::close(dir_fd);
  }
  ::close(fd_);
  fd_ = fd;
  file_bytes_ = data.size();
  buffer_.clear();
  ++syncs_;
  return absl::OkStatus();
}

}  // namespace tandem::coordinator
