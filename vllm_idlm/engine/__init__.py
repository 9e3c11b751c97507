"""ISD inside vLLM: the proposer, the sampler, the scheduler, the model classes and the code
the seam's patches run. vLLM's internals reach it through `vllm_idlm.seam` only."""
