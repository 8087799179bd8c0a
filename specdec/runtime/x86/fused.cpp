// specdec's fused float32 element-wise ops for x86 CPUs with AVX-512 (specdec/runtime/x86/fused.py
// says when and why): the RMSNorm, RoPE with the new keys' and values' write into the KV pool,
// and the MLP's silu(gate) * up, each one call over the pass's tokens instead of 3-8 torch ops.
//
// Each computes a token from that token's inputs alone, in a fixed order (the norm's sum of
// squares in 16 lanes by index, then the lanes in a fixed tree), so a token's outputs are bitwise
// the same whatever else its pass holds. RoPE and the norm's scaling round as transformers' eager
// float32 ops do (two products, then their sum; x * rsqrt, then the weight times that).

#include <torch/extension.h>

#include <ATen/Parallel.h>
#include <immintrin.h>

#include <cmath>
#include <cstdint>

#include "caches.h"
#include "simd.h"

namespace {

using specdec::WIDTH;
using specdec::exp16;
using specdec::first_lanes;
using specdec::store16;

void check_rows(const torch::Tensor& x, const char* name) {
  TORCH_CHECK(x.dim() == 2 && x.scalar_type() == torch::kFloat && x.device().is_cpu() &&
                  x.stride(1) == 1,
              name, " must be a 2-d float32 CPU tensor with contiguous rows");
}

}  // namespace

// x [N, H] -> w * (x * 1 / sqrt(mean(x^2) + eps)), row by row.
torch::Tensor rms_norm(torch::Tensor x, torch::Tensor w, double eps) {
  check_rows(x, "x");
  const int64_t N = x.size(0), H = x.size(1);
  w = w.contiguous();
  TORCH_CHECK(w.scalar_type() == torch::kFloat && w.numel() == H, "w must be float32 [", H, "]");
  auto out = torch::empty({N, H}, x.options());
  const float* xs = x.data_ptr<float>();
  const float* ws = w.data_ptr<float>();
  float* os = out.data_ptr<float>();
  const int64_t stride = x.stride(0);
  at::parallel_for(0, N, 16, [&](int64_t lo, int64_t hi) {
    for (int64_t i = lo; i < hi; ++i) {
      const float* row = xs + i * stride;
      __m512 squares = _mm512_setzero_ps();
      for (int64_t j = 0; j < H; j += WIDTH) {
        const __m512 v = _mm512_maskz_loadu_ps(first_lanes(H - j), row + j);
        squares = _mm512_fmadd_ps(v, v, squares);
      }
      const float mean = _mm512_reduce_add_ps(squares) / static_cast<float>(H);
      const __m512 inverse = _mm512_set1_ps(1.0f / std::sqrt(mean + static_cast<float>(eps)));
      for (int64_t j = 0; j < H; j += WIDTH) {
        const __mmask16 in = first_lanes(H - j);
        const __m512 normed = _mm512_mul_ps(_mm512_maskz_loadu_ps(in, row + j), inverse);
        _mm512_mask_storeu_ps(os + i * H + j, in,
                              _mm512_mul_ps(_mm512_maskz_loadu_ps(in, ws + j), normed));
      }
    }
  });
  return out;
}

// ``rope_write``'s tokens [lo, hi) with caches of element C (float, or uint16_t: float16's bits).
template <class C>
void rope_rows(int64_t lo, int64_t hi, const float* xs, int64_t stride, const float* cs,
               const float* sn, int64_t heads, int64_t kvh, int64_t L, int64_t d,
               const int64_t* ss, const int64_t* ps, float* qs, C* ks, C* vs) {
  const int64_t half = d / 2;
  for (int64_t i = lo; i < hi; ++i) {
    const float* row = xs + i * stride;
    const float* c = cs + i * d;
    const float* s = sn + i * d;
    auto rope = [&](const float* x, auto* out) {
      for (int64_t j = 0; j < d; j += WIDTH) {
        const int64_t other = j < half ? j + half : j - half;
        const __m512 a = _mm512_mul_ps(_mm512_loadu_ps(x + j), _mm512_loadu_ps(c + j));
        const __m512 b = _mm512_mul_ps(_mm512_loadu_ps(x + other), _mm512_loadu_ps(s + j));
        store16(out + j, _mm512_add_ps(a, b));
      }
    };
    for (int64_t h = 0; h < heads; ++h) rope(row + h * d, qs + (i * heads + h) * d);
    for (int64_t h = 0; h < kvh; ++h) {
      const int64_t at = ((ss[i] * kvh + h) * L + ps[i]) * d;
      rope(row + (heads + h) * d, ks + at);
      const float* value = row + (heads + kvh + h) * d;
      for (int64_t j = 0; j < d; j += WIDTH) store16(vs + at + j, _mm512_loadu_ps(value + j));
    }
  }
}

