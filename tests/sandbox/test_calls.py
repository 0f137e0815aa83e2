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


WIDE = """import collections, decimal, fractions
Point = collections.namedtuple("Point", "x y")
class Negative(ValueError):
    pass
def f(kind, arg=None):
    if kind == "type":
        return [x for x in (4, 7.7, "s") if not isinstance(x, arg)]
    if kind == "raise":
        raise Negative("below zero")
    return {
        "range": range(1, 7, 2), "map": map(abs, [-1, 2]), "gen": (i * i for i in range(3)),
        "fraction": fractions.Fraction(3, 6), "decimal": decimal.Decimal("1.10"), "bytearray": bytearray(b"ab"),
        "point": Point(1, 2), "keys": {"a": 1}.keys(), "items": {"a": 1}.items(), "int": int,
    }[kind]
"""


def test_correct_programs_returning_wider_values_pass(sb):
    tests = [
        "assert f('type', int) == [7.7, 's'] and f('type', str) == [4, 7.7]",
        "try:\n    f('raise')\nexcept ValueError as e:\n"
        "    assert str(e) == 'below zero' and type(e).__name__ == 'Negative'",
        "assert f('range') == range(1, 7, 2) and list(f('map')) == [1, 2] and f('map') != [1, 2]",
        "assert sum(f('gen')) == 5",
        "import fractions, decimal\n"
        "assert f('fraction') == fractions.Fraction(1, 2) and f('decimal') == decimal.Decimal('1.1')",
        "assert f('bytearray') == bytearray(b'ab') and type(f('bytearray')) is bytearray",
        "p = f('point')\nassert p.x == 1 and p.y == 2 and p == (1, 2)",
        "assert f('keys') == {'a'} and list(f('items')) == [('a', 1)] and f('int') is int",
        "assert f('type', range) == [4, 7.7, 's']",
    ]
    res = sb.run_function_tests(WIDE, tests, entry_point="f")
    assert res.passed == [True] * 9, res.details


def test_only_the_names_the_tests_read_are_copied(sb):
    prog = "TABLE = ['x' * 1000] * 70000\nSMALL = {'k': 1}\ndef f(i):\n    return len(TABLE[i]) + SMALL['k']\n"
    res = sb.run_function_tests(prog, ["assert f(0) == 1001", "assert SMALL == {'k': 1}", "len(TABLE)"])
    # a 70 MB table is over the frame limit: a test that reads it gets a handle, the others pass
    assert res.passed == [True, True, False], res.details
    assert res.details[2] == "TypeError: object of type 'Remote' has no len()"


def test_the_programs_globals_stay_live(sb):
    prog = (
        "calls = 0\nlog = []\n"
        "def f(x=None):\n    global calls, seen\n    calls += 1\n    seen = x\n    log.append(x)\n"
        "    if x == 'raise':\n        raise ValueError(x)\n    return calls\n"
    )
    tests = [
        "assert calls == 0\nf(); f()\nassert calls == 2",
        "f(1)\nassert calls == 3 and seen == 1 and log == [None, None, 1]",
        "try:\n    f('raise')\nexcept ValueError:\n    pass\nassert calls == 4 and seen == 'raise'",
        "calls = 100\nassert f() == 5 and calls == 100",  # a name the test assigns is the test's own
    ]
    res = sb.run_function_tests(prog, tests)
    assert res.passed == [True] * 4, res.details
    assert sb.run_function_tests(prog, ["f()\nassert calls == 2"]).details == ["AssertionError"]


STDLIB_VALUES = """import array, collections, datetime
from multiprocessing import Pool
def square(x):
    return x * x
def f(kind):
    if kind == "pool":
        with Pool(2) as pool:
            return pool.map(square, range(4))
    return {
        "deque": collections.deque([1, 2], maxlen=5), "array": array.array("i", [3, 4]),
        "date": datetime.date(2024, 2, 29), "delta": datetime.date(2024, 3, 1) - datetime.date(2024, 2, 1),
    }[kind]
"""


def test_correct_programs_returning_deques_arrays_or_dates_and_using_a_pool_pass(sb):
    tests = [
        "from collections import deque\nassert f('deque') == deque([1, 2]) and f('deque').maxlen == 5",
        "import array\nassert f('array') == array.array('i', [3, 4])",
        "import datetime\nassert f('date') == datetime.date(2024, 2, 29) and f('delta').days == 29",
        "assert f('pool') == [0, 1, 4, 9]",
    ]
    res = sb.run_function_tests(STDLIB_VALUES, tests)
    assert res.passed == [True] * 4, res.details
