"""The example scripts' console: aligned tables, and third-party chatter kept out of the demo."""

from __future__ import annotations

import subprocess
import sys
import textwrap

import pytest

from vllm_idlm.console import table


def run_script(code: str, cwd) -> subprocess.CompletedProcess:
    """`code` as a script file (vLLM's spawned processes re-run a script's top level, as they
    do the demo's), in a fresh interpreter so that this process keeps its settings."""
    script = cwd / "script.py"
    script.write_text(textwrap.dedent(code))
    return subprocess.run(
        [sys.executable, script], cwd=cwd, capture_output=True, text=True, timeout=300
    )


def test_table_columns_line_up_names_left_and_numbers_right():
    """The demo's table printed a 41-character method name into a 36-character column, so
    every column after it was pushed right on that row."""
    text = table(
        ("run", "tok/s", "=plain"),
        [("plain decoding", "12.3", "yes"), ("lossless ISD K<=3, adaptive", "7.0", "NO")],
    )
    assert text.splitlines() == [
        "run                          tok/s  =plain",
        "plain decoding                12.3     yes",
        "lossless ISD K<=3, adaptive    7.0      NO",
    ]


def test_table_refuses_a_row_with_a_missing_cell():
    with pytest.raises(ValueError, match="every row needs 3 cells"):
        table(("run", "tok/s", "=plain"), [("plain decoding", "12.3")])


def test_quiet_drops_the_named_noise_here_and_in_child_processes_but_keeps_errors(tmp_path):
    proc = run_script(
        """
        from vllm_idlm.console import quiet

        quiet()
        import logging, subprocess, sys, warnings

        logging.getLogger("vllm.triton_utils.importing").warning("an import-time notice")
        logging.getLogger("vllm.engine").error("an engine error")
        warnings.warn("resource_tracker: There appear to be 1 leaked semaphore", UserWarning)
        warnings.warn("a warning nobody named", UserWarning)
        child = '''
        import warnings
        import torch.distributed as dist
        hasattr(dist.reduce_op, "__dict__")  # as vLLM's Triton dispatcher scans modules
        warnings.warn("resource_tracker: There appear to be 2 leaked semaphores", UserWarning)
        warnings.warn("a child's warning nobody named", UserWarning)
        '''
        subprocess.run([sys.executable, "-c", child], check=True)
        """,
        tmp_path,
    )
    assert proc.returncode == 0, proc.stderr
    err = proc.stderr
    assert "an engine error" in err
    assert "a warning nobody named" in err and "a child's warning nobody named" in err
    assert "import-time notice" not in err
    assert "reduce_op" not in err and "leaked" not in err


def test_a_quiet_script_runs_a_vllm_engine_without_a_line_of_third_party_output(
    demo_models, tmp_path
):
    """The demo's answers were interleaved with "Triton is installed, but doesn't include CPU
    backend", a `reduce_op` FutureWarning, "NUMA binding" and shard-loading bars, from the
    demo's own process and from the engine processes vLLM spawned."""
    proc = run_script(
        f"""
        from vllm_idlm.console import quiet

        quiet()


        def main():
            from vllm import LLM, SamplingParams

            llm = LLM(
                model={str(demo_models["base"])!r},
                dtype="float32",
                enforce_eager=True,
                kv_cache_memory_bytes=256 << 20,
                max_model_len=256,
                use_tqdm_on_load=False,
            )
            params = SamplingParams(temperature=0.0, max_tokens=4, ignore_eos=True)
            out = llm.generate([{{"prompt_token_ids": [1, 2, 3]}}], params, use_tqdm=False)
            llm.llm_engine.engine_core.shutdown()
            print("tokens", len(out[0].outputs[0].token_ids))


        if __name__ == "__main__":
            main()
        """,
        tmp_path,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert proc.stdout == "tokens 4\n"
    assert proc.stderr == ""
