"""eval systems: the systems file, shared engine flags, DeLS grids, checkpoint hashes, CLI checks."""

import json
import math
from pathlib import Path

import pytest

from eval.cli import build_parser, engine_flags_from_args, main
from eval.systems import SystemsError, checkpoint_hash, load_systems, parse_vars, select_systems

EXAMPLE = Path(__file__).resolve().parents[1] / "eval" / "systems.example.json"
VARS = {"draft": "/ckpt/dflash", "lilicorr": "/ckpt/lilicorr", "dels_gru": "/ckpt/gru",
        "dels_markov": "/ckpt/markov", "num_spec": "15"}


def _write(tmp_path, systems) -> Path:
    path = tmp_path / "systems.json"
    path.write_text(json.dumps(systems))
    return path


def test_example_systems_file_defines_every_paper_system():
    catalog = load_systems(EXAMPLE, VARS)
    systems = select_systems(catalog, None)
    names = [s.name for s in systems]
    assert names[0] == "AR" and set(names) == {
        "AR", "DFlash", "DeLS-GRU", "DeLS-Markov", "LiLiCorr-greedy", "LiLiCorr-viterbi",
        "LiLiCorr+DeLS", "ngram"}
    by_name = {s.name: s for s in systems}
    assert by_name["AR"].speculative_config is None and by_name["AR"].options() is None
    spec = by_name["DFlash"].speculative_config
    assert spec == {"method": "dflash", "model": "/ckpt/dflash", "num_speculative_tokens": 15}
    assert by_name["LiLiCorr-viterbi"].options() == {"rule": "lattice", "walk": "viterbi"}
    assert by_name["DeLS-Markov"].options()["dels_path"] == "/ckpt/markov"
    assert by_name["ngram"].speculative_config["method"] == "ngram"  # stock method passed through


def test_placeholders_are_needed_only_for_selected_systems():
    catalog = load_systems(EXAMPLE, {"draft": "/d", "num_spec": "7"})
    assert [s.name for s in select_systems(catalog, ["DFlash", "AR"])] == ["AR", "DFlash"]
    with pytest.raises(SystemsError, match=r"\$\{lilicorr\}.*--var lilicorr=VALUE"):
        select_systems(catalog, ["LiLiCorr-greedy"])
    with pytest.raises(SystemsError, match="unknown system"):
        select_systems(catalog, ["Medusa"])


def test_dels_grid_expands_one_system_and_fills_alpha_beta(tmp_path):
    draft = tmp_path / "draft"
    (draft / "dels").mkdir(parents=True)
    (draft / "dels" / "config.json").write_text(json.dumps(
        {"liliprop_dels_format": 1, "kind": "gru", "vocab_size": 8, "rank": 2, "embed_dim": 4,
         "hidden_size": 4, "alpha": 0.25, "beta": [0.1, 0.2]}))
    spec = {"method": "dflash", "model": str(draft), "num_speculative_tokens": 7}
    path = _write(tmp_path, {
        "AR": {},
        "DeLS": {"speculative_config": spec, "liliprop": {"rule": "dels"},
                 "dels_grid": {"alpha": [0.1, 0.5], "beta": [0.2]}},
        "DeLS-default": {"speculative_config": spec, "liliprop": {"rule": "dels"}},
        "DFlash": {"speculative_config": spec},
    })
    systems = select_systems(load_systems(path), None)
    grid = [s for s in systems if s.name == "DeLS"]
    assert [s.dels_weights() for s in grid] == [(0.1, 0.2), (0.5, 0.2)]
    assert [s.options()["dels_alpha"] for s in grid] == [0.1, 0.5]
    assert len({s.config_json() for s in grid}) == 2
    default = next(s for s in systems if s.name == "DeLS-default")
    alpha, beta = default.dels_weights()  # the head's own defaults; a per-slot list is not a number
    assert alpha == 0.25 and math.isnan(beta)
    assert all(math.isnan(v) for v in next(s for s in systems if s.name == "DFlash").dels_weights())
    # A command-line grid overrides the file's and reaches every DeLS system only.
    cli = select_systems(load_systems(path), None, alphas=[0.3], betas=[0.3, 0.6])
    assert [(s.name, s.grid_alpha, s.grid_beta) for s in cli if s.uses_dels] == [
        ("DeLS", 0.3, 0.3), ("DeLS", 0.3, 0.6), ("DeLS-default", 0.3, 0.3), ("DeLS-default", 0.3, 0.6)]
    assert sum(not s.uses_dels for s in cli) == 2


