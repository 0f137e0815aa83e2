"""Isolation set-up: where the sandbox user cannot read the installed child programs, a private readable
copy is used (and bound into bubblewrap)."""

from __future__ import annotations

import os
import stat

from dllm_rl.sandbox import Sandbox, SandboxLimits
from dllm_rl.sandbox import isolation as iso_mod


def test_unreadable_child_programs_run_from_a_private_copy(monkeypatch):
    real = iso_mod._choose_python

    def unreadable(*args):
        return (*real(*args)[:3], False)  # as if the sandbox user could not read CHILD_DIR

    monkeypatch.setattr(iso_mod, "_ISOLATION", {})
    monkeypatch.setattr(iso_mod, "_choose_python", unreadable)
    sb = Sandbox(SandboxLimits(timeout_s=5))
    iso = sb.isolation
    assert iso.child_dir != iso_mod.CHILD_DIR and os.path.basename(iso.child_dir) == "_child"
    assert iso.notes[-1].startswith(f"user {iso.user!r} cannot read {iso_mod.CHILD_DIR}; using a private copy at ")
    names = sorted(n for n in os.listdir(iso.child_dir) if n.endswith(".py"))
    assert names == sorted(n for n in os.listdir(iso_mod.CHILD_DIR) if n.endswith(".py"))
    modes = {stat.S_IMODE(os.stat(os.path.join(iso.child_dir, n)).st_mode) for n in names}
    assert modes == {0o644} and stat.S_IMODE(os.stat(iso.child_dir).st_mode) == 0o755
    if iso.bwrap:
        assert ["--ro-bind", iso.child_dir, iso_mod.BWRAP_CHILD_DIR] == list(iso.bwrap_binds[-3:])
    res = sb.run_function_tests("def f(x):\n    return x + 1\n", ["assert f(1) == 2", "assert f(1) == 3"])
    assert res.passed == [True, False], res.details
