// specdec's float32 linear for x86 CPUs with AVX-512 (specdec/runtime/x86/panels.py says when and why).
//
// The weight [out, in] is held as panels: [out_pad / 16, in, 16], panel j holding outputs
// 16j..16j+15 with one 64-byte vector (a cache line) per input. A task owns PANELS panels; for
// every tile of up to ROWS rows it keeps ROWS x PANELS accumulators in registers and walks the
// inputs once, one fused multiply-add per row and panel per input, so the weight streams from
// memory once per call whatever the number of rows, and the panels stay in cache across the row
// tiles. The first tile prefetches the lines AHEAD inputs on (past the task's end, the thread's
// next task's first ones), so the stream from memory overlaps the tile's compute (a fifth less
// time for a pass of 8 to 12 rows; docs/RESULTS.md).
//
// Every output is the same chain of fused multiply-adds over the inputs in order, whatever the
// number of rows, the tile the row falls in or the thread that runs it: a row's outputs are
// bitwise its outputs alone (tests/runtime/test_panels.py checks it).
//
// The quantized panels (``qlinear``) hold GGUF's codes in the same layout, [P, in, bytes]: Q4_1
// (4-bit codes q, and per block of 32 inputs and output a float16 scale d and minimum m, the
// weight d * q + m) or Q8_0 (8-bit signed codes, the weight d * q). A task decodes its weights to
// float32 as GGUF defines them (a product, then a sum: two roundings), in registers where the
// call has at most ROWS rows, else once into a scratch copy that the float32 tiles then read.
// The products are then the float32 panels' own fused multiply-adds over the same weights:
// bitwise the float32 linear of the dequantized weight, from an eighth (Q4_1) or a quarter (Q8_0)
// of the memory traffic.

#include <torch/extension.h>

#include <ATen/Parallel.h>
#include <immintrin.h>

#include <algorithm>
#include <array>
#include <cstdint>
#include <utility>
#include <vector>

namespace {

constexpr int WIDTH = 16;  // floats in a panel's row: one 512-bit vector
constexpr int PANELS = 2;  // panels a task owns
constexpr int ROWS = 12;   // rows of a tile: ROWS x PANELS accumulators + PANELS weights in registers
constexpr int64_t AHEAD = 32;  // inputs the first tile prefetches ahead (the fastest of 16-256)

// y[r, 16p + i] = bias + sum_k x[r, k] * panel_p[k, i] for the tile's R rows and PANELS panels.
// mask[p]: which of panel p's 16 outputs exist (the last panels may pad past the output count).
// next: where the inputs past this task's continue for the prefetch (the thread's next task's
// panels), or null; prefetch: whether this tile prefetches (the first tile of a task does).
template <int R>
void tile(const float* x, int64_t in, const float* panels, float* y, int64_t out,
          const float* bias, const __mmask16* mask, bool prefetch, const float* next) {
  __m512 acc[R][PANELS];
  for (int p = 0; p < PANELS; ++p) {
    __m512 b = bias ? _mm512_maskz_loadu_ps(mask[p], bias + p * WIDTH) : _mm512_setzero_ps();
    for (int r = 0; r < R; ++r) acc[r][p] = b;
  }
  const int64_t stride = in * WIDTH;  // floats from one panel to the next
  for (int64_t k = 0; k < in; ++k) {
    __m512 w[PANELS];
    for (int p = 0; p < PANELS; ++p) w[p] = _mm512_loadu_ps(panels + p * stride + k * WIDTH);
    if (prefetch) {
      const float* line = k + AHEAD < in ? panels + (k + AHEAD) * WIDTH
                          : next ? next + (k + AHEAD - in) * WIDTH : nullptr;
      if (line)
        for (int p = 0; p < PANELS; ++p)
          _mm_prefetch(reinterpret_cast<const char*>(line + p * stride), _MM_HINT_T0);
    }
    for (int r = 0; r < R; ++r) {
      __m512 xr = _mm512_set1_ps(x[r * in + k]);
      for (int p = 0; p < PANELS; ++p) acc[r][p] = _mm512_fmadd_ps(xr, w[p], acc[r][p]);
    }
  }
  for (int r = 0; r < R; ++r)
    for (int p = 0; p < PANELS; ++p)
      _mm512_mask_storeu_ps(y + r * out + p * WIDTH, mask[p], acc[r][p]);
}

using Tile = void (*)(const float*, int64_t, const float*, float*, int64_t, const float*,
                      const __mmask16*, bool, const float*);

template <int... R>
constexpr std::array<Tile, sizeof...(R)> tiles(std::integer_sequence<int, R...>) {
  return {&tile<R + 1>...};
}

constexpr auto TILES = tiles(std::make_integer_sequence<int, ROWS>{});  // TILES[R - 1]: R rows

constexpr int64_t BLOCK = 32;  // inputs sharing a quantized block's scales

// GGUF's Q4_1: per input, a panel's 16 codes in 8 bytes (output 2i in byte i's low nibble, 2i + 1
// in its high one); per block, scales d and m: weight = d * q + m.
struct Q4_1 {
  static constexpr int BYTES = 8, SCALES = 2;
  static __m512 decode(const uint8_t* codes, const __m512* s) {
    const __m128i bytes = _mm_loadl_epi64(reinterpret_cast<const __m128i*>(codes));
    const __m128i low = _mm_set1_epi8(0x0F);
    const __m128i q = _mm_unpacklo_epi8(_mm_and_si128(bytes, low),
                                        _mm_and_si128(_mm_srli_epi16(bytes, 4), low));
    const __m512 v = _mm512_cvtepi32_ps(_mm512_cvtepu8_epi32(q));
    return _mm512_add_ps(_mm512_mul_ps(s[0], v), s[1]);
  }
};

// GGUF's Q8_0: per input, a panel's 16 signed codes in 16 bytes; per block, scale d: d * q.
struct Q8_0 {
  static constexpr int BYTES = 16, SCALES = 1;
  static __m512 decode(const uint8_t* codes, const __m512* s) {
    const __m128i q = _mm_loadu_si128(reinterpret_cast<const __m128i*>(codes));
    return _mm512_mul_ps(s[0], _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(q)));
  }
};

