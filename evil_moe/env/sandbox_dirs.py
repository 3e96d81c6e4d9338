"""Where the sandbox's folders live on the host, and who removes them.

Each worker pool (one per :class:`evil_moe.env.grader.Grader`; a lone zygote, such as
:func:`evil_moe.env.sandbox.probe_bwrap`'s, has its own) makes one parent folder in the
temporary folder, ``evil_moe_sbx_<pid>_<random>``, holding one folder per zygote and
``owner.json``: the owning process (pid, its start time in clock ticks since boot, the boot id,
the host). One removal of the parent takes every zygote's folder. It is removed

- by the pool's ``close`` (the grader's ``close`` or ``with`` block);
- at interpreter exit (:mod:`atexit`), for a pool never closed;
- on SIGTERM or SIGHUP, when nothing else in the process handles it (a stage without its own
  handler: the pilot has one for SIGTERM, and closes its grader before it exits 143): the zygotes
  are killed, the folders removed, then the signal's default action is taken, so the exit status
  is unchanged;
- after SIGKILL (or ``os._exit``), which no process can clean up after: by the next pool's start
  in any process (:func:`sweep_stale`), which removes the parents whose owner is gone: same host,
  and another boot, or the pid no longer alive, or alive with another start time (reused).

Folders of another user or another host, and folders without a readable ``owner.json`` (an
earlier version's flat ``evil_moe_sbx_*`` folders, or a parent being made), are never touched.
"""

from __future__ import annotations

import atexit
import json
import os
import secrets
import signal
import socket
import tempfile
import threading
from pathlib import Path
from typing import Callable

from evil_moe.env.sandbox_zygote import rmtree

PREFIX = "evil_moe_sbx_"
SIGNALS = (signal.SIGTERM, signal.SIGHUP)  # whose default action ends the process uncleaned
OWNER = "owner.json"
# parent folder -> (the pid that made it, what kills its zygotes: no locks taken, it may run in
# a signal handler); a forked child inherits the entries but never acts on its parent's
_LIVE: dict[str, tuple[int, Callable[[], None] | None]] = {}


def _start_ticks(pid: int) -> int | None:
    """The process's start time (clock ticks after boot; ``/proc/<pid>/stat`` field 22), None
    where there is no ``/proc`` or no such process."""
    try:
        text = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    return int(text.rsplit(")", 1)[1].split()[19])


def _boot_id() -> str | None:
    try:
        return Path("/proc/sys/kernel/random/boot_id").read_text().strip()
    except OSError:
        return None


def identity(pid: int | None = None) -> dict:
    """``{"pid", "start", "boot", "host"}`` of process ``pid`` (default: this one)."""
    pid = os.getpid() if pid is None else pid
    return {"pid": pid, "start": _start_ticks(pid), "boot": _boot_id(), "host": socket.gethostname()}


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # another user's process: alive
        return True
    return True


def owner_gone(owner: dict) -> bool:
    """Whether the process that made a parent folder is gone, as far as this host can tell
    (False for another host's folder: never ours to judge)."""
    here = identity()
    if owner.get("host") != here["host"]:
        return False
    if owner.get("boot") and here["boot"] and owner["boot"] != here["boot"]:
        return True
    pid = int(owner.get("pid", -1))
    if pid <= 0 or not _alive(pid):
        return True
    start = _start_ticks(pid)
    return owner.get("start") is not None and start is not None and start != owner["start"]


def make_parent() -> str:
    """A new parent folder for this process's zygote folders (``0o755``: a zygote that drops to
    its own uid must reach its folder), with ``owner.json``; registered for removal at exit and
    on :data:`SIGNALS` (:func:`release` removes it).

    The handlers are installed and the name registered *before* the folder is made, so a signal
    that arrives as soon as the folder exists (a scheduler's SIGTERM at start-up) removes it: a
    name registered but not yet made costs nothing to remove. Raises OSError when the temporary
    folder cannot be written."""
    _install_handlers()
    root = tempfile.gettempdir()
    while True:
        parent = os.path.join(root, f"{PREFIX}{os.getpid()}_{secrets.token_hex(4)}")
        _LIVE[parent] = (os.getpid(), None)
        try:
            os.mkdir(parent, 0o700)
            break
        except FileExistsError:  # a dead process with our pid left it: the sweep's to remove
            _LIVE.pop(parent, None)
        except OSError:
            _LIVE.pop(parent, None)
            raise
    os.chmod(parent, 0o755)
    tmp = Path(parent) / f".{OWNER}"
    tmp.write_text(json.dumps(identity()))
    tmp.replace(Path(parent) / OWNER)
    return parent


def register(parent: str, kill: Callable[[], None]) -> None:
    """``kill`` kills the zygotes of ``parent`` (called before its removal on a signal; it must
    not block nor take a lock)."""
    if parent in _LIVE:
        _LIVE[parent] = (_LIVE[parent][0], kill)


def release(parent: str) -> None:
    """Remove ``parent`` and all below it (its zygotes must be dead) and forget it."""
    _LIVE.pop(parent, None)
    rmtree(parent)
    if not _LIVE and _on_main_thread():
        for sig in SIGNALS:
            if signal.getsignal(sig) is _on_signal:
                signal.signal(sig, signal.SIG_DFL)


def remove_all() -> None:
    """Kill every registered zygote and remove every parent of this process (at exit, on a
    signal). Never raises."""
    for parent, (pid, kill) in list(_LIVE.items()):
        if pid != os.getpid():
            continue
        if kill is not None:
            try:
                kill()
            except Exception:  # noqa: BLE001 - best effort on the way out
                pass
        _LIVE.pop(parent, None)
        rmtree(parent)


def _on_main_thread() -> bool:
    return threading.current_thread() is threading.main_thread()


def _on_signal(signum, frame) -> None:
    remove_all()
    signal.signal(signum, signal.SIG_DFL)
    os.kill(os.getpid(), signum)


def _install_handlers() -> None:
    """Handle each of :data:`SIGNALS` with :func:`_on_signal` where nothing else does (the
    default action), on the main thread (only it may set handlers)."""
    if not _on_main_thread():
        return
    for sig in SIGNALS:
        if signal.getsignal(sig) == signal.SIG_DFL:
            signal.signal(sig, _on_signal)


def sweep_stale(tmp: str | None = None) -> list[str]:
    """Remove the parent folders under ``tmp`` (default: the temporary folder) that belong to
    this user and whose owner is gone (:func:`owner_gone`); returns them."""
    root = Path(tmp or tempfile.gettempdir())
    removed = []
    try:
        entries = list(os.scandir(root))
    except OSError:
        return removed
    for e in entries:
        if not e.name.startswith(PREFIX) or str(root / e.name) in _LIVE:
            continue
        try:
            if not e.is_dir(follow_symlinks=False) or e.stat(follow_symlinks=False).st_uid != os.geteuid():
                continue
            owner = json.loads((root / e.name / OWNER).read_text())
        except (OSError, ValueError):
            continue
        if isinstance(owner, dict) and owner_gone(owner):
            rmtree(str(root / e.name))
            removed.append(str(root / e.name))
    return removed


atexit.register(remove_all)
