#include "common/weights/pull/raw_sender.h"

#include <sys/socket.h>

#include <algorithm>
#include <cerrno>
#include <string>

#include "common/weights/pull/weight_server.h"

namespace tandem::weights::raw_internal {

SendResult SendAll(int fd, iovec* iov, int count) {
  while (count > 0) {
    msghdr msg{};
    msg.msg_iov = iov;
    msg.msg_iovlen = static_cast<size_t>(count);
    const ssize_t sent = sendmsg(fd, &msg, MSG_NOSIGNAL);
    if (sent < 0 && errno == EINTR) continue;
    if (sent < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) {
      return SendResult::kTimedOut;
    }
    if (sent <= 0) return SendResult::kClosed;
    auto left = static_cast<size_t>(sent);
    while (count > 0 && left >= iov->iov_len) {
      left -= iov->iov_len;
      ++iov;
      --count;
    }
    if (count > 0) {
      iov->iov_base = static_cast<uint8_t*>(iov->iov_base) + left;
      iov->iov_len -= left;
    }
  }
  return SendResult::kOk;
}

SendResult RawSender::Send(iovec* iov, int count) {
  if (seal_ == nullptr) return SendAll(fd_, iov, count);
  size_t total = 0;
  for (int i = 0; i < count; ++i) total += iov[i].iov_len;
  int at = 0;
  size_t at_offset = 0;
  while (total > 0) {
    const size_t n = std::min<size_t>(total, kRawSealedRecordBytes);
    parts_.clear();
    for (size_t need = n; need > 0;) {
      const size_t take = std::min(need, iov[at].iov_len - at_offset);
      parts_.emplace_back(
          static_cast<const uint8_t*>(iov[at].iov_base) + at_offset, take);
      need -= take;
      at_offset += take;
      if (at_offset == iov[at].iov_len) {
        ++at;
        at_offset = 0;
      }
    }
    cipher_.resize(n);
    uint32_t length = static_cast<uint32_t>(n);
    SealTag tag{};
    if (!seal_
             ->Seal(next_record_++,
                    {reinterpret_cast<const uint8_t*>(&length),
                     sizeof(length)},
                    parts_, cipher_.data(), &tag)
             .ok()) {
      return SendResult::kClosed;
    }
    if (static_cast<int64_t>(sealed_->fetch_add(1)) == corrupt_at_->load()) {
      cipher_[n / 2] ^= 0x10;
    }
    iovec out[3] = {{&length, sizeof(length)},
                    {cipher_.data(), n},
                    {tag.data(), tag.size()}};
    if (SendResult r = SendAll(fd_, out, 3); r != SendResult::kOk) return r;
    total -= n;
  }
  return SendResult::kOk;
}

SendResult RawSender::SendStatus(const absl::Status& status) {
  const std::string message(status.message());
  uint32_t head[3] = {kRawMagic, static_cast<uint32_t>(status.code()),
                      static_cast<uint32_t>(message.size())};
  iovec iov[2] = {{head, sizeof(head)},
                  {const_cast<char*>(message.data()), message.size()}};
  return Send(iov, message.empty() ? 1 : 2);
}

}  // namespace tandem::weights::raw_internal
