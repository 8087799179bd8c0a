// 16 lanes of float32 or int32 (one panel's outputs in int8.cpp), as one AVX-512 vector or two
// AVX2 vectors, whichever the compiler targets: -mavx512f (with -mavx512bw -mavx512vnni), or
// -mavx2 -mfma -mf16c without AVX-512. Not a general vector library: only what int8.cpp needs.
//
// Invariant: every float lane is the same IEEE operation on either ISA (a lane's fused
// multiply-add, product or conversion; maxima and integer sums are exact in any order), so a
// kernel written on these gives bitwise the same outputs from either build.
//
// The integer dot products of 64 bytes (16 lanes x 4 consecutive inputs) by 4 signed int8
// inputs broadcast to every lane: AVX-512 VNNI's vpdpbusd (unsigned bytes times signed ones), or
// on AVX2 llama.cpp's technique, vpmaddubsw (pairs of unsigned x signed byte products summed to
// int16, saturating) then vpmaddwd by ones (pairs of int16 summed to int32). Its int16 sums
// cannot saturate here: the unsigned side is at most 128 (|code|) and the signed side at most
// 127 in magnitude (the rows' codes), so a pair is at most 2 * 128 * 127 = 32512 < 32767.
#pragma once

#include <immintrin.h>

#include <cstdint>

namespace specdec::lanes {

#if defined(__AVX512F__)

constexpr const char* ISA = "avx512";
using Floats = __m512;
using Ints = __m512i;
using Bytes = __m512i;  // 64 bytes: lane i's 4 bytes for 4 consecutive inputs of output i
using Mask = __mmask16;

inline Floats fload(const float* at) { return _mm512_loadu_ps(at); }
inline Floats fset(float v) { return _mm512_set1_ps(v); }
inline Floats fzero() { return _mm512_setzero_ps(); }
inline Floats vabs(Floats v) { return _mm512_abs_ps(v); }
inline Floats vmax(Floats a, Floats b) { return _mm512_max_ps(a, b); }
inline Floats fmul(Floats a, Floats b) { return _mm512_mul_ps(a, b); }
inline Floats fmadd(Floats a, Floats b, Floats c) { return _mm512_fmadd_ps(a, b, c); }
inline float reduce_max(Floats v) { return _mm512_reduce_max_ps(v); }
inline Floats to_floats(Ints v) { return _mm512_cvtepi32_ps(v); }
inline Ints to_ints(Floats v) { return _mm512_cvtps_epi32(v); }  // nearest, ties to even
inline Ints izero() { return _mm512_setzero_si512(); }
inline Ints iset(int32_t v) { return _mm512_set1_epi32(v); }
inline Ints iadd(Ints a, Ints b) { return _mm512_add_epi32(a, b); }
inline Ints isub(Ints a, Ints b) { return _mm512_sub_epi32(a, b); }
inline Ints iload(const int32_t* at) { return _mm512_loadu_si512(at); }
inline int32_t reduce_add(Ints v) { return _mm512_reduce_add_epi32(v); }
// the 16 lanes to int8, saturating, at ``at``
inline void store_bytes(int8_t* at, Ints v) {
  _mm_storeu_si128(reinterpret_cast<__m128i*>(at), _mm512_cvtsepi32_epi8(v));
}
inline Floats halves(const uint16_t* at) {  // 16 float16 widened (exactly)
  return _mm512_cvtph_ps(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(at)));
}
inline Mask first(int64_t n) { return n >= 16 ? 0xFFFF : static_cast<Mask>((1u << n) - 1u); }
inline Floats load_first(const float* at, Mask m) { return _mm512_maskz_loadu_ps(m, at); }
inline void store_first(float* at, Mask m, Floats v) { _mm512_mask_storeu_ps(at, m, v); }

