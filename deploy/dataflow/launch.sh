#!/usr/bin/env bash
# renyi-stream on Google Cloud Dataflow, as a Flex Template. Edit the variables, then, from the
# repository root:
#
#   deploy/dataflow/launch.sh setup KEY_FILE      # once: registry, buckets, service account, key secret
#   deploy/dataflow/launch.sh build               # per code version: images + template spec
#   deploy/dataflow/launch.sh run 2026-03-01 none # the first day of a new ledger
#   deploy/dataflow/launch.sh run 2026-03-02      # every later day (previous = the day before's output)
#   deploy/dataflow/launch.sh status 2026-03-02   # the run's commit manifest, once it has committed
#   deploy/dataflow/launch.sh stream 2026-03-01 2026-12-31 [PREVIOUS_LEDGER_GLOB]  # streaming job
# See deploy/README.md for what each step does and for the recovery rules.
set -euo pipefail

PROJECT=my-project                    # Google Cloud project id
REGION=europe-west1                   # Dataflow region (and Artifact Registry location)
REPO=renyi                            # Artifact Registry Docker repository
TAG=$(git rev-parse --short=12 HEAD 2>/dev/null || echo latest)
BEAM_VERSION=2.77.0                   # = deploy/Dockerfile's BEAM_VERSION = the launcher's apache-beam
HARNESS_IMAGE=${REGION}-docker.pkg.dev/${PROJECT}/${REPO}/harness:${TAG}
TEMPLATE_IMAGE=${REGION}-docker.pkg.dev/${PROJECT}/${REPO}/flex-template:${TAG}
TEMPLATE_BUCKET=gs://${PROJECT}-renyi-templates
TEMPLATE_SPEC=${TEMPLATE_BUCKET}/renyi-stream-daily-${TAG}.json
TEMP_BUCKET=gs://${PROJECT}-renyi-temp          # Dataflow temp and staging
INPUT_ROOT=gs://${PROJECT}-events                # inputs: ${INPUT_ROOT}/day=YYYY-MM-DD/*.parquet
CURATOR_BUCKET=gs://${PROJECT}-renyi-curator     # PRIVATE: ledger snapshots, counts, dead letters
RELEASE_BUCKET=gs://${PROJECT}-renyi-public      # public: released answers only
RELEASES=${RELEASE_BUCKET}/releases
SECRET_NAME=renyi-noise-key
NOISE_KEY_SECRET=projects/${PROJECT}/secrets/${SECRET_NAME}/versions/1
SERVICE_ACCOUNT_NAME=renyi-dataflow
SERVICE_ACCOUNT=${SERVICE_ACCOUNT_NAME}@${PROJECT}.iam.gserviceaccount.com
EPSILON=1.0
DELTA=1e-6
NORM_BUDGET=30
SHARDS=1024                           # >= 4 x total worker cores (deploy/README.md, capacity model)
MAX_WORKERS=8                         # capacity model: a 100M-user day fits 8 x n2-standard-4
MACHINE_TYPE=n2-standard-4
SUBSCRIPTION=projects/${PROJECT}/subscriptions/renyi-indicators  # streaming: Arrow IPC messages
SCHEMA=$(dirname "$0")/../schema.example.json  # the ledger's input contract (id type, columns, bounds)
KEY_FINGERPRINT=                      # streaming: the noise key's fingerprint (python -c "from renyi_stream.stream.noise import NoiseKey; print(NoiseKey.load('noise.key').fingerprint)")

usage() { sed -n '2,11p' "$0"; exit 2; }

setup() {
  local key_file=${1:?usage: launch.sh setup KEY_FILE (a 32-byte key: python -c "from renyi_stream.stream.noise import NoiseKey; NoiseKey.load_or_create('noise.key')")}
  gcloud services enable dataflow.googleapis.com artifactregistry.googleapis.com secretmanager.googleapis.com \
    --project="$PROJECT"
  gcloud artifacts repositories create "$REPO" --repository-format=docker --location="$REGION" --project="$PROJECT"
  for bucket in "$TEMPLATE_BUCKET" "$TEMP_BUCKET" "$CURATOR_BUCKET" "$RELEASE_BUCKET"; do
    gcloud storage buckets create "$bucket" --location="$REGION" --uniform-bucket-level-access --project="$PROJECT"
  done
  gcloud iam service-accounts create "$SERVICE_ACCOUNT_NAME" --display-name="renyi-stream Dataflow workers" \
    --project="$PROJECT"
  for role in roles/dataflow.worker roles/artifactregistry.reader; do
    gcloud projects add-iam-policy-binding "$PROJECT" --member="serviceAccount:${SERVICE_ACCOUNT}" --role="$role" \
      --condition=None
  done
  for bucket in "$TEMP_BUCKET" "$CURATOR_BUCKET" "$RELEASE_BUCKET"; do
    gcloud storage buckets add-iam-policy-binding "$bucket" --member="serviceAccount:${SERVICE_ACCOUNT}" \
      --role=roles/storage.objectAdmin
  done
  for bucket in "$TEMPLATE_BUCKET" "$INPUT_ROOT"; do
    gcloud storage buckets add-iam-policy-binding "$bucket" --member="serviceAccount:${SERVICE_ACCOUNT}" \
      --role=roles/storage.objectViewer
  done
  # The key goes to Secret Manager only; keep the file's backup with the curator, offline.
  gcloud secrets create "$SECRET_NAME" --replication-policy=automatic --data-file="$key_file" --project="$PROJECT"
  gcloud secrets add-iam-policy-binding "$SECRET_NAME" --member="serviceAccount:${SERVICE_ACCOUNT}" \
    --role=roles/secretmanager.secretAccessor --project="$PROJECT"
}

