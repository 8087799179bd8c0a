// specdec's float32 attention of short rows for x86 CPUs, built for AVX-512 or AVX2 on
// ``lanes.h`` (specdec/runtime/x86/attend.py says when and why).
//
// A pass's short rows (decodes, verifies: a few new tokens each) read their KV slots where they
// lie in the pool, [slots, kv_heads, max_len, d], with no padding and no mask tensor. A task is
// one row and one kv head: the row's tokens times the query heads that read that kv head (GQA),
// so they share each cached key and value row read. Token t of a row with c cached tokens sees
// keys 0..c-1 and the row's new tokens it may see (all earlier ones and itself, or those its
// ancestor mask names); the m-th key a query sees is the m-th in each of its sums:
//   scores s_m = (q . k_m) * scale, 16 keys at a time, each key's sum the same tree of adds;
//   p_m = e^(s_m - max s), summed into 16 lanes by m mod 16, then the lanes in a fixed tree;
//   out = (sum_m p_m v_m) / sum_m p_m, one chain of fused multiply-adds per output, in m order.
// So a query's result depends only on its own q and the keys and values it sees, in order: not
// on the other rows or queries, on where its row sits in the batch, on which of its keys were
// cached before the pass, or on the thread that runs it. A token's output is bitwise the same
// whatever its pass holds: decoded alone, inside a verify (causal or a tree's branch), next to
// other requests, and from either build (tests/runtime/test_attend.py checks it).

#include <torch/extension.h>

#include <ATen/Parallel.h>

#include <algorithm>
#include <cmath>
#include <vector>

#include "caches.h"
#include "lanes.h"

