// speculate_get_output_topk: the engine side of speculate_save_output_topk; reads one message
// from the queue into the caller's buffers (host-only op). Contract: docs/ops.md,
// "speculate_get_output_topk".
#include <algorithm>
#include <memory>
#include <string>

#include "cpu/msg_queue.h"
#include "entry/checks.h"
#include "fdmtp/ops.h"

namespace fdmtp {
namespace host {

namespace {

void AtLeast(const ArgChecker& check, const TensorRef& t, int64_t n, const std::string& layout) {
  if (t.numel() < n) {
    check.Fail("`" + std::string(t.name) + "` must hold at least " + std::to_string(n) +
               " elements (" + layout + "), got shape " + t.ShapeString());
  }
}

}  // namespace

void SpeculateGetOutputTopk(const ArgChecker& check, const SpeculateGetOutputTopkCall& call) {
  constexpr int64_t kTokenEntries = int64_t{kMsgMaxBsz} * msg::kTokensPerEntry;
  AtLeast(check, call.output_tokens, 3 + kMsgMaxBsz + kTokenEntries, "3 + 512 + 512 * 6 * 21");
  AtLeast(check, call.output_scores, kTokenEntries, "512 * 6 * 21");
  AtLeast(check, call.output_ranks, int64_t{kMsgMaxBsz} * kMsgMaxDraftTokens, "512 * 6");
  if (call.real_k < 0 || call.real_k > kMsgLogprobK) {
    check.Fail("attr `real_k` must be in [0, " + std::to_string(kMsgLogprobK) + "], got " +
               std::to_string(call.real_k));
  }
  int64_t* tokens = call.output_tokens.ptr<int64_t>();
  float* scores = call.output_scores.ptr<float>();
  int64_t* ranks = call.output_ranks.ptr<int64_t>();

  const int qid = msg::OpenQueue(check, call.msg_queue_id);
  auto message = std::make_unique<msg::TopkMessage>();
  const long got = msg::Receive(check, qid, call.msg_queue_id, message.get(),
                                msg::kTopkMaxTextBytes, call.wait_flag, call.timeout_ms);
  const int bsz =
      got >= 0 && got >= static_cast<long>(msg::TopkTextBytes(0)) ? message->meta[2] : -1;
  if (bsz < 0 || bsz > kMsgMaxBsz || got < static_cast<long>(msg::TopkTextBytes(bsz))) {
    tokens[0] = -2;  // no message (or a malformed one, dropped)
    tokens[1] = 0;
    tokens[2] = 0;
    return;
  }
  tokens[0] = message->meta[0];
  tokens[1] = message->meta[1];
  tokens[2] = bsz;
  int64_t* token_rows = tokens + 3 + kMsgMaxBsz;
  for (int b = 0; b < bsz; ++b) {
    const int count = message->meta[3 + b];
    tokens[3 + b] = count;
    const int n = std::min(std::max(count, 0), kMsgMaxDraftTokens);
    const msg::TopkEntry& entry = message->batch[b];
    for (int j = 0; j < n; ++j) {
      const int64_t base = int64_t{b} * msg::kTokensPerEntry + j * (kMsgLogprobK + 1);
      for (int k = 0; k <= call.real_k; ++k) {
        token_rows[base + k] = entry.tokens[j * (kMsgLogprobK + 1) + k];
        scores[base + k] = entry.scores[j * (kMsgLogprobK + 1) + k];
      }
      ranks[int64_t{b} * kMsgMaxDraftTokens + j] = entry.ranks[j];
    }
  }
}

}  // namespace host
}  // namespace fdmtp
