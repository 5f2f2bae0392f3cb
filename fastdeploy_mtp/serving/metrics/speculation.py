"""The speculation and structured-output series of ``/metrics``, read from the engine's
:class:`~fastdeploy_mtp.runtime.engine_metrics.Metrics`.

Speculative decoding, under FastDeploy's ``fastdeploy:spec_decode_*`` prefix with vLLM's
metric names after it:

* ``fastdeploy:spec_decode_num_draft_tokens_total`` — drafts offered to the target for
  verification (placeholders not counted);
* ``fastdeploy:spec_decode_num_accepted_tokens_total`` — drafts the target accepted;
* ``..._per_pos_total{position="i"}`` — the same per draft position ``i = 1..K``. A draft at
  position ``i`` is only accepted if the drafts before it were, so accepted / offered at ``i``
  is cumulative (the share of rounds whose drafts ``1..i`` were all accepted), and accepted at
  ``i`` / accepted at ``i - 1`` is the rate conditional on draft ``i - 1`` having been
  accepted;
* ``fastdeploy:spec_decode_num_emitted_tokens_total`` — tokens emitted by decode steps
  (accepted drafts plus the target's own token per step);
* ``fastdeploy:spec_decode_num_decode_steps_total`` — (request, target forward) pairs that
  decoded;
* ``fastdeploy:spec_decode_mean_accepted_length`` — emitted / decode steps: tokens per
  request per target forward (1.0 = no gain from speculation);
* ``fastdeploy:spec_decode_num_draft_tokens_by_method_total{method="m"}`` and
  ``..._num_accepted_tokens_by_method_total`` — the drafts offered / accepted, by the method
  that made them (``"mtp"``, ``"ngram"``, ``"suffix"``; ``"grammar"`` for a round whose drafts
  are only a grammar's forced tokens): with the draft planner (``adaptive_draft_length``) each
  request's method of each round, otherwise the engine's. They sum to the two totals above;
* ``fastdeploy:spec_decode_num_forced_draft_tokens_total`` — drafts a constrained request's
  grammar forced (its only continuation, placed ahead of the method's drafts) that were offered
  to the target; ``fastdeploy:spec_decode_num_accepted_forced_draft_tokens_total`` — those
  the target accepted. Both are also inside ``num_draft_tokens`` / ``num_accepted_tokens``
  (which count every verified draft), so the method's own drafts are the difference.

Every speculation series carries a ``method`` label, the engine's
``speculative_config.method`` (``"mtp"``, ``"ngram"``, ``"suffix"``, ``"naive"``, or
``"none"`` without speculation), e.g.
``fastdeploy:spec_decode_num_draft_tokens_total{method="ngram"}``. Structured output
(``response_format``, ``guided_*``; see :mod:`~fastdeploy_mtp.runtime.guided`):

* ``fastdeploy:guided_drafts_checked_total`` — drafts of constrained requests checked against
  their grammar before verification;
* ``fastdeploy:guided_drafts_cut_total`` — of those, drafts cut before verification (past the
  longest grammar-valid prefix); they are not in the ``spec_decode`` counters;
* ``fastdeploy:guided_seconds_total`` — host seconds in grammar work (draft checks, token
  masks, advancing the matchers);
* ``fastdeploy:guided_rounds_total`` — target steps that did grammar work: seconds / rounds
  is the grammar overhead per round.
"""

from __future__ import annotations

from collections.abc import Iterator

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric

from ...runtime.engine_metrics import Metrics
from .families import PREFIX, counter


