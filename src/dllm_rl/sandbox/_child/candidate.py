"""The program's process: runs the untrusted program and answers calls from the test process with plain
values (:mod:`wire`). Nothing here decides a verdict: this process never holds the marker pipe or the
run's nonce (it is forked before the job is read), and whatever it sends is decoded as plain data.

Requests (test process -> here): ``["program", source, [names]]`` once (the names the tests may reach),
then ``["call", id, [args], [[k, v]]]``, ``["getattr", id, name]``, ``["setattr", id, name, value]``.
Replies: ``["ready", manifest]`` / ``["fail", why]`` for the program, then ``["ok", value]``, ``["raise",
type name, message, built-in base]`` (the call raised; the base is the first built-in exception class of
its type's MRO), or ``["bad", why]`` (the result is not plain data). A call returns a handle only when it calls
a class (a constructor); attributes may be handles (``node.left``).

The program runs as the module ``solution`` in ``sys.modules``, so its functions pickle by reference
(``multiprocessing.Pool`` forks workers that find them). Its globals stay live for the tests: the names the
tests read that were plain values, or not yet defined, when the program ran are checked after every request,
and those that changed are sent as ``["globals", manifest entries]`` before the reply (``calls = 0`` that
``f`` increments reads 2 after two calls).
"""

import builtins
import os
import sys
import types

from . import wire


def start(close_fds):
    """Fork the program's process; in the parent return ``(request_w, reply_r)``. The child closes
    ``close_fds`` (the marker pipe) and stdin, serves until the requests end, and exits."""
    req_r, req_w = os.pipe()
    rep_r, rep_w = os.pipe()
    pid = os.fork()
    if pid == 0:
        try:
            os.close(req_w)
            os.close(rep_r)
            for fd in close_fds:
                os.close(fd)
            null = os.open(os.devnull, os.O_RDONLY)
            os.dup2(null, 0)
            os.close(null)
            serve(req_r, rep_w)
        finally:
            for stream in (sys.stdout, sys.stderr):
                try:
                    stream.flush()
                except BaseException:
                    pass
            os._exit(0)
    os.close(req_r)
    os.close(rep_w)
    return req_w, rep_r


class _Objects:
    """The objects the test process holds handles to, by id."""

    def __init__(self):
        self.by_id = []
        self.ids = {}  # id(obj) -> handle; the object stays alive in by_id, so id(obj) stays its own

    def add(self, obj):
        if id(obj) not in self.ids:
            self.ids[id(obj)] = len(self.by_id)
            self.by_id.append(obj)
        return self.ids[id(obj)]

    def get(self, i, _type_name=None):
        if type(i) is not int or not 0 <= i < len(self.by_id):
            raise wire.ProtocolError(f"unknown handle {i!r}")
        return self.by_id[i]


def manifest(ns, objects, wanted):
    """What the program defined at top level under the ``wanted`` names (only those are copied, so a large
    table no test reads costs nothing): ``[name, "val", value]`` (plain data), ``[name, "mod", module
    name]``, or ``[name, "fn" | "cls" | "obj", id]`` (called through handles)."""
    out = []
    room = wire.MAX_FRAME // 2  # values past it stay here as handles, so the manifest always fits a frame
    for name in wanted:
        if type(name) is not str or (name.startswith("__") and name.endswith("__")) or name not in ns:
            continue
        obj = ns[name]
        if isinstance(obj, types.ModuleType):
            out.append([name, "mod", str(getattr(obj, "__name__", ""))])
            continue
        if not isinstance(obj, wire.Iterator):  # copying would consume it: the tests get a handle
            try:
                room -= len(wire.dumps(obj))
                if room >= 0:
                    out.append([name, "val", obj])
                    continue
            except wire.NotPlain:
                pass
        kind = "cls" if isinstance(obj, type) else "fn" if callable(obj) else "obj"
        out.append([name, kind, objects.add(obj)])
    return out


