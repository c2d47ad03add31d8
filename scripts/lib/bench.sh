# Shell functions of the benchmark scripts (scripts/bench,
# scripts/bench-streams), sourced after scripts/lib/postgres.sh and after
# the script defines say and die. They use the caller's globals: WORK (the
# run's temporary directory, where every process started writes
# NAME.pid or NAME.client and NAME.log), HERALD (the herald binary), DS
# (the Durable Streams server), LUA (scripts/bench.lua), SECONDS_PER_RUN,
# FANOUT and ROWS.

# client NAME CMD...: runs a client in the foreground, its pid in a file
# that cleanup reads (command substitutions do not share variables).
client() {
    local name=$1 pid status=0
    shift
    "$@" &
    pid=$!
    echo "$pid" >"$WORK/$name.client"
    wait "$pid" || status=$?
    rm -f "$WORK/$name.client"
    return "$status"
}

# A port below Linux's default ephemeral range (32768-60999), where the
# many client connections of a run take their local ports.
free_port() {
    local p
    while :; do
        p=$(( 20000 + RANDOM % 12000 ))
        pg_port_in_use "$p" || { echo "$p"; return; }
    done
}

# wait_http URL NAME: waits until URL answers 2xx.
wait_http() {
    local _
    for _ in $(seq 1 300); do
        curl -fsS -o /dev/null "$1" 2>/dev/null && return 0
        sleep 0.1
    done
    cat "$WORK/$2.log" >&2 2>/dev/null || true
    die "$2 did not become ready"
}

# start_herald NAME FLAGS...: starts `herald serve` and prints its URL.
start_herald() {
    local name=$1 port
    shift
    port=$(free_port)
    # Every client of a run connects from 127.0.0.1: without a higher
    # per-address limit (default 256) the fan-out and idle figures' clients
    # would be refused with 429.
    "$HERALD" serve --listen "127.0.0.1:$port" --data-dir "$WORK/$name" \
        --max-connections-per-ip 1000000 "$@" >"$WORK/$name.log" 2>&1 &
    echo $! >"$WORK/$name.pid"
    wait_http "http://127.0.0.1:$port/readyz" "$name"
    echo "http://127.0.0.1:$port"
}

# stop NAME: stops a server started by this script.
stop() {
    local pid
    pid=$(cat "$WORK/$1.pid")
    kill "$pid" 2>/dev/null || true
    wait "$pid" 2>/dev/null || true
    rm -f "$WORK/$1.pid"
}

# start_ds NAME: starts the Durable Streams server (wal durability: an
# append is acknowledged after a group-commit fdatasync) and prints its URL.
start_ds() {
    local name=$1 port
    port=$(free_port)
    "$DS" --host 127.0.0.1 --port "$port" --data-dir "$WORK/$name" --durability wal \
        >"$WORK/$name.log" 2>&1 &
    echo $! >"$WORK/$name.pid"
    wait_http "http://127.0.0.1:$port/health" "$name"
    echo "http://127.0.0.1:$port"
}

# ds_create URL NAME...: creates JSON streams (`PUT`).
ds_create() {
    local base=$1 name
    shift
    for name in "$@"; do
        curl -fsS -o /dev/null -X PUT -H 'Content-Type: application/json' "$base/$name" \
            || die "cannot create the stream $name on $base"
    done
}

# wrk_out NAME CONNECTIONS SECONDS URL [VAR=VALUE...]: runs wrk with
# scripts/bench.lua and its settings; prints wrk's report. Fails when any
# answer was not 2xx or 3xx.
wrk_out() {
    local name=$1 connections=$2 seconds=$3 url=$4 out
    shift 4
    out=$(client "wrk-$name" env "$@" wrk --latency -t "$(( connections < 2 ? 1 : 2 ))" \
        -c "$connections" -d "${seconds}s" -s "$LUA" "$url") \
        || die "wrk against $name failed"
    if grep -q 'Non-2xx or 3xx responses' <<<"$out"; then
        printf '%s\n' "$out" >&2
        die "wrk against $name: answers that were not 2xx or 3xx"
    fi
    printf '%s\n' "$out"
}

# wrk_rps OUTPUT: requests per second.
wrk_rps() { awk '/^Requests\/sec:/ { print $2 }' <<<"$1"; }

# wrk_ms OUTPUT PERCENTILE (50, 99): that latency in ms.
wrk_ms() {
    awk -v p="$2%" '$1 == p {
        v = $2; unit = v; sub(/^[0-9.]+/, "", unit); sub(/[a-z]+$/, "", v)
        f = (unit == "us") ? 0.001 : (unit == "s") ? 1000 : (unit == "m") ? 60000 : 1
        print v * f }' <<<"$1"
}

# fanout NAME SUBSCRIBE_TEMPLATE PUBLISH_TEMPLATE: the JSON report of
# `herald bench fanout` with the subscribers on one channel.
fanout() {
    local out
    out=$(client "fanout-$1" "$HERALD" bench fanout --json --subscribers "$FANOUT" --channels 1 \
        --rate 20 --duration "${SECONDS_PER_RUN}s" --channel-prefix "fanout-$1-" \
        --subscribe-url "$2" --publish-url "$3") || true
    [ -n "$out" ] || die "fan-out against $1 failed"
    jq -e '.missed == 0 and .duplicated == 0 and .publish_errors == 0' <<<"$out" >/dev/null \
        || say "fan-out against $1: incomplete: $out"
    printf '%s\n' "$out"
}

row() {
    ROWS+=("$1|$2|$3|$4|$5|$6|$7")
    say "$2: $3 $4, $5 $6 $7"
}

version() { { "$@" 2>&1 || true; } | head -1; }

# fmt VALUE: a number rounded for the table (anything else as it is).
fmt() { awk -v v="$1" 'BEGIN { if (v != "" && v + 0 == v) printf (v >= 100 ? "%.0f" : "%.2f"), v; else printf "%s", v }'; }

# print_rows: the table of ROWS, with Herald's ratio to its peer.
print_rows() {
    local r name peer pv herald hv ratio
    printf '\n| figure | peer | peer figure | Herald | Herald figure | ratio Herald ÷ peer |\n'
    printf '| --- | --- | --- | --- | --- | --- |\n'
    for r in "${ROWS[@]}"; do
        IFS="|" read -r _ name peer pv herald hv _ <<<"$r"
        ratio=$(awk -v h="$hv" -v p="$pv" 'BEGIN { if (p + 0 > 0 && h + 0 == h) printf "%.2f×", h / p; else print "" }')
        printf '| %s | %s | %s | %s | %s | %s |\n' "$name" "$peer" "$(fmt "$pv")" "$herald" "$(fmt "$hv")" "$ratio"
    done
    printf '\nRatios are Herald ÷ peer: above 1 is better for Herald in throughput\n'
    printf '(msg/s, req/s), below 1 better in latency (ms), CPU and memory.\n'
}
