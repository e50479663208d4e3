"""Every error twostage raises on purpose, in one place: ``from twostage.errors import ConfigError``.

Each is a :class:`TwostageError` and also the built-in exception a caller would expect (``ValueError`` for bad
input, ``FileNotFoundError`` for a missing path, ``RuntimeError`` for a broken state). They are defined in
:mod:`twostage.indexer.errors`, the lowest layer, so that every layer raises the same classes.
"""

from __future__ import annotations

from twostage.indexer.errors import (
    ConfigError,
    DataError,
    DataNotFoundError,
    DownloadError,
    FilterError,
    IndexFormatError,
    MissingDependencyError,
    ModelNotFoundError,
    PageExpiredError,
    ShardUnavailableError,
    TwostageError,
    UntrainedHeadError,
    WorkStopped,
    WriterBusyError,
)

__all__ = [
    "TwostageError", "ConfigError", "DataError", "DataNotFoundError", "DownloadError", "FilterError",
    "IndexFormatError", "MissingDependencyError", "ModelNotFoundError", "PageExpiredError", "ShardUnavailableError",
    "UntrainedHeadError", "WorkStopped", "WriterBusyError",
]
