"""What every module of ``adapters.embeddings`` shares: the logger type and names."""

from __future__ import annotations

import logging
from typing import Any, Union

__all__ = ["HTTP_LOGGER", "LOCAL_LOGGER", "Logger"]

#: A stdlib logger, or an adapter over one (never a Prefect run logger: it raises outside a
#: run and in worker threads).
Logger = Union[logging.Logger, "logging.LoggerAdapter[Any]"]

HTTP_LOGGER = "embedline.http"  # the OpenAI-compatible client: one INFO per request
LOCAL_LOGGER = "embedline.local"  # the in-process model
