"""Function tests call the program in its own process: classes through handles, exceptions by type,
values by copy, and a clear reason when the program's process cannot answer."""

from __future__ import annotations

import pytest

from dllm_rl.sandbox import Sandbox, SandboxLimits
from dllm_rl.sandbox._child.wire import PLAIN

TREE = """class Node:
    def __init__(self, data):
        self.data = data
        self.left = None
    def depth(self):
        return 1 + (self.left.depth() if self.left else 0)
def height(root):
    return 0 if root is None else 1 + height(root.left)
"""


@pytest.fixture(scope="module")
def sb():
    return Sandbox(SandboxLimits(timeout_s=5))


def test_classes_are_called_through_handles(sb):
    setup = "root = Node(1)\nroot.left = Node(2)\nroot.left.left = Node(3)\n"  # MBPP 367's shape
    tests = [
        "assert height(root) == 3",
        "assert root.left.data == 2 and root.depth() == 3",
        "assert root.left is root.left and root != Node(1) and root.left.left.left is None",
        "assert isinstance(root, Node)",
    ]
    res = sb.run_function_tests(TREE, tests, setup)
    assert res.passed == [True, True, True, False], res.details
    assert res.details[3].startswith("TypeError: isinstance() arg 2 must be a type")  # a stand-in, not a class


def test_exceptions_cross_by_builtin_type_and_values_by_copy(sb):
    prog = (
        "class Oops(Exception):\n    pass\n"
        "def f(x):\n    if isinstance(x, list):\n        x.append(1)\n        return [x]\n"
        "    if x < 0:\n        raise ValueError('negative')\n    raise Oops('zero')\n"
    )
    tests = [
        "try:\n    f(-1)\nexcept ValueError as e:\n    assert str(e) == 'negative'\nelse:\n    raise AssertionError",
        "f(0)",
        "a = []\nassert f(a) == [[1]] and a == []",
        "assert f([]) == ([1],)",
        "f(print)",
    ]
    res = sb.run_function_tests(prog, tests)
    assert res.passed == [True, False, True, False, False]
    assert res.details[1:] == [
        "Oops: zero",
        "ok",
        "AssertionError",
        f"TypeError: cannot pass an object of type builtin_function_or_method to the program: only plain data "
        f"({PLAIN}) and objects the program made",
    ]


def test_a_program_process_that_dies_fails_the_remaining_tests(sb):
    prog = "import os\ndef f(x):\n    if x:\n        os._exit(0)\n    return x\n"
    res = sb.run_function_tests(prog, ["assert f(0) == 0", "f(1)", "assert f(0) == 0"])
    assert res.passed == [True, False, False]
    assert res.details[1:] == ["ProgramGone: the program's process ended"] * 2
    top = sb.run_function_tests("import sys\nsys.exit(3)\n", ["pass"])
    assert top.details == ["program failed: SystemExit: 3"]
