"""`python -m vllm_idlm.rollouts`: the command line of `cli.py`."""

import sys

from vllm_idlm.rollouts.cli import main

if __name__ == "__main__":  # vLLM starts worker processes: keep the entry point guarded
    sys.exit(main())
