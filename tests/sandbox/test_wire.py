"""The plain-data codec between the program's process and the test process: exact round trips, and
nothing but built-in types (or explicitly allowed handles) out of the bytes an untrusted process sends."""

from __future__ import annotations

import array
import datetime
import decimal
import enum
import fractions
import math
import os
from collections import Counter, OrderedDict, deque, namedtuple

import pytest

from dllm_rl.sandbox._child import wire


def roundtrip(value):
    return wire.loads(wire.dumps(value))


def test_values_come_back_exact_with_their_types():
    big = 7**6000  # more digits than int() may print in decimal: sent in hex
    value = [None, True, False, big, -big, 0.1, -0.0, math.inf, (1, (2,)), {3, 4}, frozenset({5})]
    value += [{(1, 2): [b"\x00\xff"]}, 2 - 3j, "\udc80 é", ""]
    back = roundtrip(value)
    assert back == value and [type(x) for x in back] == [type(x) for x in value]
    assert math.copysign(1.0, back[6]) == -1.0 and math.isnan(roundtrip(math.nan))
    assert wire.dumps((1, [2.5])) == b"t2:i1;l1:f0x1.4000000000000p+1;"


def test_subclasses_travel_as_their_base_type():
    class Colour(enum.IntEnum):
        RED = 3

    class Str(str):
        def __eq__(self, other):
            return True

        __hash__ = str.__hash__

    back = roundtrip([Counter("aab"), OrderedDict(x=1), Colour.RED, Str("s")])
    assert back == [{"a": 2, "b": 1}, {"x": 1}, 3, "s"]
    assert [type(x) for x in back] == [dict, dict, int, str]


def test_values_rebuilt_from_plain_parts():
    point = namedtuple("Point", "x y")(1, [2])
    value = [int, range(1, 9, 3), bytearray(b"\x00a"), fractions.Fraction(-4, 6), decimal.Decimal("1.10"), point]
    back = roundtrip(value)
    assert back == value
    assert [type(x) for x in back[:5]] == [type, range, bytearray, fractions.Fraction, decimal.Decimal]
    assert str(back[4]) == "1.10" and back[5].x == 1 and back[5].y == [2] and type(back[5]).__name__ == "Point"
    assert wire.dumps(int) == b"Bs3:int" and wire.dumps(range(3)) == b"Rt3:i0;i3;i1;"
    views = roundtrip([{"a": 1}.keys(), {"a": 1}.values(), {"a": 1}.items()])
    assert views[0] == {"a"} and list(views[1]) == [1] and views[2] == {("a", 1)}
    lazy = roundtrip([map(abs, [-1, 2]), (i for i in "ab"), zip("ab", "cd"), filter(None, [0, 3])])
    assert [list(x) for x in lazy] == [[1, 2], ["a", "b"], [("a", "c"), ("b", "d")], [3]]
    assert [type(x) for x in lazy] == [type(iter([]))] * 4  # iterators, not lists: f() == [...] stays False


def test_deques_arrays_and_dates_rebuilt_from_plain_parts():
    class Queue(deque):
        def __eq__(self, other):
            return True

    value = [deque([1, (2,)], maxlen=3), deque(), Queue([4]), array.array("d", [1.5, -0.0]), array.array("u", "hé"),
             array.array("q"), datetime.date(2020, 2, 29), datetime.datetime(2020, 1, 2, 3, 4, 5, 6, fold=1),
             datetime.timedelta(days=-1, seconds=5, microseconds=7)]
    back = roundtrip(value)
    assert back == value[:2] + [deque([4])] + value[3:]
    assert [type(x) for x in back] == [deque] * 3 + [array.array] * 3 + [datetime.date, datetime.datetime,
                                                                        datetime.timedelta]
    assert back[0].maxlen == 3 and back[1].maxlen is None and back[7].fold == 1
    assert [x.typecode for x in back[3:6]] == ["d", "u", "q"] and math.copysign(1, back[3][1]) == -1
    assert wire.dumps(datetime.date(2020, 1, 2)) == b"Gs4:datet3:i7e4;i1;i2;"
    assert wire.dumps(deque([1], maxlen=2)) == b"Ei2;l1:i1;" and wire.dumps(array.array("b", [1])) == b"As1:bl1:i1;"
    assert wire.loads(wire.dumps(deque([object()]), lambda obj: 7), lambda i, name: (i, name)) == deque([(7, "object")])
    with pytest.raises(wire.NotPlain, match="^an object of type datetime$"):  # the tzinfo is the program's object
        wire.dumps(datetime.datetime(2020, 1, 1, tzinfo=datetime.UTC))


def test_objects_need_a_handle_maker():
    with pytest.raises(wire.NotPlain, match="^an object of type object$"):
        wire.dumps([1, object()])
    assert wire.dumps(object(), lambda obj: 7) == b"h7;s6:object"
    assert wire.loads(b"h7;s6:object", lambda i, name: (i, name)) == (7, "object")
    loop = []
    loop.append(loop)
    with pytest.raises(wire.NotPlain, match=r"^a value nested too deeply \(or containing itself\)$"):
        wire.dumps(loop)


@pytest.mark.parametrize(
    "data, message",
    [
        (b"i1;i2;", "malformed value from the other process (trailing bytes)"),
        (b"q", "unexpected value tag 'q' from the other process"),
        (b"h7;s6:object", "unexpected value tag 'h' from the other process"),
        (b"s5:abc", "truncated value from the other process"),
        (b"l-1:", "malformed length in a value from the other process"),
        (b"S1:l0:", "malformed value from the other process (TypeError)"),
        (b"i12", "malformed value from the other process (ValueError)"),
        (b"l1:", "malformed value from the other process (IndexError)"),
        (b"Bs4:open", "no built-in type 'open'"),
        (b"Bs9:__class__", "no built-in type '__class__'"),
        (b"Rt3:i0;i1;i0;", "malformed value from the other process (ValueError)"),
        (b"Rt1:f0x1p+0;", "malformed value from the other process (parts)"),
        (b"Ds3:abc", "malformed value from the other process (InvalidOperation)"),
        (b"ns1:Pt1:s1:xl1:i1;", "malformed value from the other process (parts)"),
        (b"ns3:P Qt1:s1:xt1:i1;", "malformed value from the other process (ValueError)"),
        (b"Es1:xl0:", "malformed value from the other process (parts)"),
        (b"ENt0:", "malformed value from the other process (parts)"),
        (b"As2:iil0:", "no array typecode 'ii'"),
        (b"As1:bl1:s1:x", "malformed value from the other process (TypeError)"),
        (b"Gs4:timet0:", "malformed value from the other process (parts)"),
        (b"Gs4:datet2:i1;i1;", "malformed value from the other process (parts)"),
        (b"Gs4:datet3:i7e4;id;i1;", "malformed value from the other process (ValueError)"),
    ],
)
def test_malformed_values_are_rejected(data, message):
    with pytest.raises(wire.ProtocolError) as info:
        wire.loads(data)
    assert str(info.value) == message


def test_frames_over_a_pipe():
    r, w = os.pipe()
    try:
        wire.send(w, ["ok", (1, "x")])
        assert wire.recv(r) == ["ok", (1, "x")]
        os.write(w, b"0 ok 0 0\n")
        with pytest.raises(wire.ProtocolError, match="^malformed frame header from the other process$"):
            wire.recv(r)
        os.close(w)
        w = -1
        assert wire.recv(r) is None
    finally:
        os.close(r)
        if w >= 0:
            os.close(w)