namespace {

using namespace specdec::lanes;

// A key's NV * 16 products with the query, summed to 16 lanes in one fixed chain.
template <int NV, class C>
inline Floats key_products(const Floats* qv, const C* key) {
  Floats a = fmul(qv[0], load16(key));
  for (int i = 1; i < NV; ++i) a = fmadd(qv[i], load16(key + i * WIDTH), a);
  return a;
}

// The queries of one task (see the top): query i is token i / g's head i % g of the group. C:
// the caches' element, float (float32) or uint16_t (float16's bits).
template <class C>
struct Task {
  const float* q;     // token 0's first head of the group; token t's at q + t * q_row
  int64_t q_row;
  float* out;         // likewise, out_row apart
  int64_t out_row;
  const C* k;         // the kv head's cache in the row's slot, [max_len, d]
  const C* v;
  int64_t c, n;       // cached and new tokens
  int64_t g;
  const uint8_t* seen;  // token 0's row of seen (S apart), or null: causal
  int64_t S;
  float scale;
};

// A thread's scratch, grown as needed: each query's scores then weights, each token's seen new
// positions and their count, each query's weights' sum.
struct Scratch {
  std::vector<float> scores, sums;
  std::vector<int> fresh, counts;
};

// Scaled scores of a query (qv) against `count` <= 16 key rows, into out[0..count-1]: each
// key's 16 lanes summed by the same tree (``sums16``), so a key's score does not depend on
// where it falls in a block.
template <int NV, class C>
inline void score_block(const Floats* qv, const C* const* keys, int count, float scale,
                        float* out) {
  Floats a[WIDTH];
  for (int j = 0; j < WIDTH; ++j) a[j] = j < count ? key_products<NV>(qv, keys[j]) : fzero();
  store_first(out, first(count), fmul(sums16(a), fset(scale)));
}

// Scores sc[0..M-1] -> e^(s_m - max s) in place; returns their sum.
inline float weights(float* sc, int64_t M) {
  Floats top = fset(-INFINITY);
  for (int64_t m = 0; m < M; m += WIDTH) {
    const Mask in = first(M - m);
    top = select(in, vmax(top, load_first(sc + m, in)), top);
  }
  const Floats most = fset(reduce_max(top));
  Floats total = fzero();
  for (int64_t m = 0; m < M; m += WIDTH) {
    const Mask in = first(M - m);
    const Floats p = select(in, exp16(fsub(load_first(sc + m, in), most)), fzero());
    store_first(sc + m, in, p);
    total = fadd(total, p);
  }
  return reduce_add(total);
}

template <int NV, class C>
void attend_task(const Task<C>& t, Scratch& s) {
  // QP queries' sums stay in registers at once (at least one)
  constexpr int D = NV * WIDTH, QP = VECTORS / 2 / NV > 0 ? VECTORS / 2 / NV : 1;
  const int64_t Q = t.n * t.g, stride = t.c + t.n;
  if (static_cast<int64_t>(s.scores.size()) < Q * stride) s.scores.resize(Q * stride);
  if (static_cast<int64_t>(s.sums.size()) < Q) s.sums.resize(Q);
  if (static_cast<int64_t>(s.fresh.size()) < t.n * t.n) s.fresh.resize(t.n * t.n);
  if (static_cast<int64_t>(s.counts.size()) < t.n) s.counts.resize(t.n);
  for (int64_t tok = 0; tok < t.n; ++tok) {
    int count = 0;
    for (int64_t u = 0; u <= tok; ++u)
      if (!t.seen || t.seen[tok * t.S + u]) s.fresh[tok * t.n + count++] = static_cast<int>(t.c + u);
    s.counts[tok] = count;
  }
  auto query = [&](int64_t i) { return t.q + (i / t.g) * t.q_row + (i % t.g) * D; };
  Floats qv[NV];
  const C* rows[WIDTH];
  for (int64_t m0 = 0; m0 < t.c; m0 += WIDTH) {  // the cached keys, 16 rows for every query
    const int count = static_cast<int>(std::min<int64_t>(WIDTH, t.c - m0));
    for (int j = 0; j < count; ++j) rows[j] = t.k + (m0 + j) * D;
    for (int64_t i = 0; i < Q; ++i) {
      for (int x = 0; x < NV; ++x) qv[x] = fload(query(i) + x * WIDTH);
      score_block<NV>(qv, rows, count, t.scale, s.scores.data() + i * stride + m0);
    }
  }
  for (int64_t i = 0; i < Q; ++i) {  // each query's new keys, then its weights
    const int* fresh = s.fresh.data() + (i / t.g) * t.n;
    const int count = s.counts[i / t.g];
    float* sc = s.scores.data() + i * stride;
    for (int x = 0; x < NV; ++x) qv[x] = fload(query(i) + x * WIDTH);
    for (int b = 0; b < count; b += WIDTH) {
      const int many = std::min(WIDTH, count - b);
      for (int j = 0; j < many; ++j) rows[j] = t.k + static_cast<int64_t>(fresh[b + j]) * D;
      score_block<NV>(qv, rows, many, t.scale, sc + t.c + b);
    }
    s.sums[i] = weights(sc, t.c + count);
  }
  for (int64_t i0 = 0; i0 < Q; i0 += QP) {  // the sums, QP queries at a time
    const int64_t many = std::min<int64_t>(QP, Q - i0);
    Floats acc[QP][NV];
    for (int a = 0; a < QP; ++a)
      for (int x = 0; x < NV; ++x) acc[a][x] = fzero();
    for (int64_t m = 0; m < t.c; ++m) {  // the cached values, one row for the QP queries
      Floats vm[NV];
      for (int x = 0; x < NV; ++x) vm[x] = load16(t.v + m * D + x * WIDTH);
      for (int a = 0; a < QP; ++a) {
        if (a >= many) break;
        const Floats p = fset(s.scores[(i0 + a) * stride + m]);
        for (int x = 0; x < NV; ++x) acc[a][x] = fmadd(p, vm[x], acc[a][x]);
      }
    }
    for (int a = 0; a < many; ++a) {  // each query's new values; its output
      const int64_t i = i0 + a;
      const int* fresh = s.fresh.data() + (i / t.g) * t.n;
      const float* sc = s.scores.data() + i * stride + t.c;
      for (int u = 0; u < s.counts[i / t.g]; ++u) {
        const C* vm = t.v + static_cast<int64_t>(fresh[u]) * D;
        const Floats p = fset(sc[u]);
        for (int x = 0; x < NV; ++x) acc[a][x] = fmadd(p, load16(vm + x * WIDTH), acc[a][x]);
      }
      const Floats inverse = fset(1.0f / s.sums[i]);
      float* out = t.out + (i / t.g) * t.out_row + (i % t.g) * D;
      for (int x = 0; x < NV; ++x) fstore(out + x * WIDTH, fmul(acc[a][x], inverse));
    }
  }
}

template <class C>
using Run = void (*)(const Task<C>&, Scratch&);

template <class C>
Run<C> pick(int64_t d) {
  switch (d) {
    case 16: return &attend_task<1, C>;
    case 32: return &attend_task<2, C>;
    case 64: return &attend_task<4, C>;
    case 128: return &attend_task<8, C>;
    default: return nullptr;
  }
}

// The rows' tasks on caches of element C (see ``attend`` below; its arguments checked).
template <class C>
void run_rows(const float* qs, int64_t q_row, const C* ks, const C* vs, const int64_t* table,
              int64_t R, int64_t heads, int64_t kv_heads, int64_t L, int64_t d,
              const uint8_t* sees, int64_t S, float scale, float* os) {
  const Run<C> run = pick<C>(d);
  const int64_t group = heads / kv_heads;
  at::parallel_for(0, R * kv_heads, 1, [&](int64_t lo, int64_t hi) {
    static thread_local Scratch scratch;
    for (int64_t task = lo; task < hi; ++task) {
      const int64_t r = task / kv_heads, kv = task % kv_heads;
      const int64_t start = table[4 * r], n = table[4 * r + 1], slot = table[4 * r + 2],
                    c = table[4 * r + 3];
      const int64_t head = (slot * kv_heads + kv) * L * d;  // the kv head in the row's slot
      const Task<C> t{qs + start * q_row + kv * group * d, q_row, os + start * heads * d + kv * group * d,
                      heads * d, ks + head, vs + head, c, n, group,
                      sees ? sees + start * S : nullptr, S, scale};
      run(t, scratch);
    }
  });
}

}  // namespace

