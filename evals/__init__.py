"""End-to-end accuracy of DCP attention: a transformers model whose attention runs DCP-style
(KV sharded over N ranks, partials merged through dcp_a2a), logit parity against the unsharded
model, and GSM8K through lm-eval. See docs/evals.md."""

# dcp_a2a decides at import time whether Triton is interpreted (no CUDA); import it before
# transformers can import triton.
import dcp_a2a  # noqa: E402,F401
