"""The only layer of vllm-idlm that imports vLLM internals (besides `vllm_idlm.plugin`)."""
