// Exact batched matrix products for llama.cpp's CPU backend, as a ggml "ACCEL" backend.
//
// Why: on the exact build (no llamafile kernels, no repacking), every row of a verified draft
// is computed by ggml's one-token dot product, one weight row and one token at a time. Each
// weight block is decoded again for every token of the batch, so verifying 8 drafted tokens
// costs nearly 8 single-token products. Here each weight block is decoded once and multiplied
// with up to four tokens, while each token's sum runs through exactly the operations of
// ggml's one-token kernel (its AVX2 code), in the same order: the same integer sums per block
// and lane (integers: exact whatever their order), the same float scales, the same fused
// multiply-adds into eight lanes, the same horizontal sum. A batch's rows are therefore bit for bit the rows a single token gets, and
// tests/test_exact_matmul.py compares them with ggml's own kernel.
//
// How it joins llama.cpp: ggml's scheduler offers each matrix product to the registered
// backends in order (GPUs, then accelerators, then the CPU) and takes the first that accepts
// the weights' buffer and the operation. This backend accepts host buffers and products of
// Q8_0, Q5_0, Q4_0, Q4_1, Q5_1, IQ4_NL, Q4_K, Q5_K, Q6_K and IQ4_XS weights by F32 tokens; everything else stays with ggml's CPU
// backend. It takes single tokens too: its one-token sums are ggml's bit for bit, and it
// computes them faster (measured: docs/exactness.md), so plain decoding gains as well.
#include <pybind11/pybind11.h>

#include <immintrin.h>

#include <atomic>
#include <cstdint>
#include <cstring>
#include <mutex>
#include <new>
#include <stdexcept>
#include <string>
#include <vector>

#ifdef _OPENMP
#include <omp.h>
#endif

#include "ggml_abi.hpp"

namespace py = pybind11;
using namespace ggml_abi;

