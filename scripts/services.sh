#!/usr/bin/env bash
# Local servers for the built-in receivers' tests: redis, mosquitto, amqp (RabbitMQ)
# and nats (nats-server with JetStream), bound to 127.0.0.1, run as plain user
# processes (not system services) with their own pid file, log and data directory.
#
#   scripts/services.sh start   SERVER [PORT]  # prints the port; PORT 0/absent: a free one
#   scripts/services.sh restart redis|amqp|nats  # stop and start again: same port, data kept
#   scripts/services.sh stop    SERVER|all
#   scripts/services.sh status  SERVER|all     # prints "NAME running PORT" or "NAME stopped"
#   scripts/services.sh install SERVER|chromium|all  # only installs (apt-get)
#
# SERVER: redis, mosquitto, amqp or nats. amqp and nats require a login: the user and a
# random password are in $STATE/NAME/user and $STATE/NAME/password (RabbitMQ has no
# guest user; its node name, mnesia dir, config, Erlang cookie, epmd and distribution
# ports are its own, so it never meets another session's node; nats keeps its JetStream
# store under $STATE/nats).
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
    sed -n '2,24p' "$0" | sed 's/^# \{0,1\}//' >&2
    exit 2
}

binary_of() {
    case "$1" in
        redis) echo redis-server ;;
        mosquitto) echo mosquitto ;;
        chromium) echo chromedriver ;;
        amqp) echo /usr/lib/rabbitmq/bin/rabbitmq-server ;;
        nats) echo nats-server ;;
        *) die "unknown server '$1' (redis, mosquitto, amqp or nats)" ;;
    esac
}

package_of() {
    case "$1" in
        redis) echo redis-server ;;
        mosquitto) echo mosquitto ;;
        chromium) echo chromium chromium-driver ;;
        amqp) echo rabbitmq-server ;;
        nats) echo nats-server ;;
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

# Wait until something listens on 127.0.0.1:PORT, for at most SECONDS of wall time. The
# probe is bash's own /dev/tcp (no process per try), and the bound is the clock's: it was a
# count of tries, each starting a python3, and beside a CPU hog each try took seconds, so a
# broker that did not come back had a restart wait far past its test's 300 s timeout
# (2026-11-29), which then left RabbitMQ half-started for every later test of the session.
wait_for_port() {
    local port=$1 name=$2 log=$3 seconds=${4:-60} deadline
    deadline=$((SECONDS + seconds))
    while [ "$SECONDS" -lt "$deadline" ]; do
        if (exec 3<>"/dev/tcp/127.0.0.1/$port") 2>/dev/null; then
            return 0
        fi
        sleep 0.1
    done
    echo "services.sh: $name did not listen on 127.0.0.1:$port within $seconds s; its log:" >&2
    tail -n 20 "$log" >&2 2>/dev/null || true
    return 1
}

# Wait until redis on 127.0.0.1:PORT answers PING with PONG, for at most SECONDS: it
# listens before it has loaded its append-only file and answers "-LOADING" meanwhile
# (a restart test's next command failed on it once the port probe got fast, 2026-11-29).
wait_for_redis_ready() {
    local port=$1 seconds=${2:-60} deadline reply
    deadline=$((SECONDS + seconds))
    while [ "$SECONDS" -lt "$deadline" ]; do
        reply=$( (exec 3<>"/dev/tcp/127.0.0.1/$port" && printf 'PING\r\n' >&3 \
            && IFS= read -r -t 2 line <&3 && printf '%s' "$line") 2>/dev/null) || true
        case "$reply" in +PONG*) return 0 ;; esac
        sleep 0.1
    done
    echo "services.sh: redis on 127.0.0.1:$port did not answer PONG within $seconds s" >&2
    return 1
}

