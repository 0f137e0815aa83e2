"""The test process's side of function tests: the program's top-level names as stand-ins that send each
call to the program's process and get plain values back (:mod:`candidate`, :mod:`wire`).

The test code runs here, in a process that runs nothing of the program: a stand-in (:class:`Remote`) is
defined here, compares by identity, and forwards only calls and attribute access; a reply is decoded into
exact built-in types. Supported: functions (results must be plain data), classes (calling one returns a
handle to the instance, whose attributes and methods are forwarded; passing a handle back passes the
object), plain top-level values (copied) and modules (this process imports its own copy). Not supported:
passing a function or other object of the test into the program (callbacks), seeing the program mutate an
argument in place (arguments are copies), operators on handles other than attribute access and calls.
As in the program's own namespace, its top-level names shadow builtins (MBPP 126's entry point is
``sum``): a program can redefine a name the tests call, and the tests then get that function's plain
results, as they would from any function of the program. A name of a standard-library module
(``math``), though, is always this process's own module, so a fake ``math.isclose`` never reaches a test.
"""

import builtins
import sys

from . import wire

PLAIN = "None, bool, int, float, complex, str, bytes, list, tuple, dict, set, frozenset"
_STDLIB = getattr(sys, "stdlib_module_names", None)


class ProgramError(Exception):
    """The program raised an exception that is not a built-in exception type (``Type: message``)."""


class ProgramGone(Exception):
    """The program's process ended or broke the protocol; no further call can be answered."""


class Remote:
    """A stand-in for an object in the program's process (a function, class or instance)."""

    __slots__ = ("_link", "_id", "_name", "_kind")

    def __init__(self, link, ident, name, kind):
        object.__setattr__(self, "_link", link)
        object.__setattr__(self, "_id", ident)
        object.__setattr__(self, "_name", name)
        object.__setattr__(self, "_kind", kind)

    def __call__(self, *args, **kwargs):
        return self._link.call(self, args, kwargs)

    def __getattr__(self, name):
        if name.startswith("__") and name.endswith("__"):
            raise AttributeError(name)
        return self._link.getattr(self, name)

    def __setattr__(self, name, value):
        self._link.setattr(self, name, value)

    def __repr__(self):
        return "<program {} {}>".format({"cls": "class", "fn": "function"}.get(self._kind, "object"), self._name)


def _exception_type(name):
    cls = getattr(builtins, name, None) if isinstance(name, str) else None
    if isinstance(cls, type) and issubclass(cls, Exception):
        return cls
    return None


