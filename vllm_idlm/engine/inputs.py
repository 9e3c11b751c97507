"""Refuse prompts that contain the MASK token, before they reach the engine.

A MASK inside a prompt would be read as a MASK slot by drafting and (in lossless mode)
would open the adapter's gate on a prompt row. The check runs in the API / LLM process
with vLLM's own input validation, so the request fails with a 400-style error and the
engine never sees it.
"""

from __future__ import annotations

from vllm_idlm.config import ADDITIONAL_CONFIG_KEY


def validate_model_input(original, self, prompt_input, prompt_type) -> None:
    """vLLM's `InputProcessor._validate_model_input`, then the MASK check."""
    original(self, prompt_input, prompt_type)
    options = (self.vllm_config.additional_config or {}).get(ADDITIONAL_CONFIG_KEY)
    if not options or prompt_input.get("type") == "embeds":
        return
    mask_token_id = options["mask_token_id"]
    prompt_ids = prompt_input.get("prompt_token_ids") or []
    if mask_token_id in prompt_ids:
        from vllm_idlm.seam.vllm import VLLMValidationError

        raise VLLMValidationError(
            f"The prompt contains the I-DLM MASK token (id {mask_token_id}) at position "
            f"{list(prompt_ids).index(mask_token_id)}; MASK is reserved for ISD drafting "
            "and cannot appear in a prompt",
            parameter="prompt",
        )
