"""tools/head_ablations.py: the one-change-at-a-time table of head trainings."""

import json

import pytest

from tools.head_ablations import changed_fields, main, table


def record(recipe, curve, heldout="H"):
    return {"recipe": recipe, "heldout": heldout, "curve": curve}


BASE = record({"lattice": {"k": 8, "w": 256}, "loss": {"distractor": 1.0}},
              [{"step": 0, "walk_tau": 1.1, "headroom_share": -0.6, "argmax_tau": 2.0},
               {"step": 500, "walk_tau": 2.05, "headroom_share": 0.04, "argmax_tau": 2.0, "train_headroom_share": 0.1}])


def test_rows_name_only_the_fields_they_changed():
    assert changed_fields({"a": {"b": 1, "c": 2}, "d": 3}, {"a": {"b": 1, "c": 5}, "d": 3}) == {"a.c": 2}
    other = record({"lattice": {"k": 4, "w": 256}, "loss": {"distractor": 0.0}},
                   [{"step": 500, "walk_tau": 2.01, "headroom_share": 0.02, "train_headroom_share": 0.05}])
    lines = table([other], BASE).splitlines()
    assert lines[0].startswith("| change against the baseline | step 500 |")
    assert lines[2] == "| baseline (the shipped head) | 2.050 / 4.0% | 10.0% |"
    assert lines[3] == "| lattice.k=4, loss.distractor=0.0 | 2.010 / 2.0% | 5.0% |"
    # The same recipe on other training data names its store.
    more_data = {**BASE, "store": "bigger", "curve": other["curve"]}
    assert table([more_data], {**BASE, "store": "wide"}).splitlines()[3].startswith("| store=bigger | 2.010")


def test_a_record_from_another_held_out_store_is_refused(tmp_path):
    (tmp_path / "base.json").write_text(json.dumps(BASE))
    (tmp_path / "x.json").write_text(json.dumps(record(BASE["recipe"], BASE["curve"], heldout="elsewhere")))
    with pytest.raises(SystemExit, match="another held-out store"):
        main([str(tmp_path / "x.json"), "--baseline", str(tmp_path / "base.json")])
