"""The stages both metrics ask for, one module a kind: its request (prompt and grammar, from core/prompts.py and
core/schemas.py), how its reply is read, and its audit key's reading.

claims.py      the summary (or a part of it) -> atomic claims
questions.py   the source (or a piece of it) -> closed questions
verdict.py     one statement (or question) against one text -> a verdict and its P(yes): a yes-no request, or a
               likelihood request with its baseline (PMI per token against the threshold)
likelihood.py  the likelihood verdict's fact-conflict rules (which token of a statement conflicts with the text)
"""
