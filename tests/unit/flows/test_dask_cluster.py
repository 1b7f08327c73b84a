"""``--dask-cluster-class`` / ``--dask-cluster-kwargs`` (prefect-dask's ``cluster_class`` and
``cluster_kwargs``): validated as settings, imported before Prefect starts, refused in one
line; the flow refuses a file-loaded copy of itself that a remote cluster could not import.
No cluster starts, no socket opens."""

from __future__ import annotations

import importlib
import importlib.util
import socket
from pathlib import Path

import pytest
from pydantic import ValidationError

from cli.dask_checks import check_cluster_class
from cli.failures import EXIT_USAGE
from embedline.errors import InputError
from embedline.settings import RunSettings, remote_dask, validation_message
from flows.dask_cluster import cluster_class

REMOTE_API = "http://prefect.internal:4200/api"
REPO = Path(__file__).resolve().parents[3]


def _settings(**fields: object) -> RunSettings:
    return RunSettings(input="in.csv", output="s3://bucket/out", task_runner="dask", **fields)


def _refusal(**fields: object) -> str:
    with pytest.raises(ValidationError) as caught:
        _settings(**fields)
    return validation_message(caught.value)


def test_a_cluster_class_and_its_kwargs_are_run_settings() -> None:
    settings = _settings(
        dask_cluster_class="dask_kubernetes.operator.KubeCluster",
        dask_cluster_kwargs={"n_workers": 4, "image": "embedline:1"},
    )
    assert remote_dask(settings)
    assert settings.to_parameters()["dask_cluster_kwargs"] == {
        "n_workers": 4,
        "image": "embedline:1",
    }
    local = RunSettings(
        input="in.csv", task_runner="dask", dask_cluster_class="distributed.LocalCluster"
    )
    assert not remote_dask(local)  # its workers run here: a local output is fine


def test_what_cannot_name_one_cluster_is_refused() -> None:
    assert "not an import path" in _refusal(dask_cluster_class="KubeCluster")
    assert "not both" in _refusal(dask_cluster_class="a.B", dask_address="tcp://s:8786")
    assert "needs --dask-cluster-class" in _refusal(dask_cluster_kwargs={"n_workers": 2})
    with pytest.raises(ValidationError, match="needs --task-runner dask"):
        RunSettings(input="in.csv", dask_cluster_class="a.B")
    with pytest.raises(ValidationError, match="use an s3:// --output"):
        RunSettings(input="in.csv", task_runner="dask", dask_cluster_class="coiled.Cluster")


@pytest.mark.parametrize(
    ("kwargs", "named"),
    [
        ({"token": "abc"}, "token"),
        ({"env": {"AWS_SECRET_ACCESS_KEY": "x"}}, "AWS_SECRET_ACCESS_KEY"),
        ({"env": [{"name": "EMBEDLINE_API_KEY", "value": "sk-1"}]}, "EMBEDLINE_API_KEY"),
    ],
)
def test_a_secret_in_the_kwargs_is_refused_by_name_never_echoed(
    kwargs: dict[str, object], named: str
) -> None:
    message = _refusal(dask_cluster_class="a.B", dask_cluster_kwargs=kwargs)
    assert f"{named!r} looks like a secret" in message
    assert "sk-1" not in message and "abc" not in message


def test_a_secret_by_reference_is_not_a_secret() -> None:
    env = [{"name": "EMBEDLINE_API_KEY", "valueFrom": {"secretKeyRef": {"name": "e", "key": "k"}}}]
    assert _settings(dask_cluster_class="a.B", dask_cluster_kwargs={"env": env})


def test_the_class_is_imported_by_its_path() -> None:
    from distributed import LocalCluster

    assert cluster_class("distributed.LocalCluster") is LocalCluster
    assert cluster_class("distributed.deploy.local.LocalCluster") is LocalCluster
    with pytest.raises(InputError, match=r"cannot import it \(No module named 'no_such_pkg'\)"):
        cluster_class("no_such_pkg.operator.Cluster")
    with pytest.raises(InputError, match="distributed has no NoSuchCluster"):
        cluster_class("distributed.NoSuchCluster")
    with pytest.raises(InputError, match="not a class"):
        cluster_class("json.decoder")


