#!/usr/bin/env bash
# docker compose as an operator runs it, for real, where a container engine is at hand:
#   1. build the image; `docker compose up -d --wait` (healthy at once: the gateway listens
#      first) and wait for /readyz while the demo trains, printing its progress;
#   2. create a key with `docker compose exec gateway python -m gateway keys create`, stream a
#      chat with it;
#   3. `down` + `up` again: the key, the checkpoint and the usage survive; the same key streams;
#   4. the cluster file on fresh volumes (3 nodes behind nginx, PostgreSQL): one node trains the
#      demo under the lock, the others reuse it; a chat through the balancer; /internal/ hidden.
# Where there is no container engine (`docker info` fails) it says so and exits 0, skipped;
# COMPOSE_CHECK_REQUIRE=1 makes that a failure. Everything it starts is removed at the end
# (`down -v` on its own project names). Settings: COMPOSE_CHECK_PROJECT (gwcheck),
# READY_TIMEOUT_S (1800: the first start trains the demo), TORCH_INDEX (a build argument).
set -euo pipefail
cd "$(dirname "$0")/.."

PROJECT=${COMPOSE_CHECK_PROJECT:-gwcheck}
READY_TIMEOUT_S=${READY_TIMEOUT_S:-1800}
ROOT_URL=http://127.0.0.1:8000
MODEL=deepseek-chat

skip() {
    echo "compose check SKIPPED: $*"
    if [ "${COMPOSE_CHECK_REQUIRE:-0}" = 1 ]; then exit 1; fi
    exit 0
}

command -v docker >/dev/null || skip "no docker client on PATH"
if ! info=$(docker info 2>&1); then
    skip "no container engine answers ($(echo "$info" | grep -m1 -i 'cannot\|error' || echo 'docker info failed'))"
fi
if docker compose version >/dev/null 2>&1; then
    COMPOSE=(docker compose)
elif command -v docker-compose >/dev/null; then
    COMPOSE=(docker-compose)
elif [ -x .venv/bin/docker-compose ]; then
    COMPOSE=(.venv/bin/docker-compose)
else
    skip "docker answers but Compose is missing (docker compose plugin or docker-compose)"
fi
command -v curl >/dev/null || { echo "curl is needed" >&2; exit 1; }

created_env=""
if [ ! -f .env ]; then  # a fresh clone: a throwaway .env for this check only
    created_env=.env
    cat > .env <<EOF
GATEWAY_ADMIN__API_KEY=compose-check-$(head -c 12 /dev/urandom | od -An -tx1 | tr -d ' \n')
GATEWAY_CLUSTER__SECRET=compose-check-$(head -c 16 /dev/urandom | od -An -tx1 | tr -d ' \n')
EOF
fi
CLUSTER_FILES=(-f docker-compose.yml -f docker-compose.cluster.yml)
cleanup() {
    "${COMPOSE[@]}" -p "$PROJECT" down -v --remove-orphans >/dev/null 2>&1 || true
    "${COMPOSE[@]}" -p "$PROJECT-cluster" "${CLUSTER_FILES[@]}" down -v --remove-orphans \
        >/dev/null 2>&1 || true
    if [ -n "$created_env" ]; then rm -f "$created_env"; fi
}
trap cleanup EXIT

step() { echo; echo "== $*"; }