// qkv [N, (h + 2 kvh) d] (the qkv projection's output) -> the queries [N, h, d] with RoPE; the
// keys (with RoPE) and the values go into the caches [slots, kvh, L, d] (both float32 or both
// float16) at (slots[i], positions[i]). RoPE of a head x: x * cos + x rolled by d / 2 *
// sin_signed (cos, sin_signed: [N, d], each token's rows).
torch::Tensor rope_write(torch::Tensor qkv, torch::Tensor cos, torch::Tensor sin_signed,
                         torch::Tensor k_cache, torch::Tensor v_cache, torch::Tensor slots,
                         torch::Tensor positions, int64_t heads) {
  check_rows(qkv, "qkv");
  specdec::check_caches(k_cache, v_cache);
  const int64_t N = qkv.size(0), kvh = k_cache.size(1), L = k_cache.size(2), d = k_cache.size(3);
  TORCH_CHECK(d % (2 * WIDTH) == 0, "the head dim must be a multiple of 32, not ", d);
  TORCH_CHECK(qkv.size(1) == (heads + 2 * kvh) * d, "qkv has ", qkv.size(1), " columns, not (",
              heads, " + 2 x ", kvh, ") x ", d);
  cos = cos.contiguous();
  sin_signed = sin_signed.contiguous();
  slots = slots.contiguous();
  positions = positions.contiguous();
  TORCH_CHECK(cos.scalar_type() == torch::kFloat && cos.numel() == N * d &&
                  sin_signed.scalar_type() == torch::kFloat && sin_signed.numel() == N * d,
              "cos and sin_signed must be float32 [", N, ", ", d, "]");
  TORCH_CHECK(slots.scalar_type() == torch::kLong && slots.numel() == N &&
                  positions.scalar_type() == torch::kLong && positions.numel() == N,
              "slots and positions must be int64 [", N, "]");
  const int64_t* ss = slots.data_ptr<int64_t>();
  const int64_t* ps = positions.data_ptr<int64_t>();
  for (int64_t i = 0; i < N; ++i)
    TORCH_CHECK(0 <= ss[i] && ss[i] < k_cache.size(0) && 0 <= ps[i] && ps[i] < L, "token ", i,
                " goes to slot ", ss[i], " position ", ps[i], ", outside the caches");
  auto q = torch::empty({N, heads, d}, qkv.options());
  const float* xs = qkv.data_ptr<float>();
  const float* cs = cos.data_ptr<float>();
  const float* sn = sin_signed.data_ptr<float>();
  float* qs = q.data_ptr<float>();
  const int64_t stride = qkv.stride(0);
  specdec::with_caches(k_cache, v_cache, [&](auto* ks, auto* vs) {
    at::parallel_for(0, N, 4, [&](int64_t lo, int64_t hi) {
      rope_rows(lo, hi, xs, stride, cs, sn, heads, kvh, L, d, ss, ps, qs, ks, vs);
    });
  });
  return q;
}

// gate_up [N, 2I] -> silu(gate) * up [N, I], silu(g) = g / (1 + e^-g).
torch::Tensor silu_mul(torch::Tensor gate_up) {
  check_rows(gate_up, "gate_up");
  const int64_t N = gate_up.size(0), I = gate_up.size(1) / 2;
  TORCH_CHECK(gate_up.size(1) == 2 * I, "gate_up must have an even number of columns");
  auto out = torch::empty({N, I}, gate_up.options());
  const float* xs = gate_up.data_ptr<float>();
  float* os = out.data_ptr<float>();
  const int64_t stride = gate_up.stride(0);
  const __m512 one = _mm512_set1_ps(1.0f);
  at::parallel_for(0, N, 4, [&](int64_t lo, int64_t hi) {
    for (int64_t i = lo; i < hi; ++i) {
      const float* g = xs + i * stride;
      for (int64_t j = 0; j < I; j += WIDTH) {
        const __mmask16 in = first_lanes(I - j);
        const __m512 x = _mm512_maskz_loadu_ps(in, g + j);
        const __m512 silu = _mm512_div_ps(x, _mm512_add_ps(one, exp16(_mm512_sub_ps(_mm512_setzero_ps(), x))));
        _mm512_mask_storeu_ps(os + i * I + j, in,
                              _mm512_mul_ps(silu, _mm512_maskz_loadu_ps(in, g + I + j)));
      }
    }
  });
  return out;
}

PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {
  // the kernels run without the GIL: the actor's other threads (Ray's, the requests') go on
  const auto FREE = py::call_guard<py::gil_scoped_release>();
  m.def("rms_norm", &rms_norm, FREE, "x [N, H] -> RMSNorm(x) * w");
  m.def("rope_write", &rope_write, FREE,
        "qkv [N, (h + 2 kvh) d] -> queries with RoPE [N, h, d]; keys and values into the caches");
  m.def("silu_mul", &silu_mul, FREE, "gate_up [N, 2I] -> silu(gate) * up [N, I]");
}
