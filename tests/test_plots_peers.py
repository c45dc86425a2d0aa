"""The peers table (plots/peers.py): which systems are peers, and best-of-ours vs best-peer rows,
on the shipped main job's results with a peer added (a copy of one system's rows renamed)."""

import json

import pandas as pd
import pytest

from plots.io import load_results
from plots.peers import is_peer, peer_systems, peers_table
from plots.tables import render_markdown

RESULTS = "testbed/smollm2/round3/main_job/results.csv"


def _ours() -> pd.DataFrame:
    """The shipped main job's rows without its real peers (the tests add a peer of known speed)."""
    df = load_results(RESULTS)
    return df[~df["system_config"].map(is_peer)]


def test_peers_are_vllm_methods_and_dflash_without_liliprop():
    ngram = {"speculative_config": {"method": "ngram", "num_speculative_tokens": 3}, "liliprop": None}
    stock = {"speculative_config": {"method": "dflash", "model": "d"}, "liliprop": None,
             "without_liliprop": True}
    ours = {"speculative_config": {"method": "dflash", "model": "d"}, "liliprop": {"rule": "dels"}}
    dspark = {"speculative_config": {"method": "dspark", "model": "d"}, "liliprop": None}
    plain = {"speculative_config": None, "liliprop": None}
    assert [is_peer(json.dumps(c)) for c in (ngram, stock, ours, dspark, plain)] == \
        [True, True, False, False, False]
    assert not is_peer("not json") and not is_peer(float("nan"))


def _with_peer(df: pd.DataFrame, copy_of: str, factor: float) -> pd.DataFrame:
    peer = df[df["system"] == copy_of].copy()
    peer["system"] = "ngram"
    peer["system_config"] = json.dumps({"speculative_config": {"method": "ngram"}, "liliprop": None})
    peer["speedup"] = peer["speedup"] * factor
    return pd.concat([df, peer], ignore_index=True)


@pytest.mark.parametrize("factor, verdict", [(0.8, "yes"), (1.3, "**no**")])
def test_best_of_ours_against_best_peer(factor, verdict):
    df = _with_peer(_ours(), "DFlash+lookup", factor)
    assert peer_systems(df) == {"ngram"}
    table = peers_table(df)
    average = next(r for r in table.rows if r.labels[0] == "Average")
    best_ours, _, best_peer, peer_cell, met = average.extras
    assert best_ours == "DFlash+lookup" and best_peer == "ngram"  # the hybrid leads ours in that job
    assert "[" in peer_cell and met == verdict  # the interval is shown
    assert "ours >= peer" in render_markdown(table)
    assert len(table.rows) == 8  # seven benchmarks and their average


def test_no_peer_is_a_clear_skip():
    with pytest.raises(ValueError, match="peer"):
        peers_table(_ours())


def test_summary_adds_the_table_only_with_both_kinds(tmp_path):
    from eval.summary import summary_text

    both = _with_peer(_ours(), "DFlash", 0.9)
    peers_only = both[both["system"].isin(["AR", "ngram"])]
    paths = {}
    for name, frame in (("both", both), ("peers_only", peers_only)):
        paths[name] = tmp_path / f"{name}.csv"
        frame.to_csv(paths[name], index=False)
    assert "against the peers" in summary_text(paths["both"])
    assert "against the peers" not in summary_text(paths["peers_only"])


def test_the_shipped_main_job_has_its_peer_table():
    """The shipped job serves the n-gram peer (the default main job's); each row names the peer
    with the highest mean speedup on that benchmark in the file itself."""
    df = load_results(RESULTS)
    assert peer_systems(df) == {"ngram"}
    table = peers_table(df)
    runs = df[df["system"].isin(peer_systems(df)) & (df["kind"] == "run")]
    for row in table.rows:
        if row.labels[0] != "Average":
            on_benchmark = runs[runs["benchmark"] == row.labels[0].split(" (")[0]]
            assert row.extras[2] == on_benchmark.groupby("system")["speedup"].mean().idxmax()
