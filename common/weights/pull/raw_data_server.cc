// The weight server's raw data path (weight_server.h describes the wire
// format; weight_server_internal.h the threads and bounds).

#include <arpa/inet.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <sys/socket.h>
#include <sys/time.h>
#include <sys/uio.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "common/base/logging.h"
#include "common/base/posix.h"
#include "common/weights/pull/raw_sender.h"
#include "common/weights/pull/weight_server_internal.h"
#include "kernels/crc32c.h"

namespace tandem::weights {
namespace {

using raw_internal::RawSender;
using raw_internal::SendResult;

constexpr char kOverCapacity[] = "over_capacity";
constexpr char kEvicted[] = "evicted";
constexpr char kRequestTimeout[] = "request_timeout";
constexpr char kSendTimeout[] = "send_timeout";
constexpr char kUnauthenticated[] = "unauthenticated";
constexpr char kStaleEpoch[] = "stale_epoch";
constexpr char kNoSecret[] = "no_secret";

constexpr absl::Duration kMinAcceptBackoff = absl::Milliseconds(10);
constexpr absl::Duration kMaxAcceptBackoff = absl::Seconds(1);
// Largest serialized FetchWeightsRequest accepted.
constexpr uint32_t kMaxRequestBytes = 1u << 16;


// An error answer to a connection the loop still holds (non-blocking): a
// few bytes that fit any socket buffer; best effort.
void SendStatusNow(int fd, const absl::Status& status) {
  const std::string message(status.message());
  std::string out(12, '\0');
  const uint32_t head[3] = {kRawMagic, static_cast<uint32_t>(status.code()),
                            static_cast<uint32_t>(message.size())};
  std::memcpy(out.data(), head, sizeof(head));
  out += message;
  (void)send(fd, out.data(), out.size(), MSG_NOSIGNAL | MSG_DONTWAIT);
}

v1::SharedWeightSegment SegmentMessage(const SharedWeightSegment& segment) {
  v1::SharedWeightSegment m;
  m.set_name(segment.name());
  m.set_size(segment.size());
  m.set_token(segment.token());
  return m;
}

// What one non-blocking read of a connection's pending bytes gave.
enum class Recv { kRead, kWouldBlock, kEnd };

// Reads, without blocking, what has arrived of the first `want` bytes into
// `bytes` (after those it holds), retrying EINTR. kEnd: the peer closed or
// the socket failed.
Recv RecvUpTo(int fd, std::string& bytes, size_t want) {
  const size_t have = bytes.size();
  bytes.resize(want);
  ssize_t got;
  do {
    got = recv(fd, bytes.data() + have, want - have, MSG_DONTWAIT);
  } while (got < 0 && errno == EINTR);
  const int error = errno;
  bytes.resize(have + static_cast<size_t>(std::max<ssize_t>(got, 0)));
  if (got < 0 && (error == EAGAIN || error == EWOULDBLOCK)) {
    return Recv::kWouldBlock;
  }
  return got <= 0 ? Recv::kEnd : Recv::kRead;
}

}  // namespace

std::unique_ptr<WeightServerService::RawDataServer>
WeightServerService::RawDataServer::Start(WeightServerService* service,
                                          const WeightServerOptions& options) {
  uint16_t port = 0;
  absl::StatusOr<int> fd =
      ListenTcp4(options.data_host, options.data_port, SOCK_NONBLOCK, &port);
  int wake[2] = {-1, -1};
  if (fd.ok() && pipe2(wake, O_CLOEXEC | O_NONBLOCK) != 0) {
    const int error = errno;
    close(*fd);
    fd = PosixError(error, "raw data path: wake pipe");
  }
  if (!fd.ok()) {
    std::fprintf(stderr,
                 "weight server: raw data path disabled (%s); pulls use "
                 "FetchWeights\n",
                 std::string(fd.status().message()).c_str());
    return nullptr;
  }
  auto server = std::unique_ptr<RawDataServer>(
      new RawDataServer(service, options, *fd, port));
  server->wake_[0] = wake[0];
  server->wake_[1] = wake[1];
  if (service->options_.metrics != nullptr) {
    service->options_.metrics->ExposeDataConnectionsDropped();
    service->options_.metrics->SetDataConnections(0);
  }
  for (int i = 0; i < server->stream_threads_; ++i) {
    server->streamers_.emplace_back([s = server.get()] { s->StreamLoop(); });
  }
  server->loop_ = std::thread([s = server.get()] { s->EventLoop(); });
  return server;
}

WeightServerService::RawDataServer::RawDataServer(
    WeightServerService* service, const WeightServerOptions& options,
    int listener, uint16_t port)
    : service_(service),
      max_connections_(std::max(1, options.max_data_connections)),
      stream_threads_(std::max(1, options.data_stream_threads)),
      request_timeout_(options.data_request_timeout),
      send_timeout_(options.data_send_timeout),
      listener_(listener),
      port_(port) {}

WeightServerService::RawDataServer::~RawDataServer() {
  {
    absl::MutexLock lock(&mu_);
    stopping_ = true;
    // Streams in progress fail their next send.
    for (int fd : streaming_) shutdown(fd, SHUT_RDWR);
  }
  const char byte = 0;
  (void)write(wake_[1], &byte, 1);
  if (loop_.joinable()) loop_.join();
  for (std::thread& t : streamers_) t.join();
  absl::MutexLock lock(&mu_);
  for (const Ready& r : ready_) close(r.fd);
  ready_.clear();
  close(listener_);
  close(wake_[0]);
  close(wake_[1]);
}

void WeightServerService::RawDataServer::FillStats(
    WeightServerStats* stats) const {
  {
    absl::MutexLock lock(&mu_);
    stats->data_connections = static_cast<uint64_t>(open_);
  }
  stats->data_over_capacity = over_capacity_.load();
  stats->data_evicted = evicted_.load();
  stats->data_request_timeouts = request_timeouts_.load();
  stats->data_send_timeouts = send_timeouts_.load();
  stats->data_accept_errors = accept_errors_.load();
  stats->data_auth_refused = auth_refused_.load();
  stats->data_threads = static_cast<uint64_t>(stream_threads_) + 1;
}

void WeightServerService::RawDataServer::SetOpen(int delta) {
  open_ += delta;
  if (service_->options_.metrics != nullptr) {
    service_->options_.metrics->SetDataConnections(open_);
  }
}

void WeightServerService::RawDataServer::CountDropped(const char* reason) {
  if (reason == kOverCapacity) ++over_capacity_;
  if (reason == kEvicted) ++evicted_;
  if (reason == kRequestTimeout) ++request_timeouts_;
  if (reason == kSendTimeout) ++send_timeouts_;
  if (reason == kUnauthenticated || reason == kStaleEpoch ||
      reason == kNoSecret) {
    ++auth_refused_;
  }
  if (service_->options_.metrics != nullptr) {
    service_->options_.metrics->RecordDataConnectionDropped(reason);
  }
}

void WeightServerService::RawDataServer::DropPending(
    std::list<Pending>::iterator it, const char* reason) {
  // Counted before the close, so that whoever sees the connection end also
  // sees why.
  if (reason != nullptr) CountDropped(reason);
  close(it->fd);
  pending_.erase(it);
  absl::MutexLock lock(&mu_);
  SetOpen(-1);
}

void WeightServerService::RawDataServer::EventLoop() {
  std::vector<pollfd> fds;
  std::vector<std::list<Pending>::iterator> polled;
  while (!stopping_.load()) {
    const absl::Time now = absl::Now();
    fds.clear();
    polled.clear();
    fds.push_back({wake_[0], POLLIN, 0});
    const bool accepting = now >= accept_paused_until_;
    if (accepting) fds.push_back({listener_, POLLIN, 0});
    absl::Time wake_at = accepting ? now + absl::Seconds(1)
                                   : accept_paused_until_;
    for (auto it = pending_.begin(); it != pending_.end(); ++it) {
      fds.push_back({it->fd, POLLIN, 0});
      polled.push_back(it);
      wake_at = std::min(wake_at, it->deadline);
    }
    const int ms = static_cast<int>(std::clamp<int64_t>(
        absl::ToInt64Milliseconds(wake_at - now) + 1, 0, 1000));
    const int n = poll(fds.data(), fds.size(), ms);
    if (n < 0 && errno != EINTR) {
      std::fprintf(stderr, "weight server: raw data path poll: %s\n",
                   std::strerror(errno));
      absl::SleepFor(absl::Milliseconds(10));
      continue;
    }
    if (stopping_.load()) break;
    const absl::Time after = absl::Now();
    // Requests first, so that a new connection over the cap never evicts
    // one whose request has just arrived.
    const size_t first = accepting ? 2 : 1;
    for (size_t i = 0; n > 0 && i < polled.size(); ++i) {
      if (fds[first + i].revents == 0) continue;
      auto it = polled[i];
      v1::FetchWeightsRequest request;
      switch (ReadRequest(*it, &request)) {
        case ReadResult::kMore:
          break;
        case ReadResult::kClosed:
          DropPending(it, nullptr);
          break;
        case ReadResult::kReady: {
          const int fd = it->fd;
          std::optional<WeightSeal> seal = std::move(it->seal);
          pending_.erase(it);
          // Streamed with blocking sends, each bounded by SO_SNDTIMEO.
          fcntl(fd, F_SETFL, fcntl(fd, F_GETFL) & ~O_NONBLOCK);
          const timeval tv = absl::ToTimeval(send_timeout_);
          setsockopt(fd, SOL_SOCKET, SO_SNDTIMEO, &tv, sizeof(tv));
          absl::MutexLock lock(&mu_);
          ready_.push_back({fd, std::move(request), std::move(seal)});
          break;
        }
      }
    }
    // Every connection gets the same timeout when accepted: accept order
    // is deadline order.
    while (!pending_.empty() && pending_.front().deadline <= after) {
      DropPending(pending_.begin(), kRequestTimeout);
    }
    if (accepting && n > 0 && (fds[1].revents & POLLIN) != 0) {
      AcceptAll(after);
    }
  }
  for (const Pending& p : pending_) close(p.fd);
  absl::MutexLock lock(&mu_);
  SetOpen(-static_cast<int>(pending_.size()));
  pending_.clear();
}

void WeightServerService::RawDataServer::AcceptAll(absl::Time now) {
  // A burst per wake-up, so that one busy listener cannot starve the
  // requests already pending.
  for (int burst = 0; burst < 256; ++burst) {
    const int fd =
        accept4(listener_, nullptr, nullptr, SOCK_CLOEXEC | SOCK_NONBLOCK);
    if (fd < 0) {
      if (errno == EINTR || errno == ECONNABORTED || errno == EPROTO) continue;
      if (errno == EAGAIN || errno == EWOULDBLOCK) return;
      // Out of descriptors or memory: free one (the oldest idle
      // connection) and try again; with none to free, pause accepting,
      // doubling the pause while it lasts, instead of spinning on a
      // listener that stays readable.
      const int error = errno;
      ++accept_errors_;
      if (!pending_.empty()) {
        DropPending(pending_.begin(), kEvicted);
        continue;
      }
      if (accept_backoff_ == absl::ZeroDuration()) {
        std::fprintf(stderr,
                     "weight server: raw data path cannot accept (%s); "
                     "backing off\n",
                     std::strerror(error));
      }
      accept_backoff_ = std::clamp(accept_backoff_ * 2, kMinAcceptBackoff,
                                   kMaxAcceptBackoff);
      accept_paused_until_ = now + accept_backoff_;
      return;
    }
    accept_backoff_ = absl::ZeroDuration();
    bool admitted = false;
    {
      absl::MutexLock lock(&mu_);
      if (open_ < max_connections_) {
        SetOpen(+1);
        admitted = true;
      }
    }
    if (!admitted && !pending_.empty()) {
      // Full: the oldest connection that has not sent its request yields
      // its slot (a receiver sends its request as soon as it connects).
      DropPending(pending_.begin(), kEvicted);
      absl::MutexLock lock(&mu_);
      SetOpen(+1);
      admitted = true;
    }
    if (!admitted) {
      CountDropped(kOverCapacity);  // before the close, as in DropPending
      close(fd);
      continue;
    }
    const int one = 1;
    setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
    pending_.push_back({fd, now + request_timeout_, {}});
    if (service_->options_.data_plane_key != nullptr) {
      if (const char* refused = SendChallenge(pending_.back());
          refused != nullptr) {
        DropPending(std::prev(pending_.end()),
                    *refused == '\0' ? nullptr : refused);
      }
    }
  }
}

void WeightServerService::RawDataServer::LogRefusal(const std::string& line) {
  // At most one line a second: a flood of bad connections must not flood
  // the log (the metric counts every one).
  const absl::Time now = absl::Now();
  if (now < next_refusal_log_) {
    ++refusals_not_logged_;
    return;
  }
  ComponentLogger("weights")->warn(
      "{}{}", line,
      refusals_not_logged_ == 0
          ? std::string()
          : absl::StrCat(" (and ", refusals_not_logged_,
                         " more refusals since the last line)"));
  refusals_not_logged_ = 0;
  next_refusal_log_ = now + absl::Seconds(1);
}

const char* WeightServerService::RawDataServer::SendChallenge(
    Pending& pending) {
  pending.key = service_->options_.data_plane_key->Get();
  absl::StatusOr<RawChallenge> challenge =
      pending.key.has_value() ? NewRawChallenge(pending.key->epoch)
                              : absl::UnavailableError(
                                    "the weight server holds no data-plane "
                                    "epoch secret yet");
  if (!challenge.ok()) {
    LogRefusal(absl::StrCat("raw weight data: refused a connection: ",
                            challenge.status().message()));
    // Counted before the answer, so that whoever reads it also sees why.
    CountDropped(kNoSecret);
    SendStatusNow(pending.fd, challenge.status());
    return "";
  }
  pending.challenge = *challenge;
  // 44 bytes into a new connection's empty send buffer; when even that
  // fails the peer has gone.
  const bool sent =
      send(pending.fd, pending.challenge.data(), pending.challenge.size(),
           MSG_DONTWAIT | MSG_NOSIGNAL) ==
      static_cast<ssize_t>(pending.challenge.size());
  return sent ? nullptr : "";
}

WeightServerService::RawDataServer::ReadResult
WeightServerService::RawDataServer::ReadProof(Pending& pending) {
  for (;;) {
    // The magic decides at once: a client without the secret sends its
    // request first and is not kept waiting for 44 bytes it will not send.
    const size_t have = pending.bytes.size();
    const bool refuse_now =
        have >= 4 && std::memcmp(pending.bytes.data(), &kRawAuthMagic, 4) != 0;
    if (have == kRawProofBytes || refuse_now) break;
    const Recv got = RecvUpTo(pending.fd, pending.bytes, kRawProofBytes);
    if (got == Recv::kWouldBlock) return ReadResult::kMore;
    if (got == Recv::kEnd) break;  // closed: a truncated proof
  }
  bool stale = false;
  const absl::Status verdict = VerifyRawProof(
      absl::MakeConstSpan(
          reinterpret_cast<const uint8_t*>(pending.bytes.data()),
          pending.bytes.size()),
      pending.challenge, *pending.key, &stale);
  if (verdict.ok()) {
    // The stream to this connection is sealed under a key of its own: the
    // challenge's fresh nonce salts the derivation.
    absl::StatusOr<WeightSeal> seal = WeightSeal::Derive(
        *pending.key,
        absl::MakeConstSpan(pending.challenge).subspan(12, kSealSaltBytes),
        kSealPurposeRaw);
    if (!seal.ok()) {
      SendStatusNow(pending.fd, seal.status());
      return ReadResult::kClosed;
    }
    pending.seal = *std::move(seal);
    pending.proven = true;
    pending.bytes.clear();
    return ReadResult::kReady;
  }
  sockaddr_storage peer{};
  socklen_t len = sizeof(peer);
  char host[INET6_ADDRSTRLEN] = "?";
  if (getpeername(pending.fd, reinterpret_cast<sockaddr*>(&peer), &len) ==
      0) {
    const void* addr =
        peer.ss_family == AF_INET6
            ? static_cast<const void*>(
                  &reinterpret_cast<sockaddr_in6*>(&peer)->sin6_addr)
            : static_cast<const void*>(
                  &reinterpret_cast<sockaddr_in*>(&peer)->sin_addr);
    inet_ntop(peer.ss_family, addr, host, sizeof(host));
  }
  LogRefusal(absl::StrCat("raw weight data: refused ", host, ": ",
                          verdict.message()));
  CountDropped(stale ? kStaleEpoch : kUnauthenticated);
  SendStatusNow(pending.fd, verdict);
  return ReadResult::kClosed;
}

WeightServerService::RawDataServer::ReadResult
WeightServerService::RawDataServer::ReadRequest(
    Pending& pending, v1::FetchWeightsRequest* request) {
  if (pending.key.has_value() && !pending.proven) {
    const ReadResult proof = ReadProof(pending);
    if (proof != ReadResult::kReady) return proof;
  }
  for (;;) {
    size_t want = 8;
    if (pending.bytes.size() >= 8) {
      uint32_t head[2];
      std::memcpy(head, pending.bytes.data(), sizeof(head));
      if (head[0] != kRawMagic || head[1] > kMaxRequestBytes) {
        SendStatusNow(pending.fd,
                      absl::InvalidArgumentError(
                          "raw weight data request: bad magic or length"));
        return ReadResult::kClosed;
      }
      want = 8 + head[1];
      if (pending.bytes.size() == want) {
        if (!request->ParseFromArray(pending.bytes.data() + 8,
                                     static_cast<int>(head[1]))) {
          SendStatusNow(pending.fd, absl::InvalidArgumentError(
                                        "raw weight data request: "
                                        "unparsable FetchWeightsRequest"));
          return ReadResult::kClosed;
        }
        return ReadResult::kReady;
      }
    }
    const Recv got = RecvUpTo(pending.fd, pending.bytes, want);
    if (got == Recv::kWouldBlock) return ReadResult::kMore;
    if (got == Recv::kEnd) return ReadResult::kClosed;
  }
}

void WeightServerService::RawDataServer::StreamLoop() {
  for (;;) {
    Ready ready;
    {
      absl::MutexLock lock(&mu_);
      auto woken = [this]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
        return !ready_.empty() || stopping_.load();
      };
      mu_.Await(absl::Condition(&woken));
      if (stopping_.load()) return;
      ready = std::move(ready_.front());
      ready_.pop_front();
      streaming_.insert(ready.fd);
    }
    const bool sent = Serve(ready.fd, ready.request,
                            ready.seal.has_value() ? &*ready.seal : nullptr);
    if (!sent) CountDropped(kSendTimeout);  // before the close
    absl::MutexLock lock(&mu_);
    streaming_.erase(ready.fd);
    close(ready.fd);
    SetOpen(-1);
  }
}