build() {
  gcloud auth configure-docker "${REGION}-docker.pkg.dev" --quiet
  docker build -f deploy/Dockerfile --build-arg BEAM_VERSION="$BEAM_VERSION" -t "$HARNESS_IMAGE" .
  docker push "$HARNESS_IMAGE"
  docker build -f deploy/dataflow/Dockerfile --build-arg HARNESS_IMAGE="$HARNESS_IMAGE" -t "$TEMPLATE_IMAGE" \
    deploy/dataflow
  docker push "$TEMPLATE_IMAGE"
  gcloud dataflow flex-template build "$TEMPLATE_SPEC" --image="$TEMPLATE_IMAGE" --sdk-language=PYTHON \
    --metadata-file=deploy/dataflow/metadata.json --project="$PROJECT"
}

run() {
  local day=${1:?usage: launch.sh run YYYY-MM-DD [PREVIOUS_OUTPUT|none]}
  local previous=${2:-${CURATOR_BUCKET}/runs/$(date -u -d "${day} -1 day" +%F)}
  local output=${CURATOR_BUCKET}/runs/${day}
  # ^~^ makes ~ the separator between parameters (gcloud topic escaping): values may hold commas.
  gcloud dataflow flex-template run "renyi-daily-${day//-/}-$(date -u +%H%M%S)" \
    --project="$PROJECT" --region="$REGION" --template-file-gcs-location="$TEMPLATE_SPEC" \
    --service-account-email="$SERVICE_ACCOUNT" \
    --temp-location="${TEMP_BUCKET}/tmp" --staging-location="${TEMP_BUCKET}/staging" \
    --worker-machine-type="$MACHINE_TYPE" --max-workers="$MAX_WORKERS" \
    --parameters="^~^sdk_container_image=${HARNESS_IMAGE}~input=${INPUT_ROOT}/day=${day}/*.parquet~start=${day}~end=${day}~epsilon=${EPSILON}~delta=${DELTA}~norm_budget=${NORM_BUDGET}~releases_parquet=${RELEASES}~previous_ledger=${previous}~output=${output}~noise_key_secret=${NOISE_KEY_SECRET}~shards=${SHARDS}"
}

stream() {
  local start=${1:?usage: launch.sh stream START END [PREVIOUS_LEDGER_GLOB|none]}
  local end=${2:?usage: launch.sh stream START END [PREVIOUS_LEDGER_GLOB|none]}
  local previous=${3:-none}
  # Launched from here (not a Flex Template): python -m renyi_stream.pipelines.streaming needs this
  # repository installed with the same apache-beam as the harness image.
  python -m renyi_stream.pipelines.streaming --subscription "$SUBSCRIPTION" --timestamp-attribute event_time \
    --schema "$SCHEMA" --start "$start" --end "$end" \
    --epsilon "$EPSILON" --delta "$DELTA" --norm-budget "$NORM_BUDGET" --shards "$SHARDS" \
    --releases-parquet "$RELEASES" --output "${CURATOR_BUCKET}/stream/${start}" --previous-ledger "$previous" \
    --noise-key-secret "$NOISE_KEY_SECRET" --key-fingerprint "$KEY_FINGERPRINT" \
    --runner DataflowRunner --streaming --enable_streaming_engine --project "$PROJECT" --region "$REGION" \
    --temp_location "${TEMP_BUCKET}/tmp" --staging_location "${TEMP_BUCKET}/staging" \
    --sdk_container_image "$HARNESS_IMAGE" --service_account_email "$SERVICE_ACCOUNT" \
    --machine_type "$MACHINE_TYPE" --max_num_workers "$MAX_WORKERS" \
    --job_name "renyi-stream-${start//-/}-$(date -u +%H%M%S)"
}

status() {
  local day=${1:?usage: launch.sh status YYYY-MM-DD}
  gcloud storage cat "${CURATOR_BUCKET}/runs/${day}/_COMMITTED.json"
}

case "${1:-}" in
  setup) shift; setup "$@" ;;
  build) build ;;
  run) shift; run "$@" ;;
  status) shift; status "$@" ;;
  stream) shift; stream "$@" ;;
  *) usage ;;
esac