inline Bytes bytes(const uint8_t* at) { return _mm512_loadu_si512(at); }
inline Bytes low_nibbles(Bytes v) { return _mm512_and_si512(v, _mm512_set1_epi8(0x0F)); }
inline Bytes high_nibbles(Bytes v) {
  return _mm512_and_si512(_mm512_srli_epi16(v, 4), _mm512_set1_epi8(0x0F));
}
// acc + per lane the sum of its 4 unsigned bytes (at most 128) times the 4 signed bytes ``x4``
inline Ints dot(Ints acc, Bytes u, int32_t x4) {
  return _mm512_dpbusd_epi32(acc, u, _mm512_set1_epi32(x4));
}
// Q8_0's codes as stored (each plus 128, unsigned) prepared for ``dot_q8``, and what
// dot_q8's sums hold beyond the codes' own product: CODE_OFFSET times the inputs' sum
using Q8 = Bytes;
constexpr int32_t CODE_OFFSET = 128;
inline Q8 q8(Bytes stored) { return stored; }
inline Ints dot_q8(Ints acc, const Q8& w, int32_t x4) { return dot(acc, w, x4); }

#elif defined(__AVX2__) && defined(__FMA__) && defined(__F16C__)

constexpr const char* ISA = "avx2";
struct Floats { __m256 lo, hi; };
struct Ints { __m256i lo, hi; };
struct Bytes { __m256i lo, hi; };
struct Mask { __m256i lo, hi; };

inline Floats fload(const float* at) { return {_mm256_loadu_ps(at), _mm256_loadu_ps(at + 8)}; }
inline Floats fset(float v) { return {_mm256_set1_ps(v), _mm256_set1_ps(v)}; }
inline Floats fzero() { return {_mm256_setzero_ps(), _mm256_setzero_ps()}; }
inline Floats vabs(Floats v) {
  const __m256 sign = _mm256_set1_ps(-0.0f);
  return {_mm256_andnot_ps(sign, v.lo), _mm256_andnot_ps(sign, v.hi)};
}
inline Floats vmax(Floats a, Floats b) {
  return {_mm256_max_ps(a.lo, b.lo), _mm256_max_ps(a.hi, b.hi)};
}
inline Floats fmul(Floats a, Floats b) {
  return {_mm256_mul_ps(a.lo, b.lo), _mm256_mul_ps(a.hi, b.hi)};
}
inline Floats fmadd(Floats a, Floats b, Floats c) {
  return {_mm256_fmadd_ps(a.lo, b.lo, c.lo), _mm256_fmadd_ps(a.hi, b.hi, c.hi)};
}
inline float reduce_max(Floats v) {
  __m256 m = _mm256_max_ps(v.lo, v.hi);
  __m128 h = _mm_max_ps(_mm256_castps256_ps128(m), _mm256_extractf128_ps(m, 1));
  h = _mm_max_ps(h, _mm_movehl_ps(h, h));
  h = _mm_max_ss(h, _mm_movehdup_ps(h));
  return _mm_cvtss_f32(h);
}
inline Floats to_floats(Ints v) { return {_mm256_cvtepi32_ps(v.lo), _mm256_cvtepi32_ps(v.hi)}; }
inline Ints to_ints(Floats v) { return {_mm256_cvtps_epi32(v.lo), _mm256_cvtps_epi32(v.hi)}; }
inline Ints izero() { return {_mm256_setzero_si256(), _mm256_setzero_si256()}; }
inline Ints iset(int32_t v) { return {_mm256_set1_epi32(v), _mm256_set1_epi32(v)}; }
inline Ints iadd(Ints a, Ints b) {
  return {_mm256_add_epi32(a.lo, b.lo), _mm256_add_epi32(a.hi, b.hi)};
}
inline Ints isub(Ints a, Ints b) {
  return {_mm256_sub_epi32(a.lo, b.lo), _mm256_sub_epi32(a.hi, b.hi)};
}
inline Ints iload(const int32_t* at) {
  return {_mm256_loadu_si256(reinterpret_cast<const __m256i*>(at)),
          _mm256_loadu_si256(reinterpret_cast<const __m256i*>(at + 8))};
}
inline int32_t reduce_add(Ints v) {
  const __m256i s = _mm256_add_epi32(v.lo, v.hi);
  __m128i h = _mm_add_epi32(_mm256_castsi256_si128(s), _mm256_extracti128_si256(s, 1));
  h = _mm_add_epi32(h, _mm_shuffle_epi32(h, _MM_SHUFFLE(1, 0, 3, 2)));
  h = _mm_add_epi32(h, _mm_shuffle_epi32(h, _MM_SHUFFLE(2, 3, 0, 1)));
  return _mm_cvtsi128_si32(h);
}
// int32 to int16 to int8, each step saturating: the same bytes as saturating int32 to int8
inline void store_bytes(int8_t* at, Ints v) {
  // packs works within 128-bit halves: [lo 0-3, hi 0-3 | lo 4-7, hi 4-7] -> lanes in order
  const __m256i words = _mm256_permute4x64_epi64(_mm256_packs_epi32(v.lo, v.hi), 0xD8);
  const __m128i out = _mm_packs_epi16(_mm256_castsi256_si128(words),
                                      _mm256_extracti128_si256(words, 1));
  _mm_storeu_si128(reinterpret_cast<__m128i*>(at), out);
}
inline Floats halves(const uint16_t* at) {
  return {_mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(at))),
          _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(at + 8)))};
}
inline Mask first(int64_t n) {  // lane i is on where i < n
  const __m256i lanes = _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7);
  const auto count = static_cast<int32_t>(n < 16 ? n : 16);
  return {_mm256_cmpgt_epi32(_mm256_set1_epi32(count), lanes),
          _mm256_cmpgt_epi32(_mm256_set1_epi32(count - 8), lanes)};
}
inline Floats load_first(const float* at, Mask m) {
  return {_mm256_maskload_ps(at, m.lo), _mm256_maskload_ps(at + 8, m.hi)};
}
inline void store_first(float* at, Mask m, Floats v) {
  _mm256_maskstore_ps(at, m.lo, v.lo);
  _mm256_maskstore_ps(at + 8, m.hi, v.hi);
}

