"""The code reward cannot be won by redefining a name the tests call: the tests see the program's entry point
(and the names only the program provides), while builtins and HumanEval's prompt helpers are the trusted
side's own. The sweep redefines, for every HumanEval and MBPP item, each name with a trusted meaning that
its tests read, around the item's reference solution: no redefinition may reach a test, and the reference
must still score 1.0."""

from __future__ import annotations

import ast
import builtins

import pytest

from dllm_rl.sandbox import SandboxLimits
from dllm_rl.tasks import get_task

LIMITS = SandboxLimits(timeout_s=20)
MARK = "SHADOW-REACHED"

# The reference runs in its own namespace, so the redefinitions at the top level change nothing it calls
# itself; each one writes MARK (and the name) when it is called, then answers as the original would.
SHADOW = """import builtins as _b, os as _os
_ref = {{"__name__": "solution", "__builtins__": _b}}
exec(compile({ref!r}, "<reference>", "exec"), _ref)
globals().update({{k: v for k, v in _ref.items() if not (k.startswith("__") and k.endswith("__"))}})
def _shadow(name, real):
    def shadow(*args, **kwargs):
        _os.write(1, ("{mark} " + name + "\\n").encode())
        return real(*args, **kwargs)
    return shadow
"""


def read_names(source: str) -> set[str]:
    """Every name ``source`` reads."""
    return {n.id for n in ast.walk(ast.parse(source)) if isinstance(n, ast.Name) and isinstance(n.ctx, ast.Load)}


def defined_names(source: str) -> set[str]:
    """Names ``source`` binds at its top level (HumanEval's prompt: imports and helper functions)."""
    out: set[str] = set()
    for node in ast.parse(source).body:
        if isinstance(node, ast.FunctionDef | ast.ClassDef):
            out.add(node.name)
        elif isinstance(node, ast.Import | ast.ImportFrom):
            out |= {(a.asname or a.name).partition(".")[0] for a in node.names}
        elif isinstance(node, ast.Assign):
            out |= {n.id for t in node.targets for n in ast.walk(t) if isinstance(n, ast.Name)}
    return out


def trusted_names_read(example: dict) -> list[str]:
    """The names the item's tests and setup read that have a trusted meaning (a builtin, or a name of the
    prompt), but are not the entry point: each one a program could redefine to fool the tests."""
    read: set[str] = set()
    for src in [*example["tests"], example.get("setup") or ""]:
        read |= read_names(src)
    trusted = set(dir(builtins)) | defined_names(example.get("code_prompt") or "")
    return sorted(n for n in read & trusted if n != example["entry_point"] and not n.startswith("__"))


def shadowing_program(reference: str, names: list[str]) -> str:
    lines = [SHADOW.format(ref=reference, mark=MARK)]
    for name in names:
        lines.append(f"{name} = _shadow({name!r}, _ref.get({name!r}, getattr(_b, {name!r}, None)))")
    return "\n".join(lines) + "\n"


def sweep(task, examples) -> tuple[int, list]:
    """Run every item's shadowing program; ``(names redefined, failures)``."""
    items = [(ex, trusted_names_read(ex)) for ex in examples]
    items = [(ex, names) for ex, names in items if names]
    jobs = [task.job_for(f"```python\n{shadowing_program(ex['reference'], names)}```", ex) for ex, names in items]
    results = task.sandbox.map(jobs)
    failed = [
        (ex["task_id"], names, r.reason(), r.stdout[:200])
        for (ex, names), r in zip(items, results)
        if r.fraction != 1.0 or MARK in r.stdout
    ]
    return sum(len(names) for _, names in items), failed


@pytest.mark.parametrize(
    "task_id, program",
    [
        ("HumanEval/2", "def abs(x):\n    return 0\ndef truncate_number(number):\n    return 0.5\n"),
        ("HumanEval/4", "def abs(x):\n    return 0\ndef mean_absolute_deviation(numbers):\n    return 0.0\n"),
        ("HumanEval/32", "def poly(xs, x):\n    return 0.0\ndef find_zero(xs):\n    return 0.0\n"),
    ],
)
def test_redefined_builtin_or_prompt_helper_does_not_win_the_reward(task_id, program):
    t = get_task("humaneval", limits=LIMITS)
    (ex,) = [e for e in t.examples if e["task_id"] == task_id]
    (s,) = t.score_examples([f"```python\n{program}```"], [ex])
    assert s == 0.0 and s.info["passed"] == 0, s.reason


def test_shadowing_program_reaches_the_tests_only_through_the_entry_point():
    row = {
        "task_id": "X/1",
        "prompt": "def helper(x):\n    return x * 2\n\ndef f(x):\n    \"\"\"helper(x) + 1.\"\"\"\n",
        "entry_point": "f",
        "canonical_solution": "    return helper(x) + 1\n",
        "test": "def check(candidate):\n    assert abs(candidate(2)) == helper(2) + 1 == 5\n",
    }
    t = get_task("code", data=[row], dataset=None, limits=LIMITS)
    (ex,) = t.examples
    assert trusted_names_read(ex) == ["abs", "helper"]
    assert sweep(t, [ex]) == (2, [])
    # the same redefinitions in a wrong program score nothing
    wrong = "def helper(x):\n    return 0\ndef abs(x):\n    return 1\ndef f(x):\n    return 1\n"
    assert t.score_one(f"```python\n{wrong}```", ex) == 0.0


def test_humaneval_shadowing_sweep():
    t = get_task("humaneval", limits=LIMITS)
    examples = t.examples
    assert len(examples) == 164
    n_names, failed = sweep(t, examples)
    assert not failed, failed[:5]
    assert n_names == 27  # on 17 items: str, range, abs, tuple, math, poly, encode_cyclic, encode_shift, ...


def test_mbpp_shadowing_sweep(mbpp_test):
    path, rows = mbpp_test  # all 974 with the benchmark-data folder, else the bundled 50
    complete = rows == 500
    t = get_task("mbpp", data=path, split="all", limits=LIMITS)
    examples = t.examples
    assert len(examples) == (974 if complete else 50)
    n_names, failed = sweep(t, examples)
    assert not failed, failed[:5]
    assert n_names == (4 if complete else 0)  # int (533 passes it), float, str
    sanitized = path.parent / "sanitized-mbpp.json"
    if complete and sanitized.is_file():  # its tests read set(...) on 5 items
        ts = get_task("mbpp", data=sanitized, split="all", limits=LIMITS)
        assert len(ts.examples) == 427
        assert sweep(ts, ts.examples) == (5, [])
