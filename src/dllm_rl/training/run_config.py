"""The run section every command shares (``run:`` in RL, SFT and eval configs, ``--run.seed`` etc. on their command
lines): where a run writes, its seed, one resume vocabulary, checkpoints, trackers and the hub upload."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from dllm_rl.config import Checked, field
from dllm_rl.hub import check_repo_id
from dllm_rl.training.checkpoint import CorruptCheckpointError, check_intact, latest_checkpoint, list_checkpoints
from dllm_rl.training.trackers import check_report_to

#: the words ``run.resume`` takes besides a checkpoint directory
RESUME_WORDS = ("latest", "auto")


@dataclass
class RunConfig(Checked):
    """Where a run writes and how it continues (the same keys for ``dllm-rl rl``, ``sft`` and ``eval``)."""

    output_dir: str = field("runs/run", help="run directory: config, metrics, checkpoints, samples, plots, the "
                            "final model (RL: runs/rl, SFT: runs/sft; eval: runs/eval/MODEL-TASK-SPLIT)")
    seed: int = field(0, help="seed of every random stream (data order, rollouts, masks; a fresh model's init)")
    resume: str | None = field(
        None, help="null: a new run | latest: the newest checkpoint in output_dir (an error when there is none) | "
        "auto: the newest checkpoint when there is one, else a new run (resubmit the same command after a "
        "preemption) | a checkpoint directory")
    overwrite: bool = field(False, help="output_dir already holds a run and resume is not given: delete that run's "
                            "files (only what it recorded writing) and start afresh (false = refuse to start)")
    progress: bool = field(True, help="show a progress bar")
    save_every: int = field(0, ge=0, help="checkpoint every N steps (0 = only at the end)")
    keep_checkpoints: int = field(2, ge=0, help="checkpoints kept on disk, the newest (0 = all)")
    push_to_hub: str | None = field(None, check=check_repo_id,
                                    help="hub repository org/name to upload the final model to at the end (created "
                                    "if missing; needs `hf auth login` or HF_TOKEN)")
    report_to: list[str] = field(default_factory=list, check=check_report_to,
                                 help="experiment trackers for the metrics and the config: tensorboard | wandb | "
                                 "trackio | mlflow | none (a list; tensorboard writes OUTPUT_DIR/tensorboard)")
    distributed_timeout_s: float = field(
        1800.0, gt=0, help="multi-process runs: a collective that waits longer than this ends the run with an "
        "error (a rank that died or hangs); torch's default is 1800 s")


def resume_checkpoint(run: RunConfig, out: str | Path | None = None) -> Path | None:
    """The checkpoint ``run.resume`` names (None: a new run). ``latest`` without a checkpoint is an error;
    ``auto`` without one is a new run; either passes a damaged checkpoint over for an older one (a warning), and
    is an error when every one is damaged. A named checkpoint that is damaged is an error naming the file.
    ``out``: the run directory (default ``run.output_dir``)."""
    out = Path(out if out is not None else run.output_dir)
    if run.resume is None:
        return None
    if run.resume in RESUME_WORDS:
        found = latest_checkpoint(out)
        if found is None and list_checkpoints(out):  # auto too: a new run would write over the damaged one
            raise CorruptCheckpointError(f"run.resume={run.resume}: every checkpoint in {out / 'checkpoints'} is "
                                         "damaged (the warnings above name the files); restore them, or start "
                                         "afresh with run.overwrite=true")
        if found is None and run.resume == "latest":
            raise FileNotFoundError(f"run.resume=latest but {out / 'checkpoints'} holds no checkpoint (run.resume=auto "
                                    "starts a new run when there is none)")
        return found
    path = Path(run.resume).expanduser()
    if not path.is_dir():
        raise FileNotFoundError(f"run.resume={run.resume}: no such checkpoint directory")
    check_intact(path)  # before its config.yaml is read
    return path
