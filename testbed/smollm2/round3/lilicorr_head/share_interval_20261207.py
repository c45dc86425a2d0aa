"""Held-out walk share at K = 8 with a 95% interval: blocks resampled in runs of 64 consecutive
blocks (the store holds each conversation's anchors together, 64 per held-out conversation)."""
import json, sys
import torch
from safetensors.torch import load_file
from training.export import load_lilicorr
from training.head_store import load_store
from training.train_head import walk_scores, store_ranks
from training.headroom_metrics import headroom_metrics
from vllm_liliprop.walks import greedy_walk

store = load_store(sys.argv[1])
embed = load_file(".cache/targets/smollm2-135m-instruct/model.safetensors")["model.embed_tokens.weight"]
rank, valid = store_ranks(store)
n = store["targets"].shape[0]
runs = torch.arange(n) // 64
for draft in sys.argv[2:]:
    _, head = load_lilicorr(draft)
    head.eval()
    with torch.no_grad():
        walks = [ids.gather(-1, greedy_walk(s, p).unsqueeze(-1)).squeeze(-1) for s, p, ids in
                 (walk_scores(head, None, store, torch.arange(a, min(a + 1024, n)), 8, embed) for a in range(0, n, 1024))]
    hits = torch.cat(walks) == store["targets"].long()
    point = headroom_metrics(rank, valid, hits, ks=(8,))
    g = torch.Generator().manual_seed(0)
    shares, ratios = [], []
    for _ in range(2000):
        pick = torch.randint(0, int(runs.max()) + 1, (int(runs.max()) + 1,), generator=g)
        rows = torch.cat([torch.nonzero(runs == r).squeeze(-1) for r in pick.tolist()])
        m = headroom_metrics(rank[rows], valid[rows], hits[rows], ks=(8,))
        shares.append(m["walk_share"]["8"]); ratios.append(m["walk_tau"] / m["argmax_tau"])
    q = lambda xs: [round(float(torch.tensor(xs).quantile(t)), 4) for t in (0.025, 0.975)]
    print(json.dumps({"draft": draft, "store": sys.argv[1], "blocks": n, "walk_tau": round(point["walk_tau"], 4),
                      "argmax_tau": round(point["argmax_tau"], 4), "share8": round(point["walk_share"]["8"], 4),
                      "share8_95": q(shares), "ratio": round(point["walk_tau"] / point["argmax_tau"], 4), "ratio_95": q(ratios)}))
