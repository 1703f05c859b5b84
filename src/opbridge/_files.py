"""Writing files safely: a checked target path, a temporary file beside it, one rename.

Every command that writes (export, rewrite, demo, verify --json, trt-build) goes through
:func:`write_atomic`: a bad path is named before any work is written, a failed write leaves
nothing behind, and the written file gets the permissions a plain ``open()`` would give (a file
it replaces keeps its own), where ``tempfile`` alone would make it private (0600).
"""

from __future__ import annotations

import os
import tempfile
from collections.abc import Callable, Iterable, Sequence
from pathlib import Path
from typing import IO, Any

from opbridge.errors import OutputPathError

__all__ = ["prepare_output", "read_files", "write_atomic", "write_atomic_group"]


def prepare_output(
    path: str | os.PathLike[str], *, protected: Iterable[str | os.PathLike[str]] = (), create: bool = False
) -> Path:
    """The file to write for ``path``; an :class:`OutputPathError` naming the problem and the fix
    where it cannot be used. A symbolic link is written through (its target is replaced, the link
    stays); ``protected``: files it must not be (the input's own, and the external data files of a model
    among them). Missing folders are created only
    with ``create`` (as the write does), so a check made before the work leaves nothing behind.

    Example:
        >>> prepare_output("")  # doctest: +IGNORE_EXCEPTION_DETAIL
        Traceback (most recent call last):
        OutputPathError: the output path is empty; give a file name.
    """
    if not isinstance(path, (str, os.PathLike)):
        raise OutputPathError(f"the output path is a {type(path).__name__}; give a file path, e.g. 'model.onnx'.")
    text = os.fspath(path)
    if not text.strip():
        raise OutputPathError("the output path is empty; give a file name.")
    given = Path(path)
    if text.endswith(("/", os.sep)):  # Path() drops the slash: "out/" would become a file named out
        raise OutputPathError(f"{text} names a folder; give a file path inside it.")
    if given.is_symlink():
        try:
            os.path.realpath(given, strict=True)
        except FileNotFoundError:  # (a link to a file not written yet: the write creates it)
            pass
        except OSError as exc:
            raise OutputPathError(
                f"{given} is a symbolic link that cannot be followed ({exc.strerror or exc}, a loop); remove the link "
                "or give another path."
            ) from None
    target = Path(os.path.realpath(given)) if given.is_symlink() else given
    if target.is_dir():
        raise OutputPathError(f"{given} is a folder; give a file path inside it.")
    if target.exists() and not target.is_file():  # a device or a FIFO would be replaced by a file
        raise OutputPathError(f"{given} is not a regular file (a device or a pipe); give a file path.")
    if target.exists():
        module = _module_of(target)
        if module is not None:  # a factory or --ops module given by name, or a module one of them imported
            raise OutputPathError(
                f"{given} is the source of the module {module}, which this run imported; write elsewhere."
            )
        for other in protected:
            for own in [os.fspath(other), *_data_files(os.fspath(other))]:
                if Path(own).exists() and os.path.samefile(target, own):
                    raise OutputPathError(f"{given} is one of the input's own files ({own}); write elsewhere.")
    parent = target.parent
    existing = parent
    for folder in [parent, *parent.parents]:
        if folder.exists():
            if not folder.is_dir():
                raise OutputPathError(f"cannot write {given}: {folder} is a file, not a folder.")
            existing = folder
            break
    # (write-protected: no write permission for this user, or no write bit at all, which root's access()
    # passes: a file made read-only to keep it is kept from root too)
    if target.exists() and (not os.access(target, os.W_OK) or not target.stat().st_mode & 0o222):
        raise OutputPathError(f"{given} is write-protected; remove it or choose another path.")
    if not os.access(existing, os.W_OK | os.X_OK):
        raise OutputPathError(f"cannot write {given}: no permission to write in {existing}.")
    if create:
        try:
            parent.mkdir(parents=True, exist_ok=True)
        except OSError as exc:
            raise OutputPathError(f"cannot create the folder {parent} for {given}: {exc.strerror or exc}.") from None
    return target


def _module_of(target: Path) -> str | None:
    """The name of an imported module whose source (or compiled) file ``target`` is, else None."""
    import sys

    if target.suffix not in (".py", ".pyc", ".pyw", ".so", ".pyd"):
        return None
    for name, module in list(sys.modules.items()):
        source = getattr(module, "__file__", None)
        if isinstance(source, str) and os.path.basename(source) == target.name:
            try:
                if os.path.samefile(source, target):
                    return name
            except OSError:
                continue
    return None


def _data_files(path: str) -> list[str]:
    """The external data files the ONNX model at ``path`` keeps tensors in (none for another file: only an
    ``.onnx`` file is read, so that a protected data file, gigabytes perhaps, is never parsed)."""
    if not path.endswith(".onnx") or not os.path.isfile(path):
        return []
    from opbridge.model_io import external_files

    return [os.fspath(p) for p in external_files(Path(path))]


def _mode_for(target: Path) -> int:
    if target.exists():
        return target.stat().st_mode & 0o7777
    umask = os.umask(0)
    os.umask(umask)
    return 0o666 & ~umask


def write_atomic(
    path: str | os.PathLike[str],
    write: Callable[[IO[bytes]], object],
    *,
    protected: Iterable[str | os.PathLike[str]] = (),
) -> Path:
    """Write a file through ``write(fh)`` into a temporary file beside ``path``, then rename it into
    place (see :func:`prepare_output`); the path written (a link's target for a link)."""
    (target,) = write_atomic_group([(path, write)], protected=protected)
    return target


def write_atomic_group(
    files: Sequence[tuple[str | os.PathLike[str], Callable[[IO[bytes]], object]]],
    *,
    protected: Iterable[str | os.PathLike[str]] = (),
) -> list[Path]:
    """:func:`write_atomic` for files that belong together (a model and its data file): each written,
    in order, into a temporary file beside it; only once every one is whole are they renamed into place,
    in the same order. A failed write (a full disk) leaves every file as it was. The paths written."""
    protected = list(protected)
    staged: list[tuple[Path, str]] = []
    try:
        for path, write in files:
            target = prepare_output(path, protected=protected, create=True)
            try:
                fd, tmp = tempfile.mkstemp(prefix=f".{target.name}.", suffix=".tmp", dir=target.parent)
            except OSError as exc:
                raise OutputPathError(f"cannot write in {target.parent}: {exc.strerror or exc}.") from None
            staged.append((target, tmp))
            with os.fdopen(fd, "wb") as fh:
                write(fh)
            os.chmod(tmp, _mode_for(target))
        for target, tmp in staged:
            os.replace(tmp, target)
    except BaseException:
        for _, tmp in staged:
            Path(tmp).unlink(missing_ok=True)
        raise
    return [target for target, _ in staged]


def read_files(model: Any, reference: Any = None, inputs: Any = None, ops: Iterable[Any] | None = None) -> list[str]:
    """The files a command reads, which what it writes must never replace: the model, a factory's source
    (``path/to/file.py:factory``; none for a module), input arrays given as files and ``--ops`` files
    (what of each is a path)."""
    found = [model] if isinstance(model, (str, os.PathLike)) else []
    if isinstance(reference, str):
        source = reference.rpartition(":")[0]
        if source.endswith(".py"):
            found.append(source)
    found += [
        i for i in (inputs if isinstance(inputs, (list, tuple)) else [inputs]) if isinstance(i, (str, os.PathLike))
    ]
    found += [o for o in ops or [] if isinstance(o, (str, os.PathLike)) and os.path.isfile(o)]
    return [text for text in (os.fspath(f) for f in found) if text]
