"""The installed version of Dataoad."""

from __future__ import annotations

from importlib import metadata

try:
    __version__ = metadata.version("dataoad")
except metadata.PackageNotFoundError:  # running from a source tree without install
    __version__ = "0.0.0+unknown"
