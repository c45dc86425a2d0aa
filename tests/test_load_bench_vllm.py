"""`python -m eval.load` on the tiny models: mixed requests at concurrency 8 through a KV cache so
small that vLLM preempts, LiLiCorr draft against plain decoding (the 512-request c = 32 run on the
real target is the benchmark; its figures are in docs/measurements-smollm2.md)."""

import json

import pandas as pd
import pytest

from eval.load import EngineRun, LoadRequest, check, main, mixed_requests
from tests.test_eval_loaders import DATA
from vllm_liliprop.fixtures import build_tiny_lilicorr_draft
from vllm_liliprop.vllm.metrics import SpecDecodeCounters


def test_mixed_requests_mix_every_setting_and_are_reproducible():
    requests = mixed_requests([[1, 2], [3]], 64, seed=5)
    assert requests == mixed_requests([[1, 2], [3]], 64, seed=5)
    assert {r.prompt_ids for r in requests} == {(1, 2), (3,)}
    assert {r.temperature for r in requests} == {0.0, 0.7, 1.0}
    assert len({r.max_tokens for r in requests}) == 4 and len({r.stop for r in requests}) == 3
    assert len({r.seed for r in requests}) == 64


def test_check_sees_a_changed_greedy_output_a_stop_leak_and_an_unfinished_request():
    requests = [LoadRequest(0, (1,), 0.0, 4, None, 0), LoadRequest(1, (1,), 1.0, 4, (".",), 1),
                LoadRequest(2, (1,), 0.0, 4, None, 2)]
    plain = EngineRun([[5, 6], [7], [8]], ["ab", "c", "d"], ["length", "stop", "length"], 1.0, 0,
                      SpecDecodeCounters(), None)
    same = check(requests, plain, plain)
    assert same == {"completed": 3, "stop_string_leaks": 0, "greedy_requests": 2, "greedy_identical": 2}
    broken = EngineRun([[5, 6], [7], [9]], ["ab", "c. d", "d"], ["length", "stop", None], 1.0, 0,
                       SpecDecodeCounters(), 0)
    assert check(requests, broken, plain) == {"completed": 2, "stop_string_leaks": 1,
                                              "greedy_requests": 2, "greedy_identical": 1}


@pytest.mark.vllm
@pytest.mark.slow
def test_load_run_preempts_finishes_everything_and_keeps_greedy_output(tiny_models, tmp_path, capsys):
    draft = build_tiny_lilicorr_draft(tmp_path / "lilicorr", tiny_models["target"])
    systems = tmp_path / "systems.json"
    systems.write_text(json.dumps({"LiLiCorr": {
        "speculative_config": {"method": "dflash", "model": "${draft}", "num_speculative_tokens": 7},
        "liliprop": {"rule": "lattice"}}}))
    out = tmp_path / "load.csv"
    code = main(["--target", str(tiny_models["target"]), "--systems", str(systems),
                 "--var", f"draft={draft}", "--system-name", "LiLiCorr",
                 "--benchmarks", "gsm8k,mtbench", "--data-dir", str(DATA), "--requests", "48",
                 "--concurrency", "8", "--kv-blocks", "12", "--block-size", "32",
                 "--max-prompt-tokens", "200", "--out", str(out)])
    printed = capsys.readouterr().out
    assert code == 0, printed
    table = pd.read_csv(out).set_index("system")
    assert list(table.index) == ["AR", "LiLiCorr"]
    spec = table.loc["LiLiCorr"]
    assert spec["preemptions"] > 0 and table.loc["AR", "preemptions"] > 0
    assert spec["completed"] == 48 and spec["stop_string_leaks"] == 0 and spec["rule_faults"] == 0
    assert 0 < spec["greedy_requests"] == spec["greedy_identical"]
    assert spec["num_drafts"] > 0 and table.loc["AR", "num_drafts"] == 0
    assert json.loads(spec["system_config"])["liliprop"] == {"rule": "lattice"}
