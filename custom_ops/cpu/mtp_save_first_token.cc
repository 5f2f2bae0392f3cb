// mtp_save_first_token: sends the first tokens of the requests that just finished their
// prefill to the engine through a SysV message queue (host-only op). Contract: docs/ops.md,
// "mtp_save_first_token".
#include <memory>
#include <string>

#include "cpu/msg_queue.h"
#include "entry/checks.h"
#include "fdmtp/ops.h"

namespace fdmtp {
namespace host {

void MtpSaveFirstToken(const ArgChecker& check, const MtpSaveFirstTokenCall& call) {
  if (call.rank_id > 0 && !call.save_each_rank) return;
  check.Rank(call.x, 2);
  const int64_t bsz = call.x.dim(0);
  if (bsz > kFirstTokenMaxBsz) {
    check.Fail("`x` has " + std::to_string(bsz) + " rows; a first-token message holds at most " +
               std::to_string(kFirstTokenMaxBsz));
  }
  if (bsz > 0 && call.x.dim(1) < 2) {
    check.Fail("`x` must have at least 2 columns (the target's token and the draft's), got " +
               call.x.ShapeString());
  }
  check.PerItem(call.seq_lens_decoder, bsz, call.x);
  check.PerItem(call.prompt_lens, bsz, call.x);
  check.PerItem(call.step_idx, bsz, call.x);
  const bool go_on = msg::NotNeedStop(check, call.not_need_stop);
  const int msg_id = msg::MessageId(check);

  const int64_t cols = call.x.dim(1);
  const int64_t* x = call.x.ptr<const int64_t>();
  const int32_t* dec = call.seq_lens_decoder.ptr<const int32_t>();
  const int64_t* prompt = call.prompt_lens.ptr<const int64_t>();
  const int64_t* step = call.step_idx.ptr<const int64_t>();

  auto message = std::make_unique<msg::FirstTokenMessage>();  // zeroed: no stale entries
  message->mtype = 1;
  int* text = message->mtext;
  text[0] = go_on ? msg_id : -msg_id;
  text[1] = static_cast<int>(bsz);
  int* rows = text + 2 + kFirstTokenMaxBsz;
  for (int64_t b = 0; b < bsz; ++b) {
    const bool prefilling = call.skip_chunk_prefill && dec[b] < prompt[b];
    if (prefilling || step[b] != 1) continue;  // count 0 (upstream leaves step_idx > 1 stale)
    text[2 + b] = 2;
    rows[b * kMsgMaxDraftTokens] = static_cast<int>(x[b * cols]);
    rows[b * kMsgMaxDraftTokens + 1] = static_cast<int>(x[b * cols + 1]);
  }
  const int qid = msg::OpenQueue(check, call.msg_queue_id);
  msg::Send(check, qid, call.msg_queue_id, message.get(), sizeof(message->mtext));
}

}  // namespace host
}  // namespace fdmtp
