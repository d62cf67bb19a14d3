"""vLLM 0.34.0's own serving path as the oracle for draftdata's server views (issue 26).

``benchmarks/vllm_oracle.py`` runs each of the corpus's raw model outputs through vLLM's real
request adjustment, detokenizer, reasoning and tool parsers and message assembly (installed by
``make install`` into its own venv, ``.venv/vllm``, from the pins in tests/vllm-oracle.txt:
vLLM 0.34.0 wants an older transformers than draftdata). Each response is read back by
draftdata and rebuilt, and the rebuilt ids are compared id for id with the raw output's.

What must hold:

- draftdata's own request to a vLLM server asks ``return_token_ids``: every answer comes back
  with the model's ids, exact, whether or not the profile's lossless fields are overridden;
- for text-only views (ids not offered: a proxy in front, an older vLLM without it), every view whose
  ids differ carries a ``lossy:`` label that speaks of the part where they diverge, except the
  two cases below, which no text can tell: vLLM's parser grammar matches a marker's *text*, so
  marker text the model typed as ordinary tokens is consumed as a marker and deleted from the
  content (``"The <|eot_id|> token"`` comes back as ``"The  token"``). The response's own
  ``usage`` (vLLM's count of the model's ids) tells those: they carry ``count_mismatch``, and
  no exact view does (issue 55)."""

from __future__ import annotations

from collections import Counter

import pytest

from servers import oracle_rows

#: typed marker text that vLLM's parsers delete from the content: invisible in any text view
DELETED_TEXT = {"q3-typed-think-in-content", "llama-typed-eot"}


@pytest.fixture(scope="module")
def rows(tmp_path_factory):
    return oracle_rows("vllm_oracle.py", tmp_path_factory.mktemp("oracle"))


def test_the_corpus_covers_every_parser_and_request(rows):
    cases = {r["case"] for r in rows}
    assert len(cases) >= 80
    parsers = Counter(r["parser"] for r in rows)
    assert set(parsers) >= {"qwen3", "qwen3.5", "kimi-k2", "kimi-k2-added", "deepseek-r1",
                            "deepseek-v3.1", "llama3"}  # fmt: skip
    assert not [r for r in rows if r["class"] == "vllm_error"]


@pytest.mark.parametrize("variant", ["ids", "ids-default"])
def test_draftdatas_request_gets_every_answer_exact(rows, variant):
    sel = [r for r in rows if r["variant"] == variant]
    assert sel
    assert Counter(r["class"] for r in sel) == {"exact": len(sel)}


@pytest.mark.parametrize("variant", ["profile", "default"])
def test_text_views_are_exact_or_labelled_where_they_diverge(rows, variant):
    sel = [r for r in rows if r["variant"] == variant]
    # the text deleted by vLLM's parsers is invisible in the text, and the response's own
    # usage (vLLM's count of the model's ids) shows it: none is silent, and the counts never
    # flag an exact view (issue 55)
    silent = sorted({r["case"] for r in sel if r["class"] == "SILENT_WRONG"})
    assert silent == []
    assert not [r["case"] for r in sel if r["class"] == "COUNT_FALSE"]
    caught = {r["case"] for r in sel if r["class"] == "count_caught"}
    assert caught >= DELETED_TEXT, caught
    unnamed = [
        (r["case"], r["labels"], r["where"])
        for r in sel
        if r["class"] == "lossy_wrong" and not r["label_names_divergence"]
    ]
    assert unnamed == []
    print(
        f"{variant}: {len(sel)} views, {len(caught)} caught by their counts alone: {sorted(caught)}"
    )


def test_the_deleted_text_is_deleted_by_vllm_not_by_draftdata(rows):
    """The two silent cases: vLLM's own response has lost the typed text (two spaces where
    ``" <marker> "`` was), so no reader of its text could give the ids back."""
    for r in rows:
        if r["case"] in DELETED_TEXT and r["variant"] == "profile":
            assert "  " in r["view"]["content"], r["view"]
