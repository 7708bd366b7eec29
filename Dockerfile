# gpufleet: one image for every role (serve, worker, beat, migrate, agent); the Helm chart picks
# the role with the container's arguments.
#   docker build -t ghcr.io/gpufleet/gpufleet:0.1.0 .
FROM python:3.11-slim AS build
# A C compiler in the build stage only: it compiles the remote-write decoder and the export
# encoder (collector/*/_*_c.c) into the wheel; the image itself carries no compiler. Without
# them the image would decode remote write 2.0 at ~14x the CPU (docs/prometheus.md), so the
# build fails instead of shipping the slow paths (GPUFLEET_REQUIRE_C_EXTENSIONS, setup.py).
RUN apt-get update \
 && apt-get install -y --no-install-recommends gcc libc6-dev \
 && rm -rf /var/lib/apt/lists/*
WORKDIR /src
COPY . .
ENV GPUFLEET_REQUIRE_C_EXTENSIONS=1
RUN pip install --no-cache-dir --upgrade pip \
 && pip wheel --no-cache-dir --wheel-dir /wheels ".[server,agent]"

FROM python:3.11-slim
# The wheel carries everything the roles read: the dashboard's static files, the TOML contracts,
# the migrations and the Grafana dashboards (`grafana push`); scripts/smoke_wheel.sh checks it.
ENV PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1
COPY --from=build /wheels /wheels
RUN pip install --no-cache-dir --no-index --find-links /wheels "gpufleet[server,agent]" \
 && python -c "from gpufleet.collector.remote_write import _decode_c; from gpufleet.collector.export import _encode_c" \
 && rm -rf /wheels \
 && useradd --uid 10001 --user-group --no-create-home --shell /usr/sbin/nologin gpufleet
USER 10001:10001
EXPOSE 8000 9401
ENTRYPOINT ["gpufleet"]
CMD ["serve", "--host", "0.0.0.0", "--port", "8000"]