@pytest.mark.parametrize("entry, message", [
    ({"speculative_config": {"method": "dflash"}, "max_num_seqs": 4}, r"sets engine flag\(s\) \['max_num_seqs'\]"),
    ({"speculative_config": {"method": "dflash"}, "enable_prefix_caching": False}, "shared by every system"),
    ({"speculative_config": {"method": "dflash", "enforce_eager": True}}, "must follow the shared engine flags"),
    ({"speculative_config": {"model": "/d"}}, "with a 'method'"),
    ({"speculative_config": {"method": "dflash"}, "liliprop": {"rule": "beam"}}, r"S\.liliprop: liliprop\.rule = 'beam'"),
    ({"speculative_config": {"method": "dflash"}, "liliprop": {"walk": "greedy", "depth": 3}}, "unknown field"),
    ({"liliprop": {"rule": "dels"}}, "needs a speculative_config"),
    ({"speculative_config": {"method": "dflash"}, "dels_grid": {"alpha": [0.1]}}, "needs liliprop.rule"),
    ({"speculative_config": {"method": "dflash"}, "liliprop": {"rule": "dels"}, "dels_grid": {"alpha": "0.1"}}, "list of numbers"),
    ({"speculative_config": {"method": "dflash"}, "temperature": 0}, r"unknown field\(s\) \['temperature'\]"),
    ({"speculative_config": {"method": "dflash"}, "without_liliprop": "yes"}, r"S\.without_liliprop = 'yes' must be true or false"),
    ({"speculative_config": {"method": "dflash"}, "liliprop": {"rule": "dels"}, "without_liliprop": True}, "keep one"),
])
def test_bad_entries_are_refused_naming_system_and_field(tmp_path, entry, message):
    path = _write(tmp_path, {"S": entry})
    with pytest.raises(SystemsError, match=message) as info:
        select_systems(load_systems(path), ["S"])
    assert str(path) in str(info.value)


def test_without_liliprop_is_recorded_only_when_set(tmp_path):
    spec = {"method": "dflash", "model": "/d", "num_speculative_tokens": 3}
    path = _write(tmp_path, {"DFlash": {"speculative_config": spec},
                             "DFlash-vLLM": {"speculative_config": spec, "without_liliprop": True}})
    ours, stock = select_systems(load_systems(path), ["DFlash", "DFlash-vLLM"])
    assert not ours.without_liliprop and "without_liliprop" not in ours.config()
    assert stock.without_liliprop and stock.config()["without_liliprop"] is True


def test_ar_must_not_speculate_and_files_must_parse(tmp_path):
    with pytest.raises(SystemsError, match="autoregressive baseline"):
        select_systems(load_systems(_write(tmp_path, {"AR": {"speculative_config": {"method": "ngram"}}})), None)
    bad = tmp_path / "bad.json"
    bad.write_text("{")
    with pytest.raises(SystemsError, match="not valid JSON"):
        load_systems(bad)
    with pytest.raises(SystemsError, match="cannot be read"):
        load_systems(tmp_path / "absent.json")


def test_inline_system_definitions(tmp_path):
    catalog = load_systems(None, {}, ['ngram={"speculative_config": {"method": "ngram", "num_speculative_tokens": 3, "prompt_lookup_max": 3}}', "AR={}"])
    assert [s.name for s in select_systems(catalog, None)] == ["AR", "ngram"]
    with pytest.raises(SystemsError, match="NAME="):
        load_systems(None, {}, ["ngram"])


def test_checkpoint_hash_follows_the_draft_files(tmp_path):
    draft = tmp_path / "d"
    draft.mkdir()
    (draft / "config.json").write_text("{}")
    (draft / "model.safetensors").write_bytes(b"abc")
    catalog = load_systems(None, {}, [f'D={{"speculative_config": {{"method": "dflash", "model": "{draft}"}}}}', "AR={}"])
    ar, d = select_systems(catalog, None)
    first = checkpoint_hash(d)
    assert len(first) == 16 and checkpoint_hash(ar) == ""
    other = tmp_path / "e"
    other.mkdir()
    (other / "config.json").write_text("{}")
    (other / "model.safetensors").write_bytes(b"abd")
    catalog = load_systems(None, {}, [f'D={{"speculative_config": {{"method": "dflash", "model": "{other}"}}}}'])
    assert checkpoint_hash(select_systems(catalog, None)[0]) not in ("", first)


def test_engine_flags_are_shared_and_reserved_ones_refused():
    parser = build_parser()
    base = ["run", "--target", "t", "--benchmarks", "gsm8k", "--results", "r.csv"]
    args = parser.parse_args(base + ["--engine-flags", '{"max_model_len": 4096}', "--yarn-factor", "4",
                                     "--yarn-original-max-position", "1024"])
    assert engine_flags_from_args(args) == {
        "max_model_len": 4096, "yarn": {"factor": 4.0, "original_max_position_embeddings": 1024}}
    args = parser.parse_args(base + ["--yarn-factor", "4", "--draft-yarn-factor", "0"])
    assert engine_flags_from_args(args) == {"yarn": {"factor": 4.0}, "draft_yarn": None}
    for flag, where in [("max_num_seqs", "--concurrency"), ("speculative_config", "systems file")]:
        args = parser.parse_args(base + ["--engine-flags", json.dumps({flag: 1})])
        with pytest.raises(ValueError, match=where):
            engine_flags_from_args(args)