namespace {

api g_api;
std::atomic<int> g_threads{1};
std::atomic<int64_t> g_products{0};  // products computed here (tests read it)
std::atomic<int64_t> g_min_batch{1};
bool g_cpu_ok = false;

// What the kernels know of a weight type: its block (elements, bytes) and the format ggml's
// one-token kernel reads the tokens in (Q8_0 for the 32-weight types, Q8_K for the K-quants).
typedef void (*rows_fn)(const uint8_t *, size_t, int64_t, int64_t, int, const uint8_t *const *, int64_t, float *,
                        size_t);
struct weight_kind {
  int64_t block_elems = 0;
  size_t block_bytes = 0;
  int32_t token_type = 0;
  size_t token_block_bytes = 0;
  rows_fn rows = nullptr;
};

constexpr size_t kQ8_0 = 34;   // fp16 scale, 32 int8
constexpr size_t kQ8_K = 292;  // float scale, 256 int8, 16 int16 sums of 16
constexpr size_t kQ8_1 = 36;   // fp16 scale, fp16 scale times the sum, 32 int8

#define EXACT_TARGET __attribute__((target("avx2,fma,f16c")))

EXACT_TARGET inline float half_to_float(const uint8_t *p) {
  uint16_t h;
  std::memcpy(&h, p, 2);
  return _cvtsh_ss(h);
}

// A product the compiler may not fuse with the add after it (the module builds with
// -ffp-contract=off; this keeps it so under other flags too)
inline float mul_no_contract(float a, float b) {
  volatile float p = a * b;
  return p;
}

// a * b + c rounded once: where ggml's compiler fused a scalar multiply-add, so do we (the
// tests compare with ggml's kernel and tell which)
EXACT_TARGET inline float fused(float a, float b, float c) {
  return _mm_cvtss_f32(_mm_fmadd_ss(_mm_set_ss(a), _mm_set_ss(b), _mm_set_ss(c)));
}

EXACT_TARGET inline __m256i load32(const void *p) { return _mm256_loadu_si256(reinterpret_cast<const __m256i *>(p)); }

// The 32 weights of a Q8_0/Q5_0/Q4_0 block as signed bytes, in element order.
template <int32_t T>
EXACT_TARGET inline __m256i decode32(const uint8_t *blk) {
  if constexpr (T == TYPE_Q8_0) {
    return load32(blk + 2);
  } else {
    const uint8_t *qs = blk + (T == TYPE_Q5_0 ? 6 : 2);
    const __m128i packed = _mm_loadu_si128(reinterpret_cast<const __m128i *>(qs));
    const __m128i lo_mask = _mm_set1_epi8(0x0F);
    const __m256i nibbles = _mm256_set_m128i(_mm_and_si128(_mm_srli_epi16(packed, 4), lo_mask),
                                             _mm_and_si128(packed, lo_mask));
    if constexpr (T == TYPE_Q4_0) {
      return _mm256_sub_epi8(nibbles, _mm256_set1_epi8(8));
    } else {
      // fifth bit: element j's weight is its nibble if bit j of qh is set, else nibble - 16
      uint32_t qh;
      std::memcpy(&qh, blk + 2, 4);
      const __m256i spread = _mm256_shuffle_epi8(
          _mm256_set1_epi32(static_cast<int32_t>(qh)),
          _mm256_set_epi64x(0x0303030303030303, 0x0202020202020202, 0x0101010101010101, 0));
      const __m256i bit = _mm256_set1_epi64x(static_cast<int64_t>(0x8040201008040201ULL));
      const __m256i set = _mm256_cmpeq_epi8(_mm256_and_si256(spread, bit), bit);
      return _mm256_or_si256(nibbles, _mm256_andnot_si256(set, _mm256_set1_epi8(static_cast<char>(0xF0))));
    }
  }
}

EXACT_TARGET inline float hsum8(__m256 x) {
  __m128 r = _mm256_extractf128_ps(x, 1);
  r = _mm_add_ps(r, _mm256_castps256_ps128(x));
  r = _mm_add_ps(r, _mm_movehl_ps(r, r));
  r = _mm_add_ss(r, _mm_movehdup_ps(r));
  return _mm_cvtss_f32(r);
}

// One weight row of a 32-weight type times NC tokens in Q8_0; out[c * out_stride] gets token
// c's sum. Per block and token, as ggml's one-token kernel: |w| and sign(w) * x as bytes, their
// products summed in pairs to 16 bits and in fours to 32, the scale product, one FMA into
// eight lanes; the lanes summed at the end.
template <int32_t T, int NC>
EXACT_TARGET void small_blocks(const uint8_t *w, int nblocks, const uint8_t *const *y, float *out, size_t out_stride) {
  constexpr size_t wb = T == TYPE_Q8_0 ? 34 : (T == TYPE_Q5_0 ? 22 : 18);
  const __m256i ones = _mm256_set1_epi16(1);
  __m256 acc[NC];
  for (int c = 0; c < NC; ++c) acc[c] = _mm256_setzero_ps();
  for (int ib = 0; ib < nblocks; ++ib) {
    const uint8_t *blk = w + ib * wb;
    const float wd = half_to_float(blk);
    const __m256i qx = decode32<T>(blk);
    const __m256i ax = _mm256_sign_epi8(qx, qx);
    for (int c = 0; c < NC; ++c) {
      const uint8_t *yb = y[c] + ib * kQ8_0;
      const __m256i sy = _mm256_sign_epi8(load32(yb + 2), qx);
      const __m256 q = _mm256_cvtepi32_ps(_mm256_madd_epi16(ones, _mm256_maddubs_epi16(ax, sy)));
      acc[c] = _mm256_fmadd_ps(_mm256_set1_ps(wd * half_to_float(yb)), q, acc[c]);
    }
  }
  for (int c = 0; c < NC; ++c) out[c * out_stride] = hsum8(acc[c]);
}

// One weight row of Q4_1 or Q5_1 (unsigned weights, a scale and an offset per block) times NC
// tokens in Q8_1 (whose blocks carry their scale times their sum). As ggml's one-token kernel:
// unsigned weight bytes times the token's signed bytes in pairs and fours, one FMA of the
// scale product per block into eight lanes, and the offsets' products summed in a float
// beside them, added after the lanes' sum.
template <int32_t T, int NC>
EXACT_TARGET void offset_blocks(const uint8_t *w, int nblocks, const uint8_t *const *y, float *out, size_t out_stride) {
  constexpr size_t wb = T == TYPE_Q4_1 ? 20 : 24;
  const __m256i ones = _mm256_set1_epi16(1);
  const __m128i lo_mask = _mm_set1_epi8(0x0F);
  __m256 acc[NC];
  float summs[NC];
  for (int c = 0; c < NC; ++c) {
    acc[c] = _mm256_setzero_ps();
    summs[c] = 0.0f;
  }
  for (int ib = 0; ib < nblocks; ++ib) {
    const uint8_t *blk = w + ib * wb;
    const float wd = half_to_float(blk), wm = half_to_float(blk + 2);
    const __m128i packed = _mm_loadu_si128(reinterpret_cast<const __m128i *>(blk + (T == TYPE_Q4_1 ? 4 : 8)));
    __m256i qx = _mm256_set_m128i(_mm_and_si128(_mm_srli_epi16(packed, 4), lo_mask), _mm_and_si128(packed, lo_mask));
    if constexpr (T == TYPE_Q5_1) {
      uint32_t qh;
      std::memcpy(&qh, blk + 4, 4);
      const __m256i spread = _mm256_shuffle_epi8(
          _mm256_set1_epi32(static_cast<int32_t>(qh)),
          _mm256_set_epi64x(0x0303030303030303, 0x0202020202020202, 0x0101010101010101, 0));
      const __m256i bit = _mm256_set1_epi64x(static_cast<int64_t>(0x8040201008040201ULL));
      const __m256i set = _mm256_cmpeq_epi8(_mm256_and_si256(spread, bit), bit);
      qx = _mm256_or_si256(qx, _mm256_and_si256(set, _mm256_set1_epi8(0x10)));
    }
    for (int c = 0; c < NC; ++c) {
      const uint8_t *yb = y[c] + ib * kQ8_1;
      const float yd = half_to_float(yb);
      // a separate multiply and add, as ggml's build computes it (the tests hold it to that)
      summs[c] = summs[c] + mul_no_contract(wm, half_to_float(yb + 2));
      const __m256 q = _mm256_cvtepi32_ps(_mm256_madd_epi16(ones, _mm256_maddubs_epi16(qx, load32(yb + 4))));
      acc[c] = _mm256_fmadd_ps(_mm256_mul_ps(_mm256_set1_ps(wd), _mm256_set1_ps(yd)), q, acc[c]);
    }
  }
  for (int c = 0; c < NC; ++c) out[c * out_stride] = hsum8(acc[c]) + summs[c];
}

// IQ4_NL's 16 weight values (llama.cpp's table)
alignas(16) const int8_t kIq4nlValues[16] = {-127, -104, -83, -65, -49, -35, -22, -10, 1, 13, 25, 38, 53, 69, 89, 113};

// One weight row of IQ4_NL times NC tokens in Q8_0. ggml's one-token kernel takes blocks in
// pairs into two accumulators (even and odd blocks), adds them before the lanes' sum, and
// adds an odd last block afterwards as a float.
template <int NC>
EXACT_TARGET void iq4_nl_blocks(const uint8_t *w, int nblocks, const uint8_t *const *y, float *out, size_t out_stride) {
  const __m128i values = _mm_loadu_si128(reinterpret_cast<const __m128i *>(kIq4nlValues));
  const __m128i m4 = _mm_set1_epi8(0x0F);
  const __m256i ones = _mm256_set1_epi16(1);
  __m256 acc[2][NC];
  for (int c = 0; c < NC; ++c) acc[0][c] = acc[1][c] = _mm256_setzero_ps();
  const int paired = nblocks & ~1;
  for (int ib = 0; ib < paired; ++ib) {
    const uint8_t *blk = w + ib * 18;
    const float wd = half_to_float(blk);
    const __m128i bits = _mm_loadu_si128(reinterpret_cast<const __m128i *>(blk + 2));
    const __m256i qx = _mm256_set_m128i(_mm_shuffle_epi8(values, _mm_and_si128(_mm_srli_epi16(bits, 4), m4)),
                                        _mm_shuffle_epi8(values, _mm_and_si128(bits, m4)));
    const __m256i ax = _mm256_sign_epi8(qx, qx);
    for (int c = 0; c < NC; ++c) {
      const uint8_t *yb = y[c] + ib * kQ8_0;
      const __m256i p = _mm256_madd_epi16(_mm256_maddubs_epi16(ax, _mm256_sign_epi8(load32(yb + 2), qx)), ones);
      acc[ib & 1][c] = _mm256_fmadd_ps(_mm256_set1_ps(half_to_float(yb) * wd), _mm256_cvtepi32_ps(p), acc[ib & 1][c]);
    }
  }
  for (int c = 0; c < NC; ++c) {
    float sum = hsum8(_mm256_add_ps(acc[0][c], acc[1][c]));
    if (paired < nblocks) {  // the odd block, in integers, then one scaled add
      const uint8_t *blk = w + paired * 18, *yb = y[c] + paired * kQ8_0;
      const int8_t *q8 = reinterpret_cast<const int8_t *>(yb + 2);
      int s1 = 0, s2 = 0;
      for (int j = 0; j < 16; ++j) {
        s1 += q8[j] * kIq4nlValues[blk[2 + j] & 0xf];
        s2 += q8[j + 16] * kIq4nlValues[blk[2 + j] >> 4];
      }
      sum = fused(half_to_float(yb) * half_to_float(blk), static_cast<float>(s1 + s2), sum);
    }
    out[c * out_stride] = sum;
  }
}

// A K-quant super-block (256 weights) decoded once for all tokens: eight registers of 32
// unsigned weight bytes (register k pairs with the token's bytes 32k..32k+31) and, for each,
// the 16-bit scales of its sub-blocks, laid out as ggml's one-token kernel lays them out.
struct kblock {
  __m256i q[8];
  __m256i scale[8];
  __m128i mins;  // Q4_K: the eight sub-block minimums
  __m256i scales16;  // Q6_K: the sixteen sub-block scales, sign-extended
  float d, dmin;
};

// The six-bit scales and minimums of a Q4_K or Q5_K super-block, unpacked to bytes.
EXACT_TARGET inline void k4_scales(const uint8_t *packed, uint8_t sc[8], kblock &kb) {
  uint32_t u[4];
  std::memcpy(u, packed, 12);
  u[3] = ((u[2] >> 4) & 0x0f0f0f0f) | (((u[1] >> 6) & 0x03030303) << 4);
  const uint32_t mins_lo = u[1] & 0x3f3f3f3f;
  u[1] = (u[2] & 0x0f0f0f0f) | (((u[0] >> 6) & 0x03030303) << 4);
  u[2] = mins_lo;
  u[0] &= 0x3f3f3f3f;
  uint8_t mn[8];
  std::memcpy(sc, u, 8);
  std::memcpy(mn, u + 2, 8);
  kb.mins = _mm_cvtepu8_epi16(_mm_loadl_epi64(reinterpret_cast<const __m128i *>(mn)));
}

// Q4_K (H = false) or Q5_K (H = true: a fifth bit per weight, 32 bytes of them)
template <bool H>
EXACT_TARGET inline void decode_q45_k(const uint8_t *blk, kblock &kb) {
  kb.d = half_to_float(blk);
  kb.dmin = half_to_float(blk + 2);
  uint8_t sc[8];
  k4_scales(blk + 4, sc, kb);
  const __m256i m4 = _mm256_set1_epi8(0x0F);
  const uint8_t *qs = blk + (H ? 48 : 16);
  const __m256i hbits = H ? load32(blk + 16) : _mm256_setzero_si256();
  for (int j = 0; j < 4; ++j) {
    const __m256i bits = load32(qs + 32 * j);
    kb.q[2 * j] = _mm256_and_si256(bits, m4);
    kb.q[2 * j + 1] = _mm256_and_si256(_mm256_srli_epi16(bits, 4), m4);
    if constexpr (H) {  // bit 2j of each byte of hbits for sub-block 2j, bit 2j + 1 for the next
      const __m256i one = _mm256_set1_epi8(1);
      const __m256i h0 = _mm256_and_si256(_mm256_srl_epi16(hbits, _mm_cvtsi32_si128(2 * j)), one);
      const __m256i h1 = _mm256_and_si256(_mm256_srl_epi16(hbits, _mm_cvtsi32_si128(2 * j + 1)), one);
      kb.q[2 * j] = _mm256_or_si256(kb.q[2 * j], _mm256_slli_epi16(h0, 4));
      kb.q[2 * j + 1] = _mm256_or_si256(kb.q[2 * j + 1], _mm256_slli_epi16(h1, 4));
    }
    kb.scale[2 * j] = _mm256_set1_epi16(sc[2 * j]);
    kb.scale[2 * j + 1] = _mm256_set1_epi16(sc[2 * j + 1]);
  }
}

// IQ4_XS: 4-bit indices into a table of 16 signed values, six-bit scales less 32
EXACT_TARGET inline void decode_iq4_xs(const uint8_t *blk, kblock &kb) {
  kb.d = half_to_float(blk);
  uint16_t sh;
  std::memcpy(&sh, blk + 2, 2);
  const uint8_t *sl = blk + 4, *qs = blk + 8;
  const __m128i values = _mm_loadu_si128(reinterpret_cast<const __m128i *>(kIq4nlValues));
  const __m128i m4 = _mm_set1_epi8(0x0F);
  for (int ib = 0; ib < 8; ++ib) {
    const __m128i bits = _mm_loadu_si128(reinterpret_cast<const __m128i *>(qs + 16 * ib));
    kb.q[ib] = _mm256_set_m128i(_mm_shuffle_epi8(values, _mm_and_si128(_mm_srli_epi16(bits, 4), m4)),
                                _mm_shuffle_epi8(values, _mm_and_si128(bits, m4)));
    const int ls = ((sl[ib / 2] >> (4 * (ib % 2))) & 0xf) | (((sh >> (2 * ib)) & 3) << 4);
    kb.scale[ib] = _mm256_set1_epi16(static_cast<int16_t>(ls - 32));
  }
}

EXACT_TARGET inline void decode_q6_k(const uint8_t *blk, kblock &kb) {
  const uint8_t *ql = blk, *qh = blk + 128;
  const int8_t *sc = reinterpret_cast<const int8_t *>(blk + 192);
  kb.d = half_to_float(blk + 208);
  kb.scales16 = _mm256_cvtepi8_epi16(_mm_loadu_si128(reinterpret_cast<const __m128i *>(sc)));
  const __m256i m3 = _mm256_set1_epi8(3), m15 = _mm256_set1_epi8(15);
  for (int j = 0; j < 2; ++j) {
    const __m256i l1 = load32(ql + 64 * j), l2 = load32(ql + 64 * j + 32), h = load32(qh + 32 * j);
    const __m256i h0 = _mm256_slli_epi16(_mm256_and_si256(h, m3), 4);
    const __m256i h1 = _mm256_slli_epi16(_mm256_and_si256(h, _mm256_set1_epi8(12)), 2);
    const __m256i h2 = _mm256_and_si256(h, _mm256_set1_epi8(48));
    const __m256i h3 = _mm256_srli_epi16(_mm256_and_si256(h, _mm256_set1_epi8(-64)), 2);
    kb.q[4 * j + 0] = _mm256_or_si256(_mm256_and_si256(l1, m15), h0);
    kb.q[4 * j + 1] = _mm256_or_si256(_mm256_and_si256(l2, m15), h1);
    kb.q[4 * j + 2] = _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi16(l1, 4), m15), h2);
    kb.q[4 * j + 3] = _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi16(l2, 4), m15), h3);
    for (int i = 0; i < 4; ++i) {
      const int k = 4 * j + i;  // 32 weights: sub-blocks 2k and 2k + 1, 16 weights each
      kb.scale[k] = _mm256_set_m128i(_mm_set1_epi16(sc[2 * k + 1]), _mm_set1_epi16(sc[2 * k]));
    }
  }
}

