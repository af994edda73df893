#!/usr/bin/env bash
# Submit one daily job of renyi-stream to an Apache Flink cluster through Beam's FlinkRunner.
# Edit the variables, then, from the repository root, with this project installed
# (pip install -e .):
#
#   deploy/flink/submit.sh 2026-03-01 none    # the first day of a new ledger
#   deploy/flink/submit.sh 2026-03-02         # every later day (previous = the day before's output)
#
# The launcher resolves the input globs, checks the previous snapshot and the release root, builds
# an uber jar (Beam's Flink job server + this pipeline), uploads it to the JobManager and waits for
# the job; the run has committed when ${CURATOR_ROOT}/runs/DAY/_COMMITTED.json exists.
set -euo pipefail

FLINK_MASTER=http://flink-jobmanager:8081        # the JobManager's REST endpoint
HARNESS_IMAGE=registry.example.com/renyi/harness:latest   # deploy/Dockerfile (ENVIRONMENT=docker)
ENVIRONMENT=external                             # external: worker-pool sidecar; docker: container per worker
PARALLELISM=32                                   # Flink slots for the job (= total worker cores)
INPUT_ROOT=s3://acme-events                      # inputs: ${INPUT_ROOT}/day=YYYY-MM-DD/*.parquet
CURATOR_ROOT=s3://acme-renyi-curator             # PRIVATE: ledger snapshots, counts, dead letters
RELEASES=s3://acme-renyi-public/releases         # public: released answers only
NOISE_KEY=/var/run/secrets/renyi/noise.key       # the key's path inside every worker (mounted secret)
KEY_FINGERPRINT=0123456789abcdef                 # its public fingerprint (the launcher has no key)
EPSILON=1.0
DELTA=1e-6
NORM_BUDGET=30
SHARDS=256                                       # >= 4 x PARALLELISM (deploy/README.md)
SCHEMA=$(dirname "$0")/../schema.example.json    # the ledger's input contract (id type, columns, bounds)
FLINK_JOB_SERVER_JAR=                            # optional local beam-runners-flink-1.20-job-server-<beam>.jar
                                                 # (empty: Beam downloads it from Maven Central)
OPTIONS_FILE=$(dirname "$0")/flink-options.txt

DAY=${1:?usage: submit.sh YYYY-MM-DD [PREVIOUS_OUTPUT|none]}
PREVIOUS=${2:-${CURATOR_ROOT}/runs/$(date -u -d "${DAY} -1 day" +%F)}
OUTPUT=${CURATOR_ROOT}/runs/${DAY}

mapfile -t OPTIONS < <(grep -v '^[[:space:]]*#' "$OPTIONS_FILE" | grep -v '^[[:space:]]*$')
OPTIONS+=("--flink_master=${FLINK_MASTER}" "--parallelism=${PARALLELISM}")
if [[ "$ENVIRONMENT" == docker ]]; then
  OPTIONS+=("--environment_type=DOCKER" "--environment_config=${HARNESS_IMAGE}")  # later flags win
fi
if [[ -n "$FLINK_JOB_SERVER_JAR" ]]; then
  OPTIONS+=("--flink_job_server_jar=${FLINK_JOB_SERVER_JAR}")
fi

python -m renyi_stream.pipelines.distributed \
  --input "${INPUT_ROOT}/day=${DAY}/*.parquet" --start "$DAY" --end "$DAY" \
  --epsilon "$EPSILON" --delta "$DELTA" --norm-budget "$NORM_BUDGET" \
  --previous-ledger "$PREVIOUS" --output "$OUTPUT" --releases-parquet "$RELEASES" \
  --noise-key "$NOISE_KEY" --key-fingerprint "$KEY_FINGERPRINT" --shards "$SHARDS" --schema "$SCHEMA" --wait \
  "${OPTIONS[@]}"
