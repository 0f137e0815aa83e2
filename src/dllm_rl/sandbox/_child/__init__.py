"""Programs that run in the sandbox's child processes (reaper, launcher, test harness, program server).

They run under the sandbox interpreter (``python -S -I -B``, possibly older than the host's, at least 3.8),
as the sandbox user and inside bubblewrap, so they use the standard library only and import nothing
from ``dllm_rl`` outside this package. Each entry module (``reaper``, ``launcher``, ``harness``) runs by
file path: it puts the directory above this one on ``sys.path`` and imports its siblings as the package
``_child`` (PEP 366), so the same files also import in-process as ``dllm_rl.sandbox._child`` (for tests).
"""