// One weight row of a K-quant times NC tokens in Q8_K. The integer sum per lane is exactly
// the one-token kernel's (integers: any order gives it); the float steps are its steps.
template <int32_t T, int NC>
EXACT_TARGET void k_blocks(const uint8_t *w, int nblocks, const uint8_t *const *y, float *out, size_t out_stride) {
  constexpr size_t wb = T == TYPE_Q4_K ? 144 : T == TYPE_Q5_K ? 176 : T == TYPE_IQ4_XS ? 136 : 210;
  __m256 acc[NC];
  __m128 acc_m[NC];
  float summs[NC];
  for (int c = 0; c < NC; ++c) {
    acc[c] = _mm256_setzero_ps();
    acc_m[c] = _mm_setzero_ps();
    summs[c] = 0.0f;
  }
  kblock kb;
  for (int ib = 0; ib < nblocks; ++ib) {
    if constexpr (T == TYPE_Q4_K) decode_q45_k<false>(w + ib * wb, kb);
    else if constexpr (T == TYPE_Q5_K) decode_q45_k<true>(w + ib * wb, kb);
    else if constexpr (T == TYPE_IQ4_XS) decode_iq4_xs(w + ib * wb, kb);
    else decode_q6_k(w + ib * wb, kb);
    for (int c = 0; c < NC; ++c) {
      const uint8_t *yb = y[c] + ib * kQ8_K;
      float yd;
      std::memcpy(&yd, yb, 4);
      const uint8_t *q8 = yb + 4;
      const __m256i bsums = load32(yb + 260);
      __m256i sumi = _mm256_setzero_si256();
      for (int k = 0; k < 8; ++k) {
        const __m256i q8k = load32(q8 + 32 * k);
        __m256i pairs;
        if constexpr (T == TYPE_IQ4_XS) {  // signed weights: |w| and sign(w) * x, as for Q8_0
          pairs = _mm256_maddubs_epi16(_mm256_sign_epi8(kb.q[k], kb.q[k]), _mm256_sign_epi8(q8k, kb.q[k]));
        } else {
          pairs = _mm256_maddubs_epi16(kb.q[k], q8k);
        }
        sumi = _mm256_add_epi32(sumi, _mm256_madd_epi16(kb.scale[k], pairs));
      }
      if constexpr (T == TYPE_Q4_K) {
        const __m128i q8s = _mm_hadd_epi16(_mm256_castsi256_si128(bsums), _mm256_extracti128_si256(bsums, 1));
        const __m128i prod = _mm_madd_epi16(kb.mins, q8s);
        acc_m[c] = _mm_fmadd_ps(_mm_set1_ps(-yd * kb.dmin), _mm_cvtepi32_ps(prod), acc_m[c]);
        acc[c] = _mm256_fmadd_ps(_mm256_set1_ps(yd * kb.d), _mm256_cvtepi32_ps(sumi), acc[c]);
      } else if constexpr (T == TYPE_Q5_K) {
        // the minimums' part as one integer, scaled and added to a float per super-block
        const __m128i q8s = _mm_hadd_epi16(_mm256_castsi256_si128(bsums), _mm256_extracti128_si256(bsums, 1));
        const __m128i prod = _mm_madd_epi16(kb.mins, q8s);
        const __m128i total = _mm_hadd_epi32(_mm_hadd_epi32(prod, _mm_setzero_si128()), _mm_setzero_si128());
        summs[c] = fused(-yd * kb.dmin, static_cast<float>(_mm_cvtsi128_si32(total)), summs[c]);
        acc[c] = _mm256_fmadd_ps(_mm256_set1_ps(yd * kb.d), _mm256_cvtepi32_ps(sumi), acc[c]);
      } else if constexpr (T == TYPE_IQ4_XS) {
        acc[c] = _mm256_fmadd_ps(_mm256_set1_ps(kb.d * yd), _mm256_cvtepi32_ps(sumi), acc[c]);
      } else {
        // weights are stored plus 32: take 32 * scale * (sum of the tokens' 16 bytes) off
        sumi = _mm256_sub_epi32(sumi, _mm256_slli_epi32(_mm256_madd_epi16(bsums, kb.scales16), 5));
        acc[c] = _mm256_fmadd_ps(_mm256_set1_ps(yd * kb.d), _mm256_cvtepi32_ps(sumi), acc[c]);
      }
    }
  }
  for (int c = 0; c < NC; ++c) {
    if constexpr (T == TYPE_Q4_K) {
      __m128 m = _mm_add_ps(acc_m[c], _mm_movehl_ps(acc_m[c], acc_m[c]));
      m = _mm_add_ss(m, _mm_movehdup_ps(m));
      out[c * out_stride] = hsum8(acc[c]) + _mm_cvtss_f32(m);
    } else if constexpr (T == TYPE_Q5_K) {
      out[c * out_stride] = hsum8(acc[c]) + summs[c];
    } else {
      out[c * out_stride] = hsum8(acc[c]);
    }
  }
}

