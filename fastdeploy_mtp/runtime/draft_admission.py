"""The draft planner's admission of requests (the base of
:class:`~.draft_planner.DraftPlanner`): a new request's acceptance estimates, its pinned
method, and whether the MTP layer sees it at all (a request it does not see costs no prompt
forward, and drafts with the model-free methods all its life)."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from .draft_acceptance import AcceptanceEstimates
from .draft_methods import METHODS, method_code
from .request import Request
from .step_costs import batch_class

MTP = METHODS.index("mtp")
#: One in this many requests that a batch-size class's verdict keeps from the MTP layer sees
#: it anyway, so that the verdict is measured again.
VERDICT_ADMISSIONS = 64


class Admission(AcceptanceEstimates):
    """Per-slot admission state over :class:`~.draft_acceptance.AcceptanceEstimates` (the
    same arguments).

    Attributes:
        pin: ``[N]`` a pinned method code, ``NO_METHOD``, or :attr:`FREE`.
        no_mtp: ``[N]`` admitted without the MTP layer (the MTP proposer shares the array).
        mtp_won: per batch-size class (:func:`~.step_costs.batch_class`): whether an MTP mode
            won the last decision that rated one there against the other modes.
        active: ``[N]`` the slots running at the last plan, and those admitted since.
    """

    #: a mode replaces the one in force (and an MTP mode wins a class) only when its rate
    #: is this much better
    HYSTERESIS = 0.1
    #: :attr:`pin` of a request whose method the planner chooses
    FREE = -2

    def __init__(
        self, k: int, num_slots: int, window: int, methods: tuple[int, ...], mtp_fill: bool
    ):
        super().__init__(k, num_slots, window, methods, mtp_fill)
        self.pin = np.full(num_slots, self.FREE, np.int64)
        self.no_mtp = np.zeros(num_slots, bool)
        self.mtp_won: dict[int, bool] = {}
        self.active = np.zeros(num_slots, bool)
        self._judged: dict[int, int] = {}  # per class, the requests its "no" kept out

    def reset_slot(self, idx: int, pinned: str | None = None, with_mtp: bool | None = None) -> None:
        """A new request in slot ``idx``: the estimates over every request so far (1 before
        any draft was scored); ``pinned`` its own method (``speculative_method``), None to let
        the planner choose. ``with_mtp``: whether the MTP layer sees the request (its prompt
        and every token after; if not, it drafts with the model-free methods all its life);
        None: decided here: yes if it pins ``"mtp"``, no if it pins another method, else as
        :meth:`_mtp_pays` says."""
        self.p[:, idx] = self.prior
        self.active[idx] = True
        code = method_code(pinned)
        self.pin[idx] = self.FREE if code is None else code
        if with_mtp is None:
            with_mtp = code == MTP or (code is None and self._mtp_pays())
        self.no_mtp[idx] = not with_mtp

    def admit(self, prefills: Sequence[Request]) -> None:
        """This step's prefill chunks: :meth:`reset_slot` for each request's first chunk
        (with its ``speculative_method``), after counting them all as running, so that a
        burst is admitted at the batch size it makes, not at the size before it. A request
        whose prefix-cache hit holds no MTP KV is admitted without the MTP layer."""
        first = [req for req in prefills if req.is_first_chunk]
        self.active[[int(req.idx) for req in first]] = True
        for req in first:  # (a prefix without MTP KV keeps the MTP layer out)
            seen = False if req.prefix_without_mtp else None
            self.reset_slot(int(req.idx), req.sampling.speculative_method, with_mtp=seen)

    def _mtp_pays(self) -> bool:
        """At admission: whether the MTP layer should see the request: as :attr:`mtp_won`
        says for this batch size's class; unrated there, no if it lost at the nearest smaller
        class rated (drafting with a model pays less as the batch grows), else yes (so that
        its modes get measured). Of the requests a class's "no" keeps out, every
        :data:`VERDICT_ADMISSIONS`-th is let in, so that the verdict is measured again (by
        one request, not by a whole burst)."""
        here = batch_class(int(self.active.sum()))
        if here not in self.mtp_won:
            smaller = [c for c in self.mtp_won if c < here]
            return not smaller or self.mtp_won[max(smaller)]
        if self.mtp_won[here]:
            return True
        self._judged[here] = self._judged.get(here, 0) + 1
        return self._judged[here] % VERDICT_ADMISSIONS == 0

    def note_rates(self, rates: dict[int, float], as_if_seen: dict[int, float]) -> None:
        """A decision's expected rates by mode: the verdict on the MTP modes (:attr:`mtp_won`)
        at the current batch size, when it rated one of them and another mode. An MTP mode
        is judged by its rate as if the MTP layer saw every running request (``as_if_seen``,
        by mode, where some request is not seen): the requests it does not see would
        otherwise make it look worse than it is."""
        mtp = [as_if_seen.get(mode, r) for mode, r in rates.items() if mode >= 1]
        other = [r for mode, r in rates.items() if mode < 1]
        if mtp and other:
            here = batch_class(int(self.active.sum()))
            self.mtp_won[here] = max(mtp) >= max(other) * (1.0 + self.HYSTERESIS)
