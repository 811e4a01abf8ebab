"""The server's temporary folder: locked while its server lives, removed by the next server once its server is
dead (kill -9 leaves it behind), never while it lives, and nothing else in the temporary folder is touched."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

from ootd.serve.workspace import LOCK, Workspace, remove_dead
from tests.helpers import REPO

HOLD = textwrap.dedent("""
    import os, sys
    from ootd.serve.workspace import Workspace
    folder = Workspace(sys.argv[1])
    print(folder.path, flush=True)
    if sys.argv[2] == "die":
        os._exit(0)  # as after kill -9: no cleanup ran
    sys.stdin.readline()
""")


def holder(root: Path, mode: str) -> subprocess.Popen:
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    return subprocess.Popen([sys.executable, "-c", HOLD, str(root), mode], stdin=subprocess.PIPE,
                            stdout=subprocess.PIPE, text=True, env=env)


def test_dead_servers_folders_go_live_ones_stay(tmp_path: Path) -> None:
    dead = holder(tmp_path, "die")
    dead_folder = Path(dead.stdout.readline().strip())
    assert dead.wait(30) == 0 and (dead_folder / LOCK).is_file()
    (dead_folder / "jobs").mkdir()
    (dead_folder / "jobs" / "result.png").write_bytes(b"x")
    alive = holder(tmp_path, "hold")
    try:
        alive_folder = Path(alive.stdout.readline().strip())
        mine = Workspace(tmp_path)  # this process's own, open
        starting = tmp_path / "ootd-serve-starting"  # no lock file yet: a server between mkdir and lock
        starting.mkdir()
        abandoned = tmp_path / "ootd-serve-old"  # no lock file and old: died before locking
        abandoned.mkdir()
        os.utime(abandoned, (1, 1))
        unrelated = [tmp_path / "ootd-serve-file", tmp_path / "other-folder"]
        unrelated[0].write_text("not a folder")
        unrelated[1].mkdir()
        removed = remove_dead(tmp_path)
        assert sorted(removed) == sorted([dead_folder, abandoned])
        assert not dead_folder.exists() and not abandoned.exists()
        assert alive_folder.is_dir() and mine.path.is_dir() and starting.is_dir()
        assert all(p.exists() for p in unrelated)
        mine.close()
        assert not mine.path.exists()
    finally:
        alive.communicate("\n", timeout=30)
    assert remove_dead(tmp_path) == [alive_folder]  # its server ended without cleaning up: now it is dead


def test_a_workspace_is_locked_before_its_lock_file_has_its_name(tmp_path: Path) -> None:
    folder = Workspace(tmp_path)
    try:
        assert sorted(p.name for p in folder.path.iterdir()) == [LOCK]
        assert remove_dead(tmp_path) == []
    finally:
        folder.close()