template <int32_t T, int NC>
void one_row(const uint8_t *w, int nblocks, const uint8_t *const *y, float *out, size_t out_stride) {
  if constexpr (T == TYPE_Q4_K || T == TYPE_Q5_K || T == TYPE_Q6_K || T == TYPE_IQ4_XS)
    k_blocks<T, NC>(w, nblocks, y, out, out_stride);
  else if constexpr (T == TYPE_IQ4_NL) iq4_nl_blocks<NC>(w, nblocks, y, out, out_stride);
  else if constexpr (T == TYPE_Q4_1 || T == TYPE_Q5_1) offset_blocks<T, NC>(w, nblocks, y, out, out_stride);
  else small_blocks<T, NC>(w, nblocks, y, out, out_stride);
}

// Rows row0..row1 of the weights times all ntok tokens, four tokens at a time: each weight
// block is decoded once per four tokens.
template <int32_t T>
void rows_times_tokens(const uint8_t *w, size_t w_stride, int64_t row0, int64_t row1, int nblocks,
                       const uint8_t *const *y, int64_t ntok, float *dst, size_t col) {
  for (int64_t r = row0; r < row1; ++r) {
    const uint8_t *wr = w + r * w_stride;
    int64_t c = 0;
    for (; c + 4 <= ntok; c += 4) one_row<T, 4>(wr, nblocks, y + c, dst + c * col + r, col);
    switch (ntok - c) {
      case 3: one_row<T, 3>(wr, nblocks, y + c, dst + c * col + r, col); break;
      case 2: one_row<T, 2>(wr, nblocks, y + c, dst + c * col + r, col); break;
      case 1: one_row<T, 1>(wr, nblocks, y + c, dst + c * col + r, col); break;
      default: break;
    }
  }
}

