"""The results table shared by eval (writer) and plots (reader).

One tidy row per measurement. `kind` says what the row measures:
- "run": one system x benchmark x setting x seed generation run;
- "stage": one stage of the per-step time decomposition (paper Table 3).
"""

# Identity of a measurement: a run resumes by skipping rows whose key exists.
KEY_COLUMNS = [
    "kind",            # "run" | "stage"
    "system",          # named configuration, e.g. "AR", "DFlash", "LiLiCorr-greedy"
    "benchmark",       # e.g. "gsm8k", "testbed-code", "speed-throughput_1k"
    "category",        # benchmark category or entropy tier ("" when none)
    "temperature",     # float
    "concurrency",     # int, the engine's max_num_seqs
    "input_len",       # int, fixed input length in tokens (0 = natural length)
    "seed",            # int
    "dels_alpha",      # float or NaN when the system has no DeLS head
    "dels_beta",       # float or NaN
    "stage",           # stage name for kind == "stage", "" otherwise
]

METRIC_COLUMNS = [
    "num_prompts",
    "num_truncated",       # prompts of the timed batch (every turn counted) longer than
                           # max_model_len - max_tokens, right-truncated (eval/prompts.py)
    "num_drafts",
    "num_draft_tokens",
    "num_accepted_tokens",
    "tau",                 # 1 + accepted / drafts (block-weighted); 1.0 for AR
    "accept_per_pos",      # JSON list: acceptance rate at draft position 1..k
    "output_tokens",
    "wall_s",              # generation wall time, warm-up excluded
    "tokens_per_s",        # output_tokens / wall_s
    "speedup",             # tokens_per_s / tokens_per_s of AR in the same run (with --paired:
                           # of AR's run on the same prompts just before this one)
    "paired_ar_output_tokens",  # --paired: output tokens and wall time of that AR run (NaN
    "paired_ar_wall_s",         # otherwise, and for AR itself)
    "paired_ar_retries",   # --paired: times that AR run was measured again, its tokens/s an
                           # outlier against the job's AR runs (eval/paired.py)
    "paired_ar_outlier",   # 1: still an outlier after the retries, speedup NaN (not used); 0: fine
    "stage_ms",            # per-step milliseconds for kind == "stage", NaN otherwise
    "output_hashes",       # JSON list: per prompt, a fingerprint of its generated token ids (all
                           # turns); at T = 0 equal to AR's = the system reproduced plain decoding
]

PROVENANCE_COLUMNS = [
    "run_id",          # one id per `python -m eval run` invocation
    "git_rev",
    "vllm_version",
    "target",          # target model path
    "draft",           # draft checkpoint path ("" for AR)
    "checkpoint_hash", # sha256 prefix over the draft's files
    "engine_flags",    # JSON of the engine flags shared by all arms
    "system_config",   # JSON of the system's speculative config and options
    "timestamp",
    "protocol",        # JSON of the generation protocol shared by all arms (cap, warm-up, prompts, data)
    "data_provenance", # JSON of DATA_DIR/<benchmark>.provenance.json (wheel, file, rows / full size,
                       # partial) for data from `eval fetch-data`, "" otherwise
    "machine",         # JSON of the CPU, cores and matrix instruction sets (eval/machine.py): CPU
                       # speed figures compare only within one kind (AMX or not)
]

ALL_COLUMNS = KEY_COLUMNS + METRIC_COLUMNS + PROVENANCE_COLUMNS
# Columns added after results files were first written: a file without them reads as NaN there.
LATER_COLUMNS = ["paired_ar_output_tokens", "paired_ar_wall_s", "machine", "paired_ar_retries",
                 "paired_ar_outlier", "num_truncated"]
