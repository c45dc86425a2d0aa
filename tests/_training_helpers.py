"""Tiny targets and data for the training tests (random init, a few thousand parameters)."""

from __future__ import annotations

import pytest
import torch

from training.data import TokenizedDataset

VOCAB = 256


@pytest.fixture(autouse=True)
def single_thread():
    """Training tests run on one thread: their numbers then repeat exactly, and they leave the
    other core to the rest of the suite. A module opts in by importing this fixture."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)
MASK_TOKEN = 255


def tiny_target(seed: int = 0, layers: int = 3):
    from transformers import Qwen3Config, Qwen3ForCausalLM

    torch.manual_seed(seed)
    config = Qwen3Config(
        vocab_size=VOCAB, hidden_size=64, intermediate_size=128, num_hidden_layers=layers,
        num_attention_heads=2, num_key_value_heads=1, head_dim=32, max_position_embeddings=512,
        rope_parameters={"rope_type": "default", "rope_theta": 10000.0}, tie_word_embeddings=False,
    )
    model = Qwen3ForCausalLM(config).eval()
    # Real LM heads produce confident logits; the 0.02-std init of a random model gives
    # logits near zero that a drafter could only sharpen by growing its final norm for
    # thousands of steps.
    with torch.no_grad():
        model.lm_head.weight.normal_(0.0, 0.5)
        model.model.embed_tokens.weight.normal_(0.0, 1.0)
    return model


MOTIFS = [[4 * i + j for j in range(2 + i % 3)] for i in range(4)]  # disjoint token sets


def toy_trainer(output_dir, num_examples: int, make_inputs=None, **config):
    """A real Trainer over a one-layer model whose loss needs only `x` [n, 4]; make_inputs
    defaults to ones for every example."""
    from torch import nn

    from training.trainer import OptimConfig, TrainConfig, Trainer

    class Toy(nn.Module):
        def __init__(self):
            super().__init__()
            self.head = nn.Linear(4, 1)

        def forward(self, x):
            return {"loss": self.head(x).pow(2).mean()}

    model = Toy()
    settings = dict(output_dir=str(output_dir), precision="fp32",
                    optim=OptimConfig(lr={"head": 1e-2}, weight_decay={"head": 0.0}))
    make_inputs = make_inputs or (lambda indices, epoch: {"x": torch.ones(len(indices), 4)})
    return Trainer(model, {"head": model.head}, make_inputs, num_examples,
                   TrainConfig(**{**settings, **config}), progress=False)


def patterned_dataset(num: int = 8, prompt: int = 6, length: int = 40, seed: int = 0) -> TokenizedDataset:
    """Random prompt tokens (unsupervised), then one of four short motifs repeated (supervised,
    starting at a random phase): a drafter learns to continue them within a few dozen steps."""
    generator = torch.Generator().manual_seed(seed)
    ids, masks = [], []
    for n in range(num):
        base = MOTIFS[n % len(MOTIFS)]
        phase = int(torch.randint(0, len(base), (1,), generator=generator))
        motif = base[phase:] + base[:phase]
        head = torch.randint(64, 128, (prompt,), generator=generator).tolist()
        body = (motif * length)[: length - prompt]
        ids.append(head + body)
        masks.append([False] * prompt + [True] * (length - prompt))
    return TokenizedDataset(ids, masks)


def tiny_recipe(method: str, output_dir, **train) -> dict:
    return {
        "method": method,
        "target_dtype": "float32",
        "device": "cpu",
        "drafter": {"num_hidden_layers": 1, "block_size": 4, "mask_token_id": MASK_TOKEN,
                    "target_layer_ids": [0, 2]},
        "lattice": {"candidate_topk": 4, "hidden_size": 32, "num_layers": 1, "num_heads": 2,
                    "mlp_ratio": 2.0, "factor_dim": 16, "vector_eps": 1e-6, "logit_scale": 8.0},
        "loss": {"dflash_decay": 4.0},
        "num_anchors": 8,
        "train": {"output_dir": str(output_dir), "max_steps": 6, "batch_size": 2, "seed": 1,
                  "precision": "fp32", "save_every": 3, "log_every": 1, "keep_checkpoints": 5,
                  "optim": {"lr": {"drafter": 3e-3, "head": 3e-3},
                            "weight_decay": {"drafter": 0.0, "head": 0.01},
                            "warmup_ratio": 0.1}, **train},
    }


def ddp_worker(rank: int, world_size: int, port: int, recipe: dict, result_dir: str) -> None:
    """One torchrun-like rank: join a gloo group, train, and dump this rank's logs."""
    import json
    import os

    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), RANK=str(rank),
                      WORLD_SIZE=str(world_size), LOCAL_RANK=str(rank))
    torch.set_num_threads(1)
    import torch.distributed as dist

    from training.pipeline import run_draft_training

    try:
        result = run_draft_training(recipe, target_model=tiny_target(), dataset=patterned_dataset(),
                                    progress=False)
        trainer = result["trainer"]
        state = {name: {k: v.tolist() for k, v in m.state_dict().items()}
                 for name, m in trainer.trainable.items()}
        with open(f"{result_dir}/rank{rank}.json", "w") as f:
            json.dump({"history": result["history"], "state": state}, f)
    finally:
        if dist.is_initialized():
            dist.destroy_process_group()


def record_realbed_stages(realbed, tmp_path, monkeypatch) -> dict:
    """training.realbed with its stages recorded, not run: {stage name: its function}; the
    target is tmp_path/target, and every stage returns a fragment with a dummy target sha256."""
    calls = {}

    def record(out, name, fn, log=print):
        calls[name] = fn
        return {"weights_sha256": "0" * 64}

    monkeypatch.setattr(realbed, "_eval_cli", lambda *args: str(tmp_path / "target") + "\n")
    monkeypatch.setattr(realbed, "run_stage", record)
    (tmp_path / "out").mkdir(exist_ok=True)
    return calls
