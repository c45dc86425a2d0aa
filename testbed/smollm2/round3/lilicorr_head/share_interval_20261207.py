"""Held-out walk share at K = 8 and walk/argmax tau with 95% intervals (a record of the run in
share_interval_20261207.json, not a tool): blocks resampled in runs of 64 consecutive blocks (the
store keeps each conversation's anchors together, 64 per held-out conversation), 2,000 draws.

    PYTHONPATH=. python testbed/smollm2/round3/lilicorr_head/share_interval_20261207.py STORE DRAFT...
"""
import json
import sys

import torch
from safetensors.torch import load_file

from training.export import load_lilicorr
from training.head_store import load_store
from training.headroom_metrics import accepted_lengths
from training.train_head import store_ranks, walk_hits

K, RUN, DRAWS = 8, 64, 2000

store = load_store(sys.argv[1])
embed = load_file(".cache/targets/smollm2-135m-instruct/model.safetensors")["model.embed_tokens.weight"]
rank, valid = store_ranks(store)
runs = torch.arange(rank.shape[0]) // RUN
picks = torch.randint(0, int(runs.max()) + 1, (DRAWS, int(runs.max()) + 1), generator=torch.Generator().manual_seed(0))


def per_run(hits: torch.Tensor) -> torch.Tensor:
    """Accepted drafts summed within each run of blocks."""
    return torch.zeros(int(runs.max()) + 1).index_add_(0, runs, accepted_lengths(hits).float())


blocks = torch.bincount(runs).float()
argmax, oracle = per_run(valid & (rank == 0)), per_run(valid & (rank < K))
for draft in sys.argv[2:]:
    walk = per_run(walk_hits(load_lilicorr(draft)[1], store, embed))
    tau = {name: 1 + x[picks].sum(-1) / blocks[picks].sum(-1) for name, x in
           (("walk", walk), ("argmax", argmax), ("oracle", oracle))}
    share, ratio = (tau["walk"] - tau["argmax"]) / (tau["oracle"] - tau["argmax"]), tau["walk"] / tau["argmax"]
    point = {name: 1 + float(x.sum() / blocks.sum()) for name, x in (("walk", walk), ("argmax", argmax), ("oracle", oracle))}
    q = lambda x: [round(float(v), 4) for v in x.quantile(torch.tensor([0.025, 0.975]))]
    print(json.dumps({"draft": draft, "store": sys.argv[1], "blocks": int(blocks.sum()),
                      "walk_tau": round(point["walk"], 4), "argmax_tau": round(point["argmax"], 4),
                      "share8": round((point["walk"] - point["argmax"]) / (point["oracle"] - point["argmax"]), 4),
                      "share8_95": q(share), "ratio": round(point["walk"] / point["argmax"], 4), "ratio_95": q(ratio)}))
