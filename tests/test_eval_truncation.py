"""Prompts longer than max_model_len - max_tokens: cut, counted per row and in the summary.

Issue 37: such a prompt used to end the run with a NameError. Here the tiny testbed's target
(testbed/tiny) runs `python -m eval run` on a testbed suite whose prompts are a long log, in the
chat format (single- and multi-turn) and the raw format (single-turn; multi-turn is refused
before any engine starts).
"""

import json
from pathlib import Path

import pandas as pd
import pytest

from eval.cli import main
from eval.prompts import PromptRenderer

TESTBED = Path(__file__).resolve().parents[1] / "testbed" / "tiny"
LOG = "\n".join(f"2026-12-04 10:{i // 60:02d}:{i % 60:02d} INFO worker {i}: step done" for i in range(600))
MAX_MODEL_LEN, MAX_TOKENS = 256, 16


def _suite(tmp_path: Path, rows: list[dict]) -> Path:
    data = tmp_path / "data"
    (data / "testbed").mkdir(parents=True)
    (data / "testbed" / "logs.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    return data


def _command(tmp_path: Path, data: Path, only: str, *extra: str) -> list[str]:
    return ["run", "--target", str(TESTBED / "target"), "--systems", str(TESTBED / "systems.json"),
            "--var", f"testbed={TESTBED}", "--only", only, "--benchmarks", "testbed",
            "--data-dir", str(data), "--temperatures", "0", "--max-tokens", str(MAX_TOKENS),
            "--ignore-eos", "--no-progress", "--results", str(tmp_path / "r.csv"),
            "--engine-flags", json.dumps({"dtype": "float32", "max_model_len": MAX_MODEL_LEN,
                                          "enforce_eager": True}), *extra]


@pytest.fixture(scope="module")
def tokenizer():
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(TESTBED / "target")


def test_a_later_turn_whose_history_fills_the_limit_keeps_its_turn_and_the_header(tokenizer):
    render = PromptRenderer(tokenizer, max_prompt_tokens=64)
    history = [{"role": "user", "content": LOG}, {"role": "assistant", "content": "ok"},
               {"role": "user", "content": "and the errors?"}]
    ids = render(history)
    assert len(ids) == 64 and render.num_truncated == 1
    assert tokenizer.decode(ids).endswith("and the errors?<|im_end|>\n<|im_start|>assistant\n")


def test_raw_format_refuses_a_multi_turn_suite_before_any_engine(tmp_path, capsys, monkeypatch):
    from vllm_liliprop.vllm import offline

    def refuse(self):
        raise AssertionError("an engine was built for a run that must stop first")

    monkeypatch.setattr(offline.OfflineEngine, "__enter__", refuse)
    data = _suite(tmp_path, [{"id": "two", "turns": ["a", "b"]}])
    assert main(_command(tmp_path, data, "AR", "--prompt-format", "raw")) == 2
    error = capsys.readouterr().err
    assert "--prompt-format raw takes single-turn prompts only, but testbed-logs has 1" in error
    assert "'two'" in error and not (tmp_path / "r.csv").exists()


@pytest.mark.vllm
@pytest.mark.slow
def test_long_prompts_are_cut_counted_and_summarized_chat_and_raw(tmp_path, capsys, tokenizer):
    assert len(tokenizer.encode(LOG)) > 4 * MAX_MODEL_LEN
    rows = [{"id": "one-turn", "turns": [LOG]},
            {"id": "two-turns", "turns": [LOG, "Which worker finished last?\n" + LOG]},
            {"id": "short", "turns": ["def f(x):"]}]
    chat = tmp_path / "chat"
    assert main(_command(chat, _suite(chat, rows), "AR,DFlash")) == 0
    printed = capsys.readouterr().out
    frame = pd.read_csv(chat / "r.csv")
    # One row per system; every turn of the two long conversations was cut (the warm-up's cut
    # of the first prompt is not the row's), the short prompt was not; nothing was lost.
    assert list(frame["system"]) == ["AR", "DFlash"]
    assert list(frame["num_truncated"]) == [3, 3] and list(frame["num_prompts"]) == [3, 3]
    assert list(frame["output_tokens"]) == [4 * MAX_TOKENS] * 2
    assert frame.loc[1, "num_drafts"] > 0
    assert "AR testbed-logs: 3 prompt(s) right-truncated to 240 tokens" in printed
    assert "### truncated prompts" in printed and "| DFlash | testbed-logs | 0 | 42 | 1 | 3 / 3 |" in printed

    raw = tmp_path / "raw"
    single = [r for r in rows if len(r["turns"]) == 1]
    assert main(_command(raw, _suite(raw, single), "AR", "--prompt-format", "raw", "--no-summary")) == 0
    assert list(pd.read_csv(raw / "r.csv")["num_truncated"]) == [1]
    assert main(["summarize", str(raw / "r.csv")]) == 0
    assert "| AR | testbed-logs | 0 | 42 | 1 | 1 / 2 |" in capsys.readouterr().out
