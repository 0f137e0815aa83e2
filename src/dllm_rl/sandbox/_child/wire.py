"""Plain values over a pipe: the only thing that crosses from the program's process to the test process.

Every value is written with an explicit type tag, so that a tuple stays a tuple, a set a set, and an int
of any size or a float (nan, inf, -0.0) comes back exact:

``N`` None, ``T`` / ``F`` bools, ``i<hex>;`` int, ``f<float.hex>;`` float, ``c<re>;<im>;`` complex,
``s<n>:<n bytes of UTF-8>`` str, ``y<n>:<n bytes>`` bytes, ``l<n>:`` / ``t`` / ``S`` / ``Z`` + n values
for list / tuple / set / frozenset, ``d<n>:`` + n key, value pairs for dict, and ``h<id>;`` + a str (its
type name) for an object that stays in the program's process (a handle). Subclasses of these types
travel as the base type (a Counter as a dict, an IntEnum member as an int).

Values that correct programs return although they are not among those types travel too, rebuilt from
plain parts on the receiving side: a built-in type by name (``B`` + str: MBPP 533's tests pass ``int``),
``range`` (``R`` + a tuple), ``bytearray`` (``Y`` like ``y``), ``fractions.Fraction`` (``Q`` + two ints),
``decimal.Decimal`` (``D`` + its str), a namedtuple (``n`` + type name, field names, values: read by
attribute in tests), ``collections.deque`` (``E`` + its maxlen, None or an int, and a list of its values),
``array.array`` (``A`` + its typecode and a list of its values), ``datetime.date``, naive ``datetime.datetime``
and ``datetime.timedelta`` (``G`` + the type's name and a tuple of ints: its fields; a datetime with a tzinfo is not
plain), dict views (``K`` / ``V`` / ``W`` + keys, values, pairs) and any other iterator --
``map``, ``filter``, ``zip``, a generator -- materialised (``I`` + its values; it arrives as an iterator
over them, so ``list(f())`` works and ``f() == [...]`` stays False, as in Python).

:func:`loads` builds only built-in and standard-library types (and, when the caller allows them, handles),
so nothing the program defines -- no ``__eq__``, no ``__bool__`` -- ever runs in the process that judges it.
Frames: 8 hex digits of length, a newline, then the encoded value (at most :data:`MAX_FRAME` bytes).

Hand-written rather than ``json``: importing ``json`` (it pulls in ``re`` and ``enum``) costs about as much
CPU as starting the interpreter itself (about 8 ms each, measured) in every run, and it has no tuples,
sets, bytes or exact big ints anyway; ``marshal`` is not safe to load from an untrusted process.
"""

import builtins
import os
import sys
from _collections_abc import Iterator

MAX_FRAME = 1 << 26
_HEX = frozenset(b"0123456789abcdef")
_SEQ = {list: b"l", tuple: b"t", set: b"S", frozenset: b"Z"}
_BUILD = {ord("l"): list, ord("t"): tuple, ord("S"): set, ord("Z"): frozenset}
#: what :func:`dumps` sends (the text of "not plain data" messages)
PLAIN = (
    "None, bool, int, float, complex, str, bytes, bytearray, list, tuple, dict, set, frozenset, range, "
    "built-in types, Fraction, Decimal, namedtuples, deque, array, date, datetime, timedelta, dict views, iterators"
)
_VIEWS = {type({}.keys()): b"K", type({}.values()): b"V", type({}.items()): b"W"}
_NAMEDTUPLES = {}
#: the ``datetime`` types sent as ``G`` + name + their fields (what the constructor takes back)
_DATES = {
    "date": ("year", "month", "day"),
    "datetime": ("year", "month", "day", "hour", "minute", "second", "microsecond", "fold"),
    "timedelta": ("days", "seconds", "microseconds"),
}


class NotPlain(TypeError):
    """A value that is not plain data (and no handles were allowed)."""


class ProtocolError(ValueError):
    """A malformed frame or value."""


