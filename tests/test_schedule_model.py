"""The speculation schedule's cost model (eval/schedule_model.py) and its ranges, checked against
vLLM's own batch-size lookup."""

import pytest

from eval.schedule_model import best_k, expected_tokens, interpolated, k_at, linear_in_k, schedule
from vllm_liliprop.k_ranges import as_ranges, describe_k

ACCEPTANCE = [0.6, 0.35, 0.2]
# k -> {batch -> seconds}: drafting is nearly free alone, and costs more per k as the batch grows.
COSTS = {0: {1: 0.012, 16: 0.05, 32: 0.09}, 1: {1: 0.013, 16: 0.07, 32: 0.13},
         2: {1: 0.0135, 16: 0.09, 32: 0.17}, 3: {1: 0.014, 16: 0.11, 32: 0.21}}


def test_expected_tokens_adds_the_prefix_acceptances():
    assert expected_tokens(ACCEPTANCE, 0) == 1.0
    assert expected_tokens(ACCEPTANCE, 2) == pytest.approx(1.95)
    with pytest.raises(ValueError, match="num_speculative_tokens >= 4"):
        expected_tokens(ACCEPTANCE, 4)


def test_cost_is_interpolated_between_measured_batch_sizes():
    assert interpolated(COSTS[0], 8) == pytest.approx(0.012 + 7 / 15 * 0.038)
    assert interpolated(COSTS[0], 64) == 0.09


def test_the_schedule_drafts_less_as_verification_grows_dearer():
    assert best_k(ACCEPTANCE, COSTS, 1) == 3
    assert best_k(ACCEPTANCE, COSTS, 32) == 1
    dear = {k: {b: c * (1 + k) for b, c in costs.items()} for k, costs in COSTS.items()}
    assert schedule(ACCEPTANCE, dear, 32) == [[1, 32, 0]]


@pytest.mark.parametrize("k_by_batch", [[3, 3, 2, 2, 2, 0, 0, 1], [0], [1, 2, 3, 3]])
def test_ranges_mean_to_vllm_what_they_mean_here(k_by_batch):
    from vllm.v1.spec_decode.dynamic.utils import build_dynamic_sd_schedule_lookup

    ranges = as_ranges(k_by_batch)
    dense = build_dynamic_sd_schedule_lookup(ranges, len(k_by_batch) + 4, 3)[1:]
    assert dense == k_by_batch + [k_by_batch[-1]] * 4
    assert [k_at(ranges, b) for b in range(1, len(dense) + 1)] == dense


def test_description_names_plain_steps():
    assert describe_k([3, 3, 0]) == "3 at batch 1-2, 0 at batch 3 (plain decoding)"


def test_drafting_costs_are_smoothed_to_a_line_in_k():
    # Batch 16 as a noisy host timed it: k = 3 dearer than k = 7, and k = 0 apart from the line.
    noisy = {0: {16: 0.034}, 1: {16: 0.059}, 3: {16: 0.069}, 5: {16: 0.062}, 7: {16: 0.064}}
    fitted = linear_in_k(noisy)
    assert fitted[0] == noisy[0]
    line = [fitted[k][16] for k in (1, 3, 5, 7)]
    assert line == sorted(line) and sum(line) == pytest.approx(sum(noisy[k][16] for k in (1, 3, 5, 7)))
    assert line[1] - line[0] == pytest.approx(line[3] - line[2])
    assert linear_in_k({0: {1: 0.1}, 3: {1: 0.2}}) == {0: {1: 0.1}, 3: {1: 0.2}}


def test_a_system_cut_to_fewer_verified_tokens_is_scheduled_up_to_its_cut():
    from eval.schedule import verified_top

    spec = {"method": "dflash", "num_speculative_tokens": 7}
    assert verified_top(spec, None) == 7
    assert verified_top(spec, {"rule": "argmax", "rule_draft_length": 3}) == 3
    assert verified_top(spec, {"rule_draft_length": 0}) == 0  # drafts nothing: only plain steps
    # The lookup's rows keep all 7: every k up to 7 verifies something different.
    assert verified_top(spec, {"rule_draft_length": 3, "prompt_lookup": [2, 4]}) == 7


