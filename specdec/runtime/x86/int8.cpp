// specdec's linear on GGUF codes and int8 activations, for x86 CPUs with AVX-512 VNNI or AVX2
// (specdec/runtime/x86/int8.py says when and why). One source, built once per ISA: its vector
// steps are ``lanes.h``'s, one AVX-512 vector or two AVX2 ones for a panel's 16 outputs.
//
// It computes a Q4_1 or Q8_0 weight's product as llama.cpp's CPU backend does: each row of x is
// quantized per block of 32 inputs to int8 (scale da = max |x| / 127, codes round(x / da)), and a
// block's product is an integer dot product of codes (vpdpbusd: 64 byte products a vector; on
// AVX2 vpmaddubsw and vpmaddwd), scaled once: Q4_1 (weight dw * q + mw) gives
// dw * da * sum(q * qa) + mw * da * sum(qa), Q8_0 (weight dw * q) gives dw * da * sum(q * qa).
// The blocks' terms are summed in the order of the inputs.
//
// Layout, [P, in / 32, 256 (Q4_1) or 512 (Q8_0)] bytes: panel p holds outputs 16p..16p+15, and a
// block's codes lie as vpdpbusd reads them, four consecutive inputs of one output in a 32-bit
// lane. Q4_1: vector g (of 4) holds inputs 4g..4g+3 in the low nibbles and 16+4g..16+4g+3 in the
// high ones. Q8_0: vector g (of 8) holds inputs 4g..4g+3, each code stored plus 128 (an unsigned
// byte, which vpdpbusd needs on one side): 128 * sum(qa) is taken off the integer sum (the AVX2
// build restores the signed codes instead: lanes.h). Scales: float16 [P, in / 32, 2 (dw, mw) or
// 1 (dw), 16].
//
// On a CPU with AMX (amx_int8; the AVX-512 build), passes of at least ``amx_rows`` rows take
// their blocks' integer sums from tile products instead (one tdpbsud a block: 16 rows x 16
// outputs x 32 inputs, where vpdpbusd needs 8 instructions a row); the float terms are the same
// code on the same sums.
//
// Integer sums are exact and every output's float terms are the same chain in the same order,
// whatever the number of rows, the path (vpdpbusd, AVX2 or tiles), the tile a row falls in or the
// thread that runs it: a row's outputs are bitwise its outputs alone, and the two builds' outputs
// are bitwise the same (tests/runtime/test_int8.py and test_int8_avx2.py check it).

#include <torch/extension.h>

#include <ATen/Parallel.h>
#include <immintrin.h>

#include "lanes.h"

#include <cpuid.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <algorithm>
#include <array>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <utility>
#include <vector>

