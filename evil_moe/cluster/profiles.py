"""Make ``snakemake --profile slurm`` (and ``--profile local``) work from the repository root.

Snakemake resolves a ``--profile NAME`` that is not an existing path by looking for a folder
``NAME`` in the working directory, then in its user config directory, then in its site config
directory (``snakemake.cli.get_profile_dir``; the directories come from
``platformdirs.AppDirs("snakemake", "snakemake")``: ``$XDG_CONFIG_HOME/snakemake`` or
``~/.config/snakemake`` on Linux). :func:`install_profiles` symlinks the repository's
``profiles/slurm`` and ``profiles/local`` there, so edits to the profiles in the repository
apply at once.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

PROFILES = ("slurm", "local")
REPO_PROFILES = Path(__file__).resolve().parents[2] / "profiles"


class ProfileError(RuntimeError):
    """A profile cannot be installed (names the path and what to do)."""


@dataclass(frozen=True)
class Installed:
    """One profile link: ``name``, the ``link`` made, its ``source`` and ``status``
    (``"linked"`` or ``"already linked"``)."""

    name: str
    link: Path
    source: Path
    status: str


def snakemake_config_dir() -> Path:
    """Snakemake's user config directory, exactly as Snakemake computes it.

    ``platformdirs.user_config_dir("snakemake", "snakemake")`` (what Snakemake's ``get_appdirs``
    uses); without platformdirs, ``$XDG_CONFIG_HOME/snakemake`` or ``~/.config/snakemake``.
    """
    try:
        from platformdirs import user_config_dir
    except ImportError:  # pragma: no cover - platformdirs comes with snakemake
        base = os.environ.get("XDG_CONFIG_HOME") or str(Path.home() / ".config")
        return Path(base) / "snakemake"
    return Path(user_config_dir("snakemake", "snakemake"))


def _same(link: Path, source: Path) -> bool:
    return link.is_symlink() and link.resolve() == source.resolve()


def install_profiles(target: str | os.PathLike | None = None,
                     source_dir: str | os.PathLike | None = None,
                     names: tuple[str, ...] = PROFILES) -> list[Installed]:
    """Symlink ``profiles/{slurm,local}`` into Snakemake's user config directory.

    Idempotent: a link that already points at the same profile is left as it is. Nothing is
    created unless every profile can be installed.

    Args:
        target: the directory to link into (default :func:`snakemake_config_dir`).
        source_dir: the folder holding the profiles (default the repository's ``profiles/``).
        names: the profiles to link.

    Returns:
        One :class:`Installed` per profile.

    Raises:
        ProfileError: a profile folder is missing from ``source_dir``, or ``target/NAME``
            already exists and is not a link to this repository's profile (it is never
            overwritten; the message names it).
    """
    target = Path(target) if target is not None else snakemake_config_dir()
    source_dir = Path(source_dir) if source_dir is not None else REPO_PROFILES
    plan = []
    for name in names:
        source = (source_dir / name).resolve()
        if not (source / "config.yaml").is_file():
            raise ProfileError(f"profile {name!r} not found: {source}/config.yaml "
                               "(install evil_moe from its repository with `pip install -e .`)")
        link = target / name
        if _same(link, source):
            plan.append(Installed(name, link, source, "already linked"))
        elif link.is_symlink() or link.exists():
            what = f"a link to {os.readlink(link)}" if link.is_symlink() else "a different profile"
            raise ProfileError(
                f"{link} already exists ({what}); not overwriting it. Remove or rename it and "
                f"rerun, or use `snakemake --profile {source}` directly.")
        else:
            plan.append(Installed(name, link, source, "linked"))
    for item in plan:
        if item.status == "linked":
            item.link.parent.mkdir(parents=True, exist_ok=True)
            item.link.symlink_to(item.source, target_is_directory=True)
    return plan
