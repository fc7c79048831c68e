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


def test_summary_sentences_collapse_whitespace_and_drop_empty_ones():
    assert summary_sentences("One  fact.\n\nTwo facts here.  ") == ["One fact.", "Two facts here."]
