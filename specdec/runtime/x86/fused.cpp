// specdec's fused float32 element-wise ops for x86 CPUs, built for AVX-512 or AVX2 on
// ``lanes.h`` (specdec/runtime/x86/fused.py says when and why): the RMSNorm, RoPE with the new
// keys' and values' write into the KV pool, and the MLP's silu(gate) * up, each one call over
// the pass's tokens instead of 3-8 torch ops.
//
// Each computes a token from that token's inputs alone, in a fixed order (the norm's sum of
// squares in 16 lanes by index, then the lanes in a fixed tree), so a token's outputs are bitwise
// the same whatever else its pass holds, and from either build. RoPE and the norm's scaling
// round as transformers' eager float32 ops do (two products, then their sum; x * rsqrt, then
// the weight times that).

#include <torch/extension.h>

#include <ATen/Parallel.h>

#include <cmath>
#include <cstdint>

#include "caches.h"
#include "lanes.h"

namespace {

using namespace specdec::lanes;

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
      Floats squares = fzero();
      for (int64_t j = 0; j < H; j += WIDTH) {
        const Floats v = load_first(row + j, first(H - j));
        squares = fmadd(v, v, squares);
      }
      const float mean = reduce_add(squares) / static_cast<float>(H);
      const Floats inverse = fset(1.0f / std::sqrt(mean + static_cast<float>(eps)));
      for (int64_t j = 0; j < H; j += WIDTH) {
        const Mask in = first(H - j);
        const Floats normed = fmul(load_first(row + j, in), inverse);
        store_first(os + i * H + j, in, fmul(load_first(ws + j, in), normed));
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
        const Floats a = fmul(fload(x + j), fload(c + j));
        const Floats b = fmul(fload(x + other), fload(s + j));
        store16(out + j, fadd(a, b));
      }
    };
    for (int64_t h = 0; h < heads; ++h) rope(row + h * d, qs + (i * heads + h) * d);
    for (int64_t h = 0; h < kvh; ++h) {
      const int64_t at = ((ss[i] * kvh + h) * L + ps[i]) * d;
      rope(row + (heads + h) * d, ks + at);
      const float* value = row + (heads + kvh + h) * d;
      for (int64_t j = 0; j < d; j += WIDTH) store16(vs + at + j, fload(value + j));
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
  const Floats one = fset(1.0f);
  at::parallel_for(0, N, 4, [&](int64_t lo, int64_t hi) {
    for (int64_t i = lo; i < hi; ++i) {
      const float* g = xs + i * stride;
      for (int64_t j = 0; j < I; j += WIDTH) {
        const Mask in = first(I - j);
        const Floats x = load_first(g + j, in);
        const Floats silu = fdiv(x, fadd(one, exp16(fsub(fzero(), x))));
        store_first(os + i * I + j, in, fmul(silu, load_first(g + I + j, in)));
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
  m.attr("ISA") = ISA;
}
