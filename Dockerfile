# trainfit service image: REST v1 + HTML pages. torch is NOT needed (the probe runs elsewhere).
FROM python:3.11-slim

ENV PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1 \
    PIP_NO_CACHE_DIR=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1

WORKDIR /src
COPY pyproject.toml README.md ./
COPY trainfit/ trainfit/
COPY templates/ templates/
COPY estimator/ estimator/
COPY gpu_catalog/ gpu_catalog/
COPY memtest_schema/ memtest_schema/
COPY probe/ probe/
COPY app/ app/
# the same install command as the README's service section
RUN pip install ".[service]"

RUN useradd --create-home --uid 10001 --shell /usr/sbin/nologin trainfit \
    && mkdir -p /data && chown trainfit:trainfit /data
USER trainfit
WORKDIR /data

# SQLite in the /data volume by default; set a postgresql+psycopg:// URL to use PostgreSQL.
# Tokens: TRAINFIT_UPLOAD_TOKENS / TRAINFIT_APPROVER_TOKENS (name=sha256:<hex> keeps them hashed).
ENV TRAINFIT_DATABASE_URL=sqlite:////data/trainfit.db
VOLUME ["/data"]
EXPOSE 8000

HEALTHCHECK --interval=30s --timeout=5s --start-period=30s --retries=3 \
    CMD python -c "import urllib.request; urllib.request.urlopen('http://127.0.0.1:8000/healthz', timeout=4)" || exit 1

CMD ["trainfit", "serve", "--host", "0.0.0.0", "--port", "8000"]
