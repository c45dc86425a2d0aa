"""Standalone PyTorch training of DFlash drafters, joint LiLiCorr heads and DeLS short heads,
exporting checkpoints vLLM 0.32 loads. See training/README.md for the commands.

No module here imports vllm at import time (only `regenerate.vllm_chat_generator` does, inside
the function).
"""
