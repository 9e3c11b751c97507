"""idlm_training: turn an AR checkpoint into an I-DLM checkpoint or a gated adapter.

Never imports vLLM.
"""
