// How specdec's kernels take the KV pool's caches (attend.cpp reads them, fused.cpp writes them):
// [slots, kv_heads, max_len, d], both float32 or both float16 (``specdec.runtime.cache_dtype``).
#pragma once

#include <torch/extension.h>

#include <cstdint>

namespace specdec {

// Checks the caches' shape, dtype and layout (an error naming what they must be).
inline void check_caches(const torch::Tensor& k, const torch::Tensor& v) {
  const auto dtype = k.scalar_type();
  TORCH_CHECK(k.dim() == 4 && k.sizes() == v.sizes() &&
                  (dtype == torch::kFloat || dtype == torch::kHalf) && v.scalar_type() == dtype &&
                  k.is_contiguous() && v.is_contiguous(),
              "the caches must be contiguous float32 or float16 [slots, kv_heads, max_len, d] "
              "tensors of one dtype");
}

// f(k, v) on the checked caches' elements: float* for float32, uint16_t* (float16's bits, which
// lanes.h's load16 / store16 convert) for float16.
template <class F>
void with_caches(const torch::Tensor& k, const torch::Tensor& v, F&& f) {
  if (k.scalar_type() == torch::kFloat)
    f(k.data_ptr<float>(), v.data_ptr<float>());
  else
    f(reinterpret_cast<uint16_t*>(k.data_ptr<at::Half>()),
      reinterpret_cast<uint16_t*>(v.data_ptr<at::Half>()));
}

}  // namespace specdec
