"""Bad input fails early with an error that names the problem."""

from __future__ import annotations

import dataclasses
import json

import pytest

from idlm_training.cli import main
from idlm_training.config import ConvertConfig, CorpusConfig, ModelShape, TrainConfig
from idlm_training.convert import convert
from idlm_training.corpus import load_corpus
from idlm_training.tokenizer import ensure_mask_token


def test_unknown_corpus_path(tmp_path):
    with pytest.raises(ValueError, match="does not exist"):
        load_corpus(CorpusConfig(paths=(str(tmp_path / "nope"),)))


def test_empty_corpus_directory(tmp_path):
    with pytest.raises(ValueError, match="matched no files"):
        load_corpus(CorpusConfig(paths=(str(tmp_path),)))


def test_stride_below_two():
    with pytest.raises(ValueError, match="stride must be >= 2"):
        ConvertConfig(strides=(1, 2))


def test_seq_len_shorter_than_a_block():
    with pytest.raises(ValueError, match="shorter than a block"):
        ConvertConfig(strides=(2, 8)).check_seq_len(6)


def test_bad_head_dim_and_heads():
    with pytest.raises(ValueError, match="head_dim"):
        ModelShape(head_dim=48)
    with pytest.raises(ValueError, match="divisible"):
        ModelShape(num_heads=3, num_kv_heads=2)


def test_unconvertible_architecture(tmp_path, tiny_base_dir):
    base = tmp_path / "gpt2"
    base.mkdir()
    cfg = json.loads((tiny_base_dir / "config.json").read_text())
    cfg["model_type"] = "gpt2"
    (base / "config.json").write_text(json.dumps(cfg))
    with pytest.raises(ValueError, match="model_type 'gpt2' cannot be converted"):
        convert(
            base,
            [],
            ConvertConfig(),
            TrainConfig(steps=1, seq_len=16),
            tmp_path / "out",
            tmp_path / "work",
        )


def test_tokenizer_without_rights_for_a_new_token(tiny_tokenizer):
    class SlowTokenizer:
        is_fast = False

        def get_vocab(self):
            return {"a": 0}

    with pytest.raises(ValueError, match="cannot take a new special token"):
        ensure_mask_token(SlowTokenizer(), 10)


def _plain_tokenizer():
    """A fast tokenizer without MASK: ids a=0, b=1, <eos>=2."""
    from tokenizers import Tokenizer, models
    from transformers import PreTrainedTokenizerFast

    vocab = {"a": 0, "b": 1, "<eos>": 2}
    return PreTrainedTokenizerFast(
        tokenizer_object=Tokenizer(models.WordLevel(vocab, unk_token="a")), eos_token="<eos>"
    )


def test_mask_token_reuses_a_spare_row():
    """Like Qwen3 (151669 inside 151936 rows): the new id lands in the padded matrix."""
    plan = ensure_mask_token(_plain_tokenizer(), model_vocab_size=8)
    assert plan.added and plan.mask_token_id == 3 and plan.new_vocab_size == 8


def test_mask_token_grows_a_full_matrix():
    plan = ensure_mask_token(_plain_tokenizer(), model_vocab_size=3)
    assert plan.mask_token_id == 3 and plan.new_vocab_size == 4


def test_existing_mask_token_is_kept(tiny_tokenizer, mask_id):
    plan = ensure_mask_token(tiny_tokenizer, model_vocab_size=320)
    assert not plan.added and plan.mask_token_id == mask_id


def test_cli_reports_errors_without_traceback(tmp_path, capsys):
    code = main(
        [
            "convert",
            "--base",
            str(tmp_path / "missing"),
            "--out",
            str(tmp_path / "o"),
            "--recipe",
            "tiny",
        ]
    )
    assert code == 2
    assert "has no config.json" in capsys.readouterr().err


def test_cli_strides_error(tmp_path, capsys):
    assert (
        main(
            [
                "lora",
                "--base",
                str(tmp_path),
                "--out",
                str(tmp_path / "o"),
                "--recipe",
                "tiny",
                "--strides",
                "1",
            ]
        )
        == 2
    )
    assert "stride must be >= 2" in capsys.readouterr().err


def test_train_config_rejects_nonsense():
    with pytest.raises(ValueError, match="steps"):
        dataclasses.replace(TrainConfig(), steps=0)
