from vllm_liliprop.heads.candidates import topk_candidates
from vllm_liliprop.heads.lattice import LatticeConfig, LatticeHead
