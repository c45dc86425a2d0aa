"""Give a LiLiCorr draft a candidate vocabulary: the reduced vocabulary (d2t) of a DFlash draft.

    python -m training.candidate_vocab --draft testbed/smollm2/round3/drafts/lilicorr \\
        --vocab-from testbed/smollm2/round3/drafts/dflash

Writes `<draft>/candidate_vocab/model.safetensors` (vllm_liliprop/heads/candidate_vocab.py): the
served lattice then scores the LM head rows of those ids only. Measure the head on a store built
with the same restriction (`training.head_store --candidate-vocab`) before shipping it.
"""

from __future__ import annotations

import argparse
import json
from collections.abc import Sequence
from pathlib import Path

from training.export import read_draft_vocab
from vllm_liliprop.heads.candidate_vocab import read_candidate_vocab, write_candidate_vocab


def main(argv: Sequence[str] | None = None) -> dict:
    parser = argparse.ArgumentParser(prog="python -m training.candidate_vocab", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--draft", required=True, help="the LiLiCorr draft folder to write into")
    parser.add_argument("--vocab-from", required=True, help="a draft folder with a reduced vocabulary (d2t)")
    args = parser.parse_args(argv)
    ids = read_draft_vocab(args.vocab_from)
    if ids is None:
        parser.error(f"--vocab-from {args.vocab_from}: no reduced vocabulary (d2t) there; give a DFlash "
                     "draft exported with draft_vocab_size")
    config = json.loads((Path(args.draft) / "config.json").read_text())
    folder = write_candidate_vocab(Path(args.draft), ids)
    read_candidate_vocab(Path(args.draft), int(config["vocab_size"]),
                         int(config["dflash_config"].get("lilicorr_candidate_topk", 1)))
    record = {"draft": args.draft, "vocab_from": args.vocab_from, "ids": int(ids.numel()),
              "written": str(folder)}
    print(json.dumps(record))
    return record


if __name__ == "__main__":
    main()