# Wait until RabbitMQ on 127.0.0.1:PORT answers AMQP's protocol header with a frame (its
# Connection.Start), for at most SECONDS: its listener can take connections while the node
# still boots, and it closes them unanswered then, which a test's first connect took for an
# incompatible protocol (pika: "Transport indicated EOF", a fresh clone's run of 2026-11-30).
wait_for_amqp_ready() {
    local port=$1 seconds=${2:-60} deadline first
    deadline=$((SECONDS + seconds))
    while [ "$SECONDS" -lt "$deadline" ]; do
        first=$( (exec 3<>"/dev/tcp/127.0.0.1/$port" && printf 'AMQP\x00\x00\x09\x01' >&3 \
            && timeout 5 head -c 1 <&3 | od -An -tu1 | tr -d ' ') 2>/dev/null) || true
        [ "$first" = 1 ] && return 0
        sleep 0.2
    done
    echo "services.sh: RabbitMQ on 127.0.0.1:$port did not answer AMQP within $seconds s" >&2
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
        amqp | nats)
            head -c 18 /dev/urandom | base64 | tr -d '/+=' > "$dir/password"
            echo spark > "$dir/user"
            ;;
    esac
    launch "$name"
}

# redis-server on $STATE/redis: an append-only file (fsync'd every second, and whole at a
# SIGTERM), so a restart keeps the streams, their groups and pending lists.
launch_redis() {
    local dir=$1 port=$2
    redis-server --bind 127.0.0.1 --port "$port" --protected-mode yes \
        --daemonize yes --pidfile "$dir/pid" --logfile "$dir/log" \
        --dir "$dir/data" --save "" --appendonly yes --appendfsync everysec >&2
}

# Start the broker of $STATE/NAME (amqp, nats) from the files a first start wrote there.
launch_broker() {
    local name=$1 dir port user password
    dir="$STATE_ROOT/$name"
    port=$(cat "$dir/port") user=$(cat "$dir/user") password=$(cat "$dir/password")
    case "$name" in
        amqp)
            local epmd_port dist_port
            [ -s "$dir/epmd_port" ] || free_port > "$dir/epmd_port"
            [ -s "$dir/dist_port" ] || free_port > "$dir/dist_port"
            epmd_port=$(cat "$dir/epmd_port") dist_port=$(cat "$dir/dist_port")
            mkdir -p "$dir/home" "$dir/mnesia" "$dir/logs"
            # default_user replaces guest: the only user is ours, and it needs its password
            cat > "$dir/rabbitmq.conf" <<EOF
listeners.tcp.1 = 127.0.0.1:$port
default_user = $user
default_pass = $password
default_vhost = /
loopback_users = none
log.console = false
log.file.level = info
EOF
            echo '[].' > "$dir/enabled_plugins"
            # an epmd of our own on a free port (erl uses a running one, never starts another)
            setsid epmd -address 127.0.0.1 -port "$epmd_port" >>"$dir/log" 2>&1 </dev/null &
            echo $! > "$dir/epmd.pid"
            wait_for_port "$epmd_port" epmd "$dir/log" 30 || die "epmd did not start (log: $dir/log)"
            HOME="$dir/home" ERL_EPMD_PORT=$epmd_port ERL_EPMD_ADDRESS=127.0.0.1 \
                RABBITMQ_NODENAME="spark-$port@localhost" RABBITMQ_NODE_IP_ADDRESS=127.0.0.1 \
                RABBITMQ_NODE_PORT=$port RABBITMQ_DIST_PORT=$dist_port \
                RABBITMQ_CONFIG_FILE="$dir/rabbitmq.conf" \
                RABBITMQ_ENABLED_PLUGINS_FILE="$dir/enabled_plugins" \
                RABBITMQ_MNESIA_BASE="$dir/mnesia" RABBITMQ_LOG_BASE="$dir/logs" \
                RABBITMQ_PID_FILE="$dir/beam.pid" \
                RABBITMQ_ADVANCED_CONFIG_FILE="$dir/advanced.config" \
                setsid /usr/lib/rabbitmq/bin/rabbitmq-server >>"$dir/log" 2>&1 </dev/null &
            echo $! > "$dir/pid"
            ;;
        nats)
            mkdir -p "$dir/jetstream"
            # the login in a file of its own, not on a command line that ps shows
            cat > "$dir/auth.conf" <<EOF