class Live:
    """The names whose values go back to the tests whenever a request changed them (see the module docstring)."""

    #: values that cannot change without their name being rebound
    ATOMS = (int, float, complex, str, bytes, type(None))

    def __init__(self, ns, objects, wanted, first):
        self.ns, self.objects = ns, objects
        sent = {item[0]: item for item in first}
        self.names = [n for n in wanted if type(n) is str and (n not in sent or sent[n][1] == "val")]
        self.last = {n: (self.ns.get(n, _ABSENT), self._key(sent.get(n))) for n in self.names}

    def _key(self, item):
        return None if item is None else wire.dumps(item, self.objects.add)

    def changes(self):
        """The manifest entries of the live names whose values changed since they were last sent."""
        out = []
        for name in self.names:
            obj = self.ns.get(name, _ABSENT)
            before, key = self.last[name]
            if obj is before and type(obj) in self.ATOMS:
                continue
            (item,) = manifest(self.ns, self.objects, [name]) or [None]
            if self._key(item) != key:
                out.append(item)
            self.last[name] = (obj, self._key(item))
        return [item for item in out if item is not None]


_ABSENT = object()


def _answer(req, objects):
    """``(reply, handle)``: the reply to one request, and the handle maker for its value (None: plain only)."""
    op = req[0]
    target = objects.get(req[1])
    try:
        if op == "call":
            value = target(*req[2], **req[3])
            return ["ok", value], objects.add if isinstance(target, type) else None
        if op == "getattr":
            return ["ok", getattr(target, str(req[2]))], objects.add
        if op == "setattr":
            setattr(target, str(req[2]), req[3])
            return ["ok", None], None
    except BaseException as exc:
        name, _, message = wire.describe(exc).partition(": ")
        return ["raise", name, message, _builtin_base(type(exc))], None
    raise wire.ProtocolError(f"unknown request {op!r}")


def _builtin_base(cls):
    """Name of the first built-in exception class in ``cls``'s MRO (``except ValueError`` in a test catches
    the program's ``ValueError`` subclasses)."""
    for base in getattr(cls, "__mro__", ()):
        if isinstance(base, type) and getattr(builtins, base.__name__, None) is base:
            return base.__name__
    return "Exception"


def _reply(rep_w, reply, handle):
    try:
        wire.send(rep_w, reply, handle)
    except wire.NotPlain as exc:
        wire.send(rep_w, ["bad", str(exc)])
    except BaseException as exc:
        wire.send(rep_w, ["bad", "the program's process could not send it: " + wire.describe(exc)])


def serve(req_r, rep_w):
    """Run the program, send its manifest, then answer requests until end of file."""
    objects = _Objects()
    msg = wire.recv(req_r)
    if not msg or msg[0] != "program" or len(msg) != 3 or type(msg[2]) is not list:
        return
    module = types.ModuleType("solution")
    sys.modules["solution"] = module  # pickle finds the program's functions by reference
    ns = module.__dict__
    ns["__builtins__"] = builtins
    try:
        exec(compile(msg[1], "<solution>", "exec"), ns)
    except BaseException as exc:
        wire.send(rep_w, ["fail", wire.describe(exc)])
        return
    try:
        ready = ["ready", manifest(ns, objects, msg[2])]
        live = Live(ns, objects, msg[2], ready[1])
    except BaseException as exc:
        ready = ["fail", "the program's names could not be read: " + wire.describe(exc)]
    wire.send(rep_w, ready)
    if ready[0] != "ready":
        return
    while True:
        req = wire.recv(req_r, objects.get)
        if req is None:
            return
        try:
            reply, handle = _answer(req, objects)
        except BaseException as exc:
            reply, handle = ["bad", "the program's process could not answer: " + wire.describe(exc)], None
        _send_changes(rep_w, live)
        _reply(rep_w, reply, handle)


def _send_changes(rep_w, live):
    """Send the live names that the last request changed (nothing when none did)."""
    try:
        changed = live.changes()
        if changed:
            wire.send(rep_w, ["globals", changed], live.objects.add)
    except BaseException:  # a value that cannot be read or sent stays as the tests last saw it
        pass
