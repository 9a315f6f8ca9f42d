"""End-to-end accuracy of DCP attention: a transformers model whose attention runs DCP-style
(KV sharded over N ranks, partials merged through dcp_a2a), logit parity against the unsharded
model, and GSM8K through lm-eval. See docs/evals.md."""
