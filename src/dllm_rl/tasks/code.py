"""Code generation scored by running tests in the sandbox (:mod:`dllm_rl.sandbox`).

Row formats (detected per row; raw columns are kept):

- **HumanEval**: ``prompt`` (signature + docstring; kept as ``code_prompt``), ``entry_point``,
  ``test`` (defines ``check(candidate)``), ``canonical_solution``. One test: ``check(entry_point)``.
- **MBPP**: ``text`` (or ``prompt`` in sanitized MBPP), ``test_list`` (``assert`` lines; each is one
  test), optional ``test_setup_code`` / ``test_imports``, ``challenge_test_list`` (used when
  ``include_challenge=True``), ``code`` (reference).
- **stdin/stdout**: a problem statement (``question`` / ``problem`` / ``text`` / ``description``) and
  ``inputs`` + ``outputs`` lists, or ``input_output`` (JSON ``{"inputs": [...], "outputs": [...]}``,
  APPS style), or ``tests`` as ``[{"input": ..., "output": ...}]``. Each case is one test; outputs are
  compared after right-stripping lines and dropping trailing blank lines.

The task adds: ``test_mode`` (``function`` / ``stdio``), ``tests``, ``setup``, ``entry_point``,
``code_prompt`` and ``reference`` (a known-good program, when the row has one).

Prompt: the problem with one test example (MBPP: the first assert; stdio: the first case; HumanEval:
the function header), asking for a ```python block. Code extraction: the last fenced block that
defines the entry point, else the longest fenced block, else the whole completion. HumanEval
completions that continue the function body (no ``def``) are appended to the header.

Reward: passed tests / all tests; passing means the harness saw the test complete (see the sandbox docs: exit
codes are never trusted). The tests reach the program only through its entry point (and names no builtin or
prompt provides, such as MBPP's tree classes); HumanEval's prompt runs on the trusted side as the tests'
prelude, so redefining ``abs`` or a prompt helper such as ``poly`` wins nothing. Default data:
``humaneval/HumanEval.jsonl.gz`` (``dataset= "humaneval"``) or ``mbpp/mbpp.jsonl`` (``dataset="mbpp"``; split
``test`` = task ids 11-510, ``train`` = 511-974, ``prompt`` = 1-10, ``all``).
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping
from pathlib import Path
from typing import Any, ClassVar

from ..sandbox import Job, Sandbox, SandboxLimits, default_sandbox
from .base import DataError, Score, Task
from .extract import code_blocks
from .io import default_source

MBPP_SPLITS = {"prompt": (1, 10), "test": (11, 510), "train": (511, 974), "validation": (511, 600)}
_CALL = re.compile(r"\b([A-Za-z_]\w*)\s*\(")
_BUILTIN_NAMES = set(dir(__import__("builtins"))) | {"assert", "math", "set", "sorted", "isclose"}


def mbpp_entry_point(test: str, reference: str | None = None) -> str | None:
    """The function an MBPP ``assert`` line calls: the first called name that is not a builtin, else the
    first called name the reference defines (MBPP 126's function is ``sum``)."""
    called = [m.group(1) for m in _CALL.finditer(test)]
    for name in called:
        if name not in _BUILTIN_NAMES:
            return name
    for name in called:
        if reference and re.search(rf"^\s*def\s+{re.escape(name)}\s*\(", reference, re.M):
            return name
    return None


def _stdio_cases(row: Mapping[str, Any], where: str) -> list[list[str]] | None:
    if row.get("inputs") is not None and row.get("outputs") is not None:
        ins, outs = row["inputs"], row["outputs"]
    elif row.get("input_output") is not None:
        io = row["input_output"]
        if isinstance(io, str):
            try:
                io = json.loads(io)
            except json.JSONDecodeError as exc:
                raise DataError(f"{where}: field 'input_output' is not valid JSON") from exc
        ins, outs = io.get("inputs"), io.get("outputs")
    elif isinstance(row.get("tests"), list) and row["tests"] and isinstance(row["tests"][0], Mapping | list):
        pairs = row["tests"]
        try:
            ins = [p["input"] if isinstance(p, Mapping) else p[0] for p in pairs]
            outs = [p["output"] if isinstance(p, Mapping) else p[1] for p in pairs]
        except (KeyError, IndexError, TypeError) as exc:
            raise DataError(f"{where}: field 'tests' must be a list of {{'input', 'output'}}") from exc
    else:
        return None
    if not isinstance(ins, list) or not isinstance(outs, list) or len(ins) != len(outs) or not ins:
        raise DataError(f"{where}: stdin/stdout tests need equal-length non-empty 'inputs' and 'outputs'")
    return [[_as_text(i), _as_text(o)] for i, o in zip(ins, outs)]


def _as_text(x: Any) -> str:
    if isinstance(x, list):
        return "\n".join(map(str, x)) + "\n"
    return str(x)


class CodeTask(Task):
    """Python code generation with test-based rewards (see module docstring).

    Extra args: ``dataset`` (``"humaneval"`` / ``"mbpp"``: which default file and split rule),
    ``include_challenge`` (MBPP challenge tests), ``prompt_tests`` (test examples shown in MBPP
    prompts, default 1), ``limits`` (:class:`SandboxLimits`) or ``timeout_s`` / ``memory_mb``,
    ``workers`` (parallel sandboxes), ``sandbox`` (a :class:`Sandbox` to use).
    """

    name: ClassVar[str] = "code"
    dataset_files: ClassVar[dict[str, str]] = {
        "humaneval": "humaneval/HumanEval.jsonl.gz",
        "mbpp": "mbpp/mbpp.jsonl",
    }
    #: the canonical hub datasets (MBPP ``full``: its splits are the task-id ranges of ``MBPP_SPLITS``)
    dataset_hub: ClassVar[dict[str, str]] = {
        "humaneval": "hf:openai/openai_humaneval@test",
        "mbpp": "hf:google-research-datasets/mbpp:full@{split}",
    }

    def __init__(
        self,
        data: Any = None,
        *,
        dataset: str | None = "humaneval",
        include_challenge: bool = False,
        prompt_tests: int = 1,
        limits: SandboxLimits | None = None,
        timeout_s: float | None = None,
        memory_mb: int | None = None,
        workers: int | None = None,
        sandbox: Sandbox | None = None,
        **kwargs: Any,
    ) -> None:
        if dataset is not None and dataset not in self.dataset_files:
            raise ValueError(
                f"unknown code dataset {dataset!r}; choose one of {', '.join(self.dataset_files)}"
            )
        self.dataset = dataset
        if dataset == "mbpp" and kwargs.get("split", "test") not in (*MBPP_SPLITS, "all"):
            raise ValueError(f"mbpp split must be one of {', '.join(MBPP_SPLITS)}, all")
        super().__init__(data, **kwargs)
        self.include_challenge = include_challenge
        self.prompt_tests = prompt_tests
        lim = limits or SandboxLimits()
        if timeout_s is not None or memory_mb is not None:
            lim = SandboxLimits(
                **{
                    **lim.__dict__,
                    **({"timeout_s": timeout_s} if timeout_s else {}),
                    **({"memory_mb": memory_mb} if memory_mb else {}),
                }
            )
        self._sandbox = sandbox
        self.limits = lim
        self.workers = workers

    @property
    def sandbox(self) -> Sandbox:
        """The :class:`Sandbox` used for scoring (shared per limits / workers unless given)."""
        if self._sandbox is None:
            self._sandbox = default_sandbox(self.limits, self.workers)
        return self._sandbox

    def default_data(self, split: str | None = None) -> Path | str:
        """HumanEval / MBPP (by ``dataset``): bundled, in the benchmark-data folder, else the hub dataset."""
        if self.dataset is None:
            raise FileNotFoundError("code task without dataset=... has no default data; pass data=<file>")
        split = split or self.split
        if self.dataset == "humaneval" and split not in ("test", "all"):
            raise FileNotFoundError(f"HumanEval has only a 'test' split (not {split!r}); pass data=<file>")
        hub_split = "prompt+test+validation+train" if split == "all" else split
        hub = self.dataset_hub[self.dataset].format(split=hub_split)
        return default_source(self.dataset_files[self.dataset], hub, f"task {self.dataset!r}, split {split!r}")

    # ------------------------------------------------------------------------------------------ data
    def normalize(self, row: dict[str, Any], where: str) -> dict[str, Any] | None:
        """Apply the MBPP split rule (task ids), then detect the row format."""
        if self.dataset == "mbpp" and self.split != "all" and row.get("task_id") is not None:
            lo, hi = MBPP_SPLITS.get(self.split, (1, 10**9))
            if not lo <= int(row["task_id"]) <= hi:
                return None
        return self._normalize(row, where)

    def _normalize(self, row: dict[str, Any], where: str) -> dict[str, Any]:
        if row.get("test") is not None and row.get("entry_point") is not None:  # HumanEval
            entry = str(row["entry_point"])
            row["code_prompt"] = str(row.get("code_prompt") or row.get("prompt") or "")
            row["question"] = row["code_prompt"]
            row["test_mode"] = "function"
            row["tests"] = [f"{row['test']}\n\ncheck({entry})\n"]
            row["setup"] = ""
            row["entry_point"] = entry
            if row.get("canonical_solution") is not None:
                row["reference"] = row["code_prompt"] + str(row["canonical_solution"])
        elif isinstance(row.get("test_list"), list) and row["test_list"]:  # MBPP
            tests = [str(t) for t in row["test_list"]]
            if self.include_challenge and row.get("challenge_test_list"):
                tests += [str(t) for t in row["challenge_test_list"]]
            setup = str(row.get("test_setup_code") or "")
            if row.get("test_imports"):
                setup = "\n".join(map(str, row["test_imports"])) + "\n" + setup
            text = row.get("text") or row.get("question") or row.get("prompt")
            if text is None:
                raise DataError(f"{where}: MBPP row needs a problem statement in 'text' or 'prompt'")
            row["question"] = str(text)
            row["code_prompt"] = ""
            row["test_mode"] = "function"
            row["tests"] = tests
            row["setup"] = setup
            ref = str(row["code"]) if row.get("code") is not None else None
            row["entry_point"] = row.get("entry_point") or mbpp_entry_point(tests[0], ref)
            if row.get("code") is not None:
                row["reference"] = str(row["code"])
        else:
            cases = _stdio_cases(row, where)
            if cases is None:
                raise DataError(
                    f"{where}: missing tests for the code task: need 'test' + 'entry_point' (HumanEval), "
                    f"'test_list' (MBPP) or 'inputs' + 'outputs' / 'input_output' (stdin/stdout) "
                    f"(row has: {', '.join(sorted(map(str, row)))})"
                )
            text = next(
                (
                    row[k]
                    for k in ("question", "problem", "text", "description", "prompt")
                    if row.get(k) is not None
                ),
                None,
            )
            if text is None:
                raise DataError(f"{where}: stdin/stdout row needs a problem statement in 'question'")
            row["question"] = str(text)
            row["code_prompt"] = ""
            row["test_mode"] = "stdio"
            row["tests"] = cases
            row["setup"] = ""
            row["entry_point"] = None
            for k in ("reference", "solution", "code"):
                if isinstance(row.get(k), str):
                    row["reference"] = row[k]
                    break
        return row

    # --------------------------------------------------------------------------------------- prompts
    def format_prompt(self, example: Mapping[str, Any]) -> str:
        """Problem plus one test example, asking for a ```python block (see module docstring)."""
        fence = "Reply with the Python code in a ```python code block."
        if example.get("code_prompt"):
            return (
                "Complete the following Python function. Reply with the whole function in a ```python "
                f"code block.\n\n```python\n{example['code_prompt']}```"
            )
        if example["test_mode"] == "function":
            shown = "\n".join(example["tests"][: max(1, self.prompt_tests)])
            word = "this test" if self.prompt_tests <= 1 else "these tests"
            return f"{str(example['question']).strip()}\nYour code should pass {word}:\n{shown}\n{fence}"
        inp, out = example["tests"][0]
        return (
            f"{str(example['question']).strip()}\n\nThe program reads standard input and writes standard "
            f"output.\nExample input:\n{inp}\nExample output:\n{out}\n{fence}"
        )

    def reference_completion(self, example: Mapping[str, Any]) -> str | None:
        """The row's known-good program in a ```python block, if it has one."""
        ref = example.get("reference")
        return None if ref is None else f"```python\n{ref}\n```"

    # --------------------------------------------------------------------------------------- rewards
    def extract_answer(self, text: str) -> str | None:
        """The code :meth:`extract_code` would run (no entry point known)."""
        return self.extract_code(text, None)

    def extract_code(self, text: str, entry_point: str | None) -> str:
        """The program in a completion: the last fenced block defining ``entry_point``, else the longest
        fenced block, else the whole text."""
        blocks = code_blocks(text)
        if not blocks:
            return text
        if entry_point:
            defining = [b for b in blocks if re.search(rf"\bdef\s+{re.escape(entry_point)}\s*\(", b)]
            if defining:
                return defining[-1]
        return max(blocks, key=len)

    def program_for(self, text: str, example: Mapping[str, Any]) -> str:
        """The full program to test: the extracted code, prefixed by the HumanEval header when the code
        continues the function body instead of defining it."""
        entry = example.get("entry_point")
        code = self.extract_code(text, entry)
        header = example.get("code_prompt") or ""
        if header and entry:
            if re.search(rf"\bdef\s+{re.escape(str(entry))}\s*\(", code):
                return f"{header}\n{code}\n"
            return header + code
        return code

    def _prepared(self, example: Mapping[str, Any]) -> dict[str, Any]:
        if example.get("test_mode") in ("function", "stdio") and example.get("tests"):
            return dict(example)
        return self._normalize(dict(example), "example")

    def job_for(self, text: str, example: Mapping[str, Any]) -> Job | Score:
        """The sandbox :class:`Job` for one completion (or an immediate 0 Score when there is no code)."""
        ex = self._prepared(example)
        program = self.program_for(text, ex)
        if not program.strip():
            return Score(0.0, "no code", passed=0, total=len(ex["tests"]))
        tests = ex["tests"]
        if ex["test_mode"] == "stdio":
            tests = [(str(i), str(o)) for i, o in tests]
        return self._job(program, tests, ex)

    @staticmethod
    def _job(program: str, tests: list, ex: Mapping[str, Any]) -> Job:
        """The job of a program: tests see its entry point; HumanEval's prompt is the trusted prelude (its
        helpers and imports are the test's own, whatever the program redefines)."""
        entry = ex.get("entry_point")
        prelude = str(ex.get("code_prompt") or "") if ex["test_mode"] == "function" else ""
        setup = ex.get("setup") or ""
        return Job(program, tests, ex["test_mode"], setup, entry_point=entry and str(entry), prelude=prelude)

    def _score(self, text: str, example: Mapping[str, Any]) -> Score:
        return self._score_batch([text], [dict(example)])[0]

    def _score_batch(self, texts: list[str], examples: list[dict[str, Any]]) -> list[Score]:
        out: list[Score | None] = [None] * len(texts)
        jobs: list[tuple[int, Job]] = []
        for i, (t, ex) in enumerate(zip(texts, examples)):
            try:
                j = self.job_for(t, ex)
            except DataError:
                raise
            except Exception as exc:
                j = Score(0.0, f"reward error: {type(exc).__name__}: {str(exc)[:200]}")
            if isinstance(j, Score):
                out[i] = j
            else:
                jobs.append((i, j))
        results = self.sandbox.map([j for _, j in jobs])
        for (i, _), r in zip(jobs, results):
            out[i] = Score(r.fraction, r.reason(), passed=r.n_passed, total=len(r.passed))
        return [s if s is not None else Score(0.0, "not scored") for s in out]

    def run_tests(self, program: str, example: Mapping[str, Any]):
        """Run a full program (not a completion) against an example's tests; returns the ExecResult."""
        ex = self._prepared(example)
        tests = ex["tests"] if ex["test_mode"] == "function" else [(str(i), str(o)) for i, o in ex["tests"]]
        return self.sandbox.run(self._job(program, tests, ex))


def code_task_for(dataset: str) -> type[CodeTask]:
    """A CodeTask subclass preset to ``dataset`` (for the registry names ``humaneval`` / ``mbpp``)."""

    class _Preset(CodeTask):
        name: ClassVar[str] = dataset

        def __init__(self, data: Any = None, **kwargs: Any) -> None:
            kwargs.setdefault("dataset", dataset)
            super().__init__(data, **kwargs)

    _Preset.__name__ = _Preset.__qualname__ = f"{dataset.capitalize()}Task"
    return _Preset