weight_kind kind_of(int32_t t) {
  switch (t) {
    case TYPE_Q8_0: return {32, 34, TYPE_Q8_0, kQ8_0, rows_times_tokens<TYPE_Q8_0>};
    case TYPE_Q5_0: return {32, 22, TYPE_Q8_0, kQ8_0, rows_times_tokens<TYPE_Q5_0>};
    case TYPE_Q4_0: return {32, 18, TYPE_Q8_0, kQ8_0, rows_times_tokens<TYPE_Q4_0>};
    case TYPE_Q4_1: return {32, 20, TYPE_Q8_1, kQ8_1, rows_times_tokens<TYPE_Q4_1>};
    case TYPE_Q5_1: return {32, 24, TYPE_Q8_1, kQ8_1, rows_times_tokens<TYPE_Q5_1>};
    case TYPE_Q4_K: return {256, 144, TYPE_Q8_K, kQ8_K, rows_times_tokens<TYPE_Q4_K>};
    case TYPE_Q5_K: return {256, 176, TYPE_Q8_K, kQ8_K, rows_times_tokens<TYPE_Q5_K>};
    case TYPE_Q6_K: return {256, 210, TYPE_Q8_K, kQ8_K, rows_times_tokens<TYPE_Q6_K>};
    case TYPE_IQ4_NL: return {32, 18, TYPE_Q8_0, kQ8_0, rows_times_tokens<TYPE_IQ4_NL>};
    case TYPE_IQ4_XS: return {256, 136, TYPE_Q8_K, kQ8_K, rows_times_tokens<TYPE_IQ4_XS>};
    default: return {};
  }
}