def dumps(value, handle=None):
    """The encoding of ``value``; ``handle(obj) -> int id`` for objects that are not plain data (None:
    raise :class:`NotPlain` naming the type)."""
    out = []
    try:
        _dump(value, handle, out)
    except RecursionError:
        raise NotPlain("a value nested too deeply (or containing itself)") from None
    return b"".join(out)


def _seq_tag(v):
    for base, tag in _SEQ.items():
        if isinstance(v, base):
            return tag
    return None


def _dump(v, handle, out):
    if v is None:
        out.append(b"N")
    elif v is True or v is False:
        out.append(b"T" if v else b"F")
    elif isinstance(v, int):
        out.append(b"i%x;" % int.__int__(v))
    elif isinstance(v, float):
        out.append(b"f" + float.hex(v).encode() + b";")
    elif isinstance(v, (str, bytes, bytearray)):
        data = str.encode(v, "utf-8", "surrogatepass") if isinstance(v, str) else bytes(v)
        tag = b"s" if isinstance(v, str) else b"y" if isinstance(v, bytes) else b"Y"
        out.append(b"%s%d:" % (tag, len(data)) + data)
    elif isinstance(v, tuple) and _namedtuple_fields(v) is not None:
        out.append(b"n")
        _dump(str(type(v).__name__), None, out)
        _dump(_namedtuple_fields(v), None, out)
        _dump(tuple.__new__(tuple, v), handle, out)
    elif _seq_tag(v) is not None:
        _items(_seq_tag(v), list(v), handle, out)
    elif isinstance(v, dict):
        pairs = list(dict.items(v))
        out.append(b"d%d:" % len(pairs))
        for k, x in pairs:
            _dump(k, handle, out)
            _dump(x, handle, out)
    elif isinstance(v, complex):
        out.append(b"c" + float.hex(v.real).encode() + b";" + float.hex(v.imag).encode() + b";")
    else:
        _dump_other(v, handle, out)


def _items(tag, items, handle, out):
    out.append(b"%s%d:" % (tag, len(items)))
    for x in items:
        _dump(x, handle, out)


def _namedtuple_fields(v):
    fields = getattr(type(v), "_fields", None)
    if type(fields) is tuple and all(type(f) is str for f in fields) and len(fields) == len(v):
        return fields
    return None


def _stdlib_type(module, name):
    """``module.name`` when the module is already imported (a program that returns one imported it)."""
    mod = sys.modules.get(module)
    return getattr(mod, name, None) if mod is not None else None


def _dump_other(v, handle, out):
    """The values rebuilt from plain parts (see the module docstring), else a handle or :class:`NotPlain`."""
    fraction, decimal = _stdlib_type("fractions", "Fraction"), _stdlib_type("decimal", "Decimal")
    if isinstance(v, type) and getattr(builtins, v.__name__, None) is v:
        out.append(b"B")
        _dump(v.__name__, None, out)
    elif isinstance(v, range):
        out.append(b"R")
        _dump((v.start, v.stop, v.step), None, out)
    elif fraction is not None and isinstance(v, fraction):
        out.append(b"Q")
        _dump((int.__int__(v.numerator), int.__int__(v.denominator)), None, out)
    elif decimal is not None and isinstance(v, decimal):
        out.append(b"D")
        _dump(decimal.__str__(v), None, out)
    elif _dump_stdlib(v, handle, out):
        pass
    elif type(v) in _VIEWS:
        _items(_VIEWS[type(v)], list(v), handle, out)
    elif isinstance(v, Iterator):
        _items(b"I", list(v), handle, out)
    elif handle is None:
        raise NotPlain(f"an object of type {type(v).__name__}")
    else:
        out.append(b"h%d;" % handle(v))
        _dump(str(type(v).__name__), None, out)


def _date_kind(v):
    """``date`` / ``datetime`` / ``timedelta`` for a value of those types (a datetime only without a tzinfo)."""
    mod = sys.modules.get("datetime")
    if mod is None:
        return None
    if isinstance(v, mod.datetime):
        return "datetime" if v.tzinfo is None else None
    for name in ("date", "timedelta"):
        if isinstance(v, getattr(mod, name)):
            return name
    return None


