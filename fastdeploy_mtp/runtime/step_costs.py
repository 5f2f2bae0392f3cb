"""The draft planner's step-cost model: a step's wall time as a plane in the running slots and
the verified drafts, fitted per mode (see :mod:`.draft_planner`)."""

from __future__ import annotations

import numpy as np


def batch_class(m: int) -> int:
    """The class of batch size ``m`` the draft planner's admission rule keeps its verdicts
    by: ``round(log2(m))``."""
    return int(round(np.log2(max(m, 1))))


class StepCosts:
    """``t(m, D) = a + b m + c D`` per mode (index ``0 .. modes - 1``) and batch-size class
    (:func:`batch_class`): exponentially weighted least squares, its slopes pulled by a weak
    ridge toward ``b = mean(t) / mean(m)`` (a batch size seen rarely is extrapolated in
    proportion) and ``c = 0`` (a draft costs nothing until measured). A sample more than twice
    as slow or fast as a settled estimate is clipped to that factor (a busy machine); against
    an unsettled one it restarts the fit. A step's cost per slot falls with the batch size,
    so each class keeps its own planes: a batch that shrinks as its requests finish does not
    overwrite the planes of the size it started at. A class without a plane borrows its
    neighbour's (one class away); further away nothing is extrapolated (the planner measures).
    The fit is solved when a sample arrives; a prediction is then three multiplications."""

    DECAY = 0.95
    OUTLIER = 2.0
    SETTLED = 3.0
    RIDGE = 0.5

    def __init__(self, modes: int):
        self.modes = modes
        #: per class, per mode: decayed sums of (1, m, D, t, m^2, D^2, m D, m t, D t)
        self.stats: dict[int, np.ndarray] = {}
        #: per class, per mode: the fitted plane ``(mean m, mean D, mean t, slope m, slope D)``
        self.fits: dict[int, list[tuple[float, float, float, float, float] | None]] = {}

    def _fit(self, cls: int, mode: int) -> None:
        w, sm, sd, st, smm, sdd, smd, smt, sdt = (float(v) for v in self.stats[cls][mode])
        if w < 0.5:
            self.fits[cls][mode] = None
            return
        mm, md, mt = sm / w, sd / w, st / w
        # the ridge's prior: slots in proportion, drafts free (see the class docstring)
        a11 = smm / w - mm * mm + self.RIDGE
        a22 = sdd / w - md * md + self.RIDGE
        a12 = smd / w - mm * md
        b1 = smt / w - mm * mt + self.RIDGE * mt / max(mm, 1e-9)
        b2 = sdt / w - md * mt
        det = a11 * a22 - a12 * a12
        self.fits[cls][mode] = (
            mm,
            md,
            mt,
            (b1 * a22 - b2 * a12) / det,
            (a11 * b2 - a12 * b1) / det,
        )

    def fit_of(self, mode: int, m: float) -> tuple[float, float, float, float, float] | None:
        """The plane ``mode`` is predicted with at ``m`` slots: its class's, else a
        neighbouring class's; None when neither was measured."""
        cls = batch_class(int(round(m)))
        for near in (cls, cls - 1, cls + 1):
            fits = self.fits.get(near)
            if fits is not None and fits[mode] is not None:
                return fits[mode]
        return None

    def predict(self, mode: int, m: float, d: float) -> float | None:
        """Estimated seconds of a step (None when ``mode`` was not measured near ``m``)."""
        fit = self.fit_of(mode, m)
        if fit is None:
            return None
        mm, md, mt, bm, bd = fit
        # a plane fitted over a narrow range can cross zero far from it: never below a quarter
        # of the estimate in proportion to the slots
        return max(mt + bm * (m - mm) + bd * (d - md), 0.25 * mt * m / max(mm, 1e-9), 1e-9)

    def row_cost(self, mode: int, m: float) -> float:
        """Seconds one more draft adds at ``m`` slots (the fitted ``c``, at least 0; 0 when
        unmeasured)."""
        fit = self.fit_of(mode, m)
        return max(fit[4], 0.0) if fit is not None else 0.0

    def record(self, mode: int, m: int, d: int, seconds: float) -> None:
        cls = batch_class(m)
        if cls not in self.stats:
            self.stats[cls] = np.zeros((self.modes, 9), np.float64)
            self.fits[cls] = [None] * self.modes
        st = self.stats[cls][mode]
        fit = self.fits[cls][mode]
        estimate = None if fit is None else self.predict(mode, m, d)
        if (
            estimate is not None
            and not estimate / self.OUTLIER <= seconds <= estimate * self.OUTLIER
        ):
            if st[0] < self.SETTLED:
                st[:] = 0.0
            else:
                seconds = min(max(seconds, estimate / self.OUTLIER), estimate * self.OUTLIER)
        st *= self.DECAY
        st += (1.0, m, d, seconds, m * m, d * d, m * d, m * seconds, d * seconds)
        self._fit(cls, mode)
