import sys

# Before eval.cli imports anything that imports torch, transformers or vLLM: they read their log
# levels from the environment when imported (vllm_liliprop/quiet.py).
from vllm_liliprop.quiet import quiet, verbose_requested

quiet(verbose_requested(sys.argv[1:]))

from eval.cli import main  # noqa: E402

sys.exit(main())