namespace {

using namespace specdec::lanes;

constexpr int64_t BLOCK = 32;  // inputs a block's scales cover (GGUF's blocks and the rows')
// rows of a tile: 2 x ROWS accumulators + the weights in registers (32 AVX-512 ones, 16 AVX2
// ones, each half as wide)
#if defined(__AVX512F__)
constexpr int ROWS = 12;
#else
constexpr int ROWS = 4;
#endif
constexpr int TILE_ROWS = 16;  // rows of an AMX tile product (its accumulators: 16 registers)
// the AMX path: in the AVX-512 build, compiled for AMX int8 (and run where the CPU has it)
#if defined(__AMX_TILE__) && defined(__AMX_INT8__)
#define SPECDEC_AMX 1
#endif

// A row's int8 codes per block of 32 inputs: codes [M, in], and per block the scale da, the
// codes' sum and da times that sum.
struct Rows {
  const int8_t* q;
  const float* d;
  const float* s;
  const int32_t* sum;
  int64_t in, blocks;
};

// Quantize rows [lo, hi) of x [M, in] into the buffers of ``Rows``.
void quantize(const float* x, int64_t in, int64_t lo, int64_t hi, int8_t* q, float* d, float* s,
              int32_t* sum) {
  const int64_t nb = in / BLOCK;
  for (int64_t r = lo; r < hi; ++r)
    for (int64_t b = 0; b < nb; ++b) {
      const float* at = x + r * in + b * BLOCK;
      const Floats v0 = fload(at), v1 = fload(at + WIDTH);
      const float amax = reduce_max(vmax(vabs(v0), vabs(v1)));
      const float da = amax / 127.0f;
      const float inv = amax > 0.0f ? 127.0f / amax : 0.0f;
      const Floats scale = fset(inv);
      const Ints q0 = to_ints(fmul(v0, scale)), q1 = to_ints(fmul(v1, scale));  // nearest, even
      store_bytes(q + r * in + b * BLOCK, q0);
      store_bytes(q + r * in + b * BLOCK + WIDTH, q1);
      const int32_t total = reduce_add(iadd(q0, q1));
      d[r * nb + b] = da;
      sum[r * nb + b] = total;
      s[r * nb + b] = da * static_cast<float>(total);
    }
}

// the 4 int8 codes at ``at`` as one 32-bit value (a dot product's broadcast side)
inline int32_t four(const int8_t* at) {
  int32_t v;
  std::memcpy(&v, at, sizeof v);
  return v;
}

// GGUF's Q4_1 weight (dw * q + mw) in vpdpbusd's layout: 4 vectors a block, nibbles.
struct Q4_1 {
  static constexpr int BYTES = 256, SCALES = 2;
  template <int R>
  static void block(const uint8_t* codes, const int8_t* const* xq, Ints* isum) {
    Narrow sums[R];  // the block's 8 steps a row, narrow where the ISA allows (lanes.h)
    for (int r = 0; r < R; ++r) sums[r] = narrow_zero();
    for (int g = 0; g < 4; ++g) {
      const Bytes v = bytes(codes + g * 64);
      const Bytes lo = low_nibbles(v), hi = high_nibbles(v);
      for (int r = 0; r < R; ++r) {
        sums[r] = dot_nibbles(sums[r], lo, four(xq[r] + 4 * g));
        sums[r] = dot_nibbles(sums[r], hi, four(xq[r] + 16 + 4 * g));
      }
    }
    for (int r = 0; r < R; ++r) isum[r] = iadd(isum[r], widen(sums[r]));
  }
#ifdef SPECDEC_AMX
  // The block's codes as an AMX B tile (8 rows of 16 outputs x 4 inputs, one byte a code): row
  // g holds the low nibbles of vector g (inputs 4g..4g+3), row 4 + g its high ones (16 + 4g..).
  static const uint8_t* tile(const uint8_t* codes, uint8_t* scratch) {
    for (int g = 0; g < 4; ++g) {
      const Bytes v = bytes(codes + g * 64);
      _mm512_store_si512(scratch + g * 64, low_nibbles(v));
      _mm512_store_si512(scratch + (4 + g) * 64, high_nibbles(v));
    }
    return scratch;
  }
#endif
  // acc += dw * da * isum + mw * (da * sum(qa))
  static Floats scale(Floats acc, Ints isum, const Floats* w, float da, float s, int32_t) {
    acc = fmadd(to_floats(isum), fmul(w[0], fset(da)), acc);
    return fmadd(w[1], fset(s), acc);
  }
};

// GGUF's Q8_0 weight (dw * q) in vpdpbusd's layout: 8 vectors a block, codes plus 128.
struct Q8_0 {
  static constexpr int BYTES = 512, SCALES = 1;
  template <int R>
  static void block(const uint8_t* codes, const int8_t* const* xq, Ints* isum) {
    for (int g = 0; g < 8; ++g) {
      const Q8 v = q8(bytes(codes + g * 64));
      for (int r = 0; r < R; ++r) isum[r] = dot_q8(isum[r], v, four(xq[r] + 4 * g));
    }
  }
  // Its 8 vectors are already an AMX B tile's 8 rows.
  static const uint8_t* tile(const uint8_t* codes, uint8_t*) { return codes; }
  // acc += dw * da * (isum - CODE_OFFSET * sum(qa)): the codes' own integer product
  static Floats scale(Floats acc, Ints isum, const Floats* w, float da, float, int32_t sum) {
    const Ints exact = isub(isum, iset(sum * CODE_OFFSET));
    return fmadd(to_floats(exact), fmul(w[0], fset(da)), acc);
  }
};

// acc[r] += block b's float terms for the R rows from row m, from their integer sums
// (isum(r)): the one place both paths (vpdpbusd and AMX tiles) scale a block, so their outputs
// are bitwise the same.
template <class F, int R, class Sums>
inline void add_block(const Rows& x, int64_t m, const uint16_t* scales, int64_t b, Sums isum,
                      Floats* acc) {
  Floats w[F::SCALES];
  for (int j = 0; j < F::SCALES; ++j) w[j] = halves(scales + (b * F::SCALES + j) * WIDTH);
  for (int r = 0; r < R; ++r) {
    const int64_t at = (m + r) * x.blocks + b;
    acc[r] = F::scale(acc[r], isum(r), w, x.d[at], x.s[at], x.sum[at]);
  }
}

// y[r, 16p + i] for the tile's R rows (from row m) and one panel p.
template <class F, int R>
void tile(const Rows& x, int64_t m, const uint8_t* codes, const uint16_t* scales, float* y,
          int64_t out, const float* bias, Mask mask) {
  Floats acc[R];
  const Floats b0 = bias ? load_first(bias, mask) : fzero();
  for (int r = 0; r < R; ++r) acc[r] = b0;
  const int8_t* xq[R];
  for (int b = 0; b < x.blocks; ++b) {
    Ints isum[R];
    for (int r = 0; r < R; ++r) {
      isum[r] = izero();
      xq[r] = x.q + (m + r) * x.in + b * BLOCK;
    }
    F::template block<R>(codes + b * F::BYTES, xq, isum);
    add_block<F, R>(x, m, scales, b, [&](int r) { return isum[r]; }, acc);
  }
  for (int r = 0; r < R; ++r) store_first(y + (m + r) * out, mask, acc[r]);
}

template <class F>
using Tile = void (*)(const Rows&, int64_t, const uint8_t*, const uint16_t*, float*, int64_t,
                      const float*, Mask);

template <class F, int... R>
constexpr std::array<Tile<F>, sizeof...(R)> tiles(std::integer_sequence<int, R...>) {
  return {&tile<F, R + 1>...};
}

template <class F>
constexpr auto TILES = tiles<F>(std::make_integer_sequence<int, ROWS>{});  // [R - 1]: R rows

// ---- AMX: a block's integer sums for 16 rows at once --------------------------------------

// Whether this CPU has AMX int8 tiles and Linux lets this process use them (asked once: the
// kernel must grant a process the tile state before its first tile instruction); never in a
// build without the AMX path.
#ifdef SPECDEC_AMX
bool amx_ready() {
  static const bool ready = [] {
    unsigned a, b, c, d;
    if (!__get_cpuid_count(7, 0, &a, &b, &c, &d)) return false;
    const bool tiles = (d >> 24) & 1u, int8 = (d >> 25) & 1u;  // AMX-TILE, AMX-INT8
    constexpr int ARCH_REQ_XCOMP_PERM = 0x1023, XFEATURE_XTILEDATA = 18;
    return tiles && int8 && syscall(SYS_arch_prctl, ARCH_REQ_XCOMP_PERM, XFEATURE_XTILEDATA) == 0;
  }();
  return ready;
}

// tmm0-3: C, 16 rows x 16 int32 sums; tmm4 and 6: A, 16 rows x 32 int8 codes (a block's);
// tmm5 and 7: B, 8 rows x 64 bytes (16 outputs x 4 inputs).
struct alignas(64) TileConfig {
  uint8_t palette = 1, start_row = 0, reserved[14] = {};
  uint16_t colsb[16] = {64, 64, 64, 64, BLOCK, 64, BLOCK, 64};
  uint8_t rows[16] = {TILE_ROWS, TILE_ROWS, TILE_ROWS, TILE_ROWS,
                      TILE_ROWS, BLOCK / 4, TILE_ROWS, BLOCK / 4};
};

// y[r, 16p + i] for the R rows from row m (their codes padded to 16 rows) and one panel p: the
// blocks' integer sums from tile products, four blocks in flight (tiles 0-3 hold their sums,
// 4-7 their rows and codes), then the same float terms as ``tile``, block by block. Its tiles
// must be configured (``TileConfig``).
template <class F, int R>
void amx_tile(const Rows& x, int64_t m, const uint8_t* codes, const uint16_t* scales, float* y,
              int64_t out, const float* bias, Mask mask) {
  alignas(64) int32_t sums[4][TILE_ROWS][WIDTH];
  alignas(64) uint8_t scratch[4][BLOCK / 4 * 64];
  Floats acc[R];
  const Floats b0 = bias ? load_first(bias, mask) : fzero();
  for (int r = 0; r < R; ++r) acc[r] = b0;
  const int8_t* rows = x.q + m * x.in;
  const auto tile_bytes = [&](int b, int j) { return F::tile(codes + b * F::BYTES, scratch[j]); };
  const auto add = [&](int b, int j) {  // block b's float terms from its sums in sums[j]
    add_block<F, R>(x, m, scales, b, [&](int r) { return iload(sums[j][r]); }, acc);
  };
  constexpr int64_t SUMS = WIDTH * sizeof(int32_t);
// block k's sums into tile c, from its rows in tile a and its codes in tile w (scratch j)
#define SPECDEC_PRODUCT(c, a, w, k, j)       \
  _tile_zero(c);                            \
  _tile_loadd(a, rows + (k) * BLOCK, x.in); \
  _tile_loadd(w, tile_bytes(k, j), 64);     \
  _tile_dpbsud(c, a, w)  // signed row codes times unsigned weight codes, as vpdpbusd
  int b = 0;
  for (; b + 4 <= x.blocks; b += 4) {
    SPECDEC_PRODUCT(0, 4, 5, b, 0);
    SPECDEC_PRODUCT(1, 6, 7, b + 1, 1);
    SPECDEC_PRODUCT(2, 4, 5, b + 2, 2);
    SPECDEC_PRODUCT(3, 6, 7, b + 3, 3);
    _tile_stored(0, sums[0], SUMS); _tile_stored(1, sums[1], SUMS);
    _tile_stored(2, sums[2], SUMS); _tile_stored(3, sums[3], SUMS);
    for (int j = 0; j < 4; ++j) add(b + j, j);
  }
  for (; b < x.blocks; ++b) {
    SPECDEC_PRODUCT(0, 4, 5, b, 0);
    _tile_stored(0, sums[0], SUMS);
    add(b, 0);
  }
#undef SPECDEC_PRODUCT
  for (int r = 0; r < R; ++r) store_first(y + (m + r) * out, mask, acc[r]);
}

template <class F, int... R>
constexpr std::array<Tile<F>, sizeof...(R)> amx_tiles(std::integer_sequence<int, R...>) {
  return {&amx_tile<F, R + 1>...};
}

template <class F>
constexpr auto AMX_TILES = amx_tiles<F>(std::make_integer_sequence<int, TILE_ROWS>{});

// a thread's tile configuration is its own, and oneDNN may have loaded another: loaded per call
void tiles_on() {
  const TileConfig config;
  _tile_loadconfig(&config);
}
void tiles_off() { _tile_release(); }
template <class F>
const Tile<F>* amx_kernels() { return AMX_TILES<F>.data(); }
#else
bool amx_ready() { return false; }
void tiles_on() {}
void tiles_off() {}
template <class F>
const Tile<F>* amx_kernels() { return nullptr; }
#endif  // SPECDEC_AMX

template <class F>
torch::Tensor linear_as(const torch::Tensor& xin, const torch::Tensor& codes,
                        const torch::Tensor& scales, int64_t out,
                        const c10::optional<torch::Tensor>& bias, int64_t amx_rows) {
  const int64_t P = codes.size(0), nb = codes.size(1), in = nb * BLOCK;
  TORCH_CHECK(codes.size(2) == F::BYTES, "codes must be [P, in / 32, ", F::BYTES,
              "] for this format");
  TORCH_CHECK(scales.dim() == 4 && scales.size(0) == P && scales.size(1) == nb &&
                  scales.size(2) == F::SCALES && scales.size(3) == WIDTH &&
                  scales.scalar_type() == torch::kHalf && scales.is_contiguous(),
              "scales must be a contiguous float16 [P, in / 32, ", F::SCALES, ", 16] tensor");
  TORCH_CHECK(xin.dim() == 2 && xin.scalar_type() == torch::kFloat && xin.device().is_cpu(),
              "x must be a 2-d float32 CPU tensor");
  TORCH_CHECK(xin.size(1) == in, "x has ", xin.size(1), " inputs, the weight ", in);
  TORCH_CHECK(0 < out && out <= P * WIDTH && out > (P - 1) * WIDTH, "out = ", out,
              " does not fit the panels");
  torch::Tensor b;
  if (bias.has_value()) {
    b = bias->contiguous();
    TORCH_CHECK(b.scalar_type() == torch::kFloat && b.numel() == out, "bias must be [", out, "]");
  }
  const torch::Tensor x = xin.contiguous();
  const int64_t M = x.size(0);
  auto y = torch::empty({M, out}, x.options());
  if (M == 0) return y;
  const bool amx = amx_rows > 0 && M >= amx_rows && amx_ready();
  // the rows' codes and scales, in the calling thread's buffer (a pass makes ~120 calls: four
  // tensors a call cost more than a small call's products); the codes have room for whole tiles
  // of rows (the rows past M are read, never used)
  thread_local std::vector<int32_t> buffer;
  const int64_t padded = (M + TILE_ROWS - 1) / TILE_ROWS * TILE_ROWS;
  buffer.resize(padded * in / 4 + 3 * M * nb);
  auto* q = reinterpret_cast<int8_t*>(buffer.data());
  auto* d = reinterpret_cast<float*>(buffer.data() + padded * in / 4);
  float* s = d + M * nb;
  int32_t* sum = reinterpret_cast<int32_t*>(s + M * nb);
  const float* xs = x.data_ptr<float>();
  at::parallel_for(0, M, 16, [&](int64_t lo, int64_t hi) { quantize(xs, in, lo, hi, q, d, s, sum); });
  const Rows rows{q, d, s, sum, in, nb};
  const uint8_t* cs = codes.data_ptr<uint8_t>();
  const auto* ss = reinterpret_cast<const uint16_t*>(scales.data_ptr<at::Half>());
  const float* bs = b.defined() ? b.data_ptr<float>() : nullptr;
  float* ys = y.data_ptr<float>();
  const int step = amx ? TILE_ROWS : ROWS;
  const Tile<F>* kernels = amx ? amx_kernels<F>() : TILES<F>.data();
  at::parallel_for(0, P, 1, [&](int64_t lo, int64_t hi) {
    if (amx) tiles_on();
    for (int64_t p = lo; p < hi; ++p) {
      const int64_t col = p * WIDTH;
      const int64_t valid = std::min<int64_t>(WIDTH, out - col);
      const Mask mask = first(valid);
      for (int64_t m = 0; m < M; m += step) {
        const int R = static_cast<int>(std::min<int64_t>(step, M - m));
        kernels[R - 1](rows, m, cs + p * nb * F::BYTES, ss + p * nb * F::SCALES * WIDTH,
                       ys + col, out, bs ? bs + col : nullptr, mask);
      }
    }
    if (amx) tiles_off();
  });
  return y;
}

}  // namespace

