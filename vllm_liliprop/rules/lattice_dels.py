"""Lattice walk plus DeLS: each candidate also earns alpha*log p_S(c | predecessor) - beta*log prior(c).

Markov head: the bonus depends only on the committed predecessor, so it is a unary term on the
start scores and a K x K term on every pair, added once; greedy, Viterbi and the sampled walk
then run unchanged. GRU head: the bonus depends on the whole committed path, so only the greedy
walk is defined, evaluated step by step (Viterbi and sampling are refused at load).
"""

from __future__ import annotations

import torch

from vllm_liliprop.faults import non_finite_rows
from vllm_liliprop.heads.dels import MarkovShortHead
from vllm_liliprop.heads.dels_lattice import (
    check_lattice_dels_walk,
    greedy_walk_with_short_head,
    lattice_dels_terms_markov,
)
from vllm_liliprop.options import LiliPropOptions, OptionError
from vllm_liliprop.rules.base import DraftInputs, DraftOutput
from vllm_liliprop.rules.dels import device_schedule, load_dels
from vllm_liliprop.rules.lattice import LatticeRule, load_lattice_head


class LatticeDelsRule(LatticeRule):
    def __init__(self, head, vocab_size, short_head, log_prior, alpha, beta, prefix_len,
                 walk="greedy", sampling="deterministic", reference=False, reports_confidence=False,
                 vocab_ids=None):
        super().__init__(head, vocab_size, walk, sampling, reference, reports_confidence, vocab_ids)
        self.short_head, self.log_prior = short_head, log_prior
        self.alpha = device_schedule(alpha, log_prior)
        self.beta = device_schedule(beta, log_prior)
        self.prefix_len = prefix_len
        self.name = "lattice+dels-" + self.name.removeprefix("lattice-")

    @classmethod
    def from_resources(cls, options: LiliPropOptions, resources) -> "LatticeDelsRule":
        short_head, log_prior, alpha, beta, prefix = load_dels(options, resources)
        check_lattice_dels_walk(options.walk, short_head)
        if options.sampling == "probabilistic" and not isinstance(short_head, MarkovShortHead):
            raise OptionError(
                "sampling = 'probabilistic' with rule 'lattice+dels' needs a Markov DeLS head "
                "(a GRU's bonus depends on the whole sampled path); use sampling "
                "'deterministic' or a Markov head."
            )
        return cls(load_lattice_head(resources), resources.vocab_size, short_head, log_prior,
                   alpha, beta, prefix, options.walk, options.sampling,
                   reports_confidence=options.reports_confidence, vocab_ids=resources.draft_vocab_ids)

    def _schedules(self, num_slots):
        return self.alpha[:num_slots], self.beta[:num_slots]

    def walk_scores(self, inputs: DraftInputs, lattice):
        alpha, beta = self._schedules(lattice.candidate_ids.shape[1])
        start_bonus, pair_bonus = lattice_dels_terms_markov(
            lattice.candidate_ids, inputs.anchor_ids, self.short_head, self.log_prior, alpha,
            beta, pure_draft_prefix_len=self.prefix_len,
        )
        return lattice.start + start_bonus, lattice.pairs + pair_bonus

    @torch.inference_mode()
    def propose(self, inputs: DraftInputs) -> DraftOutput:
        if isinstance(self.short_head, MarkovShortHead):
            return super().propose(inputs)
        lattice = self.lattice(inputs)
        alpha, beta = self._schedules(lattice.candidate_ids.shape[1])
        index, walk_faulty = greedy_walk_with_short_head(
            lattice.start, lattice.pairs, lattice.candidate_ids, inputs.anchor_ids,
            self.short_head, self.log_prior, alpha, beta, pure_draft_prefix_len=self.prefix_len,
            return_faulty=True,
        )
        # The walk checks the steps it took (lattice plus bonus); the rest of the lattice is
        # checked too, as the lattice rule does, so a broken lattice head is flagged either way.
        return self.draft_output(lattice, index, walk_faulty | non_finite_rows(lattice.start, lattice.pairs))
