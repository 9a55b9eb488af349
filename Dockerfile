# chaoslib-infer: the image a scheduled game day (`chaos-infer schedule`) and the distributed load
# workers (`chaos-infer load ... --workers N`, and Locust's `locust --worker` pods of a distributed
# Locust load: the `locust` extra) run. Build and push it where your cluster pulls from:
#   docker build -t registry.example.com/chaoslib-infer:0.1.0 .
# No llama.cpp wheel (the local lab's real-engine option is not needed against a cluster).
FROM python:3.11-slim

ENV PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1 \
    PIP_NO_CACHE_DIR=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1

WORKDIR /opt/chaoslib-infer
COPY pyproject.toml README.md ./
COPY chaoslib_infer ./chaoslib_infer
RUN pip install --no-cache-dir "./[locust]" \
    && useradd --uid 10001 --user-group --create-home --home-dir /home/chaos chaos \
    && mkdir /evidence \
    && chown 10001:10001 /evidence

# the drills, plans, runbooks and RBAC the commands look for (not part of the Python package)
COPY experiments ./experiments
COPY drills ./drills
COPY runbooks ./runbooks
COPY deploy ./deploy
ENV CHAOS_INFER_EXPERIMENTS=/opt/chaoslib-infer/experiments \
    CHAOS_INFER_PLAN=/opt/chaoslib-infer/drills/gameday.yaml \
    CHAOS_INFER_K8S_PLAN=/opt/chaoslib-infer/drills/gameday-k8s.yaml \
    CHAOS_INFER_RUNBOOKS=/opt/chaoslib-infer/runbooks \
    CHAOS_INFER_RBAC=/opt/chaoslib-infer/deploy/rbac.yaml

# numeric, so that Kubernetes can verify runAsNonRoot (the CronJob runs as 10001 too)
USER 10001:10001
WORKDIR /home/chaos
ENTRYPOINT ["chaos-infer"]
CMD ["--help"]
