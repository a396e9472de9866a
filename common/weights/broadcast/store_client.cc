#include "common/weights/broadcast/store_client.h"

#include <arpa/inet.h>
#include <dirent.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <sys/stat.h>

#include <chrono>
#include <cstdlib>
#include <exception>
#include <set>
#include <thread>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/synchronization/notification.h"

namespace tandem::weights {
namespace {

// Open socket descriptors of this process, each with its socket's inode: a
// descriptor number is reused as soon as it is closed, an inode is not.
std::set<std::pair<int, ino_t>> OpenSockets() {
  std::set<std::pair<int, ino_t>> sockets;
  DIR* dir = opendir("/proc/self/fd");
  if (dir == nullptr) return sockets;
  while (dirent* entry = readdir(dir)) {
    char* end = nullptr;
    const long fd = std::strtol(entry->d_name, &end, 10);
    if (end == entry->d_name || *end != '\0') continue;
    struct stat st;
    if (fstat(static_cast<int>(fd), &st) == 0 && S_ISSOCK(st.st_mode)) {
      sockets.emplace(static_cast<int>(fd), st.st_ino);
    }
  }
  closedir(dir);
  return sockets;
}

// The peer port of socket `fd`, or -1.
int PeerPort(int fd) {
  sockaddr_storage peer{};
  socklen_t length = sizeof(peer);
  if (getpeername(fd, reinterpret_cast<sockaddr*>(&peer), &length) != 0) {
    return -1;
  }
  if (peer.ss_family == AF_INET) {
    return ntohs(reinterpret_cast<sockaddr_in*>(&peer)->sin_port);
  }
  if (peer.ss_family == AF_INET6) {
    return ntohs(reinterpret_cast<sockaddr_in6*>(&peer)->sin6_port);
  }
  return -1;
}

}  // namespace

absl::StatusOr<c10::intrusive_ptr<c10d::TCPStore>> ConnectStoreClient(
    const std::string& host, uint16_t port, absl::Duration timeout) {
  c10d::TCPStoreOptions options;
  options.port = port;
  options.isServer = false;
  options.waitWorkers = false;
  options.timeout =
      std::chrono::milliseconds(absl::ToInt64Milliseconds(timeout));
  const std::set<std::pair<int, ino_t>> before = OpenSockets();
  c10::intrusive_ptr<c10d::TCPStore> store;
  std::string error;
  absl::Notification done;
  std::thread connect([&] {
    try {
      store = c10::make_intrusive<c10d::TCPStore>(host, options);
    } catch (const std::exception& e) {
      error = e.what();
    }
    done.Notify();
  });
  bool cut = false;
  // The constructor's own connect retries until `timeout`; a little slack
  // lets it report that itself.
  if (!done.WaitForNotificationWithTimeout(timeout + absl::Seconds(1))) {
    cut = true;
    while (!done.WaitForNotificationWithTimeout(absl::Milliseconds(50))) {
      for (const auto& socket : OpenSockets()) {
        if (!before.contains(socket) && PeerPort(socket.first) == port) {
          shutdown(socket.first, SHUT_RDWR);
        }
      }
    }
  }
  connect.join();
  const std::string where = absl::StrCat("TCPStore ", host, ":", port);
  if (cut) {
    return absl::DeadlineExceededError(absl::StrCat(
        where, " accepted the connection but did not answer within ",
        absl::FormatDuration(timeout)));
  }
  if (store == nullptr) {
    return absl::UnavailableError(absl::StrCat(where, ": ", error));
  }
  return store;
}

}  // namespace tandem::weights
