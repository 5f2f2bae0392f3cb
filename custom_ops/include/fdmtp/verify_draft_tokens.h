// verify_draft_tokens: per-item logic shared by the CPU, CUDA and XPU kernels.
// Contract: docs/ops.md, "verify_draft_tokens".
//
// Every float sum runs in candidate order in float32 (never a tree reduction), so every
// backend computes the same bits and picks the same tokens.
#pragma once

#include "fdmtp/common.h"

namespace fdmtp {

// VerifyStrategy (kVerifyTopP .. kVerifyRejection) comes from fdmtp/constants.h.

// Under accept_all an EOS draft is replaced by this id (upstream hard-codes 5) so that a
// dummy capture-warm-up item never stops and the per-step token count stays fixed.
constexpr int64_t kAcceptAllEosReplacement = 5;

struct VerifyDraftTokensArgs {
  FDMTP_GM int64_t* step_output_ids;       // [max_bsz, width] int64, out: emitted tokens, -1 after
  FDMTP_GM int32_t* step_output_len;       // [max_bsz] int32, out: number of emitted tokens
  FDMTP_GM const int64_t* step_input_ids;  // [max_bsz, width] int64, in: [last token, d1..]
  FDMTP_GM const int64_t* target_tokens;   // [rows] int64, in: GREEDY/TARGET_MATCH, else null
  FDMTP_GM const int64_t* candidate_ids;   // [rows, C] int64, in: TOPP/REJECTION, else null
  FDMTP_GM const float* candidate_scores;  // [rows, C] float32, in: TOPP/REJECTION, else null
  FDMTP_GM const int32_t* candidate_lens;  // [rows] int32, in: TOPP/REJECTION, else null
  FDMTP_GM const float* topp;              // [max_bsz] float32, in: TOPP's Phase-2 mass
  FDMTP_GM const bool* stop_flags;         // [max_bsz] bool, in
  FDMTP_GM const int32_t* seq_lens_encoder;    // [max_bsz] int32, in: != 0 means prefill
  FDMTP_GM const int32_t* seq_lens_this_time;  // [real_bsz] int32, in: tokens fed this step
  FDMTP_GM const int64_t* end_tokens;          // [num_end_tokens] int64, in: EOS ids
  FDMTP_GM const bool* is_block_step;          // [max_bsz] bool, in: paused items
  FDMTP_GM const int32_t*
      cu_seqlens_q_output;                   // [>= real_bsz] int32, in: first output row of item b
  FDMTP_GM const int32_t* reasoning_status;  // [max_bsz] int32, in: 1 = one token per step
  FDMTP_GM const int64_t* max_dec_len;       // [max_bsz] int64, in
  FDMTP_GM const int64_t* step_idx;          // [max_bsz] int64, in: tokens generated so far
  FDMTP_GM const float* verify_uniforms;     // [rows_u, 2] float32, in: REJECTION; TOPP optional
  int64_t max_bsz;
  int64_t real_bsz;
  int64_t width;           // K + 1
  int64_t num_candidates;  // C (1 when there are no candidate tensors)
  int64_t num_rows;        // rows readable in every row tensor this strategy uses
  int64_t num_end_tokens;  // >= 1
  int strategy;
  bool reject_all;
  bool accept_all;
  bool keep_max_dec_len_token;  // false (upstream): the token reaching max_dec_len -> end_tokens[0]
};

namespace verify_detail {

// Emitting one token: advance the step counter, replace the token by
// end_tokens[0] when max_dec_len is reached (unless it already is an EOS id, or the caller
// keeps that token), and stop the item on an EOS id or at max_dec_len.
struct Emitter {
  FDMTP_GM int64_t* out;
  int64_t step;
  int64_t max_dec_len;
  FDMTP_GM const int64_t* end_tokens;
  int64_t num_end_tokens;
  bool keep_max_dec_len_token;
  int32_t count;
  bool stopped;

