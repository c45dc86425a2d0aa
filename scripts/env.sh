# Sourced by run.sh and test.sh: runtime settings for vLLM's CPU backend.
# vLLM's CPU speculative decoding is many times slower without Intel OpenMP preloaded
# (measured here: DFlash 5.9 -> 157 tokens/s on the tiny demo); the cpu extra installs it.
iomp="$(pwd)/.venv/lib/libiomp5.so"
if [ -f "$iomp" ]; then
    case ":${LD_PRELOAD:-}:" in
        *":$iomp:"*) ;;
        *) export LD_PRELOAD="$iomp${LD_PRELOAD:+:$LD_PRELOAD}" ;;
    esac
fi
# A small KV cache (GiB) instead of most of the machine's memory, and an in-process engine
# (starts in seconds instead of half a minute); both can be overridden from the environment.
export VLLM_CPU_KVCACHE_SPACE=${VLLM_CPU_KVCACHE_SPACE:-2}
export VLLM_ENABLE_V1_MULTIPROCESSING=${VLLM_ENABLE_V1_MULTIPROCESSING:-0}
# Intel OpenMP writes "OMP: Info #277: omp_set_nested routine deprecated" straight to the console,
# past every Python log filter; off unless asked for (LILIPROP_VERBOSE=1, or KMP_WARNINGS set).
[ "${LILIPROP_VERBOSE:-0}" = 1 ] || export KMP_WARNINGS=${KMP_WARNINGS:-0}