// x [M, in] float32; codes uint8 [P, in / 32, 256 (Q4_1) or 512 (Q8_0)] and scales float16
// [P, in / 32, 2 (Q4_1: dw, mw) or 1 (Q8_0: dw), 16] (P * 16 >= out); bias [out] or None ->
// [M, out]. Passes of at least amx_rows rows (0: none) run on AMX tiles where the CPU has them.
torch::Tensor linear(torch::Tensor x, torch::Tensor codes, torch::Tensor scales, int64_t out,
                     c10::optional<torch::Tensor> bias, int64_t amx_rows) {
  TORCH_CHECK(codes.dim() == 3 && codes.scalar_type() == torch::kByte && codes.is_contiguous(),
              "codes must be a contiguous uint8 [P, in / 32, bytes] tensor");
  if (codes.size(2) == Q4_1::BYTES) return linear_as<Q4_1>(x, codes, scales, out, bias, amx_rows);
  TORCH_CHECK(codes.size(2) == Q8_0::BYTES, "codes of ", codes.size(2),
              " bytes a block are neither Q4_1's (256) nor Q8_0's (512)");
  return linear_as<Q8_0>(x, codes, scales, out, bias, amx_rows);
}

// x [M, in] float32 -> (codes int8 [M, in], da [M, in / 32], da * sum [M, in / 32], sum int32
// [M, in / 32]): the rows as the linear quantizes them (for tests and the reference).
std::vector<torch::Tensor> quantize_rows(torch::Tensor x) {
  TORCH_CHECK(x.dim() == 2 && x.scalar_type() == torch::kFloat && x.size(1) % BLOCK == 0,
              "x must be a 2-d float32 tensor of whole blocks of ", BLOCK, " inputs");
  x = x.contiguous();
  const int64_t M = x.size(0), in = x.size(1), nb = in / BLOCK;
  auto q = torch::empty({M, in}, x.options().dtype(torch::kChar));
  auto d = torch::empty({M, nb}, x.options());
  auto s = torch::empty({M, nb}, x.options());
  auto sum = torch::empty({M, nb}, x.options().dtype(torch::kInt));
  quantize(x.data_ptr<float>(), in, 0, M, q.data_ptr<int8_t>(), d.data_ptr<float>(),
           s.data_ptr<float>(), sum.data_ptr<int32_t>());
  return {q, d, s, sum};
}

PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {
  // the kernels run without the GIL: the actor's other threads (Ray's, the requests') go on
  const auto FREE = py::call_guard<py::gil_scoped_release>();
  m.def("linear", &linear, FREE,
        "x [M, in] @ the codes' weight^T (+ bias), on int8 rows -> [M, out]");
  m.def("quantize_rows", &quantize_rows, "x's rows as the linear quantizes them");
  m.def("amx_ready", &amx_ready, "whether this CPU and process run AMX int8 tiles");
  m.attr("BLOCK") = BLOCK;
  m.attr("WIDTH") = WIDTH;
  m.attr("ISA") = ISA;
}
