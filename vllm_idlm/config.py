"""User-facing ISD options: what `--speculative-config '{"method": "idlm", ...}'` accepts.

vLLM-free. The plugin translates these options into vLLM's own speculative config
(`custom_class` with 2K draft slots: K real drafts followed by K MASK slots) and carries
them to the workers in `additional_config["idlm"]`. What a checkpoint or an adapter records
(the MASK id, the strides N it was trained for) is read by `vllm_idlm.formats`.
"""

from __future__ import annotations

import os
from dataclasses import asdict, dataclass, field
from typing import Any

from vllm_idlm.policy import PolicyConfig

METHOD = "idlm"
ADDITIONAL_CONFIG_KEY = "idlm"
# Keys of vLLM's own speculative config that keep their meaning under ISD.
_PASSTHROUGH_KEYS = frozenset({"disable_by_batch_size", "max_model_len"})
_ISD_KEYS = frozenset(
    {"method", "num_speculative_tokens", "draft_lora", "uniform_query_len", "adaptive", "lookup"}
)
# The object form of "adaptive" (`vllm_idlm.policy.PolicyConfig`) and of "lookup".
ADAPTIVE_KEYS = frozenset({"margin", "min_dwell", "probe_every", "step_ms", "row_ms"})
LOOKUP_KEYS = frozenset({"min_ngram", "max_ngram", "recent"})
DEFAULT_LOOKUP_NGRAM = (2, 4)
DEFAULT_LOOKUP_RECENT = 32  # finished requests whose outputs a lookup also searches


def _dashes_to_underscores(value: Any) -> Any:
    if isinstance(value, dict):
        return {k.replace("-", "_"): v for k, v in value.items()}
    return value


def _check_adaptive(value: Any) -> None:
    if isinstance(value, bool):
        return
    if not isinstance(value, dict):
        raise ValueError(
            f"idlm: adaptive must be true, false or an object of settings, got {value!r}"
        )
    unknown = set(value) - ADAPTIVE_KEYS
    if unknown:
        raise ValueError(
            f"idlm: unknown adaptive setting(s) {sorted(unknown)}; accepted: {sorted(ADAPTIVE_KEYS)}"
        )
    for key, v in value.items():
        if isinstance(v, bool) or not isinstance(v, int | float) or v < 0:
            raise ValueError(f"idlm: adaptive {key} must be a number >= 0, got {v!r}")
    try:
        PolicyConfig(ks=(1,), **value)
    except (TypeError, ValueError) as error:
        raise ValueError(f"idlm: {error}") from None


def _lookup(value: Any) -> tuple[int, int, int] | None:
    """The n-gram lengths a lookup matches and the finished requests whose outputs it also
    searches (None: no lookup)."""
    if value is None or value is True:
        return (*DEFAULT_LOOKUP_NGRAM, DEFAULT_LOOKUP_RECENT)
    if value is False:
        return None
    if not isinstance(value, dict) or set(value) - LOOKUP_KEYS:
        raise ValueError(
            f"idlm: lookup must be true, false or an object with {sorted(LOOKUP_KEYS)}, "
            f"got {value!r}"
        )
    low = value.get("min_ngram", DEFAULT_LOOKUP_NGRAM[0])
    high = value.get("max_ngram", max(DEFAULT_LOOKUP_NGRAM[1], low))
    for v in (low, high):
        if isinstance(v, bool) or not isinstance(v, int) or v < 1:
            raise ValueError(
                f"idlm: lookup min_ngram and max_ngram must be integers >= 1, got {v!r}"
            )
    if low > high:
        raise ValueError(f"idlm: lookup min_ngram {low} is larger than max_ngram {high}")
    recent = value.get("recent", DEFAULT_LOOKUP_RECENT)
    if isinstance(recent, bool) or not isinstance(recent, int) or recent < 0:
        raise ValueError(f"idlm: lookup recent must be an integer >= 0, got {recent!r}")
    return low, high, recent


