// speculate_save_output_topk: sends one step's tokens, their top-k logprobs and ranks to the
// engine through a SysV message queue (host-only op). Contract: docs/ops.md,
// "speculate_save_output_topk".
#include <memory>
#include <string>

#include "cpu/msg_queue.h"
#include "entry/checks.h"
#include "fdmtp/ops.h"

namespace fdmtp {
namespace host {

void SpeculateSaveOutputTopk(const ArgChecker& check, const SpeculateSaveOutputTopkCall& call) {
  if (call.rank_id > 0 && !call.save_each_rank) return;
  const TensorRef& counts = call.token_num_per_batch;
  const int64_t bsz = check.ItemCount(counts);
  if (bsz > kMsgMaxBsz) {
    check.Fail("`token_num_per_batch` has " + std::to_string(bsz) +
               " items; a message holds at most " + std::to_string(kMsgMaxBsz));
  }
  check.PerItem(call.cu_batch_token_offset, bsz, counts);
  check.PerItem(call.seq_lens_decoder, bsz, counts);
  check.PerItem(call.prompt_lens, bsz, counts);
  check.PerItem(call.preempted_idx, bsz, counts);
  const int64_t token_num = check.ItemCount(call.sampled_token_ids);
  check.Rank(call.logprob_token_ids, 2);
  const int64_t width = call.logprob_token_ids.dim(1);  // K' + 1
  if (call.logprob_token_ids.dim(0) != token_num || width < 1 || width > kMsgLogprobK + 1) {
    check.Fail("`logprob_token_ids` must have shape [token_num, K' + 1] with token_num = " +
               std::to_string(token_num) + " (from `sampled_token_ids`) and 0 <= K' <= " +
               std::to_string(kMsgLogprobK) + ", got " + call.logprob_token_ids.ShapeString());
  }
  if (call.logprob_scores.shape != call.logprob_token_ids.shape) {
    check.Fail("`logprob_scores` must have the shape of `logprob_token_ids` " +
               call.logprob_token_ids.ShapeString() + ", got " + call.logprob_scores.ShapeString());
  }
  if (check.ItemCount(call.logprob_ranks) != token_num) {
    check.Fail("`logprob_ranks` must have token_num = " + std::to_string(token_num) +
               " rows (from `sampled_token_ids`), got " + call.logprob_ranks.ShapeString());
  }
  const bool go_on = msg::NotNeedStop(check, call.not_need_stop);
  const int msg_id = msg::MessageId(check);

  const int32_t* count = counts.ptr<const int32_t>();
  const int32_t* offset = call.cu_batch_token_offset.ptr<const int32_t>();
  const int32_t* dec = call.seq_lens_decoder.ptr<const int32_t>();
  const int64_t* prompt = call.prompt_lens.ptr<const int64_t>();
  const int32_t* preempted = call.preempted_idx.ptr<const int32_t>();
  const int64_t* sampled = call.sampled_token_ids.ptr<const int64_t>();
  const int64_t* ids = call.logprob_token_ids.ptr<const int64_t>();
  const float* scores = call.logprob_scores.ptr<const float>();
  const int64_t* ranks = call.logprob_ranks.ptr<const int64_t>();

  auto message = std::make_unique<msg::TopkMessage>();  // zeroed; ~0.5 MB, off the stack
  message->mtype = 1;
  message->meta[0] = go_on ? msg_id : -msg_id;
  message->meta[1] = call.message_flag;
  message->meta[2] = static_cast<int>(bsz);
  for (int64_t b = 0; b < bsz; ++b) {
    int n = 0;
    if (preempted[b] == 1) {
      message->meta[3 + b] = -9;
      continue;
    }
    if (dec[b] >= prompt[b]) n = count[b];  // 0 while the prompt is still being prefilled
    if (n < 0 || n > kMsgMaxDraftTokens) {
      check.Fail("`token_num_per_batch`[" + std::to_string(b) + "] = " + std::to_string(n) +
                 " must be in [0, " + std::to_string(kMsgMaxDraftTokens) + "]");
    }
    if (n > 0 && (offset[b] < 0 || int64_t{offset[b]} + n > token_num)) {
      check.Fail("`cu_batch_token_offset`[" + std::to_string(b) +
                 "] = " + std::to_string(offset[b]) + " with " + std::to_string(n) +
                 " token(s) leaves the " + std::to_string(token_num) +
                 " rows of `sampled_token_ids`");
    }
    message->meta[3 + b] = n;
    msg::TopkEntry& entry = message->batch[b];
    for (int j = 0; j < n; ++j) {
      const int64_t row = int64_t{offset[b]} + j;
      int* tok = entry.tokens + j * (kMsgLogprobK + 1);
      float* sc = entry.scores + j * (kMsgLogprobK + 1);
      for (int k = 0; k <= kMsgLogprobK; ++k) {
        if (k < width) {
          tok[k] = static_cast<int>(k == 0 ? sampled[row] : ids[row * width + k]);
          sc[k] = scores[row * width + k];
        } else {
          tok[k] = -1;
          sc[k] = 0.0f;
        }
      }
      entry.ranks[j] = static_cast<int>(ranks[row]);
    }
  }
  const int qid = msg::OpenQueue(check, call.msg_queue_id);
  msg::Send(check, qid, call.msg_queue_id, message.get(), msg::TopkTextBytes(bsz));
}

}  // namespace host
}  // namespace fdmtp