def spec_decode_metrics(m: Metrics) -> Iterator[Metric]:
    """The speculation series, each labelled with the engine's drafting ``method``."""
    proposed, accepted = [int(v) for v in m.proposed], [int(v) for v in m.accepted]
    method = [m.method]

    def by_method(name: str, doc: str, value: float) -> CounterMetricFamily:
        family = CounterMetricFamily(PREFIX + name, doc, labels=["method"])
        family.add_metric(method, value)
        return family

    yield by_method(
        "spec_decode_num_draft_tokens",
        "Draft tokens offered to the target for verification, by drafting method.",
        sum(proposed),
    )
    yield by_method(
        "spec_decode_num_accepted_tokens",
        "Draft tokens the target accepted, by drafting method.",
        sum(accepted),
    )
    per_pos = CounterMetricFamily(
        PREFIX + "spec_decode_num_draft_tokens_per_pos",
        "Draft tokens offered at each draft position (1 = first draft), by drafting method.",
        labels=["method", "position"],
    )
    acc_pos = CounterMetricFamily(
        PREFIX + "spec_decode_num_accepted_tokens_per_pos",
        "Draft tokens accepted at each draft position, by drafting method. A draft at position i "
        "is accepted only if drafts 1..i-1 were: accepted/offered at i is cumulative, "
        "accepted(i)/accepted(i-1) the rate conditional on draft i-1 being accepted.",
        labels=["method", "position"],
    )
    for i, (p, a) in enumerate(zip(proposed, accepted), start=1):
        per_pos.add_metric([m.method, str(i)], p)
        acc_pos.add_metric([m.method, str(i)], a)
    yield per_pos
    yield acc_pos
    emitted_doc = (
        "Tokens emitted by decode steps (accepted drafts + the target's own token per step), by "
        "drafting method."
    )
    yield by_method("spec_decode_num_emitted_tokens", emitted_doc, m.emitted_tokens)
    yield by_method(
        "spec_decode_num_decode_steps",
        "(request, target forward) pairs that decoded, by drafting method.",
        m.decode_item_steps,
    )
    yield by_method(
        "spec_decode_num_forced_draft_tokens",
        "Draft tokens a constrained request's grammar forced, offered to the target (also "
        "counted in spec_decode_num_draft_tokens), by drafting method.",
        m.forced_drafts_proposed,
    )
    yield by_method(
        "spec_decode_num_accepted_forced_draft_tokens",
        "Grammar-forced draft tokens the target accepted (also counted in "
        "spec_decode_num_accepted_tokens), by drafting method.",
        m.forced_drafts_accepted,
    )
    gauge = GaugeMetricFamily(
        PREFIX + "spec_decode_mean_accepted_length",
        "Emitted tokens per decoding request per target forward (1.0 = no speculation gain), by "
        "drafting method.",
        labels=["method"],
    )
    gauge.add_metric(method, m.mean_accepted_length)
    yield gauge
    yield from _method_mix(m)


def _method_mix(m: Metrics) -> Iterator[Metric]:
    """Drafts offered and accepted by the method that made them (the planner's method mix)."""
    for i, (name, doc) in enumerate(
        (
            ("spec_decode_num_draft_tokens_by_method", "Draft tokens offered"),
            ("spec_decode_num_accepted_tokens_by_method", "Draft tokens accepted"),
        )
    ):
        family = CounterMetricFamily(
            PREFIX + name,
            f"{doc}, by the method that made them (with the draft planner: each request's "
            "method of each round).",
            labels=["method"],
        )
        for method, counts in sorted(m.method_drafts.items()):
            family.add_metric([method], counts[i])
        yield family


def guided_metrics(m: Metrics) -> Iterator[Metric]:
    for name, doc, value in (
        (
            "guided_drafts_checked",
            "Drafts of grammar-constrained requests checked against their grammar before "
            "verification.",
            m.guided_drafts_checked,
        ),
        (
            "guided_drafts_cut",
            "Drafts of grammar-constrained requests cut before verification (past the "
            "grammar-valid prefix).",
            m.guided_drafts_cut,
        ),
        (
            "guided_seconds",
            "Host seconds in grammar work (draft checks, token masks, matchers).",
            m.guided_seconds,
        ),
        (
            "guided_rounds",
            "Target steps that did grammar work (a constrained request ran).",
            m.guided_rounds,
        ),
    ):
        yield counter(name, doc, value)
