"""Kernel tooling: `bench` (Triton vs torch eager vs torch.compile, and vLLM's selector walk),
`device_check` (GPU correctness, sync-free and CUDA-graph capture checks), `cross_compile` (an
sm_90 build without a GPU), `upstream_walk` (vLLM's own walk kernel, extracted for `bench`)."""
