"""Where torch.compile keeps its cache: the user's own cache folder ($XDG_CACHE_HOME or ~/.cache, then
ootd/inductor), not torch's default in the shared temporary folder (/tmp/torchinductor_USER: kept by nobody,
seen by every user of the machine, filling a tmpfs).

torch reads TORCHINDUCTOR_CACHE_DIR when torch._inductor is first imported (diffusers imports it), and then
writes its default back into the environment; so the device's runtime environment (policy.py, applied when a
pipeline loads) comes too late for it. `import ootd` sets it instead (unless the user did), before anything of
ootd imports diffusers. No torch here: `ootd --help` stays fast.
"""

from __future__ import annotations

import os
from collections.abc import Mapping, MutableMapping

INDUCTOR_CACHE = "TORCHINDUCTOR_CACHE_DIR"


def inductor_cache_dir(environ: Mapping[str, str] | None = None) -> str | None:
    """The folder for torch.compile's cache; None when there is no home folder to put it in (torch's default
    stays then)."""
    environ = os.environ if environ is None else environ
    base = environ.get("XDG_CACHE_HOME") or ""
    if not os.path.isabs(base):
        home = environ.get("HOME") or os.path.expanduser("~")
        if not os.path.isabs(home) or not os.path.isdir(home):
            return None
        base = os.path.join(home, ".cache")
    return os.path.join(base, "ootd", "inductor")


def use_user_cache(environ: MutableMapping[str, str] | None = None) -> str | None:
    """Point torch.compile's cache at `inductor_cache_dir` unless the environment already names one; returns
    what the environment names afterwards."""
    environ = os.environ if environ is None else environ
    if INDUCTOR_CACHE not in environ:
        folder = inductor_cache_dir(environ)
        if folder is not None:
            environ[INDUCTOR_CACHE] = folder
    return environ.get(INDUCTOR_CACHE)
