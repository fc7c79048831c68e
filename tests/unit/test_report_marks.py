"""The HTML report marks the word behind a likelihood verdict: a claim's fact conflict is wrapped in <mark>, its title
and a note saying what the text made the judge expect."""

from offline_sumscore.io.report import render


def test_a_conflict_is_marked_in_the_claims_text():
    row = {
        "id": "wrong-fact",
        "metric": "two-axis",
        "score": 0.0,
        "alignment": 0.0,
        "coverage": 1.0,
        "reason": "...",
        "claims": [
            {
                "claim": "Marta Ruiz, 27, lost the final.",
                "supported": False,
                "p_supported": 0.26,
                "conflict": {"word": "27", "expected_word": "17", "p_expected": 0.98, "pmi": -4.1},
            },
            {"claim": "It <rained>.", "supported": True, "p_supported": 0.9},
        ],
        "questions": ["She is 17."],
        "coverage_verdicts": [{"answered": True, "p_answered": 0.8}],
    }
    page = render([row])
    assert '<mark class="conflict" title="the text makes the judge expect &#39;17&#39; (p 0.98)">27</mark>' in page
    assert "Marta Ruiz, <mark" in page and "(&#39;27&#39;: the text makes" in page
    assert "It &lt;rained&gt;." in page and page.count("<mark") == 1  # escaped, and nothing else marked