// q [N, h, d] float32: the short rows' new tokens, flat (its rows may be strided); k_cache and
// v_cache [slots, kvh, L, d], both float32 or both float16 (read as float32, exactly); rows
// [R, 4] int64: (first flat token, new tokens n, slot, cached tokens c) of each row, the rows'
// tokens together exactly q's N; seen [N, S] uint8, S >= every n: seen[i, u] says whether flat
// token i sees new token u of its row (empty: every earlier one and itself). Every new key and
// value must be in the caches already. Returns [N, h * d].
torch::Tensor attend(torch::Tensor q, torch::Tensor k_cache, torch::Tensor v_cache,
                     torch::Tensor rows, torch::Tensor seen, double scale) {
  TORCH_CHECK(q.dim() == 3 && q.scalar_type() == torch::kFloat && q.device().is_cpu(),
              "q must be a 3-d float32 CPU tensor [N, heads, d]");
  specdec::check_caches(k_cache, v_cache);
  TORCH_CHECK(rows.dim() == 2 && rows.size(1) == 4 && rows.scalar_type() == torch::kLong,
              "rows must be an int64 [R, 4] tensor");
  const int64_t N = q.size(0), heads = q.size(1), d = q.size(2);
  const int64_t slots = k_cache.size(0), kv_heads = k_cache.size(1), L = k_cache.size(2);
  TORCH_CHECK(k_cache.size(3) == d, "q's head dim is ", d, ", the caches' ", k_cache.size(3));
  TORCH_CHECK(heads % kv_heads == 0, heads, " query heads do not share ", kv_heads, " kv heads");
  TORCH_CHECK(pick<float>(d) != nullptr, "head dim ", d, " is not one of 16, 32, 64, 128");
  const bool causal = seen.numel() == 0;
  if (!causal)
    TORCH_CHECK(seen.dim() == 2 && seen.size(0) == N && seen.scalar_type() == torch::kByte,
                "seen must be a uint8 [", N, ", S] tensor, or empty");
  rows = rows.contiguous();
  seen = seen.contiguous();
  if (q.stride(2) != 1 || q.stride(1) != d) q = q.contiguous();  // rows may be strided (a view
  const int64_t q_row = q.stride(0);                             // of the qkv projection's)
  const int64_t R = rows.size(0);
  const int64_t* table = rows.data_ptr<int64_t>();
  int64_t tokens = 0;
  for (int64_t r = 0; r < R; ++r) {
    const int64_t start = table[4 * r], n = table[4 * r + 1], slot = table[4 * r + 2],
                  c = table[4 * r + 3];
    TORCH_CHECK(n >= 1 && start >= 0 && start + n <= N && 0 <= slot && slot < slots && c >= 0 &&
                    c + n <= L && (causal || n <= seen.size(1)),
                "row ", r, " (start ", start, ", ", n, " tokens, slot ", slot, ", ", c,
                " cached) does not fit q, the caches or seen");
    tokens += n;
  }
  TORCH_CHECK(tokens == N, "the rows hold ", tokens, " tokens, q ", N);
  auto out = torch::empty({N, heads * d}, q.options());
  const uint8_t* sees = causal ? nullptr : seen.data_ptr<uint8_t>();
  const int64_t S = causal ? 0 : seen.size(1);
  const float* qs = q.data_ptr<float>();
  float* os = out.data_ptr<float>();
  specdec::with_caches(k_cache, v_cache, [&](const auto* ks, const auto* vs) {
    run_rows(qs, q_row, ks, vs, table, R, heads, kv_heads, L, d, sees, S,
             static_cast<float>(scale), os);
  });
  return out;
}

PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {
  // the kernels run without the GIL: the actor's other threads (Ray's, the requests') go on
  const auto FREE = py::call_guard<py::gil_scoped_release>();
  m.def("attend", &attend, FREE,
        "short rows' queries [N, h, d] against their KV slots -> [N, h * d] (see attend.cpp)");
  m.attr("ISA") = ISA;
}
