#!/usr/bin/env bash
# Local servers for the built-in receivers' tests: redis and mosquitto, bound to
# 127.0.0.1, run as plain user processes (not system services) with their own pid
# file, log and data directory.
#
#   scripts/services.sh start  redis|mosquitto [PORT]   # prints the port; PORT 0/absent: a free one
#   scripts/services.sh stop   redis|mosquitto|all
#   scripts/services.sh status redis|mosquitto|all      # prints "NAME running PORT" or "NAME stopped"
#   scripts/services.sh install redis|mosquitto|chromium|all  # only installs (apt-get)
#
# State lives in $SPARK_RECEIVERS_SERVICES_DIR (default /tmp/spark-receivers-services-$UID),
# one folder per server. $SPARK_RECEIVERS_MOSQUITTO_CONF, when set, names a file whose
# lines are appended to mosquitto's config (a test's broker: persistence, queue limits;
# the last value of a setting wins). A missing binary is installed with apt-get (after one
# `apt-get update`); an installed one is used as it is. `start` on a running server
# prints its port and does nothing else. chromium (with chromium-driver: Debian's headless
# browser for the status page test, never a browser download) is install-only.
set -euo pipefail

STATE_ROOT="${SPARK_RECEIVERS_SERVICES_DIR:-/tmp/spark-receivers-services-$(id -u)}"
PATH="$PATH:/usr/sbin:/sbin"

die() { echo "services.sh: $*" >&2; exit 1; }

usage() {
    sed -n '2,17p' "$0" | sed 's/^# \{0,1\}//' >&2
    exit 2
}

binary_of() {
    case "$1" in
        redis) echo redis-server ;;
        mosquitto) echo mosquitto ;;
        chromium) echo chromedriver ;;
        *) die "unknown server '$1' (redis or mosquitto)" ;;
    esac
}

package_of() {
    case "$1" in
        redis) echo redis-server ;;
        mosquitto) echo mosquitto ;;
        chromium) echo chromium chromium-driver ;;
    esac
}

as_root() {
    if [ "$(id -u)" -eq 0 ]; then
        "$@"
    elif command -v sudo >/dev/null 2>&1; then
        sudo -n "$@"
    else
        die "installing needs root (or sudo): run '$*' as root"
    fi
}

install_server() {
    local name=$1 bin
    bin=$(binary_of "$name")
    command -v "$bin" >/dev/null 2>&1 && return 0
    command -v apt-get >/dev/null 2>&1 || die "$bin is not installed and there is no apt-get to install it"
    local marker="$STATE_ROOT/.apt-updated"
    mkdir -p "$STATE_ROOT"
    if [ ! -e "$marker" ]; then
        echo "services.sh: apt-get update" >&2
        as_root env DEBIAN_FRONTEND=noninteractive apt-get update -qq >&2 || die "apt-get update failed"
        touch "$marker"
    fi
    echo "services.sh: apt-get install $(package_of "$name")" >&2
    # shellcheck disable=SC2046 # one word per package
    as_root env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends \
        $(package_of "$name") >&2 || die "apt-get install $(package_of "$name") failed"
    command -v "$bin" >/dev/null 2>&1 || die "$bin still not found after installing $(package_of "$name")"
}

free_port() {
    python3 -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1]); s.close()'
}

is_running() {
    local dir="$STATE_ROOT/$1"
    [ -s "$dir/pid" ] && kill -0 "$(cat "$dir/pid")" 2>/dev/null
}

wait_for_port() {
    local port=$1 name=$2 log=$3
    for _ in $(seq 1 100); do
        if python3 -c 'import socket, sys; socket.create_connection(("127.0.0.1", int(sys.argv[1])), 0.2).close()' "$port" 2>/dev/null; then
            return 0
        fi
        sleep 0.1
    done
    echo "services.sh: $name did not listen on 127.0.0.1:$port within 10 s; its log:" >&2
    tail -n 20 "$log" >&2 2>/dev/null || true
    return 1
}

wait_for_pid_file() {
    local file=$1
    for _ in $(seq 1 50); do
        [ -s "$file" ] && return 0
        sleep 0.1
    done
    return 1
}

start_server() {
    local name=$1 port=${2:-0} dir
    dir="$STATE_ROOT/$name"
    if is_running "$name"; then
        cat "$dir/port"
        return 0
    fi
    install_server "$name"
    rm -rf "$dir"
    mkdir -p "$dir/data"
    [ "$port" = 0 ] && port=$(free_port)
    echo "$port" > "$dir/port"
    case "$name" in
        redis)
            redis-server --bind 127.0.0.1 --port "$port" --protected-mode yes \
                --daemonize yes --pidfile "$dir/pid" --logfile "$dir/log" \
                --dir "$dir/data" --save "" --appendonly no >&2
            ;;
        mosquitto)
            cat > "$dir/mosquitto.conf" <<EOF
listener $port 127.0.0.1
allow_anonymous true
pid_file $dir/pid
user $(id -un)
persistence false
log_dest file $dir/log
max_inflight_messages 1000
max_queued_messages 1000000
EOF
            if [ -n "${SPARK_RECEIVERS_MOSQUITTO_CONF:-}" ]; then
                cat "$SPARK_RECEIVERS_MOSQUITTO_CONF" >> "$dir/mosquitto.conf" \
                    || die "cannot read SPARK_RECEIVERS_MOSQUITTO_CONF=$SPARK_RECEIVERS_MOSQUITTO_CONF"
            fi
            mosquitto -c "$dir/mosquitto.conf" -d >>"$dir/log" 2>&1
            ;;
    esac
    wait_for_pid_file "$dir/pid" || die "$name wrote no pid file $dir/pid (log: $dir/log)"
    wait_for_port "$port" "$name" "$dir/log" || { stop_server "$name"; die "$name failed to start"; }
    echo "$port"
}

stop_server() {
    local name=$1 dir pid
    dir="$STATE_ROOT/$name"
    if [ -s "$dir/pid" ]; then
        pid=$(cat "$dir/pid")
        if kill -0 "$pid" 2>/dev/null; then
            kill "$pid"
            for _ in $(seq 1 50); do
                kill -0 "$pid" 2>/dev/null || break
                sleep 0.1
            done
            kill -0 "$pid" 2>/dev/null && kill -9 "$pid"
        fi
    fi
    rm -rf "$dir"
}

status_server() {
    local name=$1
    if is_running "$name"; then
        echo "$name running $(cat "$STATE_ROOT/$name/port")"
    else
        echo "$name stopped"
    fi
}

[ $# -ge 2 ] || usage
command=$1 target=$2 port=${3:-0}
case "$target" in
    all) targets="redis mosquitto" ;;
    redis | mosquitto) targets=$target ;;
    chromium) [ "$command" = install ] || die "chromium is install-only"; targets=chromium ;;
    *) die "unknown server '$target' (redis, mosquitto, chromium or all)" ;;
esac
case "$command" in
    start)
        [ "$target" = all ] && die "start one server at a time: it prints the port"
        start_server "$target" "$port"
        ;;
    stop) for t in $targets; do stop_server "$t"; done ;;
    status)
        rc=0
        for t in $targets; do status_server "$t"; is_running "$t" || rc=3; done
        exit $rc
        ;;
    install)
        [ "$target" = all ] && targets="$targets chromium"
        for t in $targets; do install_server "$t"; done
        ;;
    *) usage ;;
esac
