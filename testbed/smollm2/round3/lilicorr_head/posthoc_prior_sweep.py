"""Post-hoc drafter log-prob prior on the shipped head's walk: choose w on held-out half A, report on half B."""
import json, torch
from pathlib import Path
from safetensors.torch import load_file
from training.export import load_lilicorr
from training.head_store import first_slots, load_store
from training.train_head import lattice_metrics
torch.set_num_threads(1)
embed = load_file(".cache/targets/smollm2-135m-instruct/model.safetensors")["model.embed_tokens.weight"]
_, head = load_lilicorr("testbed/smollm2/round3/drafts/lilicorr")
full = load_store(".cache/head_store/heldout")
n = full["targets"].shape[0]; half = n // 2
print("blocks", n, "keys", list(full))
def part(store, sl): return {k: v[sl] for k, v in store.items()}
rows = []
for slots in (3, 7):
    s = first_slots(full, slots)
    for w in (0.0, 0.25, 0.5, 1.0, 2.0, 4.0):
        prior = torch.tensor(w) if w else None
        for name, sl in (("A", slice(0, half)), ("B", slice(half, n))):
            m = lattice_metrics(head, part(s, sl), embed, prior=prior)
            row = {"slots": slots, "w": w, "half": name, **m}; rows.append(row); print(json.dumps(row), flush=True)
Path(".cache/posthoc_prior_sweep.json").write_text(json.dumps(rows, indent=1))