wait_ready() {  # $1: root URL; prints what is loading until /readyz is 200
    local deadline=$((SECONDS + READY_TIMEOUT_S)) last=""
    while true; do
        body=$(curl -s -o - -w '\n%{http_code}' "$1/readyz" || true)
        code=${body##*$'\n'}
        if [ "$code" = 200 ]; then echo "ready"; return 0; fi
        loading=$(echo "${body%$'\n'*}" | python3 -c \
            'import json,sys; print(json.load(sys.stdin).get("loading", {}))' 2>/dev/null || true)
        if [ "$loading" != "$last" ]; then echo "  not ready yet (HTTP $code): $loading"; last=$loading; fi
        if [ $SECONDS -ge $deadline ]; then
            echo "not ready within ${READY_TIMEOUT_S} s" >&2; return 1
        fi
        sleep 5
    done
}

stream_chat() {  # $1: root URL, $2: key; the stream must end with [DONE]
    local out
    out=$(curl -sN --max-time 300 "$1/v1/chat/completions" \
        -H "Authorization: Bearer $2" -H 'Content-Type: application/json' \
        -d "{\"model\": \"$MODEL\", \"stream\": true, \"max_tokens\": 16,
             \"messages\": [{\"role\": \"user\", \"content\": \"def fib(n):\"}]}")
    if ! grep -q '^data: \[DONE\]' <<<"$out"; then
        echo "the stream did not finish: $out" >&2; return 1
    fi
    echo "  streamed $(grep -c '^data: {' <<<"$out") chunks"
}

build_args=()
if [ -n "${TORCH_INDEX:-}" ]; then build_args=(--build-arg "TORCH_INDEX=$TORCH_INDEX"); fi

step "build the image"
"${COMPOSE[@]}" -p "$PROJECT" build ${build_args[@]+"${build_args[@]}"}

step "up --wait (healthy as soon as it listens), then ready once the demo is trained"
"${COMPOSE[@]}" -p "$PROJECT" up -d --wait --wait-timeout 300
wait_ready "$ROOT_URL"
"${COMPOSE[@]}" -p "$PROJECT" logs gateway | grep -m1 'native CPU kernels' || true

step "create a key and stream a chat"
KEY=$("${COMPOSE[@]}" -p "$PROJECT" exec -T gateway python -m gateway keys create --name compose-check \
    | python3 -c 'import json,sys; print(json.load(sys.stdin)["key"])')
stream_chat "$ROOT_URL" "$KEY"

step "down + up: the key, the checkpoint and the usage survive"
"${COMPOSE[@]}" -p "$PROJECT" down
"${COMPOSE[@]}" -p "$PROJECT" up -d --wait --wait-timeout 300
wait_ready "$ROOT_URL"
if ! "${COMPOSE[@]}" -p "$PROJECT" logs gateway | grep -q demo_checkpoint_reused; then
    echo "the restarted gateway did not reuse the demo checkpoint" >&2; exit 1
fi
stream_chat "$ROOT_URL" "$KEY"
"${COMPOSE[@]}" -p "$PROJECT" down -v

if ! grep -q '^GATEWAY_CLUSTER__SECRET=' .env; then
    skip "the cluster part: .env has no GATEWAY_CLUSTER__SECRET (see .env.example)"
fi
step "the cluster file on fresh volumes: 3 nodes, one trains the demo"
CLUSTER=("${COMPOSE[@]}" -p "$PROJECT-cluster" "${CLUSTER_FILES[@]}")
"${CLUSTER[@]}" up -d --wait --wait-timeout 300 --scale gateway=3
wait_ready "$ROOT_URL"
for _ in $(seq 60); do  # every node ready (the balancer spreads the probes)
    ready=0
    for _ in 1 2 3 4 5 6; do
        code=$(curl -s -o /dev/null -w '%{http_code}' "$ROOT_URL/readyz" || true)
        if [ "$code" = 200 ]; then ready=$((ready + 1)); fi
    done
    if [ $ready = 6 ]; then break; fi
    sleep 5
done
builds=$("${CLUSTER[@]}" logs gateway | grep -c demo_checkpoint_build_started || true)
echo "  nodes that trained the demo: $builds"
if [ "$builds" != 1 ]; then echo "expected exactly one node to train the demo" >&2; exit 1; fi
KEY=$("${CLUSTER[@]}" exec -T --index 1 gateway python -m gateway keys create --name cluster-check \
    | python3 -c 'import json,sys; print(json.load(sys.stdin)["key"])')
stream_chat "$ROOT_URL" "$KEY"
code=$(curl -s -o /dev/null -w '%{http_code}' "$ROOT_URL/internal/cluster")
if [ "$code" != 404 ]; then echo "/internal/ is published through the balancer ($code)" >&2; exit 1; fi

echo
echo "compose check PASSED"