class Link:
    """Requests to the program's process over two pipes (one call at a time)."""

    def __init__(self, req_w, rep_r):
        self.req_w, self.rep_r = req_w, rep_r
        self.broken = None
        self.remotes = {}

    def remote(self, ident, name, kind):
        """The one stand-in of handle ``ident`` (so ``node.left is node.left``)."""
        if ident not in self.remotes:
            self.remotes[ident] = Remote(self, ident, name, kind)
        return self.remotes[ident]

    def _handle_id(self, obj):
        if isinstance(obj, Remote) and obj._link is self:
            return obj._id
        raise wire.NotPlain(
            f"cannot pass an object of type {type(obj).__name__} to the program: only plain data ({PLAIN}) "
            "and objects the program made"
        )

    def ask(self, message, handles=None):
        """Send one request; its reply, a list (raises :class:`ProgramGone` once the process is gone).
        ``handles``: a list that collects the stand-ins made for handles in the reply."""
        if self.broken:
            raise ProgramGone(self.broken)
        try:
            wire.send(self.req_w, message, self._handle_id)
        except wire.NotPlain as exc:  # an argument that cannot be sent: this test fails
            raise TypeError(str(exc)) from None

        def stand_in(ident, type_name):
            remote = self.remote(ident, type_name, "obj")
            if handles is not None:
                handles.append(remote)
            return remote

        try:
            reply = wire.recv(self.rep_r, stand_in)
        except OSError:
            reply = None
        except wire.ProtocolError as exc:
            self.broken = str(exc)
            raise ProgramGone(self.broken) from None
        if type(reply) is not list or not reply:
            self.broken = "the program's process ended" if reply is None else "malformed reply from the program"
            raise ProgramGone(self.broken)
        return reply

    def _result(self, message, what, handles_ok):
        made = []
        reply = self.ask(message, made)
        tag = reply[0]
        if tag == "ok" and len(reply) == 2:
            if made and not handles_ok:
                raise TypeError(_not_plain(what, f"an object of type {made[0]._name}"))
            return reply[1]
        if tag == "raise" and len(reply) == 3:
            name, message = str(reply[1]), str(reply[2])
            cls = _exception_type(name)
            if cls is not None:
                raise cls(message)
            raise ProgramError(f"{name}: {message}" if message else name)
        if tag == "bad" and len(reply) == 2:
            raise TypeError(_not_plain(what, str(reply[1])))
        self.broken = "malformed reply from the program"
        raise ProgramGone(self.broken)

    def call(self, remote, args, kwargs):
        """``remote(*args, **kwargs)`` in the program's process."""
        message = ["call", remote._id, list(args), {str(k): v for k, v in kwargs.items()}]
        return self._result(message, f"{remote._name}(...)", remote._kind == "cls")

    def getattr(self, remote, name):
        """``remote.name`` (plain data or a handle)."""
        return self._result(["getattr", remote._id, name], f"{remote._name}.{name}", True)

    def setattr(self, remote, name, value):
        """``remote.name = value``."""
        self._result(["setattr", remote._id, name, value], f"{remote._name}.{name} = ...", False)


def _not_plain(what, why):
    return f"{what} returned {why}, not plain data ({PLAIN})"


def _module(name):
    top = name.partition(".")[0]
    if name in sys.modules or (_STDLIB is not None and top in _STDLIB):
        try:
            __import__(name)
            return sys.modules[name]
        except BaseException:
            return None
    return None


def namespace(manifest, link):
    """The test namespace: the program's top-level names as stand-ins, copies or this process's modules."""
    ns = {"__name__": "solution", "__builtins__": builtins}
    for entry in manifest if type(manifest) is list else []:
        if type(entry) is not list or len(entry) != 3 or type(entry[0]) is not str:
            continue
        name, kind, payload = entry
        if name.startswith("__") and name.endswith("__"):
            continue
        if _STDLIB is not None and name in _STDLIB:  # ``math`` is this process's math, whatever the program bound
            mod = _module(name)
            if mod is not None:
                ns[name] = mod
            continue
        if kind == "val":
            ns[name] = payload
        elif kind == "mod" and isinstance(payload, str):
            mod = _module(payload)
            if mod is not None:
                ns[name] = mod
        elif kind in ("fn", "cls", "obj") and type(payload) is int and payload >= 0:
            ns[name] = link.remote(payload, name, kind)
    return ns


def run_function_tests(job, link, emit):
    """Send the program, build the namespace, run ``setup`` then each test; ``emit(i, b"ok" | b"fail", why)``."""
    tests = job["tests"]
    step = "program"
    try:
        reply = link.ask(["program", job["program"]])
        if reply[0] != "ready" or len(reply) != 2:
            why = str(reply[1]) if reply[0] == "fail" and len(reply) == 2 else "malformed reply"
            raise ProgramError(why)
        ns = namespace(reply[1], link)
        step = "setup"
        if job.get("setup"):
            exec(compile(job["setup"], "<setup>", "exec"), ns)
    except BaseException as exc:
        why = str(exc) if isinstance(exc, (ProgramError, ProgramGone)) and step == "program" else wire.describe(exc)
        for i in range(len(tests)):
            emit(i, b"fail", (f"{step} failed: {why}").encode("utf-8", "replace"))
        return
    for i, test in enumerate(tests):
        try:
            exec(compile(test, f"<test {i}>", "exec"), ns)
        except BaseException as exc:
            emit(i, b"fail", wire.describe(exc).encode("utf-8", "replace"))
            continue
        emit(i, b"ok")
