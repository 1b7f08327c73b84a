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
import prefect.main  # reads the settings above, gives "embedline" Prefect's extra handlers
from prefect.settings import get_current_settings
from cli.prefect_env import reread_prefect_settings

kept = []  # every handler seen stays alive, so no two share an id()

def state():
    ours = logging.getLogger("embedline").handlers
    kept.extend(ours)
    extra = logging.getLogger("prefect.extra").handlers
    return {
        "url": str(get_current_settings().api.url),
        "level": logging.getLogger("prefect").level,
        "handlers": [id(h) for h in ours],
        "same": all(h in extra for h in ours),
    }

found = {"imported": state()}
os.environ["PREFECT_API_URL"] = "http://second.invalid/api"
os.environ["PREFECT_HOME"] = os.environ["OTHER_HOME"]  # no logging.yml there either
reread_prefect_settings()
found["url"] = state()  # the logging settings are those of the import: kept as configured
os.environ["PREFECT_LOGGING_LEVEL"] = "DEBUG"
reread_prefect_settings()
reread_prefect_settings()  # again: still one set of handlers
found["level"] = state()
os.environ["PREFECT_LOGGING_HANDLERS_API_LEVEL"] = "ERROR"  # overrides a key of logging.yml
reread_prefect_settings()
found["override"] = state()
os.environ["PREFECT_API_REQUEST_TIMEOUT"] = "soon"
try:
    reread_prefect_settings()
except Exception as exc:
    from cli.prefect_env import invalid_prefect_setting
    found["refused"] = invalid_prefect_setting(exc)
print(json.dumps(found))
"""


def test_an_imported_prefect_reads_the_settings_exported_after_it(tmp_path: Path) -> None:
    env = {k: v for k, v in os.environ.items() if not k.startswith("PREFECT_")}
    env.update(PYTHONPATH=str(REPO), PREFECT_HOME=str(tmp_path / "a"))
    env["OTHER_HOME"] = str(tmp_path / "b")
    done = subprocess.run(
        [sys.executable, "-c", _SCRIPT], capture_output=True, text=True, env=env, cwd=REPO
    )
    assert done.returncode == 0, done.stderr[-3000:]
    found = json.loads(done.stdout.splitlines()[-1])
    imported, url, level, override = (found[k] for k in ("imported", "url", "level", "override"))
    assert imported["url"] == "http://first.invalid/api" and len(imported["handlers"]) == 1
    assert url["url"] == "http://second.invalid/api"
    assert url["handlers"] == imported["handlers"]  # logging unchanged: not configured again
    assert level["level"] == 10  # PREFECT_LOGGING_LEVEL=DEBUG, set after the import
    assert len(level["handlers"]) == 1 and level["same"]  # Prefect's API handler, once
    assert level["handlers"] != imported["handlers"]
    assert len(override["handlers"]) == 1 and override["handlers"] != level["handlers"]
    assert found["refused"] and "PREFECT_API_REQUEST_TIMEOUT" in found["refused"]