def test_the_cli_refuses_a_class_that_cannot_run_in_one_line() -> None:
    remote = _settings(dask_cluster_class="no_such_pkg.Cluster")
    line, code = check_cluster_class(remote, REMOTE_API) or ("", 0)
    assert code == EXIT_USAGE and "install its package where the flow runs" in line
    loopback = check_cluster_class(remote, "http://127.0.0.1:4200/api")
    assert loopback is not None and "PREFECT_API_URL is on loopback" in loopback[0]
    temporary = check_cluster_class(remote, None)
    assert temporary is not None and "temporary Prefect server" in temporary[0]
    here = RunSettings(
        input="in.csv", task_runner="dask", dask_cluster_class="distributed.LocalCluster"
    )
    assert check_cluster_class(here, None) is None  # its workers reach this machine's loopback


def test_a_flow_loaded_from_its_file_refuses_a_remote_cluster() -> None:
    """What ``prefect deploy`` of ``flows/embed_csv.py:embed_csv`` runs: the file as module
    ``embed_csv``, whose tasks the cluster's scheduler cannot unpickle."""
    spec = importlib.util.spec_from_file_location("embed_csv", REPO / "flows" / "embed_csv.py")
    assert spec is not None and spec.loader is not None
    by_file = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(by_file)
    remote = _settings(dask_address="tcp://scheduler.invalid:8786")  # RFC 6761: never resolves
    problem = by_file._cluster_problem(remote)
    assert "loaded from its file as module 'embed_csv'" in problem
    assert "flows.embed_csv.embed_csv" in problem
    assert by_file._cluster_problem(_settings()) is None  # a local cluster: its own process

    from prefect.settings import PREFECT_API_URL, temporary_settings

    by_module = importlib.import_module("flows.embed_csv")  # what the module entrypoint loads
    with temporary_settings({PREFECT_API_URL: "http://10.0.0.4:4200/api"}):
        problem = by_module._cluster_problem(remote)  # the module is fine: the host is not
    assert problem == (
        "limits.dask_address tcp://scheduler.invalid:8786: no Dask scheduler reached "
        "(host 'scheduler.invalid' not found); fix the address"
    )


def test_a_deployment_s_flow_refuses_a_loopback_prefect_api_for_a_remote_cluster() -> None:
    """A deployment's flow run, which no CLI checked: workers on other machines cannot report
    to a Prefect API on the flow's loopback (every chunk would fail there)."""
    from prefect.settings import PREFECT_API_URL, temporary_settings

    flow_module = importlib.import_module("flows.embed_csv")
    remote = _settings(dask_address="tcp://10.0.0.5:8786")
    with temporary_settings({PREFECT_API_URL: "http://127.0.0.1:4200/api"}):
        problem = flow_module._cluster_problem(remote)
        assert problem.startswith("limits.dask_address tcp://10.0.0.5:8786: PREFECT_API_URL is")
        started = flow_module._cluster_problem(_settings(dask_cluster_class="coiled.Cluster"))
        assert started.startswith("--dask-cluster-class coiled.Cluster: PREFECT_API_URL is on")


def test_a_deployment_s_flow_asks_the_scheduler_at_its_address() -> None:
    """A deployment's flow run with a wrong ``dask_address`` planned, then failed after
    Dask's 30 s connect timeout with 191 lines of tracebacks (the CLI refused the same
    address in one line). The flow now asks the scheduler first, as the CLI does."""
    from distributed import LocalCluster
    from prefect.settings import PREFECT_API_URL, temporary_settings

    flow_module = importlib.import_module("flows.embed_csv")
    with socket.socket() as probe:  # a port nothing listens on
        probe.bind(("127.0.0.1", 0))
        closed = f"tcp://127.0.0.1:{probe.getsockname()[1]}"
    with (
        temporary_settings({PREFECT_API_URL: "http://127.0.0.1:4200/api"}),
        LocalCluster(
            n_workers=0,
            processes=False,
            protocol="tcp://",
            host="127.0.0.1",
            dashboard_address="127.0.0.1:0",
        ) as cluster,
    ):
        assert (
            flow_module._cluster_problem(_settings(dask_address=cluster.scheduler_address)) is None
        )
        refused = flow_module._cluster_problem(_settings(dask_address=closed))
    assert refused == (
        f"limits.dask_address {closed}: no Dask scheduler reached (connection refused); "
        "start it or fix the address"
    )
