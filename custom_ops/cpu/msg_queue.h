// SysV message queues of the token-messaging ops (speculate_save_output_topk,
// speculate_get_output_topk, mtp_save_first_token, mtp_get_first_token): the queue key,
// the message layouts (FastDeploy's) and bounded send / receive with clear errors.
// Contract: docs/ops.md, "speculate_save_output_topk" and "mtp_save_first_token".
#pragma once

#include <sys/ipc.h>
#include <sys/msg.h>
#include <sys/stat.h>
#include <sys/types.h>

#include <cerrno>
#include <chrono>
#include <cstddef>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <string>
#include <thread>

#include "fdmtp/constants.h"
#include "fdmtp/tensor_ref.h"

namespace fdmtp {
namespace msg {

constexpr int kTokensPerEntry = kMsgMaxDraftTokens * (kMsgLogprobK + 1);

// One batch entry of a top-k message.
struct TopkEntry {
  int tokens[kTokensPerEntry];  // token j, rank k at j * (K + 1) + k; k = 0: the sampled one
  float scores[kTokensPerEntry];
  int ranks[kMsgMaxDraftTokens];
};

// The top-k message; only the first `meta[2]` entries are sent (TopkTextBytes).
struct TopkMessage {
  long mtype;
  int meta[3 + kMsgMaxBsz];  // ±msg_id, message_flag, bsz, per-item token counts
  TopkEntry batch[kMsgMaxBsz];
};

// Bytes of message text (after mtype) of a top-k message with `bsz` entries.
constexpr size_t TopkTextBytes(int64_t bsz) {
  return sizeof(int) * (3 + kMsgMaxBsz) + static_cast<size_t>(bsz) * sizeof(TopkEntry);
}
// The whole struct's text (FastDeploy's writer sends this much: TopkTextBytes(512) plus the
// struct's tail padding); the readers accept up to this size.
constexpr size_t kTopkMaxTextBytes = sizeof(TopkMessage) - sizeof(long);
static_assert(sizeof(TopkEntry) == 1032 && offsetof(TopkMessage, batch) == sizeof(long) + 2060,
              "the top-k message layout must be FastDeploy's");

// The first-token message (always sent whole).
constexpr int kFirstTokenInts = 2 + kFirstTokenMaxBsz + kFirstTokenMaxBsz * kMsgMaxDraftTokens;
struct FirstTokenMessage {
  long mtype;
  int mtext[kFirstTokenInts];  // ±msg_id, bsz, per-item counts, tokens (6 slots per item)
};

// FastDeploy's custom_ftok: the key of queue `id` from the device and inode of `path`.
inline key_t QueueKey(const ArgChecker& check, int id) {
  if (id < 0 || id > 0xFFFFF) {
    check.Fail("attr `msg_queue_id` must be in [0, 1048575] (20 bits of the queue key), got " +
               std::to_string(id));
  }
  struct stat st {};
  if (stat("/dev/shm", &st) != 0) {
    check.Fail(std::string("cannot stat /dev/shm for the queue key: ") + std::strerror(errno));
  }
  const uint32_t key = ((static_cast<uint32_t>(st.st_dev) & 0xFu) << 28) |
                       ((static_cast<uint32_t>(st.st_ino) & 0xFFu) << 20) |
                       (static_cast<uint32_t>(id) & 0xFFFFFu);
  return static_cast<key_t>(key);
}

// The queue of `id` (created, mode 0600, when missing). Looked up on every call: the id
// may differ between calls, and a removed queue is recreated.
inline int OpenQueue(const ArgChecker& check, int id) {
  const int qid = msgget(QueueKey(check, id), IPC_CREAT | 0600);
  if (qid < 0) {
    check.Fail("msgget for queue `msg_queue_id` = " + std::to_string(id) +
               " failed: " + std::strerror(errno));
  }
  return qid;
}

// INFERENCE_MSG_ID (default 1): the id a save op puts in meta[0] (negated at the end).
inline int MessageId(const ArgChecker& check) {
  const char* text = std::getenv("INFERENCE_MSG_ID");
  if (text == nullptr || *text == '\0') return 1;
  errno = 0;
  char* end = nullptr;
  const long value = std::strtol(text, &end, 10);
  if (errno != 0 || end == text || *end != '\0' || value > 0x7FFFFFFF) {
    check.Fail(std::string("environment variable INFERENCE_MSG_ID=") + text +
               " is not an int32 integer");
  }
  if (value == 2) {
    check.Fail(
        "environment variable INFERENCE_MSG_ID=2 is reserved (±2 in meta[0] means \"no "
        "message\" to the reader); use another id");
  }
  if (value < 0) {
    check.Fail(std::string("environment variable INFERENCE_MSG_ID=") + text +
               " must not be negative (the sign of meta[0] carries not_need_stop)");
  }
  return static_cast<int>(value);
}

// The system's largest message text in bytes (/proc/sys/kernel/msgmax), -1 if unknown.
inline long ReadSysctl(const char* path) {
  std::ifstream in(path);
  long value = -1;
  if (!(in >> value)) return -1;
  return value;
}

// Sends `text_bytes` of message text; a full queue is retried (IPC_NOWAIT, short sleeps)
// for kMsgSendTimeoutMs, then it is an error, as is a message larger than msgmax.
inline void Send(const ArgChecker& check, int qid, int id, const void* message, size_t text_bytes) {
  const auto deadline =
      std::chrono::steady_clock::now() + std::chrono::milliseconds(kMsgSendTimeoutMs);
  while (msgsnd(qid, message, text_bytes, IPC_NOWAIT) != 0) {
    const int err = errno;
    if (err == EINTR) continue;
    const long msgmax = ReadSysctl("/proc/sys/kernel/msgmax");
    if (err == EINVAL && msgmax >= 0 && static_cast<long>(text_bytes) > msgmax) {
      check.Fail("the message needs " + std::to_string(text_bytes) +
                 " bytes but the system's largest SysV message (kernel.msgmax, "
                 "/proc/sys/kernel/msgmax) is " +
                 std::to_string(msgmax) +
                 " bytes; raise it as root, e.g. `sysctl -w kernel.msgmax=" +
                 std::to_string(TopkTextBytes(kMsgMaxBsz)) +
                 "` (and kernel.msgmnb at least as "
                 "large), or send a smaller batch");
    }
    if (err != EAGAIN) {
      check.Fail("msgsnd to queue `msg_queue_id` = " + std::to_string(id) + " (" +
                 std::to_string(text_bytes) + " bytes) failed: " + std::strerror(err));
    }
    struct msqid_ds ds {};
    const bool stat_ok = msgctl(qid, IPC_STAT, &ds) == 0;
    if (stat_ok && text_bytes > ds.msg_qbytes) {
      check.Fail("the message needs " + std::to_string(text_bytes) + " bytes but queue " +
                 "`msg_queue_id` = " + std::to_string(id) + " holds at most " +
                 std::to_string(ds.msg_qbytes) +
                 " bytes (kernel.msgmnb, /proc/sys/kernel/msgmnb, when the queue was created); "
                 "raise it as root, e.g. `sysctl -w kernel.msgmnb=" +
                 std::to_string(2 * TopkTextBytes(kMsgMaxBsz)) +
                 "`, and remove the queue so that it is created again");
    }
    if (std::chrono::steady_clock::now() >= deadline) {
      check.Fail("queue `msg_queue_id` = " + std::to_string(id) + " stayed full for " +
                 std::to_string(kMsgSendTimeoutMs) + " ms (" +
                 (stat_ok ? std::to_string(ds.msg_cbytes) + " of " + std::to_string(ds.msg_qbytes) +
                                " bytes queued, "
                          : std::string()) +
                 "message of " + std::to_string(text_bytes) +
                 " bytes): the reader is not draining it");
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
}

// Receives one message of at most `max_text_bytes` text bytes into `message`. Returns the
// text bytes received, or -1 when there is none: at once without `wait`, else after
// `timeout_ms` (0 = wait for ever, polling every millisecond).
inline long Receive(const ArgChecker& check, int qid, int id, void* message, size_t max_text_bytes,
                    bool wait, int timeout_ms) {
  if (timeout_ms < 0) {
    check.Fail("attr `timeout_ms` must be >= 0 (0 = no limit), got " + std::to_string(timeout_ms));
  }
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::milliseconds(timeout_ms);
  for (;;) {
    const ssize_t got = msgrcv(qid, message, max_text_bytes, 0, IPC_NOWAIT);
    if (got >= 0) return static_cast<long>(got);
    const int err = errno;
    if (err == EINTR) continue;
    if (err == E2BIG) {
      check.Fail("a message on queue `msg_queue_id` = " + std::to_string(id) +
                 " is larger than this op's layout (" + std::to_string(max_text_bytes) +
                 " bytes): another kind of message was sent to this queue");
    }
    if (err != ENOMSG) {
      check.Fail("msgrcv from queue `msg_queue_id` = " + std::to_string(id) +
                 " failed: " + std::strerror(err));
    }
    if (!wait) return -1;
    if (timeout_ms > 0 && std::chrono::steady_clock::now() >= deadline) return -1;
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
}

// The sign of meta[0]: +msg_id while the engine goes on, -msg_id at the end.
inline bool NotNeedStop(const ArgChecker& check, const TensorRef& not_need_stop) {
  check.Numel(not_need_stop, 1);
  return *not_need_stop.ptr<const bool>();
}

}  // namespace msg
}  // namespace fdmtp