def _dump_stdlib(v, handle, out):
    """Encode a deque, array or datetime value (see the module docstring); False for anything else."""
    deque, array = _stdlib_type("_collections", "deque"), _stdlib_type("array", "array")
    if deque is not None and isinstance(v, deque):
        out.append(b"E")
        _dump(v.maxlen if type(v.maxlen) is int else None, None, out)
        _items(b"l", list(deque.__iter__(v)), handle, out)
    elif array is not None and isinstance(v, array):
        out.append(b"A")
        _dump(str(v.typecode), None, out)
        _dump(array.tolist(v), None, out)
    elif _date_kind(v) is not None:
        kind = _date_kind(v)
        out.append(b"G")
        _dump(kind, None, out)
        _dump(tuple(int.__int__(getattr(v, f)) for f in _DATES[kind]), None, out)
    else:
        return False
    return True


def loads(data, handle=None):
    """The value encoded in ``data``; ``handle(id, type_name)`` makes the stand-in of a handle (None: a
    handle is a :class:`ProtocolError`). Raises :class:`ProtocolError` for anything malformed."""
    try:
        value, end = _load(data, 0, handle)
    except (ProtocolError, NotPlain):
        raise
    except (TypeError, ValueError, IndexError, ArithmeticError, RecursionError, UnicodeDecodeError) as exc:
        raise ProtocolError(f"malformed value from the other process ({type(exc).__name__})") from None
    if end != len(data):
        raise ProtocolError("malformed value from the other process (trailing bytes)")
    return value


def _count(d, i, stop):
    j = d.index(stop, i)
    if not d[i:j].isdigit():
        raise ProtocolError("malformed length in a value from the other process")
    return int(d[i:j]), j + 1


def _load(d, i, handle):
    tag = d[i]
    i += 1
    if tag in b"NTF":
        return (None, True, False)[b"NTF".index(tag)], i
    if tag == ord("i") or tag == ord("f"):
        j = d.index(b";", i)
        text = d[i:j].decode("ascii")
        return (int(text, 16) if tag == ord("i") else float.fromhex(text)), j + 1
    if tag in b"syY":
        n, i = _count(d, i, b":")
        raw = d[i : i + n]
        if len(raw) != n:
            raise ProtocolError("truncated value from the other process")
        if tag == ord("s"):
            return raw.decode("utf-8", "surrogatepass"), i + n
        return (bytes(raw) if tag == ord("y") else bytearray(raw)), i + n
    if tag in b"BRQDnEAG":
        return _load_rebuilt(d, i, tag, handle)
    if tag in b"KVWI":
        n, i = _count(d, i, b":")
        items = []
        for _ in range(n):
            x, i = _load(d, i, handle)
            items.append(x)
        return _view(tag, items), i
    if tag in _BUILD or tag == ord("d"):
        n, i = _count(d, i, b":")
        items = []
        for _ in range(2 * n if tag == ord("d") else n):
            x, i = _load(d, i, handle)
            items.append(x)
        if tag == ord("d"):
            return dict(zip(items[::2], items[1::2])), i
        return _BUILD[tag](items), i
    if tag == ord("c"):
        j = d.index(b";", i)
        k = d.index(b";", j + 1)
        return complex(float.fromhex(d[i:j].decode("ascii")), float.fromhex(d[j + 1 : k].decode("ascii"))), k + 1
    if tag == ord("h") and handle is not None:
        ident, i = _count(d, i, b";")
        name, i = _load(d, i, None)
        if type(name) is not str:
            raise ProtocolError("malformed handle from the other process")
        return handle(ident, name), i
    raise ProtocolError(f"unexpected value tag {chr(tag)!r} from the other process")


def _parts(d, i, kind):
    """A value of exact type ``kind`` (the plain parts of a rebuilt value)."""
    value, i = _load(d, i, None)
    if type(value) is not kind:
        raise ProtocolError("malformed value from the other process (parts)")
    return value, i


