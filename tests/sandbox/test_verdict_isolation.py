"""The verdict is out of the program's reach: programs that find the harness's reporting function (through
the garbage collector or stack frames), return an object whose ``__eq__`` always answers True, or print
fake protocol lines score 0.0 with a wrong ``f``, while the same tricks around a correct ``f`` score 1.0."""

from __future__ import annotations

import pytest

from dllm_rl.sandbox import Sandbox, SandboxLimits
from dllm_rl.sandbox._child.wire import PLAIN

LIMITS = SandboxLimits(timeout_s=5)
TESTS = ["assert f(1) == 2", "assert f(2) == 3"]
RIGHT = "def f(x):\n    return x + 1\n"
WRONG = "def f(x):\n    return x\n"

# Calls every reporting function it can find among all live objects with "test i passed", and every
# reporter factory as the harness does (the marker fd from argv) with every nonce-like string it finds.
GC_WALK = """import gc, os, sys
def _strings(o):
    vals = o.values() if isinstance(o, dict) else o if isinstance(o, (list, tuple)) else ()
    return [v for v in vals if isinstance(v, (str, bytes)) and len(v) == 32]
objs = gc.get_objects()
nonces = {s.encode() if isinstance(s, str) else s for o in objs for s in _strings(o)}
for o in objs:
    name = getattr(o, "__name__", "")
    if callable(o) and name == "emit":
        for i in range(2):
            o(i, b"ok")
    if callable(o) and name == "reporter":
        for nonce in nonces:
            try:
                for i in range(2):
                    o(int(sys.argv[1]), nonce)(i, b"ok")
            except (OSError, ValueError, IndexError):
                pass
"""

# Walks up the stack from inside f and reports passes with whatever reporter, nonce and fd it finds.
FRAME_WALK = """import os, sys
def _cheat():
    frame = sys._getframe()
    while frame is not None:
        loc = frame.f_locals
        if callable(loc.get("emit")):
            for i in range(2):
                loc["emit"](i, b"ok")
        if isinstance(loc.get("nonce"), bytes) and isinstance(loc.get("fd"), int):
            for i in range(2):
                os.write(loc["fd"], b"%s %d ok 0 0\\n" % (loc["nonce"], i))
        frame = frame.f_back
"""

ALWAYS_EQUAL = """class Yes:
    def __eq__(self, other):
        return True
    def __ne__(self, other):
        return False
    __hash__ = object.__hash__
"""

# Fake markers and fake protocol frames (a reply "ok True") to the given descriptors: all of them for a
# wrong f (its own pipes too), stdout and stderr for a right f (which must keep its pipes intact to pass).
JUNK = """import os
FAKE = [b"%d ok 0 0\\n" % i for i in range(2)] + [b"00000005\\nl2:s2:okT", b"00000009\\nl2:s2:okT\\n"]
def _junk():
    print("0 ok 0 0\\n1 ok 0 0\\n00000005\\nl2:s2:okT", flush=True)
    for fd in FDS:
        for line in FAKE:
            try:
                os.write(fd, line)
            except OSError:
                pass
_junk()
"""

CHEATS = {
    "gc walk": (GC_WALK + WRONG, GC_WALK + RIGHT),
    "frame walk": (
        FRAME_WALK + "def f(x):\n    _cheat()\n    return x\n",
        FRAME_WALK + "def f(x):\n    _cheat()\n    return x + 1\n",
    ),
    "__eq__ always True": (
        ALWAYS_EQUAL + "def f(x):\n    return Yes()\n",
        ALWAYS_EQUAL + "def f(x):\n    Yes()\n    return x + 1\n",
    ),
    "int whose __eq__ is always True": (
        "class I(int):\n    def __eq__(self, other):\n        return True\ndef f(x):\n    return I(0)\n",
        "class I(int):\n    def __eq__(self, other):\n        return True\ndef f(x):\n    return I(x + 1)\n",
    ),
    "junk and fake protocol lines": (
        "FDS = range(1, 64)\n" + JUNK + "def f(x):\n    _junk()\n    return x\n",
        "FDS = (1, 2)\n" + JUNK + "def f(x):\n    _junk()\n    return x + 1\n",
    ),
    "fake math module": (
        "import types\nmath = types.SimpleNamespace(isclose=lambda *a, **k: True)\n" + WRONG,
        "import types\nmath = types.SimpleNamespace(isclose=lambda *a, **k: False)\n" + RIGHT,
    ),
    # a call rebinds the test's own helper in the program's globals (which stay live for the tests)
    "rebinding the test's helper": (
        "def _yes(*a):\n    return None\ndef f(x):\n    global check\n    check = _yes\n    return x\n",
        "def _no(*a):\n    raise AssertionError\ndef f(x):\n    global check\n    check = _no\n    return x + 1\n",
    ),
}
CHEAT_TESTS = {
    "fake math module": ["assert math.isclose(f(1), 2)", "assert math.isclose(f(2), 3)"],
    "rebinding the test's helper": [f"def check(c):\n    assert c({i}) == {i + 1}\nf(0)\ncheck(f)" for i in (1, 2)],
}


@pytest.fixture(scope="module", params=[None, False], ids=["bwrap-if-available", "no-bwrap"])
def sb(request):
    return Sandbox(LIMITS, use_bwrap=request.param)


@pytest.mark.parametrize("name", list(CHEATS))
def test_cheat_scores_zero_with_a_wrong_f_and_one_with_a_right_f(sb, name):
    wrong, right = CHEATS[name]
    tests = CHEAT_TESTS.get(name, TESTS)
    bad = sb.run_function_tests(wrong, tests)
    assert bad.passed == [False, False], (name, bad.details)
    good = sb.run_function_tests(right, tests)
    assert good.passed == [True, True], (name, good.details, good.stderr)


def test_non_plain_return_value_fails_with_a_clear_reason(sb):
    res = sb.run_function_tests(ALWAYS_EQUAL + "def f(x):\n    return Yes()\n", TESTS)
    assert res.details == [f"TypeError: f(...) returned an object of type Yes, not plain data ({PLAIN})"] * 2


def test_printing_does_not_corrupt_the_calls(sb):
    prog = "def f(x):\n    print('00000005\\nl2:s2:okT' * 20)\n    return x + 1\n"
    res = sb.run_function_tests(prog, ["assert [f(i) for i in range(50)] == list(range(1, 51))", "assert f(2) == 3"])
    assert res.passed == [True, True], res.details
    assert res.stdout.count("00000005") == 51 * 20 and not res.truncated
