"""Translate the user's `"method": "idlm"` into vLLM's own speculative config.

vLLM's SpeculativeConfig forbids unknown methods and keys, so this runs in the API /
LLM process around `EngineArgs.create_engine_config`, before that config is built:
idlm becomes `custom_class` with 2K draft slots (K drafts + K MASKs), the ISD options
travel to the workers in `additional_config["idlm"]`, and the checkpoint is checked.
"""

from __future__ import annotations

import functools
import json
import logging
from typing import Any

from vllm_idlm.config import ADDITIONAL_CONFIG_KEY, METHOD, IsdOptions
from vllm_idlm.formats.adapter import check_fits, read_adapter, read_adapter_facts
from vllm_idlm.formats.checkpoint import ARCHITECTURES, architecture_for, read_checkpoint_facts
from vllm_idlm.seam.vllm import MAX_SPEC_LEN

logger = logging.getLogger("vllm_idlm")
PROPOSER_CLASS = "vllm_idlm.engine.proposer.IsdProposer"
SCHEDULER_CLASS = "vllm_idlm.engine.scheduler.IsdScheduler"


def serve_as_idlm(user_overrides, hf_config):
    """hf_overrides for lossless mode: the user's own overrides, then the I-DLM architecture
    of the base's family. vLLM also applies a callable override to configs it derives (its
    speculative config's draft view); those keep their architecture, and `resolve` checks
    that the served model really got the gated class."""
    if callable(user_overrides):
        hf_config = user_overrides(hf_config)
    elif user_overrides:
        for key, value in user_overrides.items():
            setattr(hf_config, key, value)
    if getattr(hf_config, "model_type", None) in ARCHITECTURES:
        hf_config.architectures = [architecture_for(hf_config.model_type)]
    return hf_config


def _user_spec(args: Any) -> dict | None:
    spec = args.speculative_config
    if isinstance(spec, str):
        spec = json.loads(spec)
    if isinstance(spec, dict) and spec.get("method") == METHOD:
        return dict(spec)
    if args.spec_method == METHOD:
        spec = dict(spec or {})
        spec["method"] = METHOD
        if args.spec_tokens is not None:
            spec["num_speculative_tokens"] = args.spec_tokens
        return spec
    return None


def translate(args: Any) -> IsdOptions | None:
    """Rewrite `args` in place for ISD; returns the options, or None when ISD is off."""
    spec = _user_spec(args)
    if spec is None:
        return None
    options = IsdOptions.from_user(spec)
    if options.num_slots > MAX_SPEC_LEN:
        raise ValueError(
            f"idlm: num_speculative_tokens={options.num_drafts} needs {options.num_slots} "
            f"draft slots per step (K drafts + K MASKs); vLLM schedules at most {MAX_SPEC_LEN}"
        )
    if args.enable_lora and options.draft_lora:
        raise ValueError(
            "idlm: draft_lora (the gated ISD adapter) cannot be combined with --enable-lora; "
            "serve ordinary LoRA adapters from a separate engine"
        )
    if getattr(args, "async_scheduling", None):
        raise ValueError(
            "idlm: async scheduling is not supported with ISD (vLLM 0.32 schedules the "
            "next step before the drafts of this one exist, and its custom_class method "
            "runs synchronously); drop --async-scheduling"
        )
    args.spec_method = None
    args.spec_tokens = None
    args.speculative_config = {
        "method": "custom_class",
        "model": PROPOSER_CLASS,
        "num_speculative_tokens": options.num_slots,
        **options.passthrough,
    }
    if args.scheduler_cls in (None, "vllm.v1.core.sched.scheduler.Scheduler"):
        args.scheduler_cls = SCHEDULER_CLASS
    else:
        logger.warning(
            "idlm: custom scheduler %s kept; MASK slots count as drafts in "
            "its spec-decoding metrics",
            args.scheduler_cls,
        )
    if options.draft_lora:
        # The base checkpoint is served by the plugin's class of its family (which holds
        # the gate); the family is known once vLLM has read the config.
        args.hf_overrides = functools.partial(serve_as_idlm, args.hf_overrides)
        # The gate's row set changes with every step; run the model eagerly.
        args.enforce_eager = True
    return options


def resolve(vllm_config, options: IsdOptions) -> None:
    """Check the checkpoint against the options and publish them to the workers."""
    model_config = vllm_config.model_config
    if options.draft_lora:
        from transformers import AutoTokenizer

        parallel = vllm_config.parallel_config
        if parallel.tensor_parallel_size > 1 or parallel.pipeline_parallel_size > 1:
            # The gated layers hold whole (unsharded) adapter matrices and walk every decoder
            # layer: see examples/ray/GPU.md for what lifting this takes.
            raise ValueError(
                "idlm: draft_lora (lossless mode) supports tensor_parallel_size=1 and "
                f"pipeline_parallel_size=1 only (got {parallel.tensor_parallel_size} and "
                f"{parallel.pipeline_parallel_size})"
            )
        # The gate lives in the plugin's model classes: a base of another family would be
        # served by vLLM's own class, silently without the adapter.
        architecture_for(getattr(model_config.hf_config, "model_type", None))
        check_fits(read_adapter(options.draft_lora), model_config.hf_config)
        tokenizer = AutoTokenizer.from_pretrained(model_config.tokenizer)
        facts = read_adapter_facts(options.draft_lora, tokenizer)
    else:
        facts = read_checkpoint_facts(model_config.hf_config, model_config.model)
    vocab = model_config.get_vocab_size()
    if not 0 <= facts.mask_token_id < vocab:
        raise ValueError(
            f"idlm: mask_token_id {facts.mask_token_id} of {facts.source} is outside the "
            f"model's vocabulary of {vocab}"
        )
    warning = facts.check_num_drafts(options.num_drafts)
    if warning:
        logger.warning(warning)
    resolved = options.resolved(facts.mask_token_id, facts.strides)
    additional = dict(vllm_config.additional_config or {})
    additional[ADDITIONAL_CONFIG_KEY] = resolved.to_dict()
    vllm_config.additional_config = additional


def create_engine_config(original, self, *args, **kwargs):
    """`EngineArgs.create_engine_config` with ISD: the args are rewritten in place; callers
    that build the config twice from the same args (Ray Data's vLLM stage does) get the
    options from the first call."""
    options = translate(self) or getattr(self, "_idlm_options", None)
    self._idlm_options = options
    vllm_config = original(self, *args, **kwargs)
    if options is not None:
        resolve(vllm_config, options)
    return vllm_config
