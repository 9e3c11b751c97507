"""vllm-idlm: Introspective Strided Decoding for I-DLM checkpoints inside vLLM.

Importing this package never imports vLLM: the verifier math, sampling, configs and
the gated-LoRA layer are usable (and tested) without an engine. Everything that
touches vLLM internals lives in `vllm_idlm.plugin` and `vllm_idlm.engine`.
"""

__version__ = "0.1.0"