bool is_product_we_take(const tensor *op) {
  const tensor *w = op->src[0];
  const tensor *x = op->src[1];
  if (!w || !x || !g_cpu_ok) return false;
  const weight_kind kind = kind_of(w->type);
  if (!kind.rows || x->type != TYPE_F32 || op->type != TYPE_F32 || w->extra != nullptr) return false;
  if (w->ne[0] % kind.block_elems != 0 || w->ne[2] != 1 || w->ne[3] != 1) return false;
  if (w->nb[0] != kind.block_bytes || w->nb[1] != kind.block_bytes * static_cast<size_t>(w->ne[0] / kind.block_elems))
    return false;
  if (x->ne[0] != w->ne[0] || x->ne[2] != 1 || x->ne[3] != 1 || x->nb[0] != sizeof(float)) return false;
  if (op->nb[0] != sizeof(float) || op->ne[0] != w->ne[1] || op->ne[1] != x->ne[1]) return false;
  return x->ne[1] >= g_min_batch.load(std::memory_order_relaxed);
}

struct backend_state {
  std::vector<uint8_t> quantized;  // the tokens in Q8_0, the format ggml's one-token kernel reads
  std::vector<const uint8_t *> cols;
};

int32_t mul_mat(backend_state &st, tensor *op) {
  const tensor *w = op->src[0];
  const tensor *x = op->src[1];
  const weight_kind kind = kind_of(w->type);
  const int64_t k = w->ne[0], m = w->ne[1], n = x->ne[1];
  const int nblocks = static_cast<int>(k / kind.block_elems);
  // the tokens in the format ggml's one-token kernel reads, quantized by ggml's own function
  const size_t qrow = static_cast<size_t>(k / (kind.token_type == TYPE_Q8_K ? 256 : 32)) * kind.token_block_bytes;
  st.quantized.resize(qrow * static_cast<size_t>(n));
  st.cols.resize(static_cast<size_t>(n));
  const from_float_t quantize = g_api.get_type_traits_cpu(kind.token_type)->from_float;
  for (int64_t c = 0; c < n; ++c) {
    const float *src = reinterpret_cast<const float *>(static_cast<const uint8_t *>(x->data) + c * x->nb[1]);
    quantize(src, st.quantized.data() + c * qrow, k);
    st.cols[static_cast<size_t>(c)] = st.quantized.data() + c * qrow;
  }
  const uint8_t *wd = static_cast<const uint8_t *>(w->data);
  float *dst = static_cast<float *>(op->data);
  const size_t dst_col = op->nb[1] / sizeof(float);
  const uint8_t *const *cols = st.cols.data();
  constexpr int64_t kChunk = 16;
  const int64_t chunks = (m + kChunk - 1) / kChunk;
  const int threads = g_threads.load(std::memory_order_relaxed);
#pragma omp parallel for schedule(static) num_threads(threads) if (threads > 1 && chunks > 1)
  for (int64_t ch = 0; ch < chunks; ++ch) {
    const int64_t r0 = ch * kChunk;
    const int64_t r1 = r0 + kChunk < m ? r0 + kChunk : m;
    kind.rows(wd, w->nb[1], r0, r1, nblocks, cols, n, dst, dst_col);
  }
  g_products.fetch_add(1, std::memory_order_relaxed);
  return STATUS_SUCCESS;
}

