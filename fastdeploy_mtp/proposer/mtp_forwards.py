"""The MTP layer's forwards for :class:`~fastdeploy_mtp.proposer.MTPProposer`: each
forward's metadata over the draft's block table and the MTP caches, the forward and the
logits of one layer (timed), and a substep's forward, which with distinct MTP layers re-reads
the accepted rows and the chain of drafts so far (each layer has its own cache)."""

from __future__ import annotations

import time

import paddle

from ..models.forward_meta import ForwardMeta
from ..models.interfaces import MTPModel
from ..runtime.spec_step import Packed
from .proposer_inputs import ProposerInputBatch


class MTPForwards:
    """The proposer's forward methods (a base of :class:`~fastdeploy_mtp.proposer.MTPProposer`,
    which sets the attributes below in its constructor and documents them).

    ``_first`` holds substep 0's inputs (ids ``[T]``, hidden rows ``[T, H]``, the item of
    each row ``[T]``, the draft's cached lengths ``[N]``) and ``_chain`` each later substep's
    (ids, hidden rows, items), while the MTP layers are distinct."""

    model: MTPModel
    model_inputs: ProposerInputBatch
    caches: list[paddle.Tensor]
    block_size: int
    seq_len_bound: int | None
    rows_bound: int | None
    overlap_round: bool
    num_mtp_layers: int
    layer_schedule: list[int]
    model_seconds: float
    _first: tuple[paddle.Tensor, paddle.Tensor, paddle.Tensor, paddle.Tensor] | None
    _chain: list[tuple[paddle.Tensor, paddle.Tensor, paddle.Tensor]]

    def _meta(
        self,
        ids: paddle.Tensor,
        cu_seqlens_q: paddle.Tensor,
        seq_lens_encoder: paddle.Tensor,
        seq_lens_decoder: paddle.Tensor,
        seq_lens_this_time: paddle.Tensor,
        max_rows_per_item: int | None,
    ) -> ForwardMeta:
        """A forward's metadata over the draft's block table and the MTP caches, with this
        round's host-known bounds; validated on the host only in rounds with a prefill."""
        return ForwardMeta(
            ids_remove_padding=ids,
            cu_seqlens_q=cu_seqlens_q,
            seq_lens_encoder=seq_lens_encoder,
            seq_lens_decoder=seq_lens_decoder,
            seq_lens_this_time=seq_lens_this_time,
            block_tables=self.model_inputs.block_tables,
            caches=self.caches,
            block_size=self.block_size,
            max_seq_len=self.seq_len_bound,
            max_rows_per_item=max_rows_per_item,
            check=not self.overlap_round,
        )

    def _forward(
        self, ids: paddle.Tensor, hidden: paddle.Tensor, meta: ForwardMeta, layer: int
    ) -> paddle.Tensor:
        t0 = time.perf_counter()
        if self.num_mtp_layers > 1:
            out = self.model(ids, hidden, meta, layer=layer)  # type: ignore[call-arg]
        else:
            out = self.model(ids, hidden, meta)
        self.model_seconds += time.perf_counter() - t0
        return out

    def _logits(self, hidden: paddle.Tensor, layer: int) -> paddle.Tensor:
        t0 = time.perf_counter()
        if self.num_mtp_layers > 1:
            out = self.model.compute_logits(hidden, None, layer=layer)  # type: ignore[call-arg]
        else:
            out = self.model.compute_logits(hidden)
        self.model_seconds += time.perf_counter() - t0
        return out

    def forward_substep(self, substep: int, packed: Packed, token_num: int) -> paddle.Tensor:
        """The MTP layer of substep ``substep`` over the packed draft tokens and the first
        ``token_num`` staged hidden rows: ``[token_num, H]``. With distinct MTP layers a
        substep after the first re-reads the accepted rows and the chain of drafts so far
        (:meth:`_chain_forward`), since its layer has its own cache."""
        draft = self.model_inputs
        multi = self.num_mtp_layers > 1
        layer = self.layer_schedule[substep]
        rows_hidden = draft.target_hidden_states[:token_num]
        if multi and substep > 0:
            self._chain.append(
                (packed.ids_remove_padding, rows_hidden.clone(), packed.batch_id_per_token)
            )
            assert self._first is not None
            return self._chain_forward(self._first, self._chain, layer, packed.batch_id_per_token)
        meta = self._meta(
            packed.ids_remove_padding,
            packed.cu_seqlens_q,
            draft.seq_lens_encoder,
            draft.seq_lens_decoder,
            draft.seq_lens_this_time,
            self.rows_bound if substep == 0 else 1,
        )
        if multi:
            dec0 = draft.seq_lens_decoder.clone()
            self._first = (
                packed.ids_remove_padding,
                rows_hidden.clone(),
                packed.batch_id_per_token,
                dec0,
            )
            self._chain = []
        return self._forward(packed.ids_remove_padding, rows_hidden, meta, layer)

    def empty_substep(self) -> None:
        self.model.empty_input_forward(None)

    def _chain_forward(
        self,
        first: tuple[paddle.Tensor, paddle.Tensor, paddle.Tensor, paddle.Tensor],
        chain: list[tuple[paddle.Tensor, paddle.Tensor, paddle.Tensor]],
        layer: int,
        batch_id_now: paddle.Tensor,
    ) -> paddle.Tensor:
        """Substep ``s >= 1`` with distinct MTP layers: run ``layer`` over, per item, the rows of
        substep 0 (accepted tokens with the target's hidden states) followed by the ``s``
        chain rows (draft ``j`` with the hidden state substep ``j - 1`` produced), from the
        position substep 0 started at. Returns this substep's rows in its own packed layout
        (one row per running item: that item's last row), as a single-layer forward would.

        All shapes are host-known (the sum of the packed row counts, padding included); the
        item of every row comes from the ops' ``batch_id_per_token`` (-1 on padding rows)."""
        ids0, hid0, bid0, dec0 = first
        bsz = int(dec0.shape[0])
        parts_ids = [ids0] + [c[0] for c in chain]
        parts_hid = [hid0] + [c[1] for c in chain]
        parts_bid = [bid0] + [c[2] for c in chain]
        bid = paddle.concat(
            [paddle.where(b < 0, paddle.full_like(b, bsz), b) for b in parts_bid]
        ).astype("int64")
        order = paddle.argsort(
            bid, stable=True
        )  # item by item; substep 0 rows, then chain rows in order
        ids = paddle.gather(paddle.concat(parts_ids), order)
        hid = paddle.gather(paddle.concat(parts_hid), order)
        # rows per item as a comparison sum, not bincount (whose output size depends on the data)
        counts = (
            (bid.unsqueeze(1) == paddle.arange(bsz, dtype="int64").unsqueeze(0))
            .astype("int32")
            .sum(0)
            .astype("int32")
        )
        cu = paddle.concat([paddle.zeros([1], "int32"), paddle.cumsum(counts).astype("int32")])
        rows = None if self.rows_bound is None else self.rows_bound + len(chain)
        meta = self._meta(ids, cu, paddle.zeros_like(counts), dec0, counts, rows)
        out = self._forward(ids, hid, meta, layer)
        last = paddle.gather(out, (cu[1:] - 1).clip(min=0).astype("int64"))  # [B, H], one per item
        now = batch_id_now.astype("int64").clip(min=0)
        return paddle.gather(last, now)
