"""Draft rules used only by tests, loaded through the `package.module:factory` option."""

import torch

from vllm_liliprop.rules import DraftInputs, DraftOutput


class RepeatAnchorRule:
    """Draft the last verified token in every slot."""

    name = "repeat-anchor"

    def propose(self, inputs: DraftInputs) -> DraftOutput:
        ids = inputs.anchor_ids[:, None].expand(-1, inputs.num_slots).contiguous()
        return DraftOutput(ids)


class ExplodingRule:
    """Raises on every call: the engine must survive and output must not change."""

    name = "exploding"

    def propose(self, inputs: DraftInputs) -> DraftOutput:
        raise RuntimeError("boom")


class NaNRowsRule:
    """Flags every other request as faulty (as a head with NaN scores would) and drafts garbage
    token 0 elsewhere; the proposer must use the drafter's argmax for the flagged rows."""

    name = "nan-rows"

    def propose(self, inputs: DraftInputs) -> DraftOutput:
        b, s = inputs.batch_size, inputs.num_slots
        faulty = torch.arange(b, device=inputs.hidden.device) % 2 == 0
        return DraftOutput(torch.zeros(b, s, dtype=torch.long), faulty_rows=faulty)


def repeat_anchor(options, resources):
    return RepeatAnchorRule()


def exploding(options, resources):
    return ExplodingRule()


def nan_rows(options, resources):
    return NaNRowsRule()


class FadingRepeatAnchorRule(RepeatAnchorRule):
    """Repeat the anchor, reporting a confidence of 0.9 in the first slot and 0.5 in each one
    after: the product falls to 0.9, 0.45, 0.225, ... (the confidence cut's known input)."""

    name = "fading-repeat-anchor"

    def propose(self, inputs: DraftInputs) -> DraftOutput:
        out = super().propose(inputs)
        confidence = torch.full(out.token_ids.shape, 0.5)
        confidence[:, 0] = 0.9
        return DraftOutput(out.token_ids, confidence=confidence)


def fading_repeat_anchor(options, resources):
    return FadingRepeatAnchorRule()