bool WeightServerService::RawDataServer::Serve(
    int fd, const v1::FetchWeightsRequest& request, const WeightSeal* seal) {
  RawSender sender(fd, seal, &service_->sealed_records_,
                   &service_->corrupt_record_at_);
  absl::StatusOr<Stream> stream = service_->OpenStream(request, /*raw=*/true);
  if (!stream.ok()) {
    return sender.SendStatus(stream.status()) != SendResult::kTimedOut;
  }
  if (SendResult r = sender.SendStatus(absl::OkStatus());
      r != SendResult::kOk) {
    return r != SendResult::kTimedOut;
  }
  if (stream->segment != nullptr) {
    const std::string m = SegmentMessage(*stream->segment).SerializeAsString();
    RawChunkHeader h{stream->bucket, kRawSharedSegment, stream->offset,
                     static_cast<uint32_t>(m.size()),
                     kernels::Crc32c(m.data(), m.size())};
    iovec iov[2] = {{&h, sizeof(h)}, {const_cast<char*>(m.data()), m.size()}};
    return sender.Send(iov, 2) != SendResult::kTimedOut;
  }
  std::vector<uint8_t> corrupted;
  for (;;) {
    if (stopping_.load()) return true;
    // An injected failure drops the connection, as a dead peer would.
    if (!service_->InjectedFailure(*stream).ok()) return true;
    NextChunk next;
    RawChunkHeader h{};
    iovec iov[2];
    int count = 1;
    if (service_->Advance(*stream, &next)) {
      h = {next.bucket, next.bucket_complete ? kRawBucketComplete : 0,
           next.offset, static_cast<uint32_t>(next.size), next.crc32c};
      const uint8_t* data = next.data;
      if (next.corrupt) {
        corrupted.assign(next.data, next.data + next.size);
        corrupted[next.size / 2] ^= 0x10;
        data = corrupted.data();
      }
      iov[1] = {const_cast<uint8_t*>(data), next.size};
      count = 2;
    } else {
      h.flags = kRawEnd;
    }
    iov[0] = {&h, sizeof(h)};
    const SendResult r = sender.Send(iov, count);
    if (r != SendResult::kOk) return r != SendResult::kTimedOut;
    if (count == 1) return true;
  }
}

}  // namespace tandem::weights