authorization { user: "$user", password: "$password" }
EOF
            setsid nats-server -a 127.0.0.1 -p "$port" -js -sd "$dir/jetstream" -c "$dir/auth.conf" \
                -l "$dir/log" >/dev/null 2>>"$dir/log" </dev/null &
            echo $! > "$dir/pid"
            ;;
    esac
}

# Start NAME from its folder (port, config, data) and wait until it listens.
launch() {
    local name=$1 dir port seconds=60
    dir="$STATE_ROOT/$name" port=$(cat "$STATE_ROOT/$name/port")
    case "$name" in
        amqp | nats) launch_broker "$name" ;;
        redis) launch_redis "$dir" "$port" ;;
    esac
    [ "$name" = amqp ] && seconds=180 # an Erlang VM and RabbitMQ's boot: a minute when busy
    wait_for_pid_file "$dir/pid" || die "$name wrote no pid file $dir/pid (log: $dir/log)"
    wait_for_port "$port" "$name" "$dir/log" "$seconds" || {
        tail -n 20 "$dir"/logs/*.log >&2 2>/dev/null || true
        stop_server "$name"
        die "$name failed to start"
    }
    if [ "$name" = redis ]; then
        wait_for_redis_ready "$port" "$seconds" || die "redis did not load its data (log: $dir/log)"
    fi
    if [ "$name" = amqp ]; then
        wait_for_amqp_ready "$port" "$seconds" || {
            tail -n 20 "$dir"/logs/*.log >&2 2>/dev/null || true
            die "RabbitMQ listens but does not answer AMQP (log: $dir/logs)"
        }
    fi
    echo "$port"
}

# Stop the processes of a server's folder (the server, its epmd), keeping its files.
stop_processes() {
    local dir=$1 pid file
    for file in "$dir/pid" "$dir/epmd.pid"; do
        [ -s "$file" ] || continue
        pid=$(cat "$file")
        if kill -0 "$pid" 2>/dev/null; then
            kill "$pid"
            for _ in $(seq 1 300); do
                kill -0 "$pid" 2>/dev/null || break
                sleep 0.1
            done
            kill -0 "$pid" 2>/dev/null && kill -9 "$pid"
        fi
        rm -f "$file"
    done
    # RabbitMQ's VM, should its wrapper script have gone first; waited for, so that a
    # restart's new VM does not find its ports still held by the old one
    if [ -s "$dir/beam.pid" ]; then
        pid=$(cat "$dir/beam.pid")
        kill -0 "$pid" 2>/dev/null && kill -9 "$pid"
        for _ in $(seq 1 100); do
            kill -0 "$pid" 2>/dev/null || break
            sleep 0.1
        done
        rm -f "$dir/beam.pid"
    fi
    return 0
}

restart_server() {
    local name=$1 dir
    dir="$STATE_ROOT/$name"
    [ -s "$dir/port" ] || die "$name was never started (no $dir/port): use start"
    stop_processes "$dir"
    launch "$name"
}

stop_server() {
    local name=$1 dir
    dir="$STATE_ROOT/$name"
    stop_processes "$dir"
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
    all) targets="redis mosquitto amqp nats" ;;
    redis | mosquitto | amqp | nats) targets=$target ;;
    chromium) [ "$command" = install ] || die "chromium is install-only"; targets=chromium ;;
    *) die "unknown server '$target' (redis, mosquitto, amqp, nats, chromium or all)" ;;
esac
case "$command" in
    start)
        [ "$target" = all ] && die "start one server at a time: it prints the port"
        start_server "$target" "$port"
        ;;
    restart)
        case "$target" in redis | amqp | nats) ;; *) die "restart keeps a server's data: redis, amqp or nats" ;; esac
        restart_server "$target"
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
