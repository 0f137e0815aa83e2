"""The configs of ``dllm-rl data make | show | sandbox``, one dataclass each: their keys are the sub-command's flags
(``data make countdown --n 6000 --seed 0 --out F`` is a :class:`MakeDataConfig`, ``task`` also the bare word)."""

from __future__ import annotations

from dataclasses import dataclass

from dllm_rl.config import Checked, FieldError, field

#: the knobs of each synthetic task (the keys of :class:`MakeDataConfig` that only that task reads)
KNOBS: dict[str, tuple[str, ...]] = {
    "countdown": ("numbers", "max_value", "max_target"),
    "sudoku": ("blanks", "size"),
    "arith": ("operands", "digits", "ops"),
    "shapes": ("image_size", "min_objects", "max_objects", "questions", "rare_weight"),
}
PROMPT_STYLES = ("chat", "plain", "compact")


@dataclass
class MakeDataConfig(Checked):
    """``dllm-rl data make TASK --n N --out FILE``: a synthetic dataset (JSON lines), distinct rows drawn from a
    seeded stream; the task's own knobs are None for its defaults (or its ``difficulty`` preset's)."""

    task: str = field(help="the synthetic task", choices=tuple(KNOBS))
    n: int = field(help="number of distinct rows", ge=1)
    out: str = field(help="output .jsonl file")
    seed: int = field(0, help="random seed")
    split: str = field("train", choices=("train", "test"),
                       help="which random stream (train and test differ for the same seed)")
    difficulty: str | None = field(None, choices=("easy", "medium", "hard"),
                                   help="preset knobs (countdown: numbers/max_value; sudoku: blanks; arith: "
                                   "operands/digits; shapes: its image knobs)")
    exclude: list[str] = field(default_factory=list, help="never emit a row that is in one of these files "
                               "(repeatable: --exclude A --exclude B): makes disjoint train/test sets")
    test_out: str | None = field(None, help="also write a disjoint test set to this file (shapes: the rare-pair set)")
    test_n: int | None = field(None, ge=1, help="rows in the test_out set (default: n/10)")
    numbers: int | None = field(None, ge=1, help="countdown: how many numbers per puzzle (default 3)")
    max_value: int | None = field(None, ge=1, help="countdown: numbers are drawn from 1..max_value (default 100)")
    max_target: int | None = field(None, ge=1, help="countdown: largest target (default: max_value)")
    blanks: int | None = field(None, ge=0, help="sudoku: blank cells per puzzle (default 8)")
    size: int | None = field(None, help="sudoku: grid size, 4 or 9 (default 4)")
    operands: int | None = field(None, ge=1, help="arith: numbers per expression (default 3)")
    digits: int | None = field(None, ge=1, help="arith: digits per number (default 2)")
    ops: str | None = field(None, help="arith: operators to draw from (default +-*)")
    image_size: int | None = field(None, help="shapes: image width and height in px, 32..96 (default 48); the "
                                   "PNG images go to NAME_images/ next to the out / test_out file")
    min_objects: int | None = field(None, help="shapes: fewest shapes per image (default 1)")
    max_objects: int | None = field(None, help="shapes: most shapes per image, up to 9 (default 4)")
    questions: str | None = field(None, help="shapes: question kinds, comma-separated: count,colour,where "
                                  "(default all)")
    rare_weight: float | None = field(None, help="shapes: how often a rare shape-colour pair is drawn relative to "
                                      "the others (default 0.05)")

    def __post_init__(self) -> None:
        super().__post_init__()
        for task, knobs in KNOBS.items():  # another task's knob would be dropped without a word
            given = [k for k in knobs if task != self.task and getattr(self, k) is not None]
            if given:
                raise FieldError(given[0], f"a {task} knob; {self.task} takes {', '.join(KNOBS[self.task])}")


@dataclass
class ShowDataConfig(Checked):
    """``dllm-rl data show TASK``: a task's prompts, reference completions and their rewards."""

    task: str = field(help="task name (gsm8k, math, countdown, sudoku, arith, code, humaneval, mbpp, shapes, "
                      "image_choice, image_math) or a data file")
    task_type: str | None = field(None, help="the task of a data file")
    data: str | None = field(None, help="data file for a named task (default: its file in the shared data folder)")
    split: str = field("test", help="split of a named task")
    n: int = field(2, ge=1, help="how many examples")
    prompt_style: str | None = field(None, choices=PROMPT_STYLES, help="prompt style (default: the task's own)")


@dataclass
class SandboxCheckConfig(Checked):
    """``dllm-rl data sandbox``: how code is sandboxed on this machine, and a self-test."""

    timeout_s: float = field(5.0, gt=0, help="seconds each self-test program may run")


__all__ = ["KNOBS", "MakeDataConfig", "SandboxCheckConfig", "ShowDataConfig"]
