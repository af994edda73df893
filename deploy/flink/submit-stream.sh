#!/usr/bin/env bash
# Submit the streaming job of renyi-stream (pipelines/streaming/beam/job.py) to an Apache Flink cluster
# through Beam's FlinkRunner, reading Arrow IPC batches from a Kafka topic. Edit the variables,
# then, from the repository root, with this project installed (pip install -e .):
#
#   deploy/flink/submit-stream.sh 2026-03-01 2026-12-31          # a new ledger
#   deploy/flink/submit-stream.sh 2027-01-01 2027-12-31 \
#       's3://acme-renyi-curator/stream/2026-03-01/ledger/window_id=20818/*/*.parquet'   # go on after --end
#
# Kafka is read by Beam's Java KafkaIO (a cross-language transform): the launcher asks a Java
# expansion service (EXPANSION_SERVICE) to expand it, and the TaskManagers run its Java part in
# the environment that service names. Start the service beside the launcher, e.g.
#
#   java -jar beam-sdks-java-io-expansion-service-2.77.0.jar 8097 \
#       --defaultEnvironmentType=PROCESS --defaultEnvironmentConfig='{"command": "/opt/apache/beam/boot"}'
#
# (PROCESS: the TaskManager image holds the Java SDK harness, /opt/apache/beam from
# apache/beam_java17_sdk:2.77.0; without these two options the Java part runs in that image with
# DOCKER, which needs Docker on the TaskManager hosts). The keyed state (every shard's ledger) and
# the Kafka read positions are checkpointed together every CHECKPOINT_MS, exactly once, to the
# cluster's checkpoint storage (Flink configuration: state.backend.type: rocksdb and
# execution.checkpointing.dir on private storage: a checkpoint holds every user's budget). See
# deploy/README.md ("Streaming on Flink over Kafka", "Recovery") for what a restart does. The job
# runs until the window of END is released; cancel it then (flink cancel JOB_ID).
set -euo pipefail

FLINK_MASTER=http://flink-jobmanager:8081        # the JobManager's REST endpoint
HARNESS_IMAGE=registry.example.com/renyi/harness:latest   # deploy/Dockerfile (ENVIRONMENT=docker)
ENVIRONMENT=external                             # external: worker-pool sidecar; docker: container per worker
PARALLELISM=32                                   # Flink slots for the job (= total worker cores)
KAFKA_TOPIC=indicators                           # records: one Arrow IPC stream of indicator rows each
BOOTSTRAP_SERVERS=kafka-0.kafka:9092,kafka-1.kafka:9092
KAFKA_GROUP_PREFIX=renyi-stream                  # each submission gets a new consumer group (below)
KAFKA_OFFSET_RESET=earliest                      # ... which reads every retained record: nothing skipped
KAFKA_CONSUMER_CONFIG=()                         # more KEY=VALUE settings, e.g. (security.protocol=SSL)
EXPANSION_SERVICE=localhost:8097                 # java -jar beam-sdks-java-io-expansion-service-2.77.0.jar 8097 ...
SCHEMA=$(dirname "$0")/../schema.example.json    # the ledger's input contract (id type, columns, bounds)
CURATOR_ROOT=s3://acme-renyi-curator             # PRIVATE: ledger snapshots, counts, dead letters
RELEASES=s3://acme-renyi-public/releases         # public: released answers only
NOISE_KEY=/var/run/secrets/renyi/noise.key       # the key's path inside every worker (mounted secret)
KEY_FINGERPRINT=0123456789abcdef                 # its public fingerprint (the launcher has no key)
EPSILON=1.0
DELTA=1e-6
NORM_BUDGET=30
SHARDS=256                                       # >= 4 x PARALLELISM (deploy/README.md)
CHECKPOINT_MS=60000                              # checkpoint interval: state + Kafka offsets, exactly once
FLINK_JOB_SERVER_JAR=                            # optional local beam-runners-flink-1.20-job-server-<beam>.jar
                                                 # (empty: Beam downloads it from Maven Central)
OPTIONS_FILE=$(dirname "$0")/flink-options.txt

START=${1:?usage: submit-stream.sh START END [PREVIOUS_LEDGER_GLOB|none]}
END=${2:?usage: submit-stream.sh START END [PREVIOUS_LEDGER_GLOB|none]}
PREVIOUS=${3:-none}
# One --output per job: after a lost job, run this script again with the same arguments; the job
# resumes in this folder from its last committed window (pipelines/streaming/recovery.py, recover).
OUTPUT=${CURATOR_ROOT}/stream/${START}
# A new group per submission: a restart restores its read positions from Flink's checkpoint, never
# from Kafka's committed offsets, and a new job re-reads the topic (rows of released windows are
# dead-lettered late_window and charge nobody; reusing an old group would skip rows that job read
# but never charged). The offsets committed under this group only show the consumer lag.
KAFKA_GROUP=${KAFKA_GROUP_PREFIX}-${START}-$(date -u +%Y%m%dT%H%M%S)

mapfile -t OPTIONS < <(grep -v '^[[:space:]]*#' "$OPTIONS_FILE" | grep -v '^[[:space:]]*$')
OPTIONS+=("--flink_master=${FLINK_MASTER}" "--parallelism=${PARALLELISM}")
if [[ "$ENVIRONMENT" == docker ]]; then
  OPTIONS+=("--environment_type=DOCKER" "--environment_config=${HARNESS_IMAGE}")  # later flags win
fi
if [[ -n "$FLINK_JOB_SERVER_JAR" ]]; then
  OPTIONS+=("--flink_job_server_jar=${FLINK_JOB_SERVER_JAR}")
fi
# Streaming: checkpoint the keyed state (ledgers, buffered rows, release bookkeeping) and the
# Kafka read positions together, exactly once; keep the last checkpoint when the job is cancelled
# or fails for good. Python's FlinkRunnerOptions do not declare these: they are Java
# FlinkPipelineOptions, which --flink_submit_uber_jar (flink-options.txt) passes on by name
# (without the uber jar, Beam would drop them).
OPTIONS+=("--streaming" "--checkpointing_interval=${CHECKPOINT_MS}" "--checkpointing_mode=EXACTLY_ONCE"
          "--min_pause_between_checkpoints=$((CHECKPOINT_MS / 2))"
          "--externalized_checkpoints_enabled" "--retain_externalized_checkpoints_on_cancellation")

KAFKA_OPTIONS=(--kafka-topic "$KAFKA_TOPIC" --bootstrap-servers "$BOOTSTRAP_SERVERS"
               --kafka-consumer-config "group.id=${KAFKA_GROUP}"
               --kafka-consumer-config "auto.offset.reset=${KAFKA_OFFSET_RESET}"
               --kafka-timestamp-policy CreateTime --kafka-expansion-service "$EXPANSION_SERVICE")
for setting in ${KAFKA_CONSUMER_CONFIG[@]+"${KAFKA_CONSUMER_CONFIG[@]}"}; do
  KAFKA_OPTIONS+=(--kafka-consumer-config "$setting")
done

python -m renyi_stream.pipelines.streaming "${KAFKA_OPTIONS[@]}" \
  --schema "$SCHEMA" --start "$START" --end "$END" \
  --epsilon "$EPSILON" --delta "$DELTA" --norm-budget "$NORM_BUDGET" --shards "$SHARDS" \
  --releases-parquet "$RELEASES" --output "$OUTPUT" --previous-ledger "$PREVIOUS" \
  --noise-key "$NOISE_KEY" --key-fingerprint "$KEY_FINGERPRINT" \
  "${OPTIONS[@]}"
