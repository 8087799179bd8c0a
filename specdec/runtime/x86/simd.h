// What specdec's AVX-512 kernels share (attend.cpp, fused.cpp).
#pragma once

#include <immintrin.h>

#include <cstdint>

namespace specdec {

constexpr int WIDTH = 16;  // floats in a 512-bit vector

// The first n lanes (all 16 from n = 16 on).
inline __mmask16 first_lanes(int64_t n) {
  return n >= WIDTH ? 0xFFFF : static_cast<__mmask16>((1u << n) - 1u);
}

// e^x lane by lane: x = n ln2 + r (Cody-Waite's two-part ln2), e^r by its Taylor series to
// degree 7 (|r| <= ln2 / 2: relative error below 1e-8), times 2^n; below -104 it is 0 (float's
// least subnormal is e^-103.3), above 88.8 infinity.
inline __m512 exp16(__m512 x) {
  x = _mm512_min_ps(_mm512_max_ps(x, _mm512_set1_ps(-104.0f)), _mm512_set1_ps(88.8f));
  const __m512 n = _mm512_roundscale_ps(_mm512_mul_ps(x, _mm512_set1_ps(1.44269504088896341f)),
                                        _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
  __m512 r = _mm512_fnmadd_ps(n, _mm512_set1_ps(0.693359375f), x);
  r = _mm512_fnmadd_ps(n, _mm512_set1_ps(-2.12194440e-4f), r);
  __m512 p = _mm512_set1_ps(1.0f / 5040);
  for (float c : {1.0f / 720, 1.0f / 120, 1.0f / 24, 1.0f / 6, 0.5f, 1.0f, 1.0f})
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(c));
  return _mm512_scalef_ps(p, n);
}

// 16 floats of a KV cache row (float32, or float16's bits as uint16_t): loaded as float32 (a
// float16 widened exactly), stored from float32 (to float16 rounded to nearest, ties to even, as
// torch's conversion rounds).
inline __m512 load16(const float* at) { return _mm512_loadu_ps(at); }
inline __m512 load16(const uint16_t* at) {
  return _mm512_cvtph_ps(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(at)));
}
inline void store16(float* at, __m512 v) { _mm512_storeu_ps(at, v); }
inline void store16(uint16_t* at, __m512 v) {
  _mm256_storeu_si256(reinterpret_cast<__m256i*>(at),
                      _mm512_cvtps_ph(v, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC));
}

}  // namespace specdec
