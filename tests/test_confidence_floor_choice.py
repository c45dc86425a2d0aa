"""tools/confidence_floor_choice.py: held-out blocks and batch-1 step costs in, the floor out."""

import json

import torch
from safetensors.torch import save_file

from tools.confidence_floor_choice import batch_one_costs, choice, cut_lengths, held_out_blocks, speedup


def _store(path, blocks=400, slots=7, seed=0):
    """Blocks whose drafter is calibrated: a slot at probability p is right with chance p."""
    g = torch.Generator().manual_seed(seed)
    prob = torch.rand(blocks, slots, generator=g) ** 2
    right = torch.rand(blocks, slots, generator=g) < prob
    targets = torch.randint(10, 100, (blocks, slots), generator=g, dtype=torch.int32)
    candidates = torch.where(right, targets, targets + 1)[..., None].expand(-1, -1, 4).contiguous()
    path.mkdir()
    save_file({"candidate_ids": candidates, "targets": targets,
               "candidate_log_probs": prob.log()[..., None].expand(-1, -1, 4).contiguous()},
              str(path / "shard_00000.safetensors"))
    return prob, right


def test_a_calibrated_drafters_cut_beats_every_fixed_length(tmp_path):
    prob, right = _store(tmp_path / "store")
    lead, read = held_out_blocks(tmp_path / "store")
    assert torch.allclose(read, prob, atol=1e-6)
    assert torch.equal(lead, torch.cumprod(right.int(), 1).sum(1))
    costs = (0.040, 0.050, 0.004)  # plain, k = 1, each further slot
    result = choice(lead, read, costs)
    assert result["best"]["speedup"] > max(result["fixed"].values())
    # Longer fixed drafts cost more than they yield here; the cut keeps them only where sure.
    assert speedup(torch.full_like(lead, 7), lead, costs) < speedup(torch.full_like(lead, 1), lead, costs)
    kept = cut_lengths(read, 0.5, 7)
    assert torch.equal(kept, (torch.cumprod(read, 1) >= 0.5).int().cumprod(1).sum(1))


def test_batch_one_costs_read_a_schedule_measurements_file(tmp_path):
    record = {"AR_step_costs_s": {"1": 0.03}, "systems": {"DFlash": {"step_costs_s": {
        "0": {"1": 0.031}, "1": {"1": 0.05}, "3": {"1": 0.056}}}}}
    path = tmp_path / "m.json"
    path.write_text(json.dumps(record))
    plain, one, slot = batch_one_costs(path, "DFlash")
    assert (plain, one) == (0.03, 0.05) and abs(slot - 0.003) < 1e-12