// Where a task's quantized panels lie: codes [PANELS][in][BYTES], scales (float16)
// [PANELS][in / BLOCK][SCALES][16], and the scales of block b of panel p, as float32.
template <class F>
struct QPanels {
  const uint8_t* codes;
  const uint16_t* scales;
  int64_t in;

  void load_scales(int p, int64_t b, __m512* s) const {
    const uint16_t* at = scales + (p * (in / BLOCK) + b) * F::SCALES * WIDTH;
    for (int j = 0; j < F::SCALES; ++j)
      s[j] = _mm512_cvtph_ps(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(at + j * WIDTH)));
  }
  __m512 weight(int p, int64_t k, const __m512* s) const {
    return F::decode(codes + (p * in + k) * F::BYTES, s);
  }
};

// tile's products over quantized panels decoded in registers: the same chain of fused
// multiply-adds, over the same float32 weights.
template <class F, int R>
void qtile(const float* x, QPanels<F> w, float* y, int64_t out, const float* bias,
           const __mmask16* mask) {
  __m512 acc[R][PANELS];
  for (int p = 0; p < PANELS; ++p) {
    __m512 b = bias ? _mm512_maskz_loadu_ps(mask[p], bias + p * WIDTH) : _mm512_setzero_ps();
    for (int r = 0; r < R; ++r) acc[r][p] = b;
  }
  const int64_t in = w.in;
  for (int64_t b = 0; b < in / BLOCK; ++b) {
    __m512 s[PANELS][F::SCALES];
    for (int p = 0; p < PANELS; ++p) w.load_scales(p, b, s[p]);
    for (int64_t k = b * BLOCK; k < (b + 1) * BLOCK; ++k) {
      __m512 wk[PANELS];
      for (int p = 0; p < PANELS; ++p) wk[p] = w.weight(p, k, s[p]);
      for (int r = 0; r < R; ++r) {
        __m512 xr = _mm512_set1_ps(x[r * in + k]);
        for (int p = 0; p < PANELS; ++p) acc[r][p] = _mm512_fmadd_ps(xr, wk[p], acc[r][p]);
      }
    }
  }
  for (int r = 0; r < R; ++r)
    for (int p = 0; p < PANELS; ++p)
      _mm512_mask_storeu_ps(y + r * out + p * WIDTH, mask[p], acc[r][p]);
}

