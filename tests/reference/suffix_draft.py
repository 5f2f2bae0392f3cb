"""Reference of suffix decoding's draft (contract: the module docstring of
``fastdeploy_mtp.proposer.suffix`` and docs/architecture.md, "The suffix structure").

Written as the suffix trie the method is defined by: every window of at most ``D`` tokens
of each sequence is counted (a window never spans two sequences); the match is the longest
suffix of the context, at most ``D - 1`` tokens, whose window has a continuation (a counted
window one token longer); the draft walks the most frequent continuation (the smaller token
on a tie) while the product of ``count(child) / sum(count(children))`` stays at or above
``min_token_prob``, for at most ``min(K, int(factor * m))`` tokens and while the window is
at most ``D`` tokens long. Brute force over a dictionary of counts: slow, and obviously so.
"""

from __future__ import annotations

from collections import Counter


def window_counts(seqs: list[list[int]], depth: int) -> Counter:
    """Every window of at most ``depth`` tokens of each sequence, with its count."""
    out: Counter = Counter()
    for seq in seqs:
        for end in range(1, len(seq) + 1):
            for n in range(1, min(depth, end) + 1):
                out[tuple(seq[end - n : end])] += 1
    return out


def _children(counts: Counter, window: tuple[int, ...]) -> dict[int, int]:
    return {w[-1]: c for w, c in counts.items() if len(w) == len(window) + 1 and w[:-1] == window}


def suffix_draft_reference(
    seqs: list[list[int]],
    context: list[int],
    depth: int,
    k: int,
    factor: float,
    min_prob: float,
) -> tuple[list[int], list[float], int]:
    """(tokens, probabilities, match length) of the draft for ``context`` from ``seqs``."""
    counts = window_counts(seqs, depth)
    match = None
    for m in range(min(len(context), depth - 1), 0, -1):
        window = tuple(context[len(context) - m :])
        if counts.get(window, 0) and _children(counts, window):
            match = (window, m)
            break
    if match is None:
        return [], [], 0
    window, m = match
    tokens: list[int] = []
    probs: list[float] = []
    prob = 1.0
    while len(tokens) < min(k, int(factor * m)) and len(window) < depth:
        kids = _children(counts, window)
        if not kids:
            break
        token, count = max(kids.items(), key=lambda kv: (kv[1], -kv[0]))
        prob *= count / sum(kids.values())
        if prob < min_prob:
            break
        tokens.append(token)
        probs.append(prob)
        window = window + (token,)
    return tokens, probs, m
