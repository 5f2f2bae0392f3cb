"""The reference a model folder's MTP drafts are checked against: transformers' own classes
(torch, float32, eager attention, CPU), loaded from the folder as transformers loads it.

Two references, both greedy and batch 1:

* :meth:`Reference.generate_rounds` -- transformers' ``generate(use_mtp=True)`` itself (its MTP
  candidate generator and its ``MtpModel``), with each round's drafts recorded as the
  generator hands them to the verifier. It drafts one token per MTP layer, so it is the
  reference for ``K = 1`` (and ``K = num_nextn_predict_layers`` where the family feeds the next
  layer the normed output, as transformers does).
* :meth:`Reference.chained_rounds` -- ``K`` drafts chained out of transformers' MTP modules by
  the rule the engine states for the family
  (:data:`fastdeploy_mtp.models.hf_config.MTP_CHAIN_DEFAULT`):
  substep ``j`` at position ``c - 1 + j`` is fed the draft of substep ``j - 1`` (the newest
  committed token for ``j = 1``) and the previous substep's output -- the MTP block's output
  before its final norm (``pre_norm``) or after it (``post_norm``). One MTP layer is reused for
  every substep over one causal sequence (its earlier rows teacher-forced: true tokens and the
  target's hidden states); with several layers, substep ``j`` runs layer ``j`` over the
  sequence rolled by one token, as transformers' ``MtpModel`` chains its layers.

Each returns :class:`Round` s: what one engine step emits and the drafts it verified. The
target's greedy sequence comes from transformers' ``generate`` without MTP; ids the folder's
tokenizer does not have (a padded vocabulary) are suppressed in the target and in the drafts,
as the engine masks them.

torch and transformers are imported on first use: they are test dependencies
(``pip install ".[test]"``), not serving ones.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import os
from collections.abc import Iterator
from typing import Any

import numpy as np

from ..models.folder_inspection import folder_config
from .transformers_models import (
    ReferenceUnavailable,
    import_transformers,
    load_mtp,
    load_target,
    quiet,
)


@dataclasses.dataclass(frozen=True)
class Round:
    """One engine step of a request: ``tokens`` it emitted, ``drafts`` it verified (empty for the
    prefill step)."""

    tokens: tuple[int, ...]
    drafts: tuple[int, ...]


def rounds_from_drafts(
    seq: list[int],
    prompt_len: int,
    max_tokens: int,
    drafts: list[list[int]],
    k: int,
    stop_ids: tuple[int, ...] = (),
) -> list[Round]:
    """The rounds of a greedy speculative run whose output is ``seq[prompt_len:]`` (at least
    ``max_tokens`` tokens) and whose decode rounds drafted ``drafts[r]``: round 0 (the prefill)
    emits ``seq[L]``; a round after ``seq[c]`` emits the accepted drafts (the leading ones equal
    to ``seq[c+1], ...``) and the target's token after them, never past ``max_tokens``. The
    output ends early at its first id in ``stop_ids`` (the model's EOS ids), that id included.
    As the engine's ops do, a round drafts only while its ``k`` drafts and the target's token
    after them fit before ``max_tokens``; closer to the end it emits one token
    without drafts (``drafts[r]`` is then not used)."""
    limit = prompt_len + max_tokens  # the ops stop drafting by max_tokens, not by an EOS ahead
    stops = [i for i in range(prompt_len, limit) if seq[i] in stop_ids]
    end = stops[0] + 1 if stops else limit
    rounds = [Round((seq[prompt_len],), ())]
    c = prompt_len
    for d in [*drafts, *([[]] * max_tokens)]:  # a reference may stop drafting at the tail
        if c + 1 >= end:
            break
        d = [int(t) for t in d] if limit - c - 1 > k else []
        accepted = 0
        while accepted < len(d) and d[accepted] == seq[c + 1 + accepted]:
            accepted += 1
        n = min(accepted + 1, end - c - 1)
        rounds.append(Round(tuple(seq[c + 1 : c + 1 + n]), tuple(d)))
        c += n
    return rounds


class Reference:
    """transformers' target and MTP layers of the folder ``path`` (float32, eager, eval).

    Attributes:
        family: our family name (``config.model_type``).
        num_mtp_layers: the folder's ``num_nextn_predict_layers``.
        chain: ``"pre_norm"`` or ``"post_norm"``: what substep ``j + 1`` is fed (the engine's rule
            for this folder).
        vocab: ids below it can be produced (``ori_vocab_size``: the tokenizer's vocabulary
            when the model's is padded beyond it).
    """

    def __init__(self, path: str | os.PathLike[str]):
        torch, transformers = import_transformers()
        quiet(transformers)
        self.path = os.fspath(path)
        with open(os.path.join(self.path, "config.json")) as f:
            raw = json.load(f)
        config = folder_config(self.path)  # the conventions the engine reads from the folder
        self.family = config.model_type
        self.num_mtp_layers = config.num_nextn_predict_layers
        self.chain = "pre_norm" if config.mtp_final_norm == "in_logits" else "post_norm"
        self.mask_first_position = config.mtp_mask_first_position
        self.vocab_size = config.vocab_size
        self.vocab = config.ori_vocab_size
        self.target = load_target(self.path, raw, self.family, torch, transformers)
        self.mtp = (
            load_mtp(self.path, self.family, self.target, self.num_mtp_layers)
            if self.num_mtp_layers
            else None
        )
        self._torch = torch

    # ---- the target ------------------------------------------------------------------------

    def _generation_config(self, n: int, **extra: Any) -> Any:
        from transformers import GenerationConfig

        padded = list(range(self.vocab, self.vocab_size))
        return GenerationConfig(
            max_new_tokens=n,
            do_sample=False,
            eos_token_id=None,
            pad_token_id=0,
            suppress_tokens=padded or None,
            **extra,
        )

    def greedy(self, prompt_ids: list[int], n: int) -> list[int]:
        """``n`` greedy tokens after ``prompt_ids`` from transformers' ``generate`` (no EOS
        stop)."""
        torch = self._torch
        with torch.no_grad(), _folder_defaults_hidden(self.target):
            out = self.target.generate(
                _ids(torch, prompt_ids), generation_config=self._generation_config(n)
            )
        return [int(t) for t in out[0, len(prompt_ids) :]]

    def hidden(self, ids: list[int]) -> Any:
        """The target's last hidden state after its final norm, ``[S, H]`` float32 (torch)."""
        with self._torch.no_grad():
            return self.target.model(input_ids=_ids(self._torch, ids)).last_hidden_state[0]

    # ---- drafts ----------------------------------------------------------------------------

    def generate_rounds(
        self, prompt_ids: list[int], max_tokens: int, k: int = 1, stop_ids: tuple[int, ...] = ()
    ) -> list[Round]:
        """The rounds of transformers' ``generate(use_mtp=True)`` with its first ``k`` MTP layers
        (one draft per layer), drafts recorded per round as its candidate generator proposes
        them."""
        if self.mtp is None:
            raise ReferenceUnavailable(
                f"{self.path}: the folder has no MTP layer (num_nextn_predict_layers 0)"
            )
        if not 1 <= k <= self.num_mtp_layers:
            raise ReferenceUnavailable(
                "generate(use_mtp=True) drafts one token per MTP layer: k must be in "
                f"1..{self.num_mtp_layers}"
            )
        torch = self._torch
        from transformers.generation import candidate_generator as cg
        from transformers.modeling_layers import MtpModel

        recorded: list[list[int]] = []
        original = cg.MTPCandidateGenerator.get_candidates

        def record(gen: Any, input_ids: Any, *args: Any, **kwargs: Any) -> Any:
            ids, logits = original(gen, input_ids, *args, **kwargs)
            if logits is not None:
                recorded.append([int(t) for t in ids[0, input_ids.shape[1] :]])
            return ids, logits

        mtp, cfg = self.mtp, self.target.config
        saved = (mtp.layers, mtp.num_mtp_layers, cfg.num_mtp_layers)
        own = MtpModel.__dict__.get("from_pretrained")  # None: inherited, restored by deleting ours
        try:
            mtp.layers, mtp.num_mtp_layers = mtp.layers[:k], k
            cfg.num_mtp_layers = k
            cfg.mtp_layer_types = ["full_attention"] * k
            # the candidate generator loads the MTP layers itself: hand it the ones loaded here
            setattr(MtpModel, "from_pretrained", classmethod(lambda _cls, *a, **kw: mtp))  # noqa: B010
            setattr(cg.MTPCandidateGenerator, "get_candidates", record)  # noqa: B010
            gen = self._generation_config(max_tokens, use_mtp=True)
            with torch.no_grad(), _folder_defaults_hidden(self.target):
                out = self.target.generate(_ids(torch, prompt_ids), generation_config=gen)
        finally:
            setattr(cg.MTPCandidateGenerator, "get_candidates", original)  # noqa: B010
            mtp.layers, mtp.num_mtp_layers, cfg.num_mtp_layers = saved
            if own is None:
                delattr(MtpModel, "from_pretrained")
            else:
                setattr(MtpModel, "from_pretrained", own)  # noqa: B010
            cfg.mtp_layer_types = ["full_attention"] * self.num_mtp_layers
        seq = [int(t) for t in out[0]]
        return rounds_from_drafts(seq, len(prompt_ids), max_tokens, recorded, k, stop_ids)

    def chained_rounds(
        self, prompt_ids: list[int], max_tokens: int, k: int, stop_ids: tuple[int, ...] = ()
    ) -> list[Round]:
        """The rounds of a greedy run drafting ``k`` tokens a round, chained by :attr:`chain`
        (see the module doc). ``k`` above the number of layers reuses a single layer only."""
        if self.mtp is None:
            raise ReferenceUnavailable(
                f"{self.path}: the folder has no MTP layer (num_nextn_predict_layers 0)"
            )
        if self.num_mtp_layers > 1 and k > self.num_mtp_layers:
            raise ReferenceUnavailable(
                "the chained reference runs at most one substep per layer (k <= "
                f"{self.num_mtp_layers})"
            )
        prompt = [int(t) for t in prompt_ids]
        seq = prompt + self.greedy(prompt, max_tokens + k + 1)
        hidden = self.hidden(seq)
        limit = len(prompt) + max_tokens
        stops = [i for i in range(len(prompt), limit) if seq[i] in stop_ids]
        end = stops[0] + 1 if stops else limit
        drafts: list[list[int]] = []
        c = len(prompt)
        while c + 1 < end:
            d = self.draft(seq, hidden, c, k) if limit - c - 1 > k else []
            drafts.append(d)
            accepted = 0
            while accepted < len(d) and d[accepted] == seq[c + 1 + accepted]:
                accepted += 1
            c += min(accepted + 1, end - c - 1)
        return rounds_from_drafts(seq, len(prompt), max_tokens, drafts, k, stop_ids)

    def draft(self, seq: list[int], hidden: Any, c: int, k: int) -> list[int]:
        """The ``k`` drafts proposed after ``seq[c]`` (the newest committed token), given the
        target's hidden states ``hidden [>= c, H]`` of ``seq``."""
        torch = self._torch
        assert self.mtp is not None
        tokens = list(seq[1 : c + 1])  # t_{p+1} for p = 0 .. c-1
        states = hidden[:c]
        start = 0
        out: list[int] = []
        for j in range(k):
            layer = j if self.num_mtp_layers > 1 else 0
            pre, post = self._run_layer(layer, tokens, states, start)
            logits = self.mtp._project_to_logits(post[-1:])[0].float()
            logits[self.vocab :] = float("-inf")
            d = int(torch.argmax(logits))
            out.append(d)
            chained = pre if self.chain == "pre_norm" else post
            if self.num_mtp_layers > 1:  # the next layer: the sequence rolled by one token
                tokens, states, start = tokens[1:] + [d], chained, start + 1
            else:  # the same layer one position on, its earlier rows unchanged (causal)
                tokens, states = tokens + [d], torch.cat([states, chained[-1:]], 0)
        return out

    def _run_layer(self, index: int, tokens: list[int], states: Any, start: int) -> tuple[Any, Any]:
        """MTP layer ``index`` over ``tokens`` at positions ``start ..`` fed ``states``; returns
        its output ``[S, H]`` before and after its final norm."""
        torch = self._torch
        assert self.mtp is not None
        layer = self.mtp.layers[index]
        ids = _ids(torch, tokens)
        positions = torch.arange(start, start + len(tokens)).unsqueeze(0)
        with torch.no_grad():
            embeds = self.mtp.embed_tokens(ids)
            if self.mask_first_position:
                embeds = torch.where(
                    (positions == 0).unsqueeze(-1), torch.zeros_like(embeds), embeds
                )
            saved = layer.use_post_norm
            layer.use_post_norm = False
            try:
                pre = self.mtp.forward_layer(
                    index, states.unsqueeze(0), positions, None, inputs_embeds=embeds
                )[0]
            finally:
                layer.use_post_norm = saved
            post = layer.post_norm(pre) if layer.post_norm is not None else pre
            if self.mtp.use_shared_post_norm:  # forward_layer applied it to `pre` already
                post = pre
        return pre, post


@contextlib.contextmanager
def _folder_defaults_hidden(target: Any) -> Iterator[None]:
    """``generate`` fills unset fields (EOS among them) from the folder's generation config:
    hide it so that only the given config counts."""
    from transformers import GenerationConfig

    saved, target.generation_config = target.generation_config, GenerationConfig()
    try:
        yield
    finally:
        target.generation_config = saved


def _ids(torch: Any, ids: list[int]) -> Any:
    return torch.as_tensor(np.asarray([list(ids)], dtype=np.int64))
