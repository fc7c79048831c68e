from offline_sumscore.core.coverage_items import distinct_questions, key_sentences, summary_sentences

SOURCE = (
    "The council of Lindford approved a new library on Mill Street on Tuesday. It will open in 2027. "
    "Building it will cost 4 million pounds. Local schools welcomed the plan."
)


def test_generic_questions_are_dropped_with_the_reason():
    kept, dropped = distinct_questions(
        ["What is the most important fact?", "Is the main point mentioned?", "Will the library open in 2027?"]
    )
    assert kept == ["Will the library open in 2027?"]
    assert [d["question"] for d in dropped] == ["What is the most important fact?", "Is the main point mentioned?"]
    assert all(d["why"].startswith("generic") for d in dropped)


def test_a_specific_question_is_kept_even_when_the_source_does_not_answer_it():
    assert distinct_questions(["Did the volcano erupt?", "Was it 5?"]) == (["Did the volcano erupt?", "Was it 5?"], [])


def test_repeated_and_reworded_questions_count_once_but_a_changed_number_does_not_merge():
    kept, dropped = distinct_questions(
        [
            "Will the library open in 2027?",
            "Will the library open in 2027?",
            "In 2027, will the library open?",
            "Will the library cost 4 million pounds?",
            "Will the library open in 2028?",
        ]
    )
    assert kept == [
        "Will the library open in 2027?",
        "Will the library cost 4 million pounds?",
        "Will the library open in 2028?",
    ]
    assert [d["why"] for d in dropped] == ["duplicate of question 1: 'Will the library open in 2027?'"] * 2


def test_key_sentences_are_the_first_sentences_of_four_words_or_more():
    assert key_sentences(SOURCE, 2) == [
        "The council of Lindford approved a new library on Mill Street on Tuesday.",
        "It will open in 2027.",
    ]
    assert len(key_sentences(SOURCE, 10)) == 4  # every sentence, no more
    assert key_sentences("Short. Too short. This one has enough words.", 3) == ["This one has enough words."]
    # a source of short sentences only still gives items: its sentences, not nothing (and not the text cut short)
    assert key_sentences("Sales rose.  Costs   fell. Ok.", 2) == ["Sales rose.", "Costs fell."]


def test_summary_sentences_collapse_whitespace_and_drop_empty_ones():
    assert summary_sentences("One  fact.\n\nTwo facts here.  ") == ["One fact.", "Two facts here."]


def test_a_list_summary_gives_a_claim_per_item_without_markers_emphasis_or_headings():
    summary = (
        "**Key points:**\n- Alice agreed to the **new** plan\n* Bob will send the report by Friday.\n"
        "# Next steps\n1. The budget is 4 million. It starts in March\n2) Carol leads it"
    )
    assert summary_sentences(summary) == [
        "Alice agreed to the new plan",
        "Bob will send the report by Friday.",
        "The budget is 4 million.",
        "It starts in March",
        "Carol leads it",
    ]


def test_a_line_that_goes_on_in_lower_case_continues_its_sentence():
    assert summary_sentences("The council voted\nto build a library.\nIt opens in 2027.") == [
        "The council voted to build a library.",
        "It opens in 2027.",
    ]
    # a hashtag opening a line is a claim, not a markdown heading
    assert summary_sentences("## Summary\n#MeToo grew in 2017.") == ["#MeToo grew in 2017."]
    # a long line ending in a colon is a claim, not a heading
    assert summary_sentences("The council named three reasons for the vote on Tuesday:") == [
        "The council named three reasons for the vote on Tuesday:"
    ]


def test_an_abbreviation_ends_no_sentence_and_the_pieces_still_make_the_text():
    from offline_sumscore.core.source_pieces import sentences

    text = "A crash on u.s. highway 36 at 4:45 a.m. . Mr. Smith met J. K. Rowling. The U.S. economy grew. Rain fell."
    assert "".join(sentences(text)) == text
    assert [s.strip() for s in sentences(text)] == [
        "A crash on u.s. highway 36 at 4:45 a.m. .",
        "Mr. Smith met J. K. Rowling.",
        "The U.S. economy grew.",
        "Rain fell.",
    ]
    # lower-cased, tokenized summaries (FRANK's, SummEval's) still split at their periods
    assert summary_sentences("the men left . she stayed (dr. who) .") == ["the men left .", "she stayed (dr. who) ."]


def test_a_transcript_without_sentence_punctuation_is_split_at_its_speaker_turns_and_checked_without_labels():
    from offline_sumscore.core.source_pieces import sentences

    transcript = (
        "Alice: thanks everyone for joining\nBob: hi\nAlice: the budget is four million and we start in march\n"
        "[00:01:05] Dr. Lee: I will send the report\nby friday\nSpeaker 2: that works for the whole team"
    )
    assert "".join(sentences(transcript)) == transcript
    # each turn a key sentence, without its speaker's label (the summary is not asked to restate "Alice:")
    assert key_sentences(transcript, 3) == [
        "thanks everyone for joining",
        "the budget is four million and we start in march",
        "I will send the report by friday",  # a wrapped line stays in its turn
    ]
    # one line that happens to open with "Word:" in an article is no transcript: a single line break ends nothing
    article = "The council met on Tuesday and said\nNothing: more would be added before the vote."
    assert [s.strip() for s in sentences(article)] == [
        "The council met on Tuesday and said\nNothing: more would be added before the vote."
    ]
    assert key_sentences(article, 1) == [
        "The council met on Tuesday and said Nothing: more would be added before the vote."
    ]
