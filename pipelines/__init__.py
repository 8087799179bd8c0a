"""Ray Data / Ray Train jobs: SD-simulation datasets, pre-verifier and drafter training,
evaluation and benchmarks (training issue #4, benchmark issue #5).
"""
