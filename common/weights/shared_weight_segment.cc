#include "common/weights/shared_weight_segment.h"

#include <dirent.h>
#include <fcntl.h>
#include <signal.h>
#include <sys/mman.h>
#include <sys/random.h>
#include <sys/stat.h>
#include <sys/statvfs.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <utility>
#include <vector>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
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
                          S_IRUSR | S_IWUSR);
  if (fd < 0) return absl::UnavailableError(ErrnoText("shm_open", name));
  // Exactly 0600 whatever the umask (which may only remove bits).
  if (fchmod(fd, S_IRUSR | S_IWUSR) != 0) {
    const std::string message = ErrnoText("fchmod 0600", name);
    close(fd);
    shm_unlink(name.c_str());
    return absl::UnavailableError(message);
  }
  const uint64_t size = kSegmentHeaderBytes + payload.size();
  // A /dev/shm that cannot hold the segment fails before any byte is
  // written: a store that shares every version at publish (kAtPut) would
  // otherwise fill it up to the limit each time, only to fail.
  struct statvfs fs {};
  if (fstatvfs(fd, &fs) == 0 &&
      static_cast<uint64_t>(fs.f_bavail) * fs.f_frsize < size) {
    close(fd);
    shm_unlink(name.c_str());
    return absl::ResourceExhaustedError(
        absl::StrCat("shared memory ", name, ": ", size, " bytes needed, ",
                     static_cast<uint64_t>(fs.f_bavail) * fs.f_frsize,
                     " available in the shm mount"));
  }
  SegmentHeader header{};
  std::memcpy(header.magic, kSegmentMagic, sizeof(kSegmentMagic));
  header.policy_version = policy_version;
  header.payload_bytes = payload.size();
  std::string token = RandomBytes(kSegmentTokenBytes);
  std::memcpy(header.token, token.data(), kSegmentTokenBytes);
  std::vector<uint8_t> head(kSegmentHeaderBytes, 0);
  std::memcpy(head.data(), &header, sizeof(header));
  // Written with pwrite, not through a mapping: one pass in which the
  // kernel allocates each page as it copies (a mapping would fault every
  // page in, after fallocate had zeroed it), and a /dev/shm too small for
  // the payload (a container's 64 MiB default) is ENOSPC here, not a
  // SIGBUS later.
  auto write_all = [fd](const uint8_t* p, uint64_t n, uint64_t at) {
    while (n > 0) {
      const ssize_t w = pwrite(fd, p, std::min<uint64_t>(n, 1u << 30),
                               static_cast<off_t>(at));
      if (w < 0 && errno == EINTR) continue;
      if (w <= 0) return false;
      p += w;
      n -= static_cast<uint64_t>(w);
      at += static_cast<uint64_t>(w);
    }
    return true;
  };
  const bool written =
      write_all(payload.data(), payload.size(), kSegmentHeaderBytes) &&
      write_all(head.data(), head.size(), 0);
  const int e = errno;
  close(fd);
  if (!written) {
    shm_unlink(name.c_str());
    const std::string message =
        absl::StrCat("writing ", size, " bytes of shared memory to ", name,
                     ": ", std::strerror(e));
    return e == ENOSPC ? absl::ResourceExhaustedError(message)
                       : absl::UnavailableError(message);
  }
  return std::unique_ptr<SharedWeightSegment>(
      new SharedWeightSegment(name, size, std::move(token)));
}

SharedWeightSegment::~SharedWeightSegment() { shm_unlink(name_.c_str()); }

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
  if (fstat(fd, &st) != 0) {
    const std::string message = ErrnoText("fstat", name);
    close(fd);
    return absl::UnavailableError(message);
  }
  if (absl::Status access = CheckSegmentOwnerAndMode(
          SegmentPath(name), st.st_mode, st.st_uid, geteuid());
      !access.ok()) {
    close(fd);
    return access;
  }
  if (static_cast<uint64_t>(st.st_size) != size) {
    const std::string message =
        absl::StrCat("weight segment ", name, " holds ", st.st_size,
                     " bytes, offered as ", size);
    close(fd);
    return absl::FailedPreconditionError(message);
  }
  // MAP_POPULATE maps the pages in one go instead of faulting each one.
  void* map = mmap(nullptr, size, PROT_READ, MAP_SHARED | MAP_POPULATE, fd, 0);
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

std::string SegmentPath(absl::string_view name) {
  // shm_open(3) on Linux: the name (with its leading '/') under /dev/shm.
  return absl::StrCat("/dev/shm", name);
}

absl::Status CheckSegmentOwnerAndMode(absl::string_view path, uint32_t mode,
                                      uint32_t owner_uid,
                                      uint32_t expected_uid) {
  const uint32_t bits = mode & 07777;
  if (bits == (S_IRUSR | S_IWUSR) && owner_uid == expected_uid) {
    return absl::OkStatus();
  }
  return absl::FailedPreconditionError(absl::StrFormat(
      "weight segment %s has mode %04o and owner uid %u; only 0600 and "
      "owner uid %u (this process's user) are accepted",
      path, bits, owner_uid, expected_uid));
}

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
