#pragma once

// Journal is the coordinator's append-only log on disk: a sequence of
// journal::Record messages, each framed as
//
//   u32 little-endian payload length | u32 little-endian CRC-32 | payload
//
// Appends are buffered in memory; Flush() writes them to the file and
// Sync() also fdatasync()s it. The coordinator syncs at batch boundaries
// (training batch committed, policy version published) and on shutdown, so
// what a trainer was told is trained stays trained. A crash may lose the
// unsynced tail; replay then sees an older, consistent state (a torn last
// record is detected by its length or CRC and cut off).
//
// Compaction replaces the whole file by a shorter record sequence that
// rebuilds the same state: written to a temporary file, synced, and renamed
// over the journal, so a crash leaves either the old or the new journal.
//
// Thread safety: not thread-safe; the GroupLedger calls it under its mutex.

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "services/coordinator/journal.pb.h"

namespace tandem::coordinator {

class Journal {
 public:
  // Opens (creating if needed) `dir`/journal. Errors name the path.
  static absl::StatusOr<std::unique_ptr<Journal>> Open(const std::string& dir);
  ~Journal();
  Journal(const Journal&) = delete;
  Journal& operator=(const Journal&) = delete;

  // Calls `apply` for every record in the file, in order. A torn or corrupt
  // tail is cut off (and reported in `*dropped_bytes`); an error from
  // `apply` stops the replay and is returned with the record's offset.
  absl::Status Replay(
      const std::function<absl::Status(const journal::Record&)>& apply,
      uint64_t* dropped_bytes);

  void Append(const journal::Record& record);
  // Writes buffered records to the file.
  absl::Status Flush();
  // Flush() and fdatasync().
  absl::Status Sync();
  // Atomically replaces the journal by `records` (synced).
  absl::Status Rewrite(const std::vector<journal::Record>& records);

  // Bytes in the file plus the buffer.
  uint64_t size_bytes() const { return file_bytes_ + buffer_.size(); }
  uint64_t syncs() const { return syncs_; }
  // Total time spent in fdatasync.
  double sync_seconds() const { return sync_seconds_; }
  const std::string& path() const { return path_; }

 private:
  Journal(std::string dir, std::string path, int fd, uint64_t size);
  static void Frame(const journal::Record& record, std::string* out);

  const std::string dir_;
  const std::string path_;
  int fd_;
  uint64_t file_bytes_;
  std::string buffer_;
  uint64_t syncs_ = 0;
  double sync_seconds_ = 0;
};

}  // namespace tandem::coordinator
