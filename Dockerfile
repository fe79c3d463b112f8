# picpeak-lite as a container image: docker build -t picpeak-lite . (podman reads this file too).
FROM python:3.11-slim

# Install the package as pyproject.toml builds it: the wheel carries templates/ and static/ inside it.
WORKDIR /src
COPY pyproject.toml README.md ./
COPY picpeak_lite ./picpeak_lite
COPY templates ./templates
COPY static ./static
RUN pip install --no-cache-dir . && rm -rf /src
# pg_dump and pg_restore, for `picpeak-lite backup` and `restore` with database_url on PostgreSQL (Debian 12's 15:
# the server's version or newer is needed).
RUN apt-get update && apt-get install -y --no-install-recommends postgresql-client \
    && rm -rf /var/lib/apt/lists/*

RUN useradd --system --uid 10001 --home-dir /data picpeak && mkdir /data && chown picpeak /data
USER picpeak
# The data (database and photos) lives in the volume; a picpeak.toml put there is read at start.
WORKDIR /data
VOLUME /data
# Listen on every interface of the container; these override the same keys in picpeak.toml.
ENV PICPEAK_HOST=0.0.0.0 PICPEAK_DATA_DIR=/data/picpeak-data
EXPOSE 8080
STOPSIGNAL SIGTERM
HEALTHCHECK --interval=30s --timeout=5s \
    CMD ["python", "-c", "import urllib.request; urllib.request.urlopen('http://127.0.0.1:8080/healthz', timeout=4)"]
CMD ["picpeak-lite", "serve"]
