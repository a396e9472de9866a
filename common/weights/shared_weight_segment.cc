#include "common/weights/shared_weight_segment.h"

#include <dirent.h>
#include <fcntl.h>
#include <signal.h>
#include <sys/mman.h>
#include <sys/random.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <utility>
#include <vector>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"

namespace tandem::weights {
namespace {

constexpr char kSegmentMagic[8] = {'T', 'A', 'N', 'D', 'W', 'S', 'M', '1'};

struct SegmentHeader {
  char magic[8];
  uint64_t policy_version;
  uint64_t payload_bytes;
  char token[kSegmentTokenBytes];
};
static_assert(sizeof(SegmentHeader) <= kSegmentHeaderBytes);

std::string RandomBytes(size_t n) {
  std::string out(n, '\0');
  size_t got = 0;
  while (got < n) {
    const ssize_t r = getrandom(out.data() + got, n - got, 0);
    if (r < 0 && errno == EINTR) continue;
    if (r <= 0) break;
    got += static_cast<size_t>(r);
  }
  return out;
}

// The inode of this process's pid namespace, 0 when unknown.
uint64_t PidNamespace() {
  struct stat st {};
  if (stat("/proc/self/ns/pid", &st) != 0) return 0;
  return static_cast<uint64_t>(st.st_ino);
}

std::string ErrnoText(const char* what, const std::string& name) {
  return absl::StrCat(what, " ", name, ": ", std::strerror(errno));
}

}  // namespace

std::string SharedWeightSegment::NewNameStem() {
  static constexpr char kHex[] = "0123456789abcdef";
  std::string random;
  for (unsigned char c : RandomBytes(6)) {
    random += kHex[c >> 4];
    random += kHex[c & 15];
  }
  return absl::StrCat(kSegmentNamePrefix, getpid(), "-", PidNamespace(), "-",
                      random);
}

absl::StatusOr<std::unique_ptr<SharedWeightSegment>>
SharedWeightSegment::Create(const std::string& name, uint64_t policy_version,
                            absl::Span<const uint8_t> payload) {
  const int fd = shm_open(name.c_str(), O_RDWR | O_CREAT | O_EXCL | O_CLOEXEC,
                          S_IRUSR | S_IWUSR | S_IRGRP | S_IROTH);
  if (fd < 0) return absl::UnavailableError(ErrnoText("shm_open", name));
  const uint64_t size = kSegmentHeaderBytes + payload.size();
  // posix_fallocate reserves the tmpfs pages now: without it a /dev/shm
  // smaller than the payload (a container's 64 MiB default) would kill
  // the process with SIGBUS on the copy below.
  const int err = posix_fallocate(fd, 0, static_cast<off_t>(size));
  void* map =
      err != 0 ? MAP_FAILED
               : mmap(nullptr, size, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
  const int map_errno = errno;
  close(fd);
  if (map == MAP_FAILED) {
    shm_unlink(name.c_str());
    const int e = err != 0 ? err : map_errno;
    const std::string message = absl::StrCat(
        err != 0 ? "reserving " : "mapping ", size,
        " bytes of shared memory for ", name, ": ", std::strerror(e));
    return e == ENOSPC ? absl::ResourceExhaustedError(message)
                       : absl::UnavailableError(message);
  }
  std::memcpy(static_cast<uint8_t*>(map) + kSegmentHeaderBytes, payload.data(),
              payload.size());
  SegmentHeader header{};
  std::memcpy(header.magic, kSegmentMagic, sizeof(kSegmentMagic));
  header.policy_version = policy_version;
  header.payload_bytes = payload.size();
  std::string token = RandomBytes(kSegmentTokenBytes);
  std::memcpy(header.token, token.data(), kSegmentTokenBytes);
  std::memcpy(map, &header, sizeof(header));
  return std::unique_ptr<SharedWeightSegment>(
      new SharedWeightSegment(name, size, std::move(token), map));
}

SharedWeightSegment::~SharedWeightSegment() {
  munmap(map_, size_);
  shm_unlink(name_.c_str());
}

absl::StatusOr<std::unique_ptr<MappedWeightSegment>> MappedWeightSegment::Open(
    const std::string& name, uint64_t size, absl::string_view token,
    uint64_t policy_version, uint64_t payload_bytes) {
  // Only names a weight server makes: never a path elsewhere.
  if (name.rfind(kSegmentNamePrefix, 0) != 0 ||
      name.find('/', 1) != std::string::npos) {
    return absl::FailedPreconditionError(
        absl::StrCat("not a weight segment name: '", name, "'"));
  }
  if (size != kSegmentHeaderBytes + payload_bytes ||
      token.size() != kSegmentTokenBytes) {
    return absl::FailedPreconditionError(absl::StrCat(
        "weight segment ", name, ": offered as ", size, " bytes with a ",
        token.size(), "-byte token, expected ",
        kSegmentHeaderBytes + payload_bytes, " and ", kSegmentTokenBytes));
  }
  const int fd = shm_open(name.c_str(), O_RDONLY | O_CLOEXEC, 0);
  if (fd < 0) {
    const std::string message = ErrnoText("shm_open", name);
    return errno == ENOENT ? absl::NotFoundError(message)
                           : absl::UnavailableError(message);
  }
  struct stat st {};
  if (fstat(fd, &st) != 0 || static_cast<uint64_t>(st.st_size) != size) {
    const std::string message =
        absl::StrCat("weight segment ", name, " holds ", st.st_size,
                     " bytes, offered as ", size);
    close(fd);
    return absl::FailedPreconditionError(message);
  }
  void* map = mmap(nullptr, size, PROT_READ, MAP_SHARED, fd, 0);
  close(fd);
  if (map == MAP_FAILED) {
    return absl::UnavailableError(ErrnoText("mmap", name));
  }
  SegmentHeader header{};
  std::memcpy(&header, map, sizeof(header));
  if (std::memcmp(header.magic, kSegmentMagic, sizeof(kSegmentMagic)) != 0 ||
      header.policy_version != policy_version ||
      header.payload_bytes != payload_bytes ||
      std::memcmp(header.token, token.data(), kSegmentTokenBytes) != 0) {
    munmap(map, size);
    return absl::FailedPreconditionError(absl::StrCat(
        "weight segment ", name,
        " is not the one offered (magic, version or token differ)"));
  }
  return std::unique_ptr<MappedWeightSegment>(
      new MappedWeightSegment(map, size));
}

MappedWeightSegment::~MappedWeightSegment() { munmap(map_, size_); }

int RemoveStaleWeightSegments(const std::string& dir) {
  DIR* d = opendir(dir.c_str());
  if (d == nullptr) return 0;
  const uint64_t ns = PidNamespace();
  const absl::string_view prefix(kSegmentNamePrefix + 1);  // no leading '/'
  std::vector<std::string> stale;
  while (dirent* e = readdir(d)) {
    const absl::string_view name(e->d_name);
    if (name.substr(0, prefix.size()) != prefix) continue;
    // <pid>-<pidns>-<random>-v<version>
    const std::vector<absl::string_view> parts =
        absl::StrSplit(name.substr(prefix.size()), '-');
    int64_t pid = 0;
    uint64_t their_ns = 0;
    if (parts.size() < 2 || !absl::SimpleAtoi(parts[0], &pid) ||
        !absl::SimpleAtoi(parts[1], &their_ns) || pid <= 0 || their_ns != ns ||
        pid == getpid()) {
      continue;
    }
    if (kill(static_cast<pid_t>(pid), 0) != 0 && errno == ESRCH) {
      stale.emplace_back(name);
    }
  }
  closedir(d);
  int removed = 0;
  for (const std::string& name : stale) {
    if (unlink(absl::StrCat(dir, "/", name).c_str()) == 0) ++removed;
  }
  return removed;
}

}  // namespace tandem::weights