def test_cli_reports_bad_input_without_a_traceback(tmp_path, capsys):
    systems = _write(tmp_path, {"AR": {}})
    code = main(["run", "--target", "t", "--systems", str(systems), "--benchmarks", "gsm8k",
                 "--data-dir", str(tmp_path), "--results", str(tmp_path / "r.csv")])
    assert code == 2 and "no data for benchmark 'gsm8k'" in capsys.readouterr().err
    code = main(["summarize", str(tmp_path / "absent.csv")])
    assert code == 2 and "does not exist" in capsys.readouterr().err
    with pytest.raises(SystemExit) as info:
        main(["run", "--help"])
    assert info.value.code == 0 and "--concurrency" in capsys.readouterr().out


def test_dels_weights_name_a_missing_head(tmp_path):
    spec = {"method": "dflash", "model": str(tmp_path / "draft"), "num_speculative_tokens": 7}
    path = _write(tmp_path, {"AR": {}, "DeLS": {"speculative_config": spec, "liliprop": {"rule": "dels"}}})
    system = next(s for s in select_systems(load_systems(path), None) if s.name == "DeLS")
    with pytest.raises(ValueError, match="no DeLS head at"):
        system.dels_weights()


def test_a_plan_file_serves_each_planned_system_under_its_own_name(tmp_path):
    from eval.systems import with_plans

    systems = tmp_path / "systems.json"
    systems.write_text(json.dumps({
        "AR": {},
        "DFlash": {"speculative_config": {"method": "dflash", "model": "${d}/dflash", "num_speculative_tokens": 3}},
        "ngram": {"speculative_config": {"method": "ngram", "num_speculative_tokens": 4,
                                         "prompt_lookup_max": 4}},
    }))
    planned = {"method": "dflash", "model": "${d}/dflash", "num_speculative_tokens": 3,
               "num_speculative_tokens_per_batch_size": [[1, 2, 3], [3, 32, 0]]}
    plans = tmp_path / "plans.json"
    plans.write_text(json.dumps({"DFlash": {}, "DFlash-scheduled": {"speculative_config": planned},
                                 "Other-scheduled": {"speculative_config": planned}}))
    catalog = with_plans(load_systems(systems, {"d": "/drafts"}), plans)
    assert sorted(catalog.entries) == ["AR", "DFlash", "ngram"]  # names kept, none added
    chosen = {s.name: s for s in select_systems(catalog, ["AR", "DFlash", "ngram"])}
    assert chosen["DFlash"].speculative_config["num_speculative_tokens_per_batch_size"] == [[1, 2, 3], [3, 32, 0]]
    assert chosen["DFlash"].speculative_config["model"] == "/drafts/dflash"
    assert chosen["ngram"].speculative_config["method"] == "ngram"  # no plan: its own entry
    bad = tmp_path / "bad.json"
    bad.write_text("[1")
    with pytest.raises(SystemsError, match=r"plan file .*bad.json cannot be read .* leave --plans out"):
        with_plans(load_systems(systems, {"d": "/drafts"}), bad)


def test_the_shipped_plan_files_plan_every_system_the_main_job_serves():
    """run.sh serves each system by its host kind's plan; every one of this package's systems in
    the main job has one in both plan files, and each plan entry parses."""
    from eval.systems import with_plans

    root = Path(__file__).resolve().parents[1]
    ours = ["DFlash", "DFlash+lookup", "DeLS-GRU", "DeLS-Markov", "LiLiCorr-greedy", "LiLiCorr-viterbi",
            "LiLiCorr+DeLS", "LiLiCorr+lookup", "Domino", "DSpark"]
    for plans in ("testbed/smollm2/schedule/systems.json", "testbed/smollm2/schedule/avx2/systems.json"):
        catalog = with_plans(load_systems(root / "testbed/smollm2/systems.json", {"drafts": "/d"}), root / plans)
        for name in ours:
            entry, where = catalog.entries[name]
            assert where.endswith(f"{name}-scheduled"), (plans, name)
            system = select_systems(catalog, [name])[0]
            assert system.speculative_config["num_speculative_tokens_per_batch_size"], (plans, name)


def test_var_flags_parse_to_a_mapping_and_a_flag_without_a_value_is_named():
    assert parse_vars(["drafts=/a/b=c", "x="]) == {"drafts": "/a/b=c", "x": ""}
    with pytest.raises(ValueError, match="--var 'drafts' must look like NAME=VALUE"):
        parse_vars(["ok=1", "drafts"])
