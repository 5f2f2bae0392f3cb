"""Structured output (guided decoding) that composes with speculative drafting, on
`llguidance <https://github.com/guidance-ai/llguidance>`_.

A request's constraint is :attr:`SamplingParams.guided
<fastdeploy_mtp.runtime.sampling_params.SamplingParams.guided>` (see :mod:`.grammar`: what it
may be, how it compiles, how a bad one is refused before it reaches an engine).

Per runner, :class:`GuidedSlots` keeps one ``LLMatcher`` per slot whose request has a
constraint, in the state "the request's generated tokens so far", and per step:

1. :meth:`GuidedSlots.prepare` (before the target step): each decoding slot's drafts are
   checked with ``validate_tokens``; the drafts past the longest grammar-valid prefix are
   cut (the runner trims them with :func:`~fastdeploy_mtp.runtime.input_batch.limit_drafts`
   before the forward, so verification only ever sees valid drafts). Then one token mask
   per logit row of the slot: row ``i`` is the matcher's mask after drafts ``1..i``
   (consume the draft, compute the next mask, ... and ``rollback`` them all at the end).
   A prefill's final chunk has one row: the mask of the state before any output.
2. :meth:`GuidedSlots.apply` (in the target's token choice): disallowed tokens of each row get
   ``-inf`` before the argmax or the seeded sampler, so the target's tokens (and logprobs)
   come from the masked distribution, as without speculation.
3. :meth:`GuidedSlots.advance` (after verification): the matcher consumes the tokens the
   step emitted for the slot. The rejected drafts were never consumed (step 1 rolled every
   draft back), so after a rejection the matcher is exactly at "output so far".
4. In the MTP proposer's round that follows, each substep's draft logits are masked per
   constrained slot (:meth:`GuidedSlots.mask_drafts`: the mask after the drafts this round
   already proposed for it), the matcher consumes the draft (:meth:`GuidedSlots.take_drafts`),
   and :meth:`GuidedSlots.end_drafts` rolls every matcher back to "output so far" and drops
   the drafts past a chain's end (an EOS draft, a complete grammar). So MTP drafts are always
   grammar-valid; step 1 cuts only drafts that do not see the grammar (the n-gram hybrid's,
   the model-free drafters').
5. After the proposer's round (every method's, and a round that skips the MTP layer),
   :meth:`GuidedSlots.offer_forced` puts the tokens each decoding slot's grammar forces next
   ahead of its drafts (:mod:`.guided_forced`); step 1 never cuts them, and the step after
   counts them offered and accepted in :class:`~fastdeploy_mtp.runtime.guided_stats.GuidedStats`.

Ids the tokenizer does not have (the model's padded vocabulary) are never allowed; the
model's EOS ids are allowed where the grammar may end, and are the only ones once it is
complete, so a finished constraint ends the request with EOS (finish reason ``"stop"``),
also on a model whose EOS id is a padded column it never scores (:meth:`GuidedSlots.apply`).
Everything here is deterministic on the host: with tensor parallelism every rank computes the
same cuts and masks.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any

import numpy as np

from .grammar import grammar_of
from .guided_drafts import DraftChain, GuidedDrafting
from .guided_forced import GuidedForcing
from .guided_stats import GuidedStats
from .guided_tokens import ll_tokenizer, masked_logits
from .request import InvalidRequestError, Request, RequestType

if TYPE_CHECKING:
    from ..config import FDConfig


class GuidedSlots(GuidedDrafting, GuidedForcing):
    """The grammar matchers of one runner's slots (see the module docstring).

    Args:
        model_dir: the model folder whose ``tokenizer.json`` the matchers tokenize with
            (``fd_config.model_config.model``; empty: constrained requests are refused).
        vocab_size: ``V``, the logits' width (the model's padded vocabulary).
        eos_ids: the model's EOS ids (allowed where the grammar may end, with the tokenizer
            folder's); the first is what a row left with no allowed finite logit emits.
    """

    def __init__(self, model_dir: str, vocab_size: int, eos_ids: Sequence[int]):
        self.folder = model_dir
        self.vocab_size = int(vocab_size)
        self.eos_ids = tuple(int(t) for t in eos_ids)
        self.matchers: dict[int, Any] = {}
        #: per slot, this step's masks: ``[rows, ceil(V / 32)]`` int32 bitmasks (bit set = allowed)
        self.masks: dict[int, np.ndarray] = {}
        self.stats = GuidedStats()
        #: grammar-aware MTP drafting: per constrained slot, its drafts of the current round,
        #: and the mask row its draft of the current substep was sampled under
        self._chains: dict[int, DraftChain] = {}
        self._draft_masks: dict[int, np.ndarray] = {}
        self._running = np.zeros(0, np.int64)  # the draft slots of the current substep's rows
        #: forced drafts (:class:`~fastdeploy_mtp.runtime.guided_forced.GuidedForcing`)
        self._advanced: set[int] = set()
        self._forced: dict[int, list[int]] = {}
        self._offered: dict[int, list[int]] = {}

    @classmethod
    def for_model(cls, fd_config: FDConfig, config: Any) -> GuidedSlots:
        """The matchers of a runner of the model whose config is ``config`` (its logits are
        ``config.vocab_size`` wide) under ``fd_config`` (the model folder and EOS ids of its
        ``model_config``); the serving engine builds the same from the folder's architecture
        to check a task before the workers get it."""
        mc = fd_config.model_config
        eos = [t for t in [*mc.eos_token_id, *getattr(config, "eos_token_ids", ())] if int(t) >= 0]
        return cls(mc.model, int(getattr(config, "vocab_size", mc.vocab_size)), eos)

    def tokenizer(self) -> Any:
        """The cached ``LLTokenizer`` (raises ``ValueError``/``TokenizerFileError`` when there
        is no model folder, or its tokenizer cannot serve the model)."""
        if not self.folder:
            raise ValueError(
                "needs the model folder's tokenizer: fd_config.model_config.model is not set"
            )
        return ll_tokenizer(self.folder, self.vocab_size, self.eos_ids)

    def matcher(self, guided: dict[str, Any]) -> Any:
        """A fresh ``LLMatcher`` for a constraint (``ValueError`` naming the grammar's problem)."""
        from llguidance import LLMatcher

        matcher = LLMatcher(self.tokenizer(), grammar_of(guided), log_level=0)
        if matcher.is_error():
            raise ValueError(" ".join(matcher.get_error().split())[:500])
        return matcher

    def _matcher_after(self, guided: dict[str, Any], output_token_ids: Sequence[int]) -> Any:
        """A matcher for ``guided`` that consumed ``output_token_ids`` (``ValueError`` when
        they do not match the grammar)."""
        matcher = self.matcher(guided)
        if output_token_ids and not matcher.consume_tokens([int(t) for t in output_token_ids]):
            raise ValueError(
                f"the tokens generated so far do not match the grammar ({matcher.get_error()})"
            )
        return matcher

    # ---- slots ---------------------------------------------------------------------------
    @staticmethod
    def _starts(req: Request) -> bool:
        """Whether ``req``'s task starts its request in the slot (a prompt's first chunk, or a
        splitwise import)."""
        return req.is_first_chunk or req.task_type == RequestType.IMPORT

    def check_task(self, req: Request) -> None:
        """Raise :class:`~fastdeploy_mtp.runtime.request.InvalidRequestError` (field
        ``guided``) if a task starting a constrained request cannot get a matcher here (the
        model folder's tokenizer cannot serve the model, the grammar does not compile, or a
        handed-over request's tokens do not match it)."""
        if req.sampling.guided is None or not self._starts(req):
            return
        try:
            self._matcher_after(req.sampling.guided, req.output_token_ids)
        except ValueError as exc:
            raise InvalidRequestError(req.request_id, "guided", str(exc)) from None

    def load(self, req: Request) -> None:
        """A loaded task: where it starts its request, the slot's matcher starts (after the
        request's ``output_token_ids``: those a prefill instance handed over)."""
        if self._starts(req):
            self.start(req.idx, req.sampling.guided, req.output_token_ids)

    def start(
        self, idx: int, guided: dict[str, Any] | None, output_token_ids: Sequence[int] = ()
    ) -> None:
        """Slot ``idx`` starts a request: a matcher in the state after ``output_token_ids``
        (a splitwise import's first tokens; empty for a new request), or none without a
        constraint."""
        self.drop(idx)
        if guided is None:
            return
        t0 = time.perf_counter()
        self.matchers[idx] = self._matcher_after(guided, output_token_ids)
        self.stats.seconds += time.perf_counter() - t0

    def drop(self, idx: int) -> None:
        """Slot ``idx`` no longer holds a constrained request."""
        self.matchers.pop(idx, None)
        self.masks.pop(idx, None)
        self._advanced.discard(idx)
        self._forced.pop(idx, None)
        self._offered.pop(idx, None)

    # ---- one step ------------------------------------------------------------------------
    def cut_drafts(
        self, target: Any, skip: set[int], limit: Callable[[Any, np.ndarray], None]
    ) -> None:
        """Before the target step over ``target`` (the runner's ``share_inputs``): :meth:`prepare`
        on its host copies, then ``limit(target, limits)`` (the runner's ``limit_drafts``) when a
        draft was cut. Nothing happens without a constrained slot."""
        if not self.matchers:
            return
        limits = self.prepare(
            target.draft_tokens.numpy(),
            target.seq_lens_this_time.numpy().astype(np.int64),
            target.seq_lens_encoder.numpy().astype(np.int64),
            skip,
        )
        if limits is not None:
            limit(target, limits)

    def prepare(
        self, draft_tokens: np.ndarray, slt: np.ndarray, enc: np.ndarray, skip: set[int]
    ) -> np.ndarray | None:
        """Before the target step: cut each constrained decoding slot's drafts to their
        grammar-valid prefix and compute its rows' masks.

        Args:
            draft_tokens: ``[N, K + 1]`` int64 host copy of ``share_inputs.draft_tokens``
                (column 0 the last token, then the drafts).
            slt, enc: ``[N]`` host ``seq_lens_this_time`` / ``seq_lens_encoder``.
            skip: slots whose prefill chunk is not the last (their one row is thrown away).

        Returns:
            ``[N]`` int64 draft limits for :func:`limit_drafts` when a draft was cut (other
            slots keep ``K``), else ``None``.
        """
        t0 = time.perf_counter()
        self.masks, self._offered = {}, {}
        k = int(draft_tokens.shape[1]) - 1
        limits: np.ndarray | None = None
        for idx, matcher in self.matchers.items():
            n = int(slt[idx])
            if n == 0 or idx in skip:
                continue
            drafts: list[int] = []
            if enc[idx] == 0:
                drafts = [int(t) for t in draft_tokens[idx, 1:n]]
                valid = int(matcher.validate_tokens(drafts)) if drafts else 0
                self.stats.checked += len(drafts)
                if valid < len(drafts):
                    self.stats.cut += len(drafts) - valid
                    if limits is None:
                        limits = np.full(draft_tokens.shape[0], k, np.int64)
                    limits[idx] = valid
                    drafts = drafts[:valid]
                self._count_offered(idx, drafts)
            self.masks[idx] = self._row_masks(matcher, drafts)
        self._forced = {}
        self.stats.seconds += time.perf_counter() - t0
        return limits

    def _row_masks(self, matcher: Any, drafts: list[int]) -> np.ndarray:
        """``[len(drafts) + 1, ceil(V / 32)]`` int32: row ``i`` the mask after ``drafts[:i]``
        (all grammar-valid); the matcher is rolled back to where it was."""
        from llguidance.numpy import allocate_token_bitmask, fill_next_token_bitmask

        masks = allocate_token_bitmask(len(drafts) + 1, self.vocab_size)
        for i in range(len(drafts) + 1):
            if i:
                matcher.consume_token(drafts[i - 1])
            fill_next_token_bitmask(matcher, masks, i)
        if drafts:
            matcher.rollback(len(drafts))
        return masks

    def apply(self, logits: Any, slots: np.ndarray, positions: np.ndarray) -> Any:
        """``logits`` ``[R, V]`` (Paddle, the rows of ``slots`` at ``positions`` within their
        slot, as :class:`~fastdeploy_mtp.runtime.spec_step.LogitRows`) with each constrained
        row's disallowed tokens at ``-inf``; unchanged when no row is constrained."""
        if not self.masks:
            return logits
        import paddle

        t0 = time.perf_counter()
        r, v = int(logits.shape[0]), int(logits.shape[1])
        packed = np.full([r, (v + 31) // 32], -1, np.int32)
        for row, (b, j) in enumerate(zip(slots, positions)):
            masks = self.masks.get(int(b))
            if masks is not None:
                packed[row] = masks[int(j)]
        masked = masked_logits(logits, packed)
        # A row left with no finite logit (a complete grammar allows only EOS, and the model's
        # EOS id may be a padded column at -inf; or a matcher in error) emits the first EOS id:
        # decided on the device, nothing is read back.
        ending = np.full([1, v], float("-inf"), np.float32)
        ending[0, self.eos_ids[0]] = 0.0
        stuck = paddle.isinf(masked.max(axis=-1, keepdim=True))
        out = paddle.where(
            stuck, paddle.to_tensor(ending).astype(masked.dtype).expand_as(masked), masked
        )
        self.stats.seconds += time.perf_counter() - t0
        return out

    def advance(self, accept_tokens: np.ndarray, accept_num: np.ndarray) -> GuidedStats:
        """After verification: each constrained slot's matcher consumes the tokens it emitted
        (``accept_tokens[b, :accept_num[b]]``, host ``[N, K + 1]`` / ``[N]``). Returns the
        step's grammar work (and starts counting the next step's)."""
        t0 = time.perf_counter()
        self._advanced = set()
        for idx, matcher in self.matchers.items():
            emitted = int(accept_num[idx])
            if emitted > 0 and idx in self.masks:
                matcher.consume_tokens([int(t) for t in accept_tokens[idx, :emitted]])
                self._count_accepted(idx, accept_tokens[idx, :emitted])
                self._advanced.add(idx)
        self.masks = {}
        if self.matchers:
            self.stats.seconds += time.perf_counter() - t0
        stats, self.stats = self.stats, GuidedStats()
        return stats
