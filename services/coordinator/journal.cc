#include "services/coordinator/journal.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <array>
#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <utility>

#include "absl/strings/str_cat.h"
#include "common/base/posix.h"
#include "common/base/status_macros.h"
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
  return PosixError(errno, absl::StrCat("journal: cannot ", what, " ", path));
}

// Writes `data` at `offset` of `fd`.
absl::Status WriteAll(int fd, const std::string& data, uint64_t offset,
                      const std::string& path) {
  size_t done = 0;
  while (done < data.size()) {
    ssize_t n = ::pwrite(fd, data.data() + done, data.size() - done,
                         static_cast<off_t>(offset + done));
    if (n < 0) {
      if (errno == EINTR) continue;
      return Errno("write", path);
    }
    done += static_cast<size_t>(n);
  }
  return absl::OkStatus();
}

absl::Duration SyncDelayForTest() {
  const char* ms = std::getenv("TANDEM_TEST_JOURNAL_SYNC_DELAY_MS");
  return ms == nullptr ? absl::ZeroDuration()
                       : absl::Milliseconds(std::atoi(ms));
}

}  // namespace

Journal::Journal(std::string dir, std::string path, int fd, uint64_t size)
    : dir_(std::move(dir)),
      path_(std::move(path)),
      sync_delay_(SyncDelayForTest()),
      fd_(fd),
      file_bytes_(size) {}

Journal::~Journal() {
  (void)Flush();
  absl::MutexLock lock(&mu_);
  if (fd_ >= 0) ::close(fd_);
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
  absl::MutexLock lock(&mu_);
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

uint64_t Journal::Append(const journal::Record& record) {
  std::string framed;
  Frame(record, &framed);
  absl::MutexLock lock(&mu_);
  buffer_ += framed;
  return buffer_start_ + buffer_.size();
}

void Journal::AcquireWriter() {
  absl::MutexLock lock(&mu_);
  mu_.Await(absl::Condition(
      +[](bool* busy) { return !*busy; }, &writer_busy_));
  writer_busy_ = true;
}

void Journal::ReleaseWriter() {
  absl::MutexLock lock(&mu_);
  writer_busy_ = false;
}

absl::Status Journal::Fdatasync(int fd, const std::string& path) {
  std::function<void()> hook;
  {
    absl::MutexLock lock(&mu_);
    hook = before_sync_;
  }
  if (hook) hook();
  const absl::Time start = absl::Now();
  if (sync_delay_ > absl::ZeroDuration()) absl::SleepFor(sync_delay_);
  if (::fdatasync(fd) != 0) return Errno("fsync", path);
  absl::MutexLock lock(&mu_);
  sync_seconds_ += absl::ToDoubleSeconds(absl::Now() - start);
  ++syncs_;
  return absl::OkStatus();
}

absl::Status Journal::WriteOut(bool sync) {
  std::string data;
  uint64_t end = 0;
  uint64_t offset = 0;
  int fd = -1;
  {
    absl::MutexLock lock(&mu_);
    data.swap(buffer_);
    end = buffer_start_ + data.size();
    buffer_start_ = end;
    offset = file_bytes_;
    fd = fd_;
  }
  absl::Status status = WriteAll(fd, data, offset, path_);
  if (status.ok()) {
    absl::MutexLock lock(&mu_);
    file_bytes_ += data.size();
  } else {
    // Nothing counts as written: the records go back in front of the
    // buffer, and the next write starts at the same offset again.
    absl::MutexLock lock(&mu_);
    buffer_.insert(0, data);
    buffer_start_ -= data.size();
    return status;
  }
  if (!sync) return absl::OkStatus();
  RETURN_IF_ERROR(Fdatasync(fd, path_));
  absl::MutexLock lock(&mu_);
  synced_ = std::max(synced_, end);
  return absl::OkStatus();
}

absl::Status Journal::SyncTo(uint64_t position) {
  {
    absl::MutexLock lock(&mu_);
    // Wait for the token unless a sync by its holder covers `position`.
    mu_.Await(absl::Condition(
        +[](Journal* j) ABSL_NO_THREAD_SAFETY_ANALYSIS {
          return !j->writer_busy_;
        },
        this));
    if (synced_ >= position) return absl::OkStatus();
    writer_busy_ = true;
  }
  // One sync for every record appended so far, this caller's and those of
  // the callers now queueing behind it.
  absl::Status status = WriteOut(/*sync=*/true);
  ReleaseWriter();
  return status;
}

absl::Status Journal::Sync() { return SyncTo(appended()); }

absl::Status Journal::Flush() {
  AcquireWriter();
  absl::Status status = WriteOut(/*sync=*/false);
  ReleaseWriter();
  return status;
}

absl::Status Journal::Rewrite(const std::vector<journal::Record>& records) {
  return Compact([&] { return Snapshot{records, appended()}; });
}

absl::Status Journal::Compact(const std::function<Snapshot()>& snapshot) {
  AcquireWriter();
  // Appends go on while the snapshot is written; those before its
  // position are in it, the rest stay in the buffer for the new file.
  const Snapshot taken = snapshot();
  const uint64_t cut = taken.position;
  std::string data;
  for (const auto& record : taken.records) Frame(record, &data);
  const std::string tmp = path_ + ".tmp";
  absl::Status status;
  const int fd =
      ::open(tmp.c_str(), O_RDWR | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (fd < 0) status = Errno("create", tmp);
  if (status.ok()) status = WriteAll(fd, data, 0, tmp);
  if (status.ok()) status = Fdatasync(fd, tmp);
  if (status.ok() && ::rename(tmp.c_str(), path_.c_str()) != 0) {
    status = Errno("rename over", path_);
  }
  if (!status.ok()) {
    if (fd >= 0) ::close(fd);
    ReleaseWriter();
    return status;
  }
  // The rename itself is durable once the directory is synced.
  const int dir_fd = ::open(dir_.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (dir_fd >= 0) {
    ::fsync(dir_fd);
    ::close(dir_fd);
  }
  {
    absl::MutexLock lock(&mu_);
    ::close(fd_);
    fd_ = fd;
    file_bytes_ = data.size();
    buffer_.erase(0, cut - buffer_start_);
    buffer_start_ = cut;
    synced_ = std::max(synced_, cut);
  }
  ReleaseWriter();
  return absl::OkStatus();
}

void Journal::set_before_sync(std::function<void()> hook) {
  absl::MutexLock lock(&mu_);
  before_sync_ = std::move(hook);
}

uint64_t Journal::appended() const {
  absl::MutexLock lock(&mu_);
  return buffer_start_ + buffer_.size();
}

uint64_t Journal::size_bytes() const {
  absl::MutexLock lock(&mu_);
  return file_bytes_ + buffer_.size();
}

uint64_t Journal::syncs() const {
  absl::MutexLock lock(&mu_);
  return syncs_;
}

double Journal::sync_seconds() const {
  absl::MutexLock lock(&mu_);
  return sync_seconds_;
}

}  // namespace tandem::coordinator