@dataclass(frozen=True)
class IsdOptions:
    """ISD configuration of one engine.

    num_drafts: K, the drafts verified per step (stride N = K + 1, so at most K + 1
        tokens per forward).
    draft_lora: path of a gated-LoRA adapter (lossless mode) or None.
    uniform_query_len: pad cold starts with extra MASK slots so that every decode step
        has the same query length (1 + 2K), which full CUDA graphs need.
    adaptive: choose the batch's K per step (0..K, only K = N - 1 for the strides N the
        checkpoint was trained for) for the most expected tokens per second (`vllm_idlm.policy`); on by
        default (None resolves to True, or to False with uniform_query_len, whose fixed query
        length it cannot keep); False keeps K fixed. An object turns it on with settings
        (`ADAPTIVE_KEYS`): `margin`, `min_dwell`, `probe_every`, and `step_ms` with `row_ms`,
        which pin the step cost (step_ms + row_ms per query row) so that the K chosen follows
        acceptance alone, not this machine's timings (what tests and reproducible runs need).
    lookup: the lookup draft source (`engine.lookup`): (min_ngram, max_ngram[, recent]), the
        n-gram lengths it matches and how many finished requests' outputs it searches besides
        the request's own text (0 or absent: none); None for no lookup (`"lookup": false`).
    ks: the K values the checkpoint was trained for (resolved at startup from its strides N).
    mask_token_id: resolved from the checkpoint (or the adapter) at startup.
    passthrough: vLLM speculative-config keys forwarded unchanged.
    """

    num_drafts: int
    draft_lora: str | None = None
    uniform_query_len: bool = False
    adaptive: bool | dict[str, Any] | None = None
    lookup: tuple[int, ...] | None = (*DEFAULT_LOOKUP_NGRAM, DEFAULT_LOOKUP_RECENT)
    mask_token_id: int | None = None
    ks: tuple[int, ...] = ()
    passthrough: dict[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if isinstance(self.num_drafts, bool) or not isinstance(self.num_drafts, int):
            raise ValueError(
                f"idlm: num_speculative_tokens must be an integer >= 1, got {self.num_drafts!r}"
            )
        if self.num_drafts < 1:
            raise ValueError(
                f"idlm: num_speculative_tokens must be >= 1 (K drafts per step), got {self.num_drafts}"
            )
        if self.adaptive is None:
            object.__setattr__(self, "adaptive", not self.uniform_query_len)
        _check_adaptive(self.adaptive)
        if self.adaptive_on and self.uniform_query_len:
            raise ValueError(
                "idlm: the adaptive policy varies K, and the query length, per step; it cannot be "
                'combined with uniform_query_len (set "adaptive": false)'
            )
        if self.draft_lora is not None and not os.path.isdir(self.draft_lora):
            raise ValueError(f"idlm: draft_lora {self.draft_lora!r} is not a directory")

    @property
    def adaptive_on(self) -> bool:
        return self.adaptive is True or isinstance(self.adaptive, dict)

    @property
    def adaptive_settings(self) -> dict[str, Any]:
        """The object form's settings ({} for `true` or `false`)."""
        return dict(self.adaptive) if isinstance(self.adaptive, dict) else {}

    @property
    def lookup_on(self) -> bool:
        return self.lookup is not None

    @property
    def lookup_ngram(self) -> tuple[int, int]:
        return tuple(self.lookup[:2]) if self.lookup else DEFAULT_LOOKUP_NGRAM

    @property
    def lookup_recent(self) -> int:
        return self.lookup[2] if self.lookup and len(self.lookup) > 2 else 0

    @property
    def num_slots(self) -> int:
        """Draft slots vLLM schedules per step: K drafts + K MASKs."""
        return 2 * self.num_drafts

    @property
    def max_drafts(self) -> int:
        """The most real drafts a step verifies: 2K - 1, where a lookup's continuation takes
        the slots of the MASK-row drafts it replaces and leaves at least one MASK slot
        (MASK-row drafts alone are at most K)."""
        return 2 * self.num_drafts - 1

    @classmethod
    def from_user(cls, spec: dict[str, Any]) -> IsdOptions:
        spec = {k.replace("-", "_"): v for k, v in spec.items()}
        unknown = set(spec) - _ISD_KEYS - _PASSTHROUGH_KEYS
        if unknown:
            raise ValueError(
                f"idlm: unknown speculative-config key(s) {sorted(unknown)}; "
                f"accepted: {sorted(_ISD_KEYS | _PASSTHROUGH_KEYS)}"
            )
        if "num_speculative_tokens" not in spec:
            raise ValueError("idlm: num_speculative_tokens (K, drafts per step) is required")
        return cls(
            num_drafts=spec["num_speculative_tokens"],
            draft_lora=spec.get("draft_lora"),
            uniform_query_len=bool(spec.get("uniform_query_len", False)),
            adaptive=_dashes_to_underscores(spec.get("adaptive")),
            lookup=_lookup(_dashes_to_underscores(spec.get("lookup"))),
            passthrough={k: spec[k] for k in _PASSTHROUGH_KEYS if k in spec},
        )

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> IsdOptions:
        data = dict(data)
        data["ks"] = tuple(data.get("ks", ()))
        if data.get("lookup") is not None:
            data["lookup"] = tuple(data["lookup"])
        return cls(**data)

    def resolved(self, mask_token_id: int, trained_strides: tuple[int, ...]) -> IsdOptions:
        """With the checkpoint's MASK id and the K values a request may use: the strides
        N it was trained for, as K = N - 1 up to num_speculative_tokens (all of 1..K when
        the checkpoint does not say)."""
        ks = sorted({n - 1 for n in trained_strides if 1 <= n - 1 <= self.num_drafts})
        data = self.to_dict()
        data["mask_token_id"] = int(mask_token_id)
        data["ks"] = tuple(ks or range(1, self.num_drafts + 1))
        return IsdOptions.from_dict(data)