// ---- the backend, device and registry objects ggml sees --------------------------------------

guid g_guid = {{0x6e, 0x67, 0x72, 0x61, 0x6d, 0x63, 0x61, 0x63, 0x68, 0x65, 0x2d, 0x65, 0x78, 0x61, 0x63, 0x74}};
const char *kName = "ngramcache-exact";
const char *kDescription = "ngramcache: batched matrix products whose rows equal one-token rows";

const char *backend_name(backend *) { return kName; }
void backend_free(backend *b) {
  delete static_cast<backend_state *>(b->context);
  delete b;
}
void backend_sync(backend *) {}
int32_t compute_nodes(backend_state &st, cgraph *g);

// No C++ exception may cross ggml's C frames: a failed allocation becomes ggml's status
int32_t backend_compute(backend *b, cgraph *g) {
  try {
    return compute_nodes(*static_cast<backend_state *>(b->context), g);
  } catch (const std::bad_alloc &) {
    return -2;  // GGML_STATUS_ALLOC_FAILED
  } catch (...) {
    return -1;  // GGML_STATUS_FAILED
  }
}

int32_t compute_nodes(backend_state &st, cgraph *g) {
  const int n = g_api.graph_n_nodes(g);
  for (int i = 0; i < n; ++i) {
    tensor *t = g_api.graph_node(g, i);
    switch (t->op) {
      case OP_NONE: case OP_RESHAPE: case OP_VIEW: case OP_PERMUTE: case OP_TRANSPOSE: break;
      case OP_MUL_MAT: {
        const int32_t s = mul_mat(st, t);
        if (s != STATUS_SUCCESS) return s;
        break;
      }
      default: return -1;  // GGML_STATUS_FAILED: the scheduler gave an operation never accepted
    }
  }
  return STATUS_SUCCESS;
}

device g_device;
reg g_reg;

backend *dev_init(device *d, const char *) {
  auto *b = new backend();
  b->id = &g_guid;
  b->iface.get_name = backend_name;
  b->iface.free = backend_free;
  b->iface.synchronize = backend_sync;
  b->iface.graph_compute = backend_compute;
  b->dev = d;
  b->context = new backend_state();
  return b;
}
const char *dev_name(device *) { return kName; }
const char *dev_description(device *) { return kDescription; }
void dev_memory(device *, size_t *free, size_t *total) { *free = 0; *total = 0; }
int32_t dev_get_type(device *) { return DEV_ACCEL; }
void dev_props_fn(device *d, dev_props *p) {
  p->name = kName;
  p->description = kDescription;
  dev_memory(d, &p->memory_free, &p->memory_total);
  p->type = DEV_ACCEL;
  p->device_id = nullptr;
  p->caps = dev_caps{false, false, false, false, false};
}
buffer_type *dev_buft(device *) { return g_api.cpu_buffer_type(); }
bool dev_supports_op(device *, const tensor *op) {
  switch (op->op) {
    case OP_NONE: case OP_RESHAPE: case OP_VIEW: case OP_PERMUTE: case OP_TRANSPOSE: return true;
    case OP_MUL_MAT: return is_product_we_take(op);
    default: return false;
  }
}
bool dev_supports_buft(device *, buffer_type *bt) { return g_api.buft_is_host(bt); }

const char *reg_name(reg *) { return kName; }
size_t reg_count(reg *) { return 1; }
device *reg_device(reg *, size_t i) { return i == 0 ? &g_device : nullptr; }
void *reg_proc(reg *, const char *) { return nullptr; }

std::mutex g_install_lock;
bool g_registered = false;

template <typename F>
F fn(py::dict addrs, const char *name) {
  if (!addrs.contains(name)) throw std::invalid_argument(std::string("missing ggml function ") + name);
  const auto a = addrs[name].cast<uintptr_t>();
  if (a == 0) throw std::invalid_argument(std::string("null address for ggml function ") + name);
  return reinterpret_cast<F>(a);
}

bool cpu_has_kernels() {
  __builtin_cpu_init();
  return __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma") && __builtin_cpu_supports("f16c");
}

}  // namespace

