"""The one seam between vllm-idlm and vLLM's internals.

Everything private of vLLM the plugin patches, calls, subclasses or reads is listed once, with
why and the test that fails when it breaks, in `seam.table`; nothing else in `vllm_idlm` imports
vLLM beyond its public API (`tests/seam/test_seam.py` scans for it). The rest of the package
gets vLLM's symbols from `seam.vllm`, patches through `seam.patch` (one idempotent way, applied
from the table as vLLM's modules load) and reads the model runner through `seam.runner.RunnerView`.

`table`, `signature` and `sources` import nothing of vLLM: `tools/check_vllm_seam.py` checks the
table against another vLLM release's sources without installing it.
"""
