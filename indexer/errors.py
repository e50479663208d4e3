"""The one error hierarchy of twostage.

Every error the library raises on purpose is a :class:`TwostageError`. Each class also derives from the
built-in exception a caller would expect (``ValueError`` for bad input, ``FileNotFoundError`` for a missing
path, ``RuntimeError`` for a broken state), so ``except ValueError`` keeps working. Messages name the file,
line and id involved and say what to do.
"""

from __future__ import annotations


class TwostageError(Exception):
    """Base class of every error raised on purpose by twostage."""


class DataError(TwostageError, ValueError):
    """Input data is malformed: a bad JSON line, a duplicate id, an empty corpus, a bad encoding."""


class DataNotFoundError(TwostageError, FileNotFoundError):
    """A data file or directory that was asked for does not exist."""


class ConfigError(TwostageError, ValueError):
    """An argument or configuration value is invalid (unknown split, unknown system, k <= 0...)."""


class IndexFormatError(TwostageError, RuntimeError):
    """An index directory is missing a file, is corrupted, or was written by an unknown format version."""


class DownloadError(TwostageError, RuntimeError):
    """A dataset could not be downloaded or its archive is not usable."""


class MissingDependencyError(TwostageError, ImportError):
    """An optional dependency is needed for this feature; the message says what to install."""


class WriterBusyError(TwostageError, RuntimeError):
    """Another process holds the directory's writer lock for longer than we were willing to wait."""


class ShardUnavailableError(TwostageError, RuntimeError):
    """No live replica of a shard answered (a Ray cluster lost them all); replacements are starting."""


class ModelNotFoundError(TwostageError, FileNotFoundError):
    """No local directory, cache, hub or wheel could provide the model."""


class UntrainedHeadError(TwostageError, RuntimeError):
    """The classification head is randomly initialised: its scores would be noise."""


class FilterError(ConfigError):
    """A metadata filter is malformed, names a field no document has, or compares a field with the wrong type."""


class PageExpiredError(ConfigError):
    """A page token names an engine version that is no longer on disk; search again for the first page."""


class WorkStopped(TwostageError, RuntimeError):
    """Work run in a :class:`~twostage.indexer.work.WorkScope` was cancelled (its client left) or ran past its
    deadline; it stopped at a stage boundary and changed nothing. ``timed_out``: the deadline, not a cancel."""

    def __init__(self, message: str, *, timed_out: bool = False) -> None:
        super().__init__(message)
        self.timed_out = timed_out
