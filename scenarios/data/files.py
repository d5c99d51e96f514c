"""Where the benchmark files live, how they are checked, and how ``fairclip data`` fetches them.

The data directory holds four folders, laid out as in ``/work/shared/data`` (see its SOURCES.md)::

    mnist/{train,t10k}-{images-idx3,labels-idx1}-ubyte.gz
    fashion-mnist/{train,t10k}-{images-idx3,labels-idx1}-ubyte.gz
    adult/adult.{data,test,names}
    dutch/dutch_census_2001.arff

It is named explicitly (``--data-dir``) or by the environment variable ``FAIRCLIP_DATA``
(:func:`resolve_data_dir`). Every file is checked against the SHA-256 below before it is read
(:func:`verified_path`); a file that passed once is not hashed again in this process while its
size and modification time stay the same. :func:`fetch` downloads missing or corrupt files with
``urllib`` (tried source by source, written to a temporary file, checked, then renamed into
place). Every failure raises :class:`DataError` with one line naming the file and the remedy.
"""

from __future__ import annotations

import hashlib
import http.client
import os
import tempfile
import urllib.error
import urllib.request
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path

from fairclip.atomic import process_umask
from fairclip.scenarios import dataset_registry as registry
from fairclip.scenarios.errors import DataError

ENV_VAR = "FAIRCLIP_DATA"

#: Expected SHA-256 of every data file, by path relative to the data directory (= SHA256SUMS),
#: the files each dataset reads, and each file's download URLs, tried in order: declared by each
#: built-in dataset's module (:mod:`fairclip.scenarios.dataset_registry`), read from there when asked.


def mirrored(relative: str, mirrors: Sequence[str]) -> tuple[str, ...]:
    """The URLs of file ``relative`` (its name, without its folder) under each of ``mirrors``."""
    return tuple(mirror + relative.rsplit("/", 1)[1] for mirror in mirrors)


# (absolute path, size, mtime_ns, ctime_ns) -> digest that was found to match.
_VERIFIED: dict[tuple[str, int, int, int], str] = {}


def _remedy(root: Path) -> str:
    return (
        f"run `fairclip data --data-dir {root}` where the network allows, "
        f"or set {ENV_VAR} to a folder holding it"
    )


def _absolute(path: str | os.PathLike[str]) -> Path:
    return Path(path).expanduser().absolute()


def resolve_data_dir(explicit: str | os.PathLike[str] | None = None) -> Path:
    """The data directory: ``explicit`` if given, else ``$FAIRCLIP_DATA``, as an absolute path.

    Raises :class:`DataError` when neither is set (an empty value counts as unset). Whether the
    folder holds the right files is checked later, file by file, by :func:`verified_path`.
    """
    if explicit is not None and str(explicit) != "":
        return _absolute(explicit)
    from_env = os.environ.get(ENV_VAR, "")
    if from_env:
        return _absolute(from_env)
    raise DataError(
        f"no data directory given: pass --data-dir DIR or set {ENV_VAR}=DIR, where DIR holds "
        "mnist/, fashion-mnist/, adult/ and dutch/ (`fairclip data --data-dir DIR` downloads them)"
    )


def _check_known(relative: str) -> str:
    known = registry.checksums()
    if relative not in known:
        raise DataError(f"unknown data file {relative!r}; known files: {', '.join(sorted(known))}")
    return relative


