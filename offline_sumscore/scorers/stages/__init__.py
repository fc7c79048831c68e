"""The stages both metrics ask for, one module a kind: its prompt, its grammar (the schema its reply must fit), how
its reply is read, and its audit key's reading. What every stage shares (the system messages, the fence, the
schemas' building blocks) is in core/prompts.py and core/schemas.py.

claims.py      the summary (or a part of it) -> atomic claims
questions.py   the source (or a piece of it) -> closed questions: the two-axis metric's, and Ragas-style ones drawn
               with its keyphrases
keyphrases.py  the source (or a piece of it) -> its names, dates, amounts (Ragas-style)
answers.py     one question against the summary alone -> "1" or "0" (Ragas-style)
verdict.py     one statement (or question) against one text -> a verdict and its P(yes): a yes-no request, or a
               likelihood request with its baseline (PMI per token against the threshold)
likelihood.py  the likelihood verdict's fact-conflict rules (which token of a statement conflicts with the text)
"""