  FDMTP_HOST_DEVICE void Emit(int64_t pos, int64_t token, bool final_token) {
    step = SatAdd(step, 1);  // a step_idx of INT64_MAX cannot wrap
    const bool eos = IsEndToken(token, end_tokens, num_end_tokens);
    const bool hit = step >= max_dec_len;
    if (hit && !eos && !keep_max_dec_len_token) token = end_tokens[0];
    out[pos] = token;
    count += 1;
    if (!final_token && (eos || hit)) stopped = true;
  }
};

// Rows outside the given tensors are never read (a malformed cu_seqlens_q_output must not
// make the kernel read out of bounds): such a draft is not tested, such a final row emits
// nothing.
FDMTP_HOST_DEVICE inline bool RowOk(const VerifyDraftTokensArgs& a, int64_t r) {
  return r >= 0 && r < a.num_rows;
}

// Candidates of row r that count: min(max(len, 0), C).
FDMTP_HOST_DEVICE inline int64_t RowLen(const VerifyDraftTokensArgs& a, int64_t r) {
  const int64_t len = a.candidate_lens[r];
  return len < 0 ? 0 : (len > a.num_candidates ? a.num_candidates : len);
}

// S = sum of the row's first RowLen scores (fixed order, float32) and the score of
// `token` (0 when it is not listed).
FDMTP_HOST_DEVICE inline void RowMass(const VerifyDraftTokensArgs& a, int64_t r, int64_t token,
                                      float* total, float* token_score) {
  FDMTP_GM const int64_t* ids = a.candidate_ids + r * a.num_candidates;
  FDMTP_GM const float* scores = a.candidate_scores + r * a.num_candidates;
  const int64_t len = RowLen(a, r);
  float s = 0.0f;
  float sd = 0.0f;
  bool found = false;
  for (int64_t j = 0; j < len; ++j) {
    s += scores[j];
    if (!found && ids[j] == token) {
      sd = scores[j];
      found = true;
    }
  }
  *total = s;
  *token_score = sd;
}

FDMTP_HOST_DEVICE inline bool Accepts(const VerifyDraftTokensArgs& a, int64_t r, int64_t draft) {
  switch (a.strategy) {
    case kVerifyTopP: {
      FDMTP_GM const int64_t* ids = a.candidate_ids + r * a.num_candidates;
      const int64_t len = RowLen(a, r);
      for (int64_t j = 0; j < len; ++j) {
        if (ids[j] == draft) return true;
      }
      return false;
    }
    case kVerifyRejection: {
      float s = 0.0f;
      float sd = 0.0f;
      RowMass(a, r, draft, &s, &sd);
      const float u_acc = a.verify_uniforms[2 * r];
      return s > 0.0f && u_acc * s < sd;  // u < p(d) without a division
    }
    default:  // GREEDY, TARGET_MATCH
      return a.target_tokens[r] == draft;
  }
}

// Philox-4x32-10 (Salmon et al., "Parallel random numbers: as easy as 1, 2, 3"): the first
// output word for counter (c0, c1, c2, c3) and key (k0, k1). Pure integer arithmetic, so the
// host, CUDA, XPU3 and the numpy version (fastdeploy_mtp.ops.sampling) give the same bits.
FDMTP_HOST_DEVICE inline uint32_t Philox4x32First(uint32_t c0, uint32_t c1, uint32_t c2,
                                                  uint32_t c3, uint32_t k0, uint32_t k1) {
  for (int round = 0; round < 10; ++round) {
    const uint64_t p0 = static_cast<uint64_t>(0xD2511F53u) * c0;
    const uint64_t p1 = static_cast<uint64_t>(0xCD9E8D57u) * c2;
    const uint32_t n0 = static_cast<uint32_t>(p1 >> 32) ^ c1 ^ k0;
    const uint32_t n2 = static_cast<uint32_t>(p0 >> 32) ^ c3 ^ k1;
    c1 = static_cast<uint32_t>(p1);
    c3 = static_cast<uint32_t>(p0);
    c0 = n0;
    c2 = n2;
    k0 += 0x9E3779B9u;
    k1 += 0xBB67AE85u;
  }
  return c0;
}

// TOPP's u_draw when no verify_uniforms are given: Philox-4x32-10 with the fixed key
// kTopPSeed and counter (step_idx low, step_idx high, slot low, slot high) -- one uniform
// per item and step, independent of the launch and of the backend. The first word's top 24
// bits times 2^-24: a float32 in [0, 1), exactly. Mirrored by
// fastdeploy_mtp.ops.sampling.topp_uniforms.
constexpr uint64_t kTopPSeed = 0x6D74705F746F7070ull;  // "mtp_topp"

FDMTP_HOST_DEVICE inline float TopPUniform(int64_t slot, int64_t step_idx) {
  const uint64_t s = static_cast<uint64_t>(step_idx);
  const uint64_t b = static_cast<uint64_t>(slot);
  const uint32_t word =
      Philox4x32First(static_cast<uint32_t>(s), static_cast<uint32_t>(s >> 32),
                      static_cast<uint32_t>(b), static_cast<uint32_t>(b >> 32),
                      static_cast<uint32_t>(kTopPSeed), static_cast<uint32_t>(kTopPSeed >> 32));
  return static_cast<float>(word >> 8) * (1.0f / 16777216.0f);
}

// TOPP's Phase-2 draw: t = u * topp over the raw scores; the first j with t <= cum, else
// the row's first candidate (upstream's fallback, also for len == 0). u = u_draw of row r
// when verify_uniforms is given, else TopPUniform(b, step_idx[b]).
FDMTP_HOST_DEVICE inline int64_t DrawTopP(const VerifyDraftTokensArgs& a, int64_t r, int64_t b) {
  FDMTP_GM const int64_t* ids = a.candidate_ids + r * a.num_candidates;
  FDMTP_GM const float* scores = a.candidate_scores + r * a.num_candidates;
  const int64_t len = RowLen(a, r);
  const float u = a.verify_uniforms ? a.verify_uniforms[2 * r + 1] : TopPUniform(b, a.step_idx[b]);
  const float t = u * a.topp[b];
  float cum = 0.0f;
  for (int64_t j = 0; j < len; ++j) {
    cum += scores[j];
    if (t <= cum) return ids[j];
  }
  return ids[0];
}

// REJECTION's Phase-2 draw. `rejected`: draw from the row without `excluded`
// (mass S - score(excluded)); otherwise from the whole row (mass S). Inverse CDF in
// candidate order with t < cum. Fallbacks for rounding: the last positive-score candidate
// that may be emitted. A rejected row whose other candidates all have zero mass puts all
// its mass on `excluded` (the rejection came from rounding), so `excluded` is emitted;
// an empty row (len 0 or S <= 0) emits ids[r, 0].
FDMTP_HOST_DEVICE inline int64_t DrawRejection(const VerifyDraftTokensArgs& a, int64_t r,
                                               bool rejected, int64_t excluded) {
  FDMTP_GM const int64_t* ids = a.candidate_ids + r * a.num_candidates;
  FDMTP_GM const float* scores = a.candidate_scores + r * a.num_candidates;
  const int64_t len = RowLen(a, r);
  float s = 0.0f;
  float sd = 0.0f;
  RowMass(a, r, excluded, &s, &sd);
  if (len == 0 || !(s > 0.0f)) return ids[0];
  const float mass = rejected ? s - sd : s;
  const float t = a.verify_uniforms[2 * r + 1] * mass;
  float cum = 0.0f;
  int64_t last_positive = -1;
  for (int64_t j = 0; j < len; ++j) {
    if (rejected && ids[j] == excluded) continue;
    cum += scores[j];
    if (scores[j] > 0.0f) last_positive = j;
    if (t < cum) return ids[j];
  }
  if (last_positive >= 0) return ids[last_positive];
  return excluded;  // only reachable when rejected: every other candidate has zero mass
}

FDMTP_HOST_DEVICE inline int64_t Draw(const VerifyDraftTokensArgs& a, int64_t r, int64_t b,
                                      bool rejected, int64_t rejected_token) {
  switch (a.strategy) {
    case kVerifyTopP: return DrawTopP(a, r, b);
    case kVerifyRejection: return DrawRejection(a, r, rejected, rejected_token);
    default: return a.target_tokens[r];
  }
}

}  // namespace verify_detail

// The whole per-item computation; the kernels only add the loop over b < max_bsz.
FDMTP_HOST_DEVICE inline void VerifyDraftTokensItem(const VerifyDraftTokensArgs& a, int64_t b) {
  using verify_detail::Emitter;
  FDMTP_GM int64_t* out = a.step_output_ids + b * a.width;
  for (int64_t j = 0; j < a.width; ++j) out[j] = kPlaceholderToken;
  a.step_output_len[b] = 0;
  // A width-0 row holds no token: nothing is emitted (and out[0] is never touched).
  if (a.width <= 0) return;
  if (b >= a.real_bsz || a.is_block_step[b] || a.stop_flags[b]) return;
  const int64_t slt = a.seq_lens_this_time[b];
  // Deviation: upstream would emit from row r0, which belongs to the next item. A negative
  // slt (never rejected: a device kernel cannot check it without a sync) counts as 0.
  if (slt <= 0) return;
  const int64_t r0 = a.cu_seqlens_q_output[b];
  Emitter e{out,
            a.step_idx[b],
            a.max_dec_len[b],
            a.end_tokens,
            a.num_end_tokens,
            a.keep_max_dec_len_token,
            0,
            false};
  FDMTP_GM const int64_t* in = a.step_input_ids + b * a.width;
  // Drafts d_1..d_{slt-1}; slt is capped at the row width (a prefill slt is larger, but
  // prefill never looks at drafts).
  const int64_t drafts = (slt < a.width ? slt : a.width) - 1;
  const bool skip_drafts = a.reject_all || a.seq_lens_encoder[b] != 0 || a.reasoning_status[b] == 1;
  bool rejected = false;  // a draft was tested and rejected (not an early break)
  int64_t rejected_token = 0;
  int64_t i = 0;
  if (!skip_drafts) {
    for (; i < drafts; ++i) {
      const int64_t d = in[i + 1];
      if (a.accept_all) {
        e.Emit(i, IsEndToken(d, a.end_tokens, a.num_end_tokens) ? kAcceptAllEosReplacement : d,
               false);
        if (e.stopped) break;
        continue;
      }
      if (!verify_detail::RowOk(a, r0 + i)) break;
      if (!verify_detail::Accepts(a, r0 + i, d)) {
        rejected = true;
        rejected_token = d;
        break;
      }
      e.Emit(i, d, false);
      if (e.stopped) break;
    }
  }
  if (!e.stopped && verify_detail::RowOk(a, r0 + i)) {
    e.Emit(i, verify_detail::Draw(a, r0 + i, b, rejected, rejected_token), true);
  }
  a.step_output_len[b] = e.count;
}

}  // namespace fdmtp
