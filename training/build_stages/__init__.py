"""Build stages shared by the builders (training.testbed: the offline tiny target; training.realbed:
a real pretrained target). Every stage is a function of explicit inputs that writes its outputs
under the build folder and returns a JSON-able manifest fragment; the builders run them through
training.stages.run_stage, which stores the fragment as OUT/stages/<name>.json and skips the stage
on a rerun.

  regenerate    the target's greedy replies to prompt files through vLLM (both builders)
  tokenization  chat template -> ids + assistant loss mask (both)
  drafts        DFlash / DFlash + LiLiCorr training and export (both)
  dels          DeLS GRU / Markov short head training and export (both)
  measure       held-out teacher-forced tau of the drafts, DeLS held-out CE (both)
  corpus        standard-library split and prompts (testbed)
  target        BPE tokenizer and the tiny target trained from scratch via training.lm (testbed)
  suites        held-out eval suites with entropy tiers (testbed)
  jsonl, versions  the files and the version record every manifest shares
"""
