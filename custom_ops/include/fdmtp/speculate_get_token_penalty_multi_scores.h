// speculate_get_token_penalty_multi_scores: per-row logic shared by the CPU, CUDA and XPU
// kernels. Contract: docs/ops.md, "speculate_get_token_penalty_multi_scores".
//
// A logits row is processed in four passes, each a function below that takes a
// (start, stride) partition of its loop so that a CUDA block can share a pass between its
// threads (with a barrier between passes) while the CPU and XPU kernels run each pass with
// (0, 1). Passes in order: min length (EOS ids banned), penalties (once per distinct id of
// the counted sequence), temperature (every logit), bad words. Each element is loaded as
// float32, computed in float32 and stored back rounded to nearest even; the arithmetic uses
// explicitly rounded operations on CUDA (no fused multiply-add), so every backend stores the
// same bits.
#pragma once

#include <cstring>

#include "fdmtp/common.h"
#include "fdmtp/float_types.h"

namespace fdmtp {

// Which float type `logits` (and the three score tensors) hold: lets the XPU kernel, which
// only receives the element size, pick the right conversion.
enum PenaltyFloatKind : int32_t {
  kPenaltyFloat32 = 0,
  kPenaltyFloat16 = 1,
  kPenaltyBFloat16 = 2,
};

struct SpeculateGetTokenPenaltyMultiScoresArgs {
  FDMTP_GM const int64_t* token_ids_all;              // [>= bsz, hist_width] int64, in
  FDMTP_GM const int64_t* prompt_lens;                // [>= bsz] int64, in
  FDMTP_GM void* logits;                              // [rows, vocab] float, in/out
  FDMTP_GM const void* penalty_scores;                // [>= bsz] float (like logits), in: alpha
  FDMTP_GM const void* frequency_scores;              // [>= bsz] float (like logits), in: beta
  FDMTP_GM const void* presence_scores;               // [>= bsz] float (like logits), in: gamma
  FDMTP_GM const float* temperatures;                 // [>= bsz] float32, in
  FDMTP_GM const int64_t* bad_tokens;                 // [>= bsz, bad_width] int64, in
  FDMTP_GM const int64_t* bad_tokens_len;             // [>= bsz] int64, in
  FDMTP_GM const int64_t* cur_len;                    // [>= bsz] int64, in: < 0 = no history
  FDMTP_GM const int64_t* min_len;                    // [>= bsz] int64, in
  FDMTP_GM const int64_t* eos_token_id;               // [num_eos] int64, in
  FDMTP_GM const int32_t* batch_id_per_token_output;  // [>= rows] int32, in
  FDMTP_GM const int32_t* cu_seqlens_q_output;        // [>= bsz] int32, in
  FDMTP_GM const int64_t* step_input_ids;  // [>= bsz, draft_width] int64, in; may be null
  int64_t bsz;
  int64_t rows;
  int64_t vocab;
  int64_t hist_width;   // L
  int64_t bad_width;    // B
  int64_t num_eos;      // E
  int64_t draft_width;  // W (0 without step_input_ids)
  int32_t float_kind;   // a PenaltyFloatKind
};

namespace penalty_detail {

// The bit copy of FloatBits / BitsFloat: the compiler's builtin, except for nvcc (whose device
// code has memcpy). No C-library call: XPU device code has no libc, and the XTDK compile
// (-fno-builtin) would turn `memcpy` into one.
#if defined(__CUDACC__)
#define FDMTP_PENALTY_BIT_COPY memcpy
#else
#define FDMTP_PENALTY_BIT_COPY __builtin_memcpy
#endif

FDMTP_HOST_DEVICE inline uint32_t FloatBits(float f) {
  uint32_t u;
  FDMTP_PENALTY_BIT_COPY(&u, &f, sizeof(u));
  return u;
}

FDMTP_HOST_DEVICE inline float BitsFloat(uint32_t u) {
  float f;
  FDMTP_PENALTY_BIT_COPY(&f, &u, sizeof(f));
  return f;
}

// IEEE binary16 -> float32, exact (NaN payloads kept).
FDMTP_HOST_DEVICE inline float HalfToFloat(uint16_t h) {
  const uint32_t sign = static_cast<uint32_t>(h & 0x8000u) << 16;
  const uint32_t exp = (h >> 10) & 0x1fu;
  const uint32_t man = h & 0x3ffu;
  if (exp == 0) {
    // zero or subnormal: man * 2^-24, exact in float32
    const float mag = static_cast<float>(man) * 5.9604644775390625e-8f;
    return BitsFloat(FloatBits(mag) | sign);
  }
  if (exp == 31) return BitsFloat(sign | 0x7f800000u | (man << 13));
  return BitsFloat(sign | ((exp + 112u) << 23) | (man << 13));
}

// float32 -> IEEE binary16, round to nearest even; overflow gives infinity; a NaN keeps the
// top 10 bits of its payload and is quiet.
FDMTP_HOST_DEVICE inline uint16_t FloatToHalf(float f) {
  const uint32_t x = FloatBits(f);
  const uint32_t sign = (x >> 16) & 0x8000u;
  const uint32_t ax = x & 0x7fffffffu;
  if (ax > 0x7f800000u) return static_cast<uint16_t>(sign | 0x7e00u | ((ax & 0x7fffffu) >> 13));
  if (ax >= 0x477ff000u) return static_cast<uint16_t>(sign | 0x7c00u);  // >= 65520: infinity
  if (ax < 0x38800000u) {                                               // below 2^-14
    if (ax <= 0x33000000u) return static_cast<uint16_t>(sign);          // <= 2^-25: zero
    const uint32_t exp = ax >> 23;
    const uint32_t man = (ax & 0x7fffffu) | 0x800000u;
    const uint32_t shift = 126u - exp;  // 14..24
    uint32_t q = man >> shift;
    const uint32_t rem = man & ((1u << shift) - 1u);
    const uint32_t half = 1u << (shift - 1u);
    if (rem > half || (rem == half && (q & 1u))) ++q;
    return static_cast<uint16_t>(sign | q);
  }
  const uint32_t rounded = ax + 0xfffu + ((ax >> 13) & 1u);
  return static_cast<uint16_t>(sign | ((rounded - (112u << 23)) >> 13));
}

// float32 -> bfloat16, round to nearest even; a NaN keeps the top 7 bits of its payload and
// is quiet.
FDMTP_HOST_DEVICE inline uint16_t FloatToBFloat(float f) {
  const uint32_t x = FloatBits(f);
  if ((x & 0x7fffffffu) > 0x7f800000u) return static_cast<uint16_t>((x >> 16) | 0x40u);
  return static_cast<uint16_t>((x + 0x7fffu + ((x >> 16) & 1u)) >> 16);
}

FDMTP_HOST_DEVICE inline float Load(FDMTP_GM const float* p) { return *p; }
FDMTP_HOST_DEVICE inline float Load(FDMTP_GM const Float16* p) { return HalfToFloat(p->bits); }
FDMTP_HOST_DEVICE inline float Load(FDMTP_GM const BFloat16* p) {
  return BitsFloat(static_cast<uint32_t>(p->bits) << 16);
}
FDMTP_HOST_DEVICE inline void Store(FDMTP_GM float* p, float v) { *p = v; }
FDMTP_HOST_DEVICE inline void Store(FDMTP_GM Float16* p, float v) { p->bits = FloatToHalf(v); }
FDMTP_HOST_DEVICE inline void Store(FDMTP_GM BFloat16* p, float v) { p->bits = FloatToBFloat(v); }

// The value a banned logit gets: -1e10, except float16 (whose range ends at 65504): -1e4.
template <typename T>
FDMTP_HOST_DEVICE inline float BanValue() {
  return -1e10f;
}
template <>
FDMTP_HOST_DEVICE inline float BanValue<Float16>() {
  return -1e4f;
}

// Correctly rounded float32 arithmetic; on CUDA the intrinsics keep the compiler from
// contracting a multiply and an add into one FMA (which would round differently).
FDMTP_HOST_DEVICE inline float Mul(float a, float b) {
#if defined(__CUDA_ARCH__)
  return __fmul_rn(a, b);
#else
  return a * b;
#endif
}
FDMTP_HOST_DEVICE inline float Div(float a, float b) {
#if defined(__CUDA_ARCH__)
  return __fdiv_rn(a, b);
#else
  return a / b;
#endif
}
FDMTP_HOST_DEVICE inline float Add(float a, float b) {
#if defined(__CUDA_ARCH__)
  return __fadd_rn(a, b);
#else
  return a + b;
#endif
}
FDMTP_HOST_DEVICE inline float Sub(float a, float b) {
#if defined(__CUDA_ARCH__)
  return __fsub_rn(a, b);
#else
  return a - b;
#endif
}

}  // namespace penalty_detail

// What a logits row r refers to: its item b (active = false for a row whose batch id lies
// outside [0, bsz): untouched), its index j within the item (r - cu_seqlens_q_output[b],
// read as 0 when negative), and the sequence whose counts penalise it: the item's generated
// ids token_ids_all[b, begin .. begin + hist) (begin = prompt_lens[b] clamped to [0, L];
// hist = up to the first negative id, within the row) followed by the drafts
// step_input_ids[b, 1 .. drafts] (drafts = min(j, W - 1)). cur_len < 0: nothing is counted.
struct PenaltyRow {
  bool active;
  int64_t b;
  int64_t j;
  int64_t begin;
  int64_t hist;
  int64_t drafts;
};

FDMTP_HOST_DEVICE inline PenaltyRow PenaltyRowOf(const SpeculateGetTokenPenaltyMultiScoresArgs& a,
                                                 int64_t r) {
  PenaltyRow row{false, 0, 0, 0, 0, 0};
  const int64_t b = a.batch_id_per_token_output[r];
  if (b < 0 || b >= a.bsz) return row;
  row.active = true;
  row.b = b;
  const int64_t j = r - static_cast<int64_t>(a.cu_seqlens_q_output[b]);
  row.j = j < 0 ? 0 : j;
  if (a.cur_len[b] < 0) return row;
  row.begin = ClampTo(a.prompt_lens[b], 0, a.hist_width);
  FDMTP_GM const int64_t* ids = a.token_ids_all + b * a.hist_width;
  int64_t end = row.begin;
  while (end < a.hist_width && ids[end] >= 0) ++end;
  row.hist = end - row.begin;
  if (a.step_input_ids != nullptr && a.draft_width > 1) {
    row.drafts = row.j < a.draft_width - 1 ? row.j : a.draft_width - 1;
  }
  return row;
}

// Element k of the row's counted sequence; -1 when it does not count (outside [0, vocab)).
FDMTP_HOST_DEVICE inline int64_t PenaltySeqId(const SpeculateGetTokenPenaltyMultiScoresArgs& a,
                                              const PenaltyRow& row, int64_t k) {
  const int64_t id = k < row.hist ? a.token_ids_all[row.b * a.hist_width + row.begin + k]
                                  : a.step_input_ids[row.b * a.draft_width + 1 + (k - row.hist)];
  return id >= 0 && id < a.vocab ? id : -1;
}

// Pass 1: below the minimum length (cur_len + j < min_len) every EOS id in [0, vocab) is
// banned. Partitioned over the EOS list.
template <typename T>
FDMTP_HOST_DEVICE inline void PenaltyMinLength(const SpeculateGetTokenPenaltyMultiScoresArgs& a,
                                               const PenaltyRow& row, int64_t r, int64_t start,
                                               int64_t stride) {
  if (a.cur_len[row.b] < 0 || SatAdd(a.cur_len[row.b], row.j) >= a.min_len[row.b]) return;
  FDMTP_GM T* logits = static_cast<FDMTP_GM T*>(a.logits) + r * a.vocab;
  for (int64_t e = start; e < a.num_eos; e += stride) {
    const int64_t id = a.eos_token_id[e];
    if (id >= 0 && id < a.vocab) penalty_detail::Store(logits + id, penalty_detail::BanValue<T>());
  }
}

// Pass 2: for each distinct id of the counted sequence (handled at its first position, so
// one writer per id), with c = its count: x = x < 0 ? x * alpha : x / alpha, then
// x -= c * beta + gamma. alpha <= 0 (or NaN) reads as 1. Partitioned over the positions;
// O(n^2) for a sequence of n ids, no scratch memory.
template <typename T>
FDMTP_HOST_DEVICE inline void PenaltyScores(const SpeculateGetTokenPenaltyMultiScoresArgs& a,
                                            const PenaltyRow& row, int64_t r, int64_t start,
                                            int64_t stride) {
  using penalty_detail::Load;
  const int64_t n = row.hist + row.drafts;
  if (n == 0) return;
  float alpha = Load(static_cast<FDMTP_GM const T*>(a.penalty_scores) + row.b);
  if (!(alpha > 0.0f)) alpha = 1.0f;
  const float beta = Load(static_cast<FDMTP_GM const T*>(a.frequency_scores) + row.b);
  const float gamma = Load(static_cast<FDMTP_GM const T*>(a.presence_scores) + row.b);
  FDMTP_GM T* logits = static_cast<FDMTP_GM T*>(a.logits) + r * a.vocab;
  for (int64_t k = start; k < n; k += stride) {
    const int64_t id = PenaltySeqId(a, row, k);
    if (id < 0) continue;
    bool seen = false;
    for (int64_t k2 = 0; k2 < k && !seen; ++k2) seen = PenaltySeqId(a, row, k2) == id;
    if (seen) continue;
    int64_t count = 1;
    for (int64_t k2 = k + 1; k2 < n; ++k2) count += PenaltySeqId(a, row, k2) == id ? 1 : 0;
    float x = Load(logits + id);
    x = x < 0.0f ? penalty_detail::Mul(x, alpha) : penalty_detail::Div(x, alpha);
    const float shift =
        penalty_detail::Add(penalty_detail::Mul(static_cast<float>(count), beta), gamma);
    penalty_detail::Store(logits + id, penalty_detail::Sub(x, shift));
  }
}

// Pass 3: every logit divided by the item's temperature, unless it is <= 0, NaN or
// infinite (a greedy row: not scaled). Partitioned over the vocabulary.
template <typename T>
FDMTP_HOST_DEVICE inline void PenaltyTemperature(const SpeculateGetTokenPenaltyMultiScoresArgs& a,
                                                 const PenaltyRow& row, int64_t r, int64_t start,
                                                 int64_t stride) {
  const float t = a.temperatures[row.b];
  if (!(t > 0.0f && t <= 3.40282347e38f)) return;
  FDMTP_GM T* logits = static_cast<FDMTP_GM T*>(a.logits) + r * a.vocab;
  for (int64_t v = start; v < a.vocab; v += stride) {
    penalty_detail::Store(logits + v, penalty_detail::Div(penalty_detail::Load(logits + v), t));
  }
}

// Pass 4: bad_tokens[b, i] for i < clamp(bad_tokens_len[b], 0, B), ids in [0, vocab), are
// banned. Partitioned over the list.
template <typename T>
FDMTP_HOST_DEVICE inline void PenaltyBadWords(const SpeculateGetTokenPenaltyMultiScoresArgs& a,
                                              const PenaltyRow& row, int64_t r, int64_t start,
                                              int64_t stride) {
  const int64_t n = ClampTo(a.bad_tokens_len[row.b], 0, a.bad_width);
  FDMTP_GM const int64_t* bad = a.bad_tokens + row.b * a.bad_width;
  FDMTP_GM T* logits = static_cast<FDMTP_GM T*>(a.logits) + r * a.vocab;
  for (int64_t i = start; i < n; i += stride) {
    const int64_t id = bad[i];
    if (id >= 0 && id < a.vocab) penalty_detail::Store(logits + id, penalty_detail::BanValue<T>());
  }
}

// The whole row, sequentially (the CPU and XPU kernels).
template <typename T>
FDMTP_HOST_DEVICE inline void SpeculateGetTokenPenaltyMultiScoresRow(
    const SpeculateGetTokenPenaltyMultiScoresArgs& a, int64_t r) {
  const PenaltyRow row = PenaltyRowOf(a, r);
  if (!row.active) return;
  PenaltyMinLength<T>(a, row, r, 0, 1);
  PenaltyScores<T>(a, row, r, 0, 1);
  PenaltyTemperature<T>(a, row, r, 0, 1);
  PenaltyBadWords<T>(a, row, r, 0, 1);
}

}  // namespace fdmtp
