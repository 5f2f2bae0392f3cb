"""Draft fidelity through ``fastdeploy-mtp serve``: a greedy completion's verified drafts
(``include_draft_logprobs``) and tokens, round for round, beside a reference's rounds
(:mod:`fastdeploy_mtp.checks.reference`).

A served choice lists one step per round that verified drafts: ``position`` (the output index
of the round's first token) and the drafts' token ids. A reference round ``i`` verified its
``drafts`` at the position that is the number of tokens the rounds before it emitted, so the
two lists are equal exactly when every round's drafts are, at the same place in the output;
the emitted tokens are compared through their logprob token strings.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor

from fastdeploy_mtp.checks.reference import Reference, Round
from tests.support.fidelity_cases import fidelity_prompts
from tests.support.servers import http_post

Steps = list[tuple[int, tuple[int, ...]]]


def expected_steps(rounds: Sequence[Round]) -> Steps:
    """``(position, drafts)`` of every reference round that verified drafts."""
    steps: Steps = []
    position = 0
    for r in rounds:
        if r.drafts:
            steps.append((position, tuple(r.drafts)))
        position += len(r.tokens)
    return steps


def served_round(
    base_url: str, model: str, prompt_ids: list[int], max_tokens: int
) -> tuple[list[str], Steps]:
    """(logprob token strings, ``(position, draft ids)`` per step) of one greedy completion of
    ``prompt_ids`` (token ids, sent as they are)."""
    body = {
        "model": model,
        "prompt": prompt_ids,
        "max_tokens": max_tokens,
        "temperature": 0,
        "logprobs": 0,
        "include_draft_logprobs": True,
    }
    status, answer = http_post(base_url + "/v1/completions", body, timeout=180)
    assert status == 200, answer
    choice = answer["choices"][0]
    steps = [
        (s["position"], tuple(d["token_id"] for d in s["drafts"])) for s in choice["draft_logprobs"]
    ]
    return choice["logprobs"]["tokens"], steps


def check_served_drafts(
    base_url: str,
    model: str,
    prompts: Sequence[list[int]],
    max_tokens: int,
    reference_rounds: Callable[[list[int]], list[Round]],
    token_string: Callable[[int], str],
    label: str,
) -> int:
    """Send every prompt at once (so the server batches them) and assert that each response's
    tokens and per-round drafts equal ``reference_rounds(prompt)``'s. Returns the number of
    rounds that verified drafts (so a caller can check that drafting happened)."""
    with ThreadPoolExecutor(len(prompts)) as pool:
        served = list(pool.map(lambda p: served_round(base_url, model, p, max_tokens), prompts))
    verified = 0
    for i, (prompt, (tokens, steps)) in enumerate(zip(prompts, served)):
        rounds = reference_rounds(prompt)
        want_tokens = [token_string(t) for r in rounds for t in r.tokens]
        assert tokens == want_tokens, (
            f"{label} prompt {i}: served tokens differ from the reference's"
        )
        want = expected_steps(rounds)
        for j, (got, exp) in enumerate(zip(steps, want)):
            assert got == exp, (
                f"{label} prompt {i}: drafting step {j} differs: served {got}, reference {exp}"
            )
        assert len(steps) == len(want), (
            f"{label} prompt {i}: {len(steps)} drafting steps served, {len(want)} expected"
        )
        verified += len(steps)
    return verified


def check_family_drafts_served(
    base_url: str,
    folder: str,
    *,
    k: int,
    label: str,
    max_tokens: int = 32,
    ref: Reference | None = None,
) -> None:
    """:func:`check_served_drafts` of the :func:`fidelity_prompts` on a server of ``folder``
    drafting ``k`` tokens a round, against transformers: its own ``generate(use_mtp=True)``
    for ``k`` = 1, its MTP layer chained by the engine's stated rule for ``k`` > 1. Asserts
    too that drafting ran through the requests. ``ref``: the folder's reference when the
    caller already loaded it (default: loaded here)."""
    from fastdeploy_mtp.models.folder_inspection import folder_config
    from fastdeploy_mtp.tokenization import load_tokenizer

    if ref is None:
        ref = Reference(folder)
    stops = tuple(t for t in folder_config(folder).eos_token_ids if t >= 0)

    def rounds(prompt: list[int]) -> list[Round]:
        if k == 1:
            return ref.generate_rounds(prompt, max_tokens, 1, stop_ids=stops)
        return ref.chained_rounds(prompt, max_tokens, k, stop_ids=stops)

    prompts = fidelity_prompts()
    tokenizer = load_tokenizer(folder)
    verified = check_served_drafts(
        base_url, folder, prompts, max_tokens, rounds, tokenizer.token_string, label
    )
    assert verified >= len(prompts) * 4, f"{label}: only {verified} rounds verified drafts"
