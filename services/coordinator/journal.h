#pragma once

// Journal is the coordinator's append-only log on disk: a sequence of
// journal::Record messages, each framed as
//
//   u32 little-endian payload length | u32 little-endian CRC-32 | payload
//
// Appends are buffered in memory and return the record's position in the
// log. SyncTo(position) returns once everything up to that position is on
// disk (written and fdatasync()ed). Syncs are group commits, as in
// LevelDB's write path: one caller at a time holds the writer token and
// writes and syncs the whole buffer outside the journal's lock, so appends
// go on meanwhile and the callers waiting behind it usually find their
// records already synced by it. The coordinator syncs at batch boundaries
// (training batch handed out, committed or published) and on shutdown,
// after releasing its ledger's lock, and answers only once synced, so what
// a trainer was told is trained stays trained. A crash may lose the
// unsynced tail; replay then sees an older, consistent state (a torn last
// record is detected by its length or CRC and cut off).
//
// Compaction replaces the whole file by a shorter record sequence that
// rebuilds the same state: written to a temporary file, synced, and renamed
// over the journal, so a crash leaves either the old or the new journal.
// Compact() holds the writer token throughout and the caller's lock only
// while it takes the snapshot.
//
// Thread safety: thread-safe. Append() may be called under the caller's
// lock (it never waits on the disk); SyncTo(), Flush() and Compact() wait
// for the disk and must not be.
//
// Test seam: with the environment variable TANDEM_TEST_JOURNAL_SYNC_DELAY_MS
// set, every fdatasync takes that much longer (a slow disk); set_before_sync
// installs a hook called before each one.

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
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

  // Buffers `record`; returns the log position just after it.
  uint64_t Append(const journal::Record& record);
  // Returns once everything up to `position` is written and synced.
  absl::Status SyncTo(uint64_t position);
  // Writes buffered records to the file (no fdatasync).
  absl::Status Flush();
  // Writes and syncs everything appended so far.
  absl::Status Sync();
  // Atomically replaces the journal by `records` (synced); nothing may be
  // appended meanwhile (recovery).
  absl::Status Rewrite(const std::vector<journal::Record>& records);
  // Records that rebuild the state as of log position `position`.
  struct Snapshot {
    std::vector<journal::Record> records;
    uint64_t position = 0;
  };
  // Compaction: with the writer token held, calls `snapshot` (which takes
  // the caller's lock, builds the records and reads appended() under it),
  // writes the records as the new journal, and keeps the records appended
  // after the snapshot's position.
  absl::Status Compact(const std::function<Snapshot()>& snapshot);

  // Test seam: called (without locks) before every fdatasync.
  void set_before_sync(std::function<void()> hook);

  // The log position after the last appended record.
  uint64_t appended() const;
  // Bytes in the file plus the buffer.
  uint64_t size_bytes() const;
  uint64_t syncs() const;
  // Total time spent in fdatasync.
  double sync_seconds() const;
  const std::string& path() const { return path_; }

 private:
  Journal(std::string dir, std::string path, int fd, uint64_t size);
  static void Frame(const journal::Record& record, std::string* out);
  // Takes the writer token (waiting for the holder), and gives it back.
  void AcquireWriter() ABSL_LOCKS_EXCLUDED(mu_);
  void ReleaseWriter() ABSL_LOCKS_EXCLUDED(mu_);
  // With the token: writes the buffer out and, with `sync`, syncs it.
  absl::Status WriteOut(bool sync) ABSL_LOCKS_EXCLUDED(mu_);
  absl::Status Fdatasync(int fd, const std::string& path);

  const std::string dir_;
  const std::string path_;
  const absl::Duration sync_delay_;
  mutable absl::Mutex mu_;
  // Only the writer token's holder changes fd_ and file_bytes_ and writes
  // to the file; others read them under mu_.
  int fd_ ABSL_GUARDED_BY(mu_);
  uint64_t file_bytes_ ABSL_GUARDED_BY(mu_);
  // Records not yet written; buffer_[0] is at log position buffer_start_.
  std::string buffer_ ABSL_GUARDED_BY(mu_);
  uint64_t buffer_start_ ABSL_GUARDED_BY(mu_) = 0;
  // Log positions: everything before synced_ is on disk.
  uint64_t synced_ ABSL_GUARDED_BY(mu_) = 0;
  bool writer_busy_ ABSL_GUARDED_BY(mu_) = false;
  std::function<void()> before_sync_ ABSL_GUARDED_BY(mu_);
  uint64_t syncs_ ABSL_GUARDED_BY(mu_) = 0;
  double sync_seconds_ ABSL_GUARDED_BY(mu_) = 0;
};

}  // namespace tandem::coordinator