def _sha256_of(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as stream:
        while chunk := stream.read(1 << 20):
            digest.update(chunk)
    return digest.hexdigest()


def verified_path(data_dir: str | os.PathLike[str], relative: str) -> Path:
    """The path of data file ``relative`` under ``data_dir``, once it exists and matches its SHA-256.

    Raises :class:`DataError` (one line, naming the file) when it is missing, unreadable or
    corrupt. Successful checks are remembered per (path, size, mtime, ctime) in this process.
    """
    _check_known(relative)
    root = _absolute(data_dir)
    path = root / relative
    try:
        status = path.stat()
    except FileNotFoundError:
        raise DataError(f"missing data file {path}: {_remedy(root)}") from None
    except OSError as error:
        raise DataError(f"cannot read data file {path} ({error.strerror}): {_remedy(root)}") from None
    if not path.is_file():
        raise DataError(f"data file {path} is not a regular file: {_remedy(root)}")
    expected = registry.checksums()[relative]
    key = (str(path), status.st_size, status.st_mtime_ns, status.st_ctime_ns)
    if _VERIFIED.get(key) == expected:
        return path
    try:
        found = _sha256_of(path)
    except OSError as error:
        raise DataError(f"cannot read data file {path} ({error.strerror}): {_remedy(root)}") from None
    if found != expected:
        raise DataError(
            f"corrupt data file {path}: its SHA-256 is {found[:16]}… where {expected[:16]}… is expected; "
            f"delete it and {_remedy(root)}"
        )
    _VERIFIED[key] = expected
    return path


def _expand(names: Iterable[str] | None) -> list[str]:
    checksums, dataset_files = registry.checksums(), registry.dataset_files()
    if names is None:
        return list(checksums)
    if isinstance(names, str):
        names = [names]
    wanted: list[str] = []
    for name in names:
        if name in dataset_files:
            wanted.extend(dataset_files[name])
        elif name in checksums:
            wanted.append(name)
        else:
            raise DataError(
                f"unknown dataset or data file {name!r}; datasets: {', '.join(dataset_files)}; "
                f"files: {', '.join(sorted(checksums))}"
            )
    return list(dict.fromkeys(wanted))


def _download(url: str, target: Path, expected: str, timeout: float) -> None:
    """Stream ``url`` into a temporary file beside ``target``, check it, then rename it into place."""
    request = urllib.request.Request(url, headers={"User-Agent": "fairclip-data/0.1 (python urllib)"})
    handle, temporary = tempfile.mkstemp(dir=target.parent, prefix=f".{target.name}.", suffix=".part")
    try:
        digest = hashlib.sha256()
        with os.fdopen(handle, "wb") as sink, urllib.request.urlopen(request, timeout=timeout) as source:
            while chunk := source.read(1 << 20):
                digest.update(chunk)
                sink.write(chunk)
            os.fchmod(sink.fileno(), 0o666 & ~process_umask())  # not mkstemp's 0600
        if digest.hexdigest() != expected:
            raise ValueError(f"SHA-256 {digest.hexdigest()[:16]}… where {expected[:16]}… is expected")
        os.replace(temporary, target)
    except BaseException:
        Path(temporary).unlink(missing_ok=True)
        raise


def _reason(error: BaseException) -> str:
    if isinstance(error, urllib.error.HTTPError):
        return f"HTTP {error.code} {error.reason}"
    if isinstance(error, urllib.error.URLError):
        return str(error.reason)
    if isinstance(error, OSError) and error.strerror:
        return error.strerror
    return str(error) or type(error).__name__


def fetch(
    data_dir: str | os.PathLike[str],
    names: Iterable[str] | None = None,
    *,
    sources: Mapping[str, Sequence[str]] | None = None,
    timeout: float = 60.0,
) -> list[str]:
    """Download the missing or corrupt data files into ``data_dir``; returns the ones downloaded.

    ``names`` picks datasets (``"mnist"``, ``"fashion-mnist"``, ``"adult"``, ``"dutch"``) or single
    files by relative path; ``None`` means all 12 files. Files already present and intact are left
    alone. Each file is tried from each of its ``sources`` (default: the registry's) in turn and
    only an intact copy is renamed into place. Raises :class:`DataError` (one line) when a file
    cannot be obtained from any source or the folder cannot be written.
    """
    root = _absolute(data_dir)
    urls_of = registry.sources() if sources is None else sources
    downloaded: list[str] = []
    for relative in _expand(names):
        try:
            verified_path(root, relative)
            continue
        except DataError:
            pass
        target = root / relative
        try:
            target.parent.mkdir(parents=True, exist_ok=True)
        except OSError as error:
            reason = error.strerror or error
            raise DataError(f"cannot create folder {target.parent} for {relative} ({reason})") from None
        failures: list[str] = []
        for url in urls_of.get(relative, ()):
            try:
                _download(url, target, registry.checksums()[relative], timeout)
            except (OSError, ValueError, http.client.HTTPException) as error:  # URLError is an OSError
                failures.append(f"{url}: {_reason(error)}")
                continue
            downloaded.append(relative)
            break
        else:
            tried = "; ".join(failures) if failures else "no source known"
            raise DataError(
                f"could not download data file {target} ({tried}); copy an intact {relative} there "
                f"from a machine with network access, or set {ENV_VAR} to a folder holding it"
            )
        verified_path(root, relative)
    return downloaded