def test_a_margin_keeps_plain_steps_where_drafting_is_predicted_to_gain_little():
    accepted = [0.45, 0.16, 0.08]
    # batch 16: k = 3 predicted 4% over k = 0 (1.69 tokens a step for 1.625x the cost)
    costs = {0: {16: 0.040}, 1: {16: 0.056}, 2: {16: 0.063}, 3: {16: 0.065}}
    assert best_k(accepted, costs, 16) == 3
    assert best_k(accepted, costs, 16, margin=0.05) == 0
    assert best_k(accepted, costs, 16, margin=0.03) == 3
    assert schedule(accepted, costs, 4, margin=0.05) == [[1, 4, 0]]


def test_served_batches_calibrate_the_plan_where_they_were_measured():
    from eval.schedule_model import calibration, served_factors, tokens_per_s

    accepted = [0.45, 0.16, 0.08]
    # Steady state: k = 3 predicted 1.10x plain decoding at batch 32.
    costs = {0: {1: 0.030, 32: 0.050}, 3: {1: 0.035, 32: 0.0768}}
    assert best_k(accepted, costs, 32, margin=0.05) == 3
    # Served batches of 32 ran k = 3 at 0.85x plain decoding, k = 0 at 0.98x.
    predicted = {k: {32: tokens_per_s(accepted, costs, 32, k) * 0.050 / 32} for k in costs}
    factors = served_factors({0: {32: 0.98}, 3: {32: 0.85}}, predicted)
    assert 0 not in factors and factors[3][32] == pytest.approx(0.85 / 1.10, rel=0.01)
    assert best_k(accepted, costs, 32, 0.05, factors) == 0
    assert best_k(accepted, costs, 1, 0.05, factors) == 3  # batch 1: factor 1, nothing to drain
    assert calibration(factors[3], 16) == pytest.approx(1 + 15 / 31 * (factors[3][32] - 1))
    assert calibration(None, 16) == 1.0
    assert schedule(accepted, costs, 32, 0.05, factors)[-1][1:] == [32, 0]
    assert schedule(accepted, costs, 32, 0.05)[-1][1:] == [32, 3]


def test_a_noisy_served_plain_step_does_not_make_drafting_look_better_than_plain_decoding():
    """k = 0 is a plain step: one round's served k = 0 batch 10% under plain decoding is noise, and
    calibrating k = 0 by it drafted up to batch 16. The numbers: LiLiCorr greedy's one-round plan
    on the AMX host, 2026-12-07 (testbed/smollm2/schedule/replan_amx_1207.measurements.json)."""
    from eval.schedule_model import served_factors

    accepted = [0.471, 0.204, 0.097, 0.0, 0.0, 0.0, 0.0]
    costs = {3: {1: 0.05290, 4: 0.05277, 16: 0.07562, 32: 0.17309},
             2: {1: 0.05067, 4: 0.05175, 16: 0.07694, 32: 0.13699},
             1: {1: 0.04844, 4: 0.05074, 16: 0.07826, 32: 0.10088},
             0: {1: 0.03693, 4: 0.03427, 16: 0.04986, 32: 0.06476}}
    served = {3: {1: 1.5101, 4: 0.9698}, 2: {1: 1.3843, 4: 0.9456}, 1: {1: 1.162, 4: 0.8571}, 0: {1: 1.0341, 4: 0.898}}
    predicted = {3: {1: 1.1068, 4: 1.3032}, 2: {1: 1.0923, 4: 1.256}, 1: {1: 1.0033, 4: 1.125}, 0: {1: 0.8949, 4: 1.1324}}
    factors = served_factors(served, predicted)
    assert schedule(accepted, costs, 32, 0.05, factors) == [[1, 3, 3], [4, 32, 0]]
    with_plain_calibrated = {**factors, 0: {b: served[0][b] / predicted[0][b] for b in (1, 4)}}
    assert schedule(accepted, costs, 32, 0.05, with_plain_calibrated) == [[1, 16, 3], [17, 32, 0]]


def test_the_plain_step_pools_plain_decoding_and_every_k0_arm():
    """Each engine's k = 0 arm is one more sample of a plain step: one slow engine's round does
    not make its own plain steps look dear (LiLiCorr+lookup at batch 32, 0.078 s against 0.061)."""
    from eval.schedule import plain_step_costs

    times = {"AR": {0: {1: [0.033], 32: [0.0606]}},
             "A": {0: {1: [0.034], 32: [0.0653]}, 3: {1: [0.05], 32: [0.11]}},
             "B": {0: {1: [0.036], 32: [0.0780]}, 3: {1: [0.05], 32: [0.11]}},
             "C": {0: {1: [0.035], 32: [0.0624]}}}
    assert plain_step_costs(times) == {1: pytest.approx(0.0345), 32: pytest.approx(0.06385)}
