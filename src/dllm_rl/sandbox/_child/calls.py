"""The test process's side of function tests: the program's names the tests reach, as stand-ins that send
each call to the program's process and get plain values back (:mod:`candidate`, :mod:`wire`).

The test code runs here, in a process that runs nothing of the program: a stand-in (:class:`Remote`) is
defined here, compares by identity, and forwards only calls and attribute access; a reply is decoded into
built-in (or standard-library value) types. Supported: functions (results must be plain data, see
:data:`wire.PLAIN`), classes (calling one returns a handle to the instance, whose attributes and methods
are forwarded; passing a handle back passes the object), plain top-level values (copied) and modules
(this process imports its own copy). An exception the program raises arrives as its built-in type, or as
a class of its name made here on its first built-in base (``except ValueError`` catches the program's
``ValueError`` subclass). Not supported: passing a function or other object of the test into the
program (callbacks), seeing the program mutate an argument in place (arguments are copies), operators on
handles other than attribute access and calls.

Which names of the program the tests see: the entry point, and every other global name the tests or the
setup read that is not a builtin and that the trusted *prelude* (HumanEval's prompt, run here first:
its helpers such as ``poly``) does not define. So a program that redefines ``abs``, ``poly`` or any
other name with a trusted meaning changes nothing the tests call; a name of a standard-library module
(``math``) is always this process's own module. The entry point may carry a builtin's name (MBPP 126's
is ``sum``). The program's globals stay live: when a call changes one the tests read, the program's process
sends it again before the reply and it is bound again here, unless the tests or the setup bound that name
themselves since (a helper of the test stays the test's).
"""

import builtins
import sys

from . import wire

PLAIN = wire.PLAIN
_STDLIB = getattr(sys, "stdlib_module_names", None)
_BUILTIN_NAMES = frozenset(dir(builtins))
_EXCEPTIONS = {}


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


def _builtin_exception(name):
    cls = getattr(builtins, name, None) if type(name) is str else None
    if isinstance(cls, type) and issubclass(cls, Exception):
        return cls
    return None


def _exception_type(name, base):
    """The class to raise for the program's exception ``name`` whose first built-in base is ``base``: the
    built-in class itself, else a class of that name made here on that base (None: neither is usable)."""
    cls = _builtin_exception(name)
    if cls is not None:
        return cls
    base_cls = _builtin_exception(base)
    if base_cls is None or type(name) is not str or not name.isidentifier():
        return None
    if (name, base_cls) not in _EXCEPTIONS:
        _EXCEPTIONS[name, base_cls] = type(name, (base_cls,), {"__module__": "solution"})
    return _EXCEPTIONS[name, base_cls]


class Link:
    """Requests to the program's process over two pipes (one call at a time)."""

    def __init__(self, req_w, rep_r):
        self.req_w, self.rep_r = req_w, rep_r
        self.broken = None
        self.remotes = {}
        self.on_globals = None  # called with the program's changed globals (a manifest) before a reply

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
        self.send(message)
        return self.receive(handles)

    def send(self, message):
        """Send one request (its reply is read by :meth:`receive`)."""
        if self.broken:
            raise ProgramGone(self.broken)
        try:
            wire.send(self.req_w, message, self._handle_id)
        except wire.NotPlain as exc:  # an argument that cannot be sent: this test fails
            raise TypeError(str(exc)) from None

    def receive(self, handles=None):
        """The reply to the last request (see :meth:`ask`)."""

        while True:
            made = []
            reply = self._frame(made)
            if reply[0] != "globals":
                if handles is not None:
                    handles.extend(made)
                return reply
            if len(reply) == 2 and self.on_globals is not None:
                self.on_globals(reply[1])

    def _frame(self, made):
        """The next frame from the program's process, a non-empty list; ``made`` collects its new stand-ins."""

        def stand_in(ident, type_name):
            remote = self.remote(ident, type_name, "obj")
            made.append(remote)
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
        if tag == "raise" and len(reply) == 4:
            name, message = str(reply[1]), str(reply[2])
            cls = _exception_type(name, reply[3])
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


def _global_names(code):
    """Every name ``code`` (and the functions and classes in it) may read as a global or an attribute."""
    names = set(code.co_names)
    for const in code.co_consts:
        if isinstance(const, type(code)):
            names |= _global_names(const)
    return names


