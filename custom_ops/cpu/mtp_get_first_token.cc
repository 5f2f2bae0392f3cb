// mtp_get_first_token (ours): the engine side of mtp_save_first_token; reads one message from
// the queue into the caller's buffer (host-only op). Contract: docs/ops.md,
// "mtp_get_first_token".
#include <algorithm>
#include <memory>
#include <string>

#include "cpu/msg_queue.h"
#include "entry/checks.h"
#include "fdmtp/ops.h"

namespace fdmtp {
namespace host {

void MtpGetFirstToken(const ArgChecker& check, const MtpGetFirstTokenCall& call) {
  if (call.output_tokens.numel() < msg::kFirstTokenInts) {
    check.Fail("`output_tokens` must hold at least " + std::to_string(msg::kFirstTokenInts) +
               " elements (2 + 256 + 256 * 6), got shape " + call.output_tokens.ShapeString());
  }
  int64_t* out = call.output_tokens.ptr<int64_t>();
  const int qid = msg::OpenQueue(check, call.msg_queue_id);
  auto message = std::make_unique<msg::FirstTokenMessage>();
  const long got = msg::Receive(check, qid, call.msg_queue_id, message.get(),
                                sizeof(message->mtext), call.wait_flag, call.timeout_ms);
  const int* text = message->mtext;
  const int bsz = got >= 2 * static_cast<long>(sizeof(int)) ? text[1] : -1;
  if (got != static_cast<long>(sizeof(message->mtext)) || bsz < 0 || bsz > kFirstTokenMaxBsz) {
    out[0] = -2;  // no message (or a malformed one, dropped)
    out[1] = 0;
    return;
  }
  out[0] = text[0];
  out[1] = bsz;
  const int* rows = text + 2 + kFirstTokenMaxBsz;
  int64_t* out_rows = out + 2 + kFirstTokenMaxBsz;
  for (int b = 0; b < bsz; ++b) {
    out[2 + b] = text[2 + b];
    const int n = std::min(std::max(text[2 + b], 0), kMsgMaxDraftTokens);
    for (int j = 0; j < n; ++j) {
      out_rows[b * kMsgMaxDraftTokens + j] = rows[b * kMsgMaxDraftTokens + j];
    }
  }
}

}  // namespace host
}  // namespace fdmtp