PYBIND11_MODULE(_exact_matmul, m) {
  m.doc() = "Exact batched matrix products for llama.cpp's CPU backend (a ggml accelerator backend).";
  m.def("cpu_supported", &cpu_has_kernels, "Whether this CPU runs the kernels (AVX2, FMA, F16C).");
  m.def(
      "probe_layout",
      [](uintptr_t t_addr, int32_t type, int64_t ne0, int64_t ne1, const std::string &name, int32_t op,
         uintptr_t src0, uintptr_t src1) {
        const auto *t = reinterpret_cast<const tensor *>(t_addr);
        return t->type == type && t->ne[0] == ne0 && t->ne[1] == ne1 && t->ne[2] == 1 && t->ne[3] == 1 &&
               std::string(t->name) == name && t->op == op && reinterpret_cast<uintptr_t>(t->src[0]) == src0 &&
               reinterpret_cast<uintptr_t>(t->src[1]) == src1;
      },
      "Whether the ggml tensor at t_addr reads as expected through this module's layout.");
  m.def(
      "register_backend",
      [](py::dict addrs, int threads) {
        std::lock_guard<std::mutex> lock(g_install_lock);
        if (threads < 1) throw std::invalid_argument("threads must be at least 1");
        g_threads.store(threads);
        if (g_registered) return false;
        g_api.backend_register = fn<void (*)(reg *)>(addrs, "ggml_backend_register");
        g_api.cpu_buffer_type = fn<buffer_type *(*)()>(addrs, "ggml_backend_cpu_buffer_type");
        g_api.buft_is_host = fn<bool (*)(buffer_type *)>(addrs, "ggml_backend_buft_is_host");
        g_api.graph_n_nodes = fn<int (*)(cgraph *)>(addrs, "ggml_graph_n_nodes");
        g_api.graph_node = fn<tensor *(*)(cgraph *, int)>(addrs, "ggml_graph_node");
        g_api.get_type_traits_cpu = fn<const type_traits_cpu *(*)(int32_t)>(addrs, "ggml_get_type_traits_cpu");
        g_cpu_ok = cpu_has_kernels();
        device_i &di = g_device.iface;
        di = {};
        di.get_name = dev_name;
        di.get_description = dev_description;
        di.get_memory = dev_memory;
        di.get_type = dev_get_type;
        di.get_props = dev_props_fn;
        di.init_backend = dev_init;
        di.get_buffer_type = dev_buft;
        di.supports_op = dev_supports_op;
        di.supports_buft = dev_supports_buft;
        g_device.owner = &g_reg;
        g_reg.api_version = kBackendApiVersion;
        g_reg.iface.get_name = reg_name;
        g_reg.iface.get_device_count = reg_count;
        g_reg.iface.get_device = reg_device;
        g_reg.iface.get_proc_address = reg_proc;
        g_api.backend_register(&g_reg);
        g_registered = true;
        return true;
      },
      py::arg("addresses"), py::arg("threads"),
      "Register the backend with ggml (once per process; later calls only set the thread count). "
      "Returns whether this call registered it.");
  m.def("products", []() { return g_products.load(); }, "Matrix products computed by the backend so far.");
  m.def(
      "set_min_batch", [](int64_t n) {
        if (n < 1) throw std::invalid_argument("min batch must be at least 1");
        g_min_batch.store(n);
      },
      "Smallest token count the backend takes (1, the default: every product of its types; 2 leaves "
      "single tokens to ggml's CPU backend). llama.cpp asks when it builds a graph of a new shape: a graph "
      "it reuses keeps the backends it had.");
  m.def(
      "dot_rows",
      [](int32_t type, py::buffer weights, py::buffer tokens, int64_t k) {
        // The kernel alone, for tests: weights (rows of type) times tokens already quantized
        // in the type's token format (Q8_0, or Q8_K for the K-quants).
        const weight_kind kind = kind_of(type);
        if (!kind.rows || !cpu_has_kernels()) throw std::invalid_argument("type not supported on this CPU");
        if (k <= 0 || k % kind.block_elems)
          throw std::invalid_argument("k must be a positive multiple of " + std::to_string(kind.block_elems));
        const py::buffer_info wi = weights.request(), yi = tokens.request();
        const int64_t nb = k / kind.block_elems;
        const size_t wrow = kind.block_bytes * static_cast<size_t>(nb), qrow = kind.token_block_bytes * static_cast<size_t>(nb);
        const size_t wbytes = static_cast<size_t>(wi.size * wi.itemsize), ybytes = static_cast<size_t>(yi.size * yi.itemsize);
        if (wbytes == 0 || ybytes == 0 || wbytes % wrow || ybytes % qrow) throw std::invalid_argument("buffer sizes are not whole rows");
        const int64_t m_rows = static_cast<int64_t>(wbytes / wrow), n = static_cast<int64_t>(ybytes / qrow);
        std::vector<const uint8_t *> cols(static_cast<size_t>(n));
        for (int64_t c = 0; c < n; ++c) cols[static_cast<size_t>(c)] = static_cast<const uint8_t *>(yi.ptr) + c * qrow;
        std::string out(static_cast<size_t>(m_rows * n) * sizeof(float), '\0');
        kind.rows(static_cast<const uint8_t *>(wi.ptr), wrow, 0, m_rows, static_cast<int>(nb), cols.data(), n,
                  reinterpret_cast<float *>(&out[0]), static_cast<size_t>(m_rows));
        return py::bytes(out);
      },
      py::arg("type"), py::arg("weights"), py::arg("tokens"), py::arg("k"),
      "Float32 bytes, token-major: token c's sums at [c * rows, (c + 1) * rows).");
}
