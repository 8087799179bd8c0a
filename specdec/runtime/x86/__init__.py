"""The x86 backend of specdec's runtime: x86-64 CPUs.

Its parts: the plan's x86 decisions (``plan``), the backend the forward calls (``backend``),
its linear variants (``linears``: int8 rows on GGUF codes, float32 panels and their codes,
oneDNN's packed copies), its attentions (``attention``: the short-row kernel, batch-invariant
SDPA, SDPA split by a fitted cost), the batch-invariance probes (``invariance``) and the C++
kernels with their builds (``kernels``, ``panels``, ``qpanels``, ``int8``, ``attend``,
``fused``; on AVX-512, and all but the panels on AVX2 too: ``lanes.h``). Nothing outside the
runtime imports it, and a plan whose backend is torch never does (a test checks).
"""
