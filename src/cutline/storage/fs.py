"""Opening an fsspec filesystem from a URL plus storage options, with errors that say what to do.

Used by checkpoint storage and by the file-based connectors, so ``s3://``, ``gs://``,
``hdfs://`` ... are configured the same way everywhere: ``storage_options`` are the keyword
arguments of the fsspec implementation (for ``s3://``, s3fs: ``endpoint_url``, ``key``,
``secret``, ``client_kwargs``, ``config_kwargs`` ...).  s3fs also reads the standard AWS
environment variables and files (``AWS_ENDPOINT_URL``, ``AWS_ACCESS_KEY_ID``, profiles).

Directory listings are not cached (``use_listings_cache=False`` unless the options say
otherwise): several processes write the same prefix, and a cached listing in one of them
would hide files the others wrote (a checkpoint's state files, a sink's staged files).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import fsspec
import fsspec.core

__all__ = ["check_storage_options", "describe_open_error", "url_to_fs"]

# a local directory that fills up and fails writes on purpose (tests, chaos): faulty.py
fsspec.register_implementation("faulty", "cutline.storage.faulty.FaultyFileSystem",
                               clobber=True)

_EXTRAS = {"s3": "s3fs (pip install 'cutline[s3]')", "s3a": "s3fs (pip install 'cutline[s3]')",
           "gs": "gcsfs", "gcs": "gcsfs", "abfs": "adlfs", "az": "adlfs"}


def check_storage_options(options: Any, what: str = "storage_options") -> dict | None:
    """``None`` or a plain dict copy of a mapping with string keys; anything else is refused."""
    if options is None:
        return None
    if not isinstance(options, Mapping) or not all(isinstance(k, str) for k in options):
        raise ValueError(f"{what} must be a dict of fsspec options with string keys (e.g. "
                         f"{{'endpoint_url': ..., 'key': ..., 'secret': ...}} for s3://), "
                         f"got {type(options).__name__}")
    return dict(options)


def url_to_fs(url: str, options: Mapping[str, Any] | None = None) -> tuple[Any, str]:
    """``(filesystem, path without protocol)`` for ``url`` opened with ``options``."""
    kwargs = {"use_listings_cache": False, **(options or {})}
    return fsspec.core.url_to_fs(str(url), **kwargs)


def scheme(url: str) -> str:
    return str(url).split("://", 1)[0].lower() if "://" in str(url) else "file"


def describe_open_error(url: str, exc: BaseException) -> str:
    """One line saying why ``url`` could not be opened, and for known cases what is needed."""
    text = str(exc).strip()
    first = text.splitlines()[0] if text else type(exc).__name__
    kind = scheme(url)
    if kind in ("hdfs", "viewfs"):
        return (f"{first}. pyarrow's HDFS client needs a JVM (set JAVA_HOME), the native "
                "libhdfs.so of a Hadoop installation (HADOOP_HOME or ARROW_LIBHDFS_DIR) and "
                "the Hadoop jars on CLASSPATH (`hadoop classpath --glob`)")
    if isinstance(exc, ImportError) and kind in _EXTRAS:
        return f"{first}; {kind}:// needs {_EXTRAS[kind]}"
    return first
