"""Per-question records of a GSM8K run, and the paired statistics of two runs computed from
them.

A run's samples (``samples_<backend>.jsonl``) hold the generated text; its record in
``results.json`` keeps, per question, what pairing needs and no more (so a committed results
file is enough to recompute every paired number but the token-prefix agreement)::

    {"doc_id": 17,                                  # index in GSM8K's test split
     "strict-match": {"answer": "18", "correct": 1.0},
     "flexible-extract": {"answer": "18", "correct": 1.0},
     "generation_sha256": "5f0c..."}                # first 16 hex digits of sha256(UTF-8 text)

:func:`paired` takes either form: answers and correctness give agreement, flips and McNemar's
exact test; equal texts (or hashes, 64 bits: a chance collision among 1,319 questions has
probability ~1e-13) give identical generations; the token-prefix agreement needs both texts and
the model's tokenizer, and is None without them.
"""

from __future__ import annotations

import hashlib

FILTERS = ("strict-match", "flexible-extract")
HASH_HEX = 16


def generation_hash(text: str) -> str:
    """The first :data:`HASH_HEX` hex digits of the SHA-256 of ``text`` in UTF-8."""
    return hashlib.sha256(text.encode("utf-8")).hexdigest()[:HASH_HEX]


def question_records(samples: list[dict]) -> list[dict]:
    """The per-question records (module docstring) of a run's samples, in doc_id order."""
    return [{"doc_id": s["doc_id"], **{f: dict(s[f]) for f in FILTERS},
             "generation_sha256": _hash_of(s)}
            for s in sorted(samples, key=lambda s: s["doc_id"])]


def _hash_of(s: dict) -> str:
    return generation_hash(s["generation"]) if "generation" in s else s["generation_sha256"]


def em_interval(records: list[dict], f: str, confidence: float = 0.95) -> tuple[float, float]:
    """The Wilson score interval of the exact-match rate under filter ``f`` of a run's records
    (scipy.stats.binomtest's proportion_ci): (low, high); NaNs for no records."""
    from scipy.stats import binomtest

    if not records:
        return float("nan"), float("nan")
    right = sum(int(r[f]["correct"] > 0) for r in records)
    ci = binomtest(right, len(records)).proportion_ci(confidence, method="wilson")
    return ci.low, ci.high


def paired(base: dict, other: dict, tokenizer=None) -> dict:
    """Per-question paired statistics of ``other`` against ``base`` on their common doc ids.

    Each run is ``{"samples": [...]}`` of samples or records (module docstring). Per filter:
    answer agreement, flips right->wrong and wrong->right, McNemar's exact p (two-sided
    binomial test on the discordant pairs, scipy.stats.binomtest); identical generations (the
    fraction of questions with the same text); token-prefix agreement (tokens up to the first
    difference over the longer generation, 1 for identical ones; None unless both runs carry
    their texts and ``tokenizer`` is given)."""
    from scipy.stats import binomtest

    a = {s["doc_id"]: s for s in base["samples"]}
    b = {s["doc_id"]: s for s in other["samples"]}
    ids = sorted(set(a) & set(b))
    out: dict = {"n": len(ids)}
    for f in FILTERS:
        agree = sum(a[i][f]["answer"] == b[i][f]["answer"] for i in ids)
        lost = sum(a[i][f]["correct"] > b[i][f]["correct"] for i in ids)  # base right, other wrong
        gained = sum(a[i][f]["correct"] < b[i][f]["correct"] for i in ids)
        p = binomtest(lost, lost + gained, 0.5).pvalue if lost + gained else 1.0
        out[f] = {"answer_agreement": agree / len(ids) if ids else float("nan"),
                  "flips_right_to_wrong": lost, "flips_wrong_to_right": gained,
                  "mcnemar_exact_p": p}
    same = [_hash_of(a[i]) == _hash_of(b[i]) for i in ids]
    out["identical_generations"] = sum(same) / len(ids) if ids else float("nan")
    texts = all("generation" in a[i] and "generation" in b[i] for i in ids)
    out["token_prefix_agreement"] = (_prefix_agreement([a[i]["generation"] for i in ids],
                                                       [b[i]["generation"] for i in ids],
                                                       tokenizer)
                                     if texts and tokenizer is not None and ids else None)
    return out


def _prefix_agreement(texts_a: list[str], texts_b: list[str], tokenizer) -> float:
    fractions = []
    for x, y in zip(texts_a, texts_b):
        ta = tokenizer(x, add_special_tokens=False)["input_ids"]
        tb = tokenizer(y, add_special_tokens=False)["input_ids"]
        k = 0
        while k < min(len(ta), len(tb)) and ta[k] == tb[k]:
            k += 1
        # identical generations (also two empty ones) agree fully
        fractions.append(1.0 if x == y else k / max(len(ta), len(tb), 1))
    return sum(fractions) / len(fractions)