def _load_rebuilt(d, i, tag, handle):
    if tag in b"EAG":
        return _load_stdlib(d, i, tag, handle)
    if tag == ord("B"):
        name, i = _parts(d, i, str)
        cls = getattr(builtins, name, None) if not name.startswith("_") else None
        if not isinstance(cls, type):
            raise ProtocolError(f"no built-in type {name[:40]!r}")
        return cls, i
    if tag == ord("D"):
        import decimal

        text, i = _parts(d, i, str)
        return decimal.Decimal(text), i
    if tag == ord("n"):
        name, i = _parts(d, i, str)
        fields, i = _parts(d, i, tuple)
        values, i = _load(d, i, handle)
        if type(values) is not tuple:
            raise ProtocolError("malformed value from the other process (parts)")
        return _namedtuple(name, fields)(*values), i
    ints, i = _parts(d, i, tuple)
    if not all(type(x) is int for x in ints):
        raise ProtocolError("malformed value from the other process (parts)")
    if tag == ord("R"):
        return range(*ints), i
    import fractions

    return fractions.Fraction(*ints), i


def _load_stdlib(d, i, tag, handle):
    """A deque, array or datetime value rebuilt from its plain parts."""
    if tag == ord("E"):
        import collections

        maxlen, i = _load(d, i, None)
        items, i = _load(d, i, handle)  # the values may be handles, as a list's may
        if not (maxlen is None or type(maxlen) is int) or type(items) is not list:
            raise ProtocolError("malformed value from the other process (parts)")
        return collections.deque(items, maxlen), i
    name, i = _parts(d, i, str)
    if tag == ord("A"):
        import array

        values, i = _parts(d, i, list)
        if len(name) != 1 or name not in array.typecodes:
            raise ProtocolError(f"no array typecode {name[:40]!r}")
        return array.array(name, values), i
    import datetime

    fields, i = _parts(d, i, tuple)
    if name not in _DATES or len(fields) != len(_DATES[name]) or not all(type(x) is int for x in fields):
        raise ProtocolError("malformed value from the other process (parts)")
    if name == "datetime":
        return datetime.datetime(*fields[:7], fold=fields[7]), i
    return getattr(datetime, name)(*fields), i


def _namedtuple(name, fields):
    """This process's namedtuple class for a type name and its fields (made once)."""
    key = (name, fields)
    if key not in _NAMEDTUPLES:
        import collections

        _NAMEDTUPLES[key] = collections.namedtuple(name, fields)
    return _NAMEDTUPLES[key]


def _view(tag, items):
    if tag == ord("K"):
        return dict.fromkeys(items).keys()
    if tag == ord("V"):
        return dict(enumerate(items)).values()
    if tag == ord("W"):
        return dict(items).items()
    return iter(items)


def send(fd, value, handle=None):
    """Write one frame holding ``value`` (see :func:`dumps`) to ``fd``."""
    data = dumps(value, handle)
    if len(data) > MAX_FRAME:
        raise NotPlain(f"a value too large to send ({len(data)} bytes; at most {MAX_FRAME})")
    data = b"%08x\n" % len(data) + data
    while data:
        data = data[os.write(fd, data) :]


def _read_exact(fd, n):
    chunks = []
    while n:
        chunk = os.read(fd, min(n, 1 << 20))
        if not chunk:
            return None
        chunks.append(chunk)
        n -= len(chunk)
    return b"".join(chunks)


def recv(fd, handle=None):
    """Read one frame from ``fd``: its value (see :func:`loads`), or None at end of file."""
    header = _read_exact(fd, 9)
    if header is None:
        return None
    if header[8:] != b"\n" or not _HEX.issuperset(header[:8]):
        raise ProtocolError("malformed frame header from the other process")
    n = int(header[:8], 16)
    if n > MAX_FRAME:
        raise ProtocolError(f"frame of {n} bytes from the other process (at most {MAX_FRAME})")
    data = _read_exact(fd, n)
    if data is None:
        return None
    return loads(data, handle)


def describe(exc):
    """``Type: message`` of an exception, at most 400 characters of message, room for the
    list of plain types in a "not plain data" reason (never raises)."""
    try:
        name = type(exc).__name__
        text = str(exc)
    except BaseException:
        return "exception"
    if not isinstance(name, str) or not isinstance(text, str):
        return "exception"
    if len(text) > 400:
        text = text[:400] + "..."
    return f"{name}: {text}" if text else name