// A task's quantized panels decoded into float32 panels [PANELS][in][16], for passes of more
// than ROWS rows (decoded once, read by every tile).
template <class F>
void decode(QPanels<F> w, float* panels) {
  for (int p = 0; p < PANELS; ++p)
    for (int64_t b = 0; b < w.in / BLOCK; ++b) {
      __m512 s[F::SCALES];
      w.load_scales(p, b, s);
      for (int64_t k = b * BLOCK; k < (b + 1) * BLOCK; ++k)
        _mm512_storeu_ps(panels + (p * w.in + k) * WIDTH, w.weight(p, k, s));
    }
}

template <class F>
using QTile = void (*)(const float*, QPanels<F>, float*, int64_t, const float*, const __mmask16*);

template <class F, int... R>
constexpr std::array<QTile<F>, sizeof...(R)> qtiles(std::integer_sequence<int, R...>) {
  return {&qtile<F, R + 1>...};
}

template <class F>
constexpr auto QTILES = qtiles<F>(std::make_integer_sequence<int, ROWS>{});

// The checks both linears make of x, out and the bias; x made contiguous, and the bias's data.
const float* checked(torch::Tensor& x, int64_t in, int64_t tasks, int64_t out,
                     const c10::optional<torch::Tensor>& bias, torch::Tensor& b) {
  TORCH_CHECK(x.dim() == 2 && x.scalar_type() == torch::kFloat && x.device().is_cpu(),
              "x must be a 2-d float32 CPU tensor");
  TORCH_CHECK(x.size(1) == in, "x has ", x.size(1), " inputs, the weight ", in);
  TORCH_CHECK(0 < out && out <= tasks * PANELS * WIDTH && out > (tasks - 1) * PANELS * WIDTH,
              "out = ", out, " does not fit the panels");
  if (bias.has_value()) {
    b = bias->contiguous();
    TORCH_CHECK(b.scalar_type() == torch::kFloat && b.numel() == out, "bias must be [", out, "]");
  }
  x = x.contiguous();
  return b.defined() ? b.data_ptr<float>() : nullptr;
}

// Which of a task's panels' outputs exist (the last panels may pad past the output count).
void task_mask(int64_t t, int64_t out, __mmask16* mask) {
  const int64_t col = t * PANELS * WIDTH;
  for (int p = 0; p < PANELS; ++p) {
    const int64_t valid = std::clamp<int64_t>(out - col - p * WIDTH, 0, WIDTH);
    mask[p] = static_cast<__mmask16>((1u << valid) - 1u);
  }
}

}  // namespace

// x [M, in] float32, panels [P, in, 16] (P a multiple of PANELS, P * 16 >= out), bias [out] or
// None -> [M, out].
torch::Tensor linear(torch::Tensor x, torch::Tensor panels, int64_t out,
                     c10::optional<torch::Tensor> bias) {
  TORCH_CHECK(panels.dim() == 3 && panels.size(2) == WIDTH && panels.size(0) % PANELS == 0 &&
                  panels.scalar_type() == torch::kFloat && panels.is_contiguous(),
              "panels must be a contiguous float32 [P, in, 16] tensor, P a multiple of ", PANELS);
  const int64_t in = panels.size(1), tasks = panels.size(0) / PANELS;
  torch::Tensor b;
  const float* bs = checked(x, in, tasks, out, bias, b);
  const int64_t M = x.size(0);
  auto y = torch::empty({M, out}, x.options());
  const float* xs = x.data_ptr<float>();
  const float* ws = panels.data_ptr<float>();
  float* ys = y.data_ptr<float>();
  at::parallel_for(0, tasks, 1, [&](int64_t lo, int64_t hi) {
    for (int64_t t = lo; t < hi; ++t) {
      const int64_t col = t * PANELS * WIDTH;
      __mmask16 mask[PANELS];
      task_mask(t, out, mask);
      for (int64_t m = 0; m < M; m += ROWS) {
        const int R = static_cast<int>(std::min<int64_t>(ROWS, M - m));
        const float* task = ws + t * PANELS * in * WIDTH;
        TILES[R - 1](xs + m * in, in, task, ys + m * out + col, out, bs ? bs + col : nullptr, mask,
                     m == 0, t + 1 < hi && in >= AHEAD ? task + PANELS * in * WIDTH : nullptr);
      }
    }
  });
  return y;
}

