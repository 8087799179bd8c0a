// 16 lanes of float32 or int32, as one AVX-512 vector or two AVX2 vectors, whichever the
// compiler targets: -mavx512f (the int8 linear with -mavx512bw -mavx512vnni), or -mavx2 -mfma
// -mf16c without AVX-512. Not a general vector library: what specdec's kernels on both ISAs
// need (int8.cpp, attend.cpp, fused.cpp), each kernel one source built once per ISA.
//
// Invariant: every float lane is the same IEEE operation on either ISA (a lane's fused
// multiply-add, product, quotient, rounding or conversion; maxima and integer sums are exact in
// any order), and every sum across lanes is the same tree of adds (``reduce_add``, ``sums16``),
// so a kernel written on these gives bitwise the same outputs from either build.
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

constexpr int WIDTH = 16;  // lanes a ``Floats`` or ``Ints`` holds (a panel's outputs in int8.cpp)

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

constexpr int VECTORS = 32;  // Floats a kernel may keep in registers
inline void fstore(float* at, Floats v) { _mm512_storeu_ps(at, v); }
inline Floats fadd(Floats a, Floats b) { return _mm512_add_ps(a, b); }
inline Floats fsub(Floats a, Floats b) { return _mm512_sub_ps(a, b); }
inline Floats fdiv(Floats a, Floats b) { return _mm512_div_ps(a, b); }
inline Floats vmin(Floats a, Floats b) { return _mm512_min_ps(a, b); }
inline Floats fnmadd(Floats a, Floats b, Floats c) { return _mm512_fnmadd_ps(a, b, c); }
inline Floats select(Mask m, Floats on, Floats off) { return _mm512_mask_mov_ps(off, m, on); }
inline Floats nearest(Floats v) {  // to the nearest integer, ties to even
  return _mm512_roundscale_ps(v, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
}
inline Floats scale2(Floats p, Floats n) { return _mm512_scalef_ps(p, n); }  // p 2^n, n whole
// the lanes as float16, rounded to nearest, ties to even (as torch's conversion rounds)
inline void store_halves(uint16_t* at, Floats v) {
  _mm256_storeu_si256(reinterpret_cast<__m256i*>(at),
                      _mm512_cvtps_ph(v, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC));
}
inline __m256 half_of(Floats v, int i) {  // lanes 8i..8i+7
  return _mm256_castpd_ps(_mm512_extractf64x4_pd(_mm512_castps_pd(v), i));
}
// 16 vectors' lane sums as one vector, lane j holding a[j]'s: within each 128-bit lane, pairs 2
// apart then 1 apart (unpacks, shuffles), then the 128-bit lanes 0 + 1 and 2 + 3, then those
inline Floats sums16(const Floats* a) {
  Floats b[8], c[4], d[2];
  for (int j = 0; j < 8; ++j)
    b[j] = _mm512_add_ps(_mm512_unpacklo_ps(a[2 * j], a[2 * j + 1]),
                         _mm512_unpackhi_ps(a[2 * j], a[2 * j + 1]));
  for (int j = 0; j < 4; ++j)
    c[j] = _mm512_add_ps(_mm512_shuffle_ps(b[2 * j], b[2 * j + 1], 0x44),
                         _mm512_shuffle_ps(b[2 * j], b[2 * j + 1], 0xEE));
  for (int j = 0; j < 2; ++j)
    d[j] = _mm512_add_ps(_mm512_shuffle_f32x4(c[2 * j], c[2 * j + 1], 0x88),
                         _mm512_shuffle_f32x4(c[2 * j], c[2 * j + 1], 0xDD));
  return _mm512_add_ps(_mm512_shuffle_f32x4(d[0], d[1], 0x88),
                       _mm512_shuffle_f32x4(d[0], d[1], 0xDD));
}

inline Bytes bytes(const uint8_t* at) { return _mm512_loadu_si512(at); }
inline Bytes low_nibbles(Bytes v) { return _mm512_and_si512(v, _mm512_set1_epi8(0x0F)); }
inline Bytes high_nibbles(Bytes v) {
  return _mm512_and_si512(_mm512_srli_epi16(v, 4), _mm512_set1_epi8(0x0F));
}
// acc + per lane the sum of its 4 unsigned bytes (at most 128) times the 4 signed bytes ``x4``
inline Ints dot(Ints acc, Bytes u, int32_t x4) {
  return _mm512_dpbusd_epi32(acc, u, _mm512_set1_epi32(x4));
}
// A block's products of 4-bit codes (``dot_nibbles``), summed narrow and widened once: on
// AVX-512 VNNI the sums are int32 already
using Narrow = Ints;
inline Narrow narrow_zero() { return izero(); }
inline Narrow dot_nibbles(Narrow acc, Bytes u, int32_t x4) { return dot(acc, u, x4); }
inline Ints widen(Narrow n) { return n; }
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
// the lane-wise binary ops: one AVX2 op on each half
#define SPECDEC_HALVES(Type, name, op) \
  inline Type name(Type a, Type b) { return {op(a.lo, b.lo), op(a.hi, b.hi)}; }
SPECDEC_HALVES(Floats, fadd, _mm256_add_ps)
SPECDEC_HALVES(Floats, fsub, _mm256_sub_ps)
SPECDEC_HALVES(Floats, fmul, _mm256_mul_ps)
SPECDEC_HALVES(Floats, fdiv, _mm256_div_ps)
SPECDEC_HALVES(Floats, vmax, _mm256_max_ps)
SPECDEC_HALVES(Floats, vmin, _mm256_min_ps)
SPECDEC_HALVES(Ints, iadd, _mm256_add_epi32)
SPECDEC_HALVES(Ints, isub, _mm256_sub_epi32)
#undef SPECDEC_HALVES
inline Floats fset(float v) { return {_mm256_set1_ps(v), _mm256_set1_ps(v)}; }
inline Floats fzero() { return {_mm256_setzero_ps(), _mm256_setzero_ps()}; }
inline Floats vabs(Floats v) {
  const __m256 sign = _mm256_set1_ps(-0.0f);
  return {_mm256_andnot_ps(sign, v.lo), _mm256_andnot_ps(sign, v.hi)};
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

constexpr int VECTORS = 8;  // Floats a kernel may keep in registers (16 AVX2 ones, two each)
inline void fstore(float* at, Floats v) {
  _mm256_storeu_ps(at, v.lo);
  _mm256_storeu_ps(at + 8, v.hi);
}
inline Floats fnmadd(Floats a, Floats b, Floats c) {
  return {_mm256_fnmadd_ps(a.lo, b.lo, c.lo), _mm256_fnmadd_ps(a.hi, b.hi, c.hi)};
}
inline Floats select(Mask m, Floats on, Floats off) {
  return {_mm256_blendv_ps(off.lo, on.lo, _mm256_castsi256_ps(m.lo)),
          _mm256_blendv_ps(off.hi, on.hi, _mm256_castsi256_ps(m.hi))};
}
inline Floats nearest(Floats v) {
  constexpr int MODE = _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC;
  return {_mm256_round_ps(v.lo, MODE), _mm256_round_ps(v.hi, MODE)};
}
// p 2^n for whole n in [-150, 128] (``exp16``'s), rounded once as vscalefps rounds: p times
// 2^(n - n / 2) is exact (p near 1, the power normal), then times 2^(n / 2) rounds
inline __m256 scale2(__m256 p, __m256 n) {
  const __m256i k = _mm256_cvtps_epi32(n), half = _mm256_srai_epi32(k, 1);
  const auto power = [](__m256i e) {
    return _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_add_epi32(e, _mm256_set1_epi32(127)), 23));
  };
  return _mm256_mul_ps(_mm256_mul_ps(p, power(_mm256_sub_epi32(k, half))), power(half));
}
inline Floats scale2(Floats p, Floats n) { return {scale2(p.lo, n.lo), scale2(p.hi, n.hi)}; }
inline void store_halves(uint16_t* at, Floats v) {
  constexpr int MODE = _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC;
  _mm_storeu_si128(reinterpret_cast<__m128i*>(at), _mm256_cvtps_ph(v.lo, MODE));
  _mm_storeu_si128(reinterpret_cast<__m128i*>(at + 8), _mm256_cvtps_ph(v.hi, MODE));
}
inline __m256 half_of(Floats v, int i) { return i ? v.hi : v.lo; }
// ``sums16`` of the AVX-512 build, step for step: the same two in-lane steps on each half, then
// the 128-bit lanes 0 + 1 and 2 + 3 (lanes 0-1 are lo's halves, 2-3 hi's), then those
inline Floats sums16(const Floats* a) {
  const auto in_lanes = [&](int j, bool high) {  // a[4j..4j+3]'s 128-bit lane sums of one half
    __m256 b[2];
    for (int i = 0; i < 2; ++i) {
      const __m256 x = high ? a[4 * j + 2 * i].hi : a[4 * j + 2 * i].lo;
      const __m256 y = high ? a[4 * j + 2 * i + 1].hi : a[4 * j + 2 * i + 1].lo;
      b[i] = _mm256_add_ps(_mm256_unpacklo_ps(x, y), _mm256_unpackhi_ps(x, y));
    }
    return _mm256_add_ps(_mm256_shuffle_ps(b[0], b[1], 0x44), _mm256_shuffle_ps(b[0], b[1], 0xEE));
  };
  __m128 e[4];  // e[j], lane i: a[4j + i]'s sum
  for (int j = 0; j < 4; ++j) {
    const __m256 lo = in_lanes(j, false), hi = in_lanes(j, true);
    e[j] = _mm_add_ps(_mm_add_ps(_mm256_castps256_ps128(lo), _mm256_extractf128_ps(lo, 1)),
                      _mm_add_ps(_mm256_castps256_ps128(hi), _mm256_extractf128_ps(hi, 1)));
  }
  return {_mm256_set_m128(e[1], e[0]), _mm256_set_m128(e[3], e[2])};
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
// A block's products of 4-bit codes (u at most 15) summed as vpmaddubsw's int16 pairs, widened
// to int32 once (vpmaddwd by ones) where ``dot`` widens every step: a pair is at most
// 2 * 15 * 127 = 3810 in magnitude, so a Q4_1 block's 8 steps sum to at most 30480 < 32767,
// exactly
struct Narrow { __m256i lo, hi; };
inline Narrow narrow_zero() { return {_mm256_setzero_si256(), _mm256_setzero_si256()}; }
inline Narrow dot_nibbles(Narrow acc, Bytes u, int32_t x4) {
  const __m256i x = _mm256_set1_epi32(x4);
  return {_mm256_add_epi16(acc.lo, _mm256_maddubs_epi16(u.lo, x)),
          _mm256_add_epi16(acc.hi, _mm256_maddubs_epi16(u.hi, x))};
}
inline Ints widen(Narrow n) {
  const __m256i one = _mm256_set1_epi16(1);
  return {_mm256_madd_epi16(n.lo, one), _mm256_madd_epi16(n.hi, one)};
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

// ---- on either ISA ----------------------------------------------------------------------

// The lanes' sum: lanes i + 8 i, then the 128-bit halves, then lanes 2 apart, then the two
// left (gcc's _mm512_reduce_add_ps, written out, so both builds sum alike).
inline float reduce_add(Floats v) {
  const __m256 a = _mm256_add_ps(half_of(v, 1), half_of(v, 0));
  const __m128 b = _mm_add_ps(_mm256_extractf128_ps(a, 1), _mm256_castps256_ps128(a));
  const __m128 c = _mm_add_ps(b, _mm_shuffle_ps(b, b, _MM_SHUFFLE(1, 0, 3, 2)));
  return _mm_cvtss_f32(c) + _mm_cvtss_f32(_mm_shuffle_ps(c, c, 1));
}

// e^x lane by lane: x = n ln2 + r (Cody-Waite's two-part ln2), e^r by its Taylor series to
// degree 7 (|r| <= ln2 / 2: relative error below 1e-8), times 2^n; below -104 it is 0 (float's
// least subnormal is e^-103.3), above 88.8 infinity.
inline Floats exp16(Floats x) {
  x = vmin(vmax(x, fset(-104.0f)), fset(88.8f));
  const Floats n = nearest(fmul(x, fset(1.44269504088896341f)));
  Floats r = fnmadd(n, fset(0.693359375f), x);
  r = fnmadd(n, fset(-2.12194440e-4f), r);
  Floats p = fset(1.0f / 5040);
  for (float c : {1.0f / 720, 1.0f / 120, 1.0f / 24, 1.0f / 6, 0.5f, 1.0f, 1.0f})
    p = fmadd(p, r, fset(c));
  return scale2(p, n);
}

// 16 floats of a KV cache row (float32, or float16's bits as uint16_t): loaded as float32 (a
// float16 widened exactly), stored from float32 (to float16 rounded to nearest, ties to even).
inline Floats load16(const float* at) { return fload(at); }
inline Floats load16(const uint16_t* at) { return halves(at); }
inline void store16(float* at, Floats v) { fstore(at, v); }
inline void store16(uint16_t* at, Floats v) { store_halves(at, v); }

}  // namespace specdec::lanes
