/// @file gating_device.cuh
/// @brief Device helpers shared by the chapter's before and after kernels: the order-preserving
/// 32-bit key that makes "largest value, NaN last" an unsigned-integer comparison, conversions, and
/// the scores of the routing functions. Internal to the chapter.
#pragma once

#include <cuda_bf16.h>

#include <cstdint>

namespace kc::ch04::detail {

/// Key of an expert that must never be chosen again (already chosen, masked out, or padding).
inline constexpr unsigned kTakenKey = 0u;
/// Key of a NaN score: above kTakenKey, below every number (including -Inf).
inline constexpr unsigned kNanKey = 1u;

/// The order-preserving bits of a float that is not NaN: flip all bits of a negative float, set the
/// sign bit of a positive one. -0 is folded into +0 first (x + 0.0f is +0 for -0 and x otherwise;
/// the two zeros are equal, so the tie rule must see them as equal). No branch: a shift, an OR and
/// an XOR, which matters because every logit of every row goes through here.
__device__ inline unsigned order_bits(float x) {
  const unsigned bits = __float_as_uint(x + 0.0f);
  return bits ^ (static_cast<unsigned>(static_cast<int>(bits) >> 31) | 0x80000000u);
}

/// Maps a float to an unsigned key with the same order (larger value, larger key), every NaN to
/// kNanKey. -Inf gets 0x007FFFFF, far above kNanKey.
__device__ inline unsigned order_key(float x) { return x != x ? kNanKey : order_bits(x); }

/// Inverse of order_key for keys of numbers; kNanKey and kTakenKey give NaN (0xFFFFFFFE and
/// 0xFFFFFFFF are NaN bit patterns). Branch-free like order_bits: a key with its top bit set came
/// from a positive float (clear that bit), any other from a negative one (flip every bit).
__device__ inline float key_value(unsigned key) {
  return __uint_as_float(key ^ (static_cast<unsigned>(static_cast<int>(~key) >> 31) | 0x80000000u));
}

/// Widens one logit to fp32.
__device__ inline float to_float(float x) { return x; }
/// Widens one bf16 logit to fp32 (exact).
__device__ inline float to_float(__nv_bfloat16 x) { return __bfloat162float(x); }

/// Softmax numerator of logit @p x relative to the row's largest non-NaN logit @p m, with the
/// chapter's policy: NaN weighs 0; when m is +Inf only +Inf logits weigh (1 each); when m is -Inf
/// (no logit above -Inf) everything weighs 0, so the weights become 0, never NaN.
__device__ inline float softmax_mass(float x, float m) {
  if (x != x || m == -__int_as_float(0x7f800000)) return 0.0f;
  if (m == __int_as_float(0x7f800000)) return x == m ? 1.0f : 0.0f;
  return expf(x - m);
}

/// DeepSeek-V3's score: sigmoid(x) in fp32 (NaN stays NaN, -Inf gives 0, +Inf gives 1).
/// __frcp_rn is the correctly rounded reciprocal: the same bits as 1.0f / y, without the division's
/// slow-path branch.
__device__ inline float sigmoid(float x) { return __frcp_rn(1.0f + expf(-x)); }

/// The lanes of a warp that take part in every shuffle and vote here: all of them.
inline constexpr unsigned kFullMask = 0xFFFFFFFFu;

}  // namespace kc::ch04::detail
