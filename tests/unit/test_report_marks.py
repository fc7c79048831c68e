"""The HTML report marks the word behind a likelihood verdict: a claim's fact conflict is wrapped in <mark>, its title
and a note saying what the text made the judge expect; a failed verdict without a conflict, its weakest word."""

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


def test_a_failed_verdict_without_a_conflict_marks_its_weakest_word_and_a_passed_one_marks_nothing():
    def evidence(token, word, expected):
        return {"token": token, "word": word, "at": 3, "pmi": -5.7, "p": 0.003, "expected": expected, "p_expected": 0.9}

    row = {
        "id": "abstractive",
        "metric": "two-axis",
        "score": 0.0,
        "alignment": 0.5,
        "coverage": 0.0,
        "reason": "...",
        "claims": [
            {
                "claim": "The team lost in 2024.",
                "supported": False,
                "p_supported": 0.2,
                "evidence": evidence(" lost", "lost", " won"),
            },
            {
                "claim": "It rained.",
                "supported": True,
                "p_supported": 0.8,
                "evidence": evidence(" rained", "rained", " snowed"),
            },
        ],
        "questions": ["Sales rose by 4 million."],
        "coverage_verdicts": [{"answered": False, "p_answered": 0.1, "evidence": evidence(" ", "4", " four")}],
    }
    page = render([row])
    assert (
        'The team <mark class="weakest" title="the word the text explains least (PMI -5.7 nats); the judge expected '
        '&#39;won&#39; (p 0.90)">lost</mark> in 2024.' in page
    )
    assert 'Sales rose by <mark class="weakest"' in page and ">4</mark> million." in page
    assert page.count("<mark") == 2 and "snowed" not in page  # the supported claim is left unmarked


def test_the_cli_names_the_weakest_word_never_a_bare_whitespace_token():
    from offline_sumscore.cli.judges import evidence_text

    spaced = {"token": " ", "word": "4", "pmi": -1.4, "p": 0.001, "expected": " new", "p_expected": 0.9}
    spaced["expected_word"] = "new"
    assert evidence_text(spaced).startswith("'4' (PMI -1.4 nats") and "token" not in evidence_text(spaced)
    piece = {"token": "20", "word": "2014", "pmi": -2.0, "p": 0.01, "expected": "19", "p_expected": 0.8}
    piece["expected_word"] = "1914"
    assert evidence_text(piece).startswith("'2014' (token '20', PMI -2.0") and "expected '1914'" in evidence_text(piece)
