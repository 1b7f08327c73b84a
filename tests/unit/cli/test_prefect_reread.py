"""``reread_prefect_settings``: a process that imported Prefect before the CLI exported its
settings runs on the CLI's settings, its log lines printed once (a fresh interpreter each,
since Prefect's settings and logging are process-wide)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[3]

_SCRIPT = """
import json, logging, os
os.environ["PREFECT_API_URL"] = "http://first.invalid/api"
os.environ["PREFECT_LOGGING_EXTRA_LOGGERS"] = "embedline"
import prefect  # reads the settings above, gives "embedline" Prefect's extra handlers
from prefect.settings import get_current_settings
from cli.prefect_env import reread_prefect_settings

os.environ["PREFECT_API_URL"] = "http://second.invalid/api"
os.environ["PREFECT_LOGGING_LEVEL"] = "DEBUG"
reread_prefect_settings()
reread_prefect_settings()  # again: still one set of handlers
extra = list(logging.getLogger("prefect.extra").handlers)
ours = list(logging.getLogger("embedline").handlers)
url = str(get_current_settings().api.url)
os.environ["PREFECT_API_REQUEST_TIMEOUT"] = "soon"
try:
    reread_prefect_settings()
    refused = None
except Exception as exc:
    from cli.prefect_env import invalid_prefect_setting
    refused = invalid_prefect_setting(exc)
print(json.dumps({
    "url": url,
    "level": logging.getLogger("prefect").level,
    "handlers": len(ours),
    "same": all(h in extra for h in ours),
    "refused": refused,
}))
"""


def test_an_imported_prefect_reads_the_settings_exported_after_it() -> None:
    env = {k: v for k, v in os.environ.items() if not k.startswith("PREFECT_")}
    env["PYTHONPATH"] = str(REPO)
    done = subprocess.run(
        [sys.executable, "-c", _SCRIPT], capture_output=True, text=True, env=env, cwd=REPO
    )
    assert done.returncode == 0, done.stderr[-3000:]
    got = json.loads(done.stdout.splitlines()[-1])
    assert got["url"] == "http://second.invalid/api"
    assert got["level"] == 10  # PREFECT_LOGGING_LEVEL=DEBUG, set after the import
    assert got["handlers"] == 1 and got["same"]  # Prefect's API handler, once
    assert got["refused"] and "PREFECT_API_REQUEST_TIMEOUT" in got["refused"]
