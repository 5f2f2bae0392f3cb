"""transformers' models of a tiny test folder, loaded once per path by the package's own
reference (:class:`fastdeploy_mtp.checks.reference.Reference`, the loading ``check-drafts``
uses: float32, eager attention, MTP layers through ``MtpModel.from_pretrained`` where
transformers maps the family's names, by the released names for MiMo and dense ERNIE-4.5).
The folder writers call :func:`forget` when they (re)write a folder."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from fastdeploy_mtp.checks.reference import Reference

_LOADED: dict[str, Reference] = {}


def reference(folder: str | Path) -> Reference:
    """The cached :class:`Reference` of ``folder``."""
    key = str(Path(folder).resolve())
    if key not in _LOADED:
        _LOADED[key] = Reference(key)
    return _LOADED[key]


def models(folder: str | Path) -> tuple[Any, Any]:
    """``(target, mtp or None)`` of ``folder``."""
    ref = reference(folder)
    return ref.target, ref.mtp


def forget(folder: str | Path) -> None:
    """Drop ``folder``'s cached models (it was written anew)."""
    _LOADED.pop(str(Path(folder).resolve()), None)


def ids_tensor(ids: Any) -> Any:
    """Token ids ``[B, S]`` as a torch int64 tensor (``ValueError`` for another shape)."""
    import numpy as np
    import torch

    if np.ndim(ids) != 2:
        raise ValueError(f"ids: expected shape [B, S], got {np.shape(ids)}")
    return torch.as_tensor(np.asarray(ids), dtype=torch.long)


def logits(folder: str | Path, ids: Any) -> Any:
    """Target logits, float32 numpy ``[B, S, V]``, for token ids ``[B, S]`` at positions 0..S-1."""
    import torch

    target, _ = models(folder)
    with torch.no_grad():
        return target(input_ids=ids_tensor(ids)).logits.float().numpy()


def hidden(folder: str | Path, ids: Any) -> Any:
    """The target's last hidden state after its final norm, float32 numpy ``[B, S, H]`` -- what
    transformers hands its MTP layers."""
    import torch

    target, _ = models(folder)
    with torch.no_grad():
        return target.model(input_ids=ids_tensor(ids)).last_hidden_state.float().numpy()


def greedy(folder: str | Path, prompt_ids: list[int], n: int) -> list[int]:
    """``n`` greedy tokens after ``prompt_ids`` from transformers' ``generate`` (no EOS stop)."""
    return reference(folder).greedy(list(prompt_ids), n)


def recomputed_greedy(folder: str | Path, prompt_ids: list[int], n: int) -> list[int]:
    """``n`` greedy tokens after ``prompt_ids`` by full recomputation: the argmax of the last
    position's logits over the whole sequence, one token at a time (no KV cache, so nothing but
    the model's math is compared)."""
    seq = list(prompt_ids)
    for _ in range(n):
        seq.append(int(logits(folder, [seq])[0, -1].argmax()))
    return seq[len(prompt_ids) :]


def mtp_step(folder: str | Path, layer: int, next_ids: Any, states: Any) -> tuple[Any, Any]:
    """MTP layer ``layer`` over whole sequences, causal, at positions 0..S-1, no position-0
    mask: ``next_ids`` int ``[B, S]`` the token after each position, ``states`` float32
    ``[B, S, H]`` the previous hidden states (the target's, or the previous MTP layer's output).
    Returns numpy (logits float32 ``[B, S, V]`` through the shared head, the layer's output
    ``[B, S, H]`` after its final norm)."""
    import numpy as np
    import torch

    _, mtp = models(folder)
    if mtp is None:
        raise ValueError(f"{folder}: the folder has no MTP layers (num_nextn_predict_layers)")
    if not 0 <= layer < mtp.num_mtp_layers:
        raise ValueError(f"layer: expected 0..{mtp.num_mtp_layers - 1}, got {layer}")
    ids = ids_tensor(next_ids)
    h = torch.as_tensor(np.asarray(states, dtype=np.float32))
    if tuple(h.shape[:2]) != tuple(ids.shape):
        raise ValueError(
            f"hidden: expected shape [B, S, H] with [B, S] = {tuple(ids.shape)}, got "
            f"{tuple(h.shape)}"
        )
    positions = torch.arange(ids.shape[1]).unsqueeze(0).expand(ids.shape[0], -1)
    with torch.no_grad():
        out = mtp.forward_layer(layer, h, positions, None, input_ids=ids)
        return mtp._project_to_logits(out).float().numpy(), out.float().numpy()
