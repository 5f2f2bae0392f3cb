"""The one place the engine, the cache manager and the workers derive the serving config
from, so that all processes agree on every shape and name."""

from __future__ import annotations

import argparse
import ctypes
import os
import signal
import warnings
from dataclasses import dataclass
from typing import TYPE_CHECKING

from ..config import FDConfig, SpeculativeConfig

if TYPE_CHECKING:  # importing the models imports Paddle: children import it after their set-up
    from ..models.model_config import ModelConfig as ArchConfig


@dataclass
class ServeLayout:
    """What every process of one server must agree on.

    Attributes:
        model: checkpoint directory (``config.json`` + ``model.safetensors``).
        speculative_config: FastDeploy's ``speculative_config`` as JSON.
        max_num_seqs: batch slots ``N``.
        max_model_len: longest prompt + output of one request.
        tensor_parallel_size: worker processes (one per rank).
        engine_worker_queue_port: loopback TCP port of the engine's worker socket; also the
            suffix of ``cache_ready_signal`` and the SysV message queue id of the token output.
        device_ids: per rank, the device id in the cache names.
        cache_ready_timeout: seconds a worker waits for its caches.
        splitwise_role: ``"mixed"``, ``"prefill"`` or ``"decode"`` (FastDeploy's
            ``scheduler_config.splitwise_role``).
    """

    model: str
    speculative_config: str
    max_num_seqs: int
    max_model_len: int
    tensor_parallel_size: int
    engine_worker_queue_port: int
    device_ids: list[int]
    cache_ready_timeout: float = 120.0
    splitwise_role: str = "mixed"

    @property
    def msg_queue_id(self) -> int:
        """SysV queue id of the workers' token output (FastDeploy's ``INFERENCE_MSG_QUEUE_ID``)."""
        return self.engine_worker_queue_port

    def arch(self) -> ArchConfig:
        """The checkpoint's architecture (its ``config.json``)."""
        from ..models.model_config import ModelConfig

        return ModelConfig.load_json(os.path.join(self.model, "config.json"))

    def fd_config(self, rank: int = 0, arch: ArchConfig | None = None) -> FDConfig:
        """The FDConfig of rank ``rank`` (the engine uses rank 0's): caches owned by the cache
        manager, every name and shape as the other processes derive them."""
        from ..engine_args import build_config

        spec = SpeculativeConfig.from_json(self.speculative_config)
        cfg = build_config(arch or self.arch(), spec, self.max_num_seqs, self.max_model_len)
        cfg.model_config.model = self.model
        cfg.cache_config.cache_manager = True
        cfg.cache_config.cache_ready_timeout = self.cache_ready_timeout
        cfg.scheduler_config.splitwise_role = self.splitwise_role
        pc = cfg.parallel_config
        pc.tensor_parallel_size = self.tensor_parallel_size
        pc.tensor_parallel_rank = rank
        pc.local_rank = rank
        pc.device_id = self.device_ids[rank]
        pc.engine_worker_queue_port = self.engine_worker_queue_port
        return cfg

    def to_args(self) -> list[str]:
        """Command-line arguments (FastDeploy's worker names) that rebuild this layout."""
        return [
            "--model",
            self.model,
            "--speculative_config",
            self.speculative_config,
            "--max_num_seqs",
            str(self.max_num_seqs),
            "--max_model_len",
            str(self.max_model_len),
            "--tensor_parallel_size",
            str(self.tensor_parallel_size),
            "--engine_worker_queue_port",
            str(self.engine_worker_queue_port),
            "--device_ids",
            ",".join(str(d) for d in self.device_ids),
            "--cache_ready_timeout",
            str(self.cache_ready_timeout),
            "--splitwise_role",
            self.splitwise_role,
        ]

    @staticmethod
    def add_args(parser: argparse.ArgumentParser) -> None:
        """The arguments :meth:`to_args` writes (FastDeploy's worker argument names)."""
        parser.add_argument("--model", required=True, help="checkpoint directory")
        parser.add_argument("--speculative_config", required=True, help="FastDeploy's speculative_config JSON")
        parser.add_argument("--max_num_seqs", type=int, required=True)
        parser.add_argument("--max_model_len", type=int, required=True)
        parser.add_argument("--tensor_parallel_size", type=int, default=1)
        parser.add_argument("--engine_worker_queue_port", type=int, required=True)
        parser.add_argument("--device_ids", default=None, help="comma-separated, one per rank (default 0..tp-1)")
        parser.add_argument("--cache_ready_timeout", type=float, default=120.0)
        parser.add_argument("--splitwise_role", default="mixed", choices=("mixed", "prefill", "decode"))

    @classmethod
    def from_args(cls, args: argparse.Namespace) -> ServeLayout:
        tp = int(args.tensor_parallel_size)
        device_ids = [int(d) for d in args.device_ids.split(",")] if args.device_ids else list(range(tp))
        if len(device_ids) != tp:
            raise ValueError(f"--device_ids names {len(device_ids)} devices; --tensor_parallel_size is {tp}")
        return cls(
            model=args.model,
            speculative_config=args.speculative_config,
            max_num_seqs=int(args.max_num_seqs),
            max_model_len=int(args.max_model_len),
            tensor_parallel_size=tp,
            engine_worker_queue_port=int(args.engine_worker_queue_port),
            device_ids=device_ids,
            cache_ready_timeout=float(args.cache_ready_timeout),
            splitwise_role=str(args.splitwise_role),
        )


class Terminated(SystemExit):
    """Raised in a child process by SIGTERM (from the engine, or from the kernel when the
    parent died): unwinds ``finally`` blocks so shared memory is released."""


def _on_term(signum: int, frame: object) -> None:
    raise Terminated(0)


def install_stop_handlers() -> None:
    """SIGTERM unwinds (:class:`Terminated`); SIGINT is ignored. Paddle installs its own
    fatal-signal handlers when it is imported (they abort the process, skipping every
    ``finally``, so shared memory would leak): call this after importing Paddle. Children
    call it once more after their Paddle set-up (model, caches), a cheap guard should a later
    initialisation install Paddle's again."""
    signal.signal(signal.SIGTERM, _on_term)
    signal.signal(signal.SIGINT, signal.SIG_IGN)


def become_child_process() -> None:
    """Set up a process the engine launched: Paddle imported (see
    :func:`install_stop_handlers`), SIGTERM unwinds, SIGINT is ignored (a terminal's Ctrl-C
    reaches the whole process group; the engine decides how its children stop), and on
    Linux the kernel sends SIGTERM if the parent dies first."""
    warnings.filterwarnings("ignore", message="No ccache found")  # Paddle's import-time notice
    import paddle  # noqa: F401  (its handlers first, ours over them)

    install_stop_handlers()
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        PR_SET_PDEATHSIG = 1
        libc.prctl(PR_SET_PDEATHSIG, signal.SIGTERM, 0, 0, 0)
    except (OSError, AttributeError):  # pragma: no cover - not Linux
        pass
    if os.getppid() == 1:  # the parent died before prctl took effect
        raise Terminated(1)
