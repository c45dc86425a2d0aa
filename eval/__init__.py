"""Speculative-decoding evaluation on vLLM offline batches: `python -m eval --help`, eval/README.md."""