template <class F>
torch::Tensor qlinear_as(torch::Tensor x, const torch::Tensor& codes, const torch::Tensor& scales,
                         int64_t out, const c10::optional<torch::Tensor>& bias) {
  const int64_t in = codes.size(1), tasks = codes.size(0) / PANELS;
  TORCH_CHECK(codes.size(2) == F::BYTES, "codes must be [P, in, ", F::BYTES, "] for this format");
  TORCH_CHECK(in % BLOCK == 0, "the inputs (", in, ") must be whole blocks of ", BLOCK);
  TORCH_CHECK(scales.dim() == 4 && scales.size(0) == codes.size(0) && scales.size(1) == in / BLOCK &&
                  scales.size(2) == F::SCALES && scales.size(3) == WIDTH &&
                  scales.scalar_type() == torch::kHalf && scales.is_contiguous(),
              "scales must be a contiguous float16 [P, in / ", BLOCK, ", ", F::SCALES, ", 16] tensor");
  torch::Tensor b;
  const float* bs = checked(x, in, tasks, out, bias, b);
  const int64_t M = x.size(0);
  auto y = torch::empty({M, out}, x.options());
  const float* xs = x.data_ptr<float>();
  const uint8_t* cs = codes.data_ptr<uint8_t>();
  const auto* ss = reinterpret_cast<const uint16_t*>(scales.data_ptr<at::Half>());
  float* ys = y.data_ptr<float>();
  at::parallel_for(0, tasks, 1, [&](int64_t lo, int64_t hi) {
    thread_local std::vector<float> scratch;
    for (int64_t t = lo; t < hi; ++t) {
      const int64_t col = t * PANELS * WIDTH;
      __mmask16 mask[PANELS];
      task_mask(t, out, mask);
      const QPanels<F> w{cs + t * PANELS * in * F::BYTES,
                         ss + t * PANELS * (in / BLOCK) * F::SCALES * WIDTH, in};
      const float* bias_t = bs ? bs + col : nullptr;
      if (M <= ROWS) {
        QTILES<F>[M - 1](xs, w, ys + col, out, bias_t, mask);
        continue;
      }
      scratch.resize(PANELS * in * WIDTH);
      decode(w, scratch.data());
      for (int64_t m = 0; m < M; m += ROWS) {
        const int R = static_cast<int>(std::min<int64_t>(ROWS, M - m));
        TILES[R - 1](xs + m * in, in, scratch.data(), ys + m * out + col, out, bias_t, mask,
                     false, nullptr);
      }
    }
  });
  return y;
}

// x [M, in] float32; codes uint8 [P, in, 8 (Q4_1) or 16 (Q8_0)] and scales float16
// [P, in / 32, 2 (Q4_1: d, m) or 1 (Q8_0: d), 16] (P a multiple of PANELS, P * 16 >= out); bias
// [out] or None -> [M, out].
torch::Tensor qlinear(torch::Tensor x, torch::Tensor codes, torch::Tensor scales, int64_t out,
                      c10::optional<torch::Tensor> bias) {
  TORCH_CHECK(codes.dim() == 3 && codes.size(0) % PANELS == 0 &&
                  codes.scalar_type() == torch::kByte && codes.is_contiguous(),
              "codes must be a contiguous uint8 [P, in, bytes] tensor, P a multiple of ", PANELS);
  if (codes.size(2) == Q4_1::BYTES) return qlinear_as<Q4_1>(x, codes, scales, out, bias);
  TORCH_CHECK(codes.size(2) == Q8_0::BYTES, "codes of ", codes.size(2),
              " bytes an input are neither Q4_1's (8) nor Q8_0's (16)");
  return qlinear_as<Q8_0>(x, codes, scales, out, bias);
}

PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {
  // the kernels run without the GIL: the actor's other threads (Ray's, the requests') go on
  const auto FREE = py::call_guard<py::gil_scoped_release>();
  m.def("linear", &linear, FREE, "x [M, in] @ the panels' weight^T (+ bias) -> [M, out]");
  m.def("qlinear", &qlinear, FREE,
        "x [M, in] @ the quantized panels' weight^T (+ bias) -> [M, out]");
  m.attr("BLOCK") = BLOCK;
  m.attr("PANELS") = PANELS;
  m.attr("WIDTH") = WIDTH;
}