def wanted_names(entry, codes):
    """The program's names the tests may see: ``entry``, and every other name the compiled tests and setup
    read that is not a builtin (the prelude's names are dropped when the reply is bound)."""
    names = set()
    for code in codes:
        if not isinstance(code, BaseException):
            names |= _global_names(code)
    names -= _BUILTIN_NAMES
    if type(entry) is str and entry:
        names.add(entry)
    return sorted(names)


_ABSENT = object()


class Names:
    """The program's names in the test namespace ``ns`` (which already holds the prelude's), bound from the
    program's manifest and bound again when a call changes them."""

    def __init__(self, ns, link, entry, wanted):
        self.ns, self.link, self.entry, self.wanted = ns, link, entry, frozenset(wanted)
        self.trusted = set(ns)
        self.bound = {}  # what this class last bound to each name

    def bind(self, manifest):
        """Bind the names of the program's manifest: as stand-ins, copies or this process's modules. A name the
        prelude defined stays the prelude's, except the entry point, which the program provides."""
        for item in manifest if type(manifest) is list else []:
            if type(item) is not list or len(item) != 3 or type(item[0]) is not str:
                continue
            name, kind, payload = item
            if (name.startswith("__") and name.endswith("__")) or (name in self.trusted and name != self.entry):
                continue
            value = self._value(name, kind, payload)
            if value is not _ABSENT:
                self.ns[name] = self.bound[name] = value
        return self.ns

    def rebind(self, manifest):
        """Bind again the program's globals that a call changed (the names the tests read), except those the tests
        or the setup bound themselves since."""
        self.bind([item for item in manifest if type(manifest) is list and type(item) is list and item
                   and item[0] in self.wanted and self.ns.get(item[0], _ABSENT) is self.bound.get(item[0], _ABSENT)])

    def _value(self, name, kind, payload):
        if _STDLIB is not None and name in _STDLIB:  # ``math`` is this process's math, whatever the program bound
            return _module(name) or _ABSENT
        if kind == "val":
            return payload
        if kind == "mod" and isinstance(payload, str):
            return _module(payload) or _ABSENT
        if kind in ("fn", "cls", "obj") and type(payload) is int and payload >= 0:
            return self.link.remote(payload, name, kind)
        return _ABSENT



def _compiled(source, where):
    try:
        return compile(source, where, "exec")
    except BaseException as exc:  # the test fails when its turn comes
        return exc


def run_function_tests(job, link, emit):
    """Send the program, run the prelude, bind the program's names, run ``setup`` then each test;
    ``emit(i, b"ok" | b"fail", why)``."""
    tests = [_compiled(t, f"<test {i}>") for i, t in enumerate(job["tests"])]
    setup = _compiled(job.get("setup") or "", "<setup>")
    entry = job.get("entry_point")
    ns = {"__name__": "solution", "__builtins__": builtins}
    wanted = wanted_names(entry, [setup, *tests])
    step = "program"
    try:
        link.send(["program", job["program"], wanted])
        step = "prelude"  # runs here while the program's process runs the program
        if job.get("prelude"):
            exec(compile(job["prelude"], "<prelude>", "exec"), ns)
        step = "program"
        reply = link.receive()
        if reply[0] != "ready" or len(reply) != 2:
            why = str(reply[1]) if reply[0] == "fail" and len(reply) == 2 else "malformed reply"
            raise ProgramError(why)
        names = Names(ns, link, entry, wanted)
        names.bind(reply[1])
        link.on_globals = names.rebind
        step = "setup"
        if isinstance(setup, BaseException):
            raise setup
        exec(setup, ns)
    except BaseException as exc:
        why = str(exc) if isinstance(exc, (ProgramError, ProgramGone)) and step == "program" else wire.describe(exc)
        for i in range(len(tests)):
            emit(i, b"fail", (f"{step} failed: {why}").encode("utf-8", "replace"))
        return
    for i, test in enumerate(tests):
        try:
            if isinstance(test, BaseException):
                raise test
            exec(test, ns)
        except BaseException as exc:
            emit(i, b"fail", wire.describe(exc).encode("utf-8", "replace"))
            continue
        emit(i, b"ok")