inline Bytes bytes(const uint8_t* at) {
  return {_mm256_loadu_si256(reinterpret_cast<const __m256i*>(at)),
          _mm256_loadu_si256(reinterpret_cast<const __m256i*>(at + 32))};
}
inline Bytes low_nibbles(Bytes v) {
  const __m256i low = _mm256_set1_epi8(0x0F);
  return {_mm256_and_si256(v.lo, low), _mm256_and_si256(v.hi, low)};
}
inline Bytes high_nibbles(Bytes v) {
  const __m256i low = _mm256_set1_epi8(0x0F);
  return {_mm256_and_si256(_mm256_srli_epi16(v.lo, 4), low),
          _mm256_and_si256(_mm256_srli_epi16(v.hi, 4), low)};
}
// per 32-bit lane: the 4 products of unsigned u (at most 128) by signed x, summed exactly
inline __m256i dot4(__m256i u, __m256i x) {
  return _mm256_madd_epi16(_mm256_maddubs_epi16(u, x), _mm256_set1_epi16(1));
}
inline Ints dot(Ints acc, Bytes u, int32_t x4) {
  const __m256i x = _mm256_set1_epi32(x4);
  return {_mm256_add_epi32(acc.lo, dot4(u.lo, x)), _mm256_add_epi32(acc.hi, dot4(u.hi, x))};
}
// Q8_0's codes as stored plus 128 would make pairs of up to 2 * 255 * 127, past int16: so the
// signed codes w are restored (stored ^ 0x80), and |w| (unsigned) times x with w's sign
// (vpsignb: -x, 0 or x) is the exact w * x. Nothing is left over: CODE_OFFSET is 0.
struct Q8 { __m256i abs_lo, abs_hi, sign_lo, sign_hi; };
constexpr int32_t CODE_OFFSET = 0;
inline Q8 q8(Bytes stored) {
  const __m256i flip = _mm256_set1_epi8(static_cast<char>(0x80));
  const __m256i lo = _mm256_xor_si256(stored.lo, flip), hi = _mm256_xor_si256(stored.hi, flip);
  return {_mm256_abs_epi8(lo), _mm256_abs_epi8(hi), lo, hi};
}
inline Ints dot_q8(Ints acc, const Q8& w, int32_t x4) {
  const __m256i x = _mm256_set1_epi32(x4);
  return {_mm256_add_epi32(acc.lo, dot4(w.abs_lo, _mm256_sign_epi8(x, w.sign_lo))),
          _mm256_add_epi32(acc.hi, dot4(w.abs_hi, _mm256_sign_epi8(x, w.sign_hi)))};
}

#else
#error "lanes.h needs AVX-512 (-mavx512f) or AVX2 with FMA and F16C (-mavx2 -mfma -mf16c)"
#endif

}  // namespace specdec::lanes
