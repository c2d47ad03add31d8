# Shell functions for a disposable PostgreSQL cluster, sourced by
# scripts/test and scripts/bench (bash). They expect `say` and `die`.
#
#   pg_find_or_install   sets PG_BIN (initdb, pg_ctl, postgres), installing
#                        Debian's `postgresql` as root when it is missing
#   pg_user_setup        sets PG_USER and defines `as_pg CMD...`: as root,
#                        the unprivileged user herald-test (created if
#                        missing), because PostgreSQL refuses to run as root
#   pg_cluster_start DIR OPTIONS
#                        initdb in DIR/data and start it on a free loopback
#                        port with the server OPTIONS (`-c name=value ...`);
#                        sets PG_PORT; DIR must exist
#   pg_cluster_stop DIR  stops the cluster in DIR (immediate shutdown)

pg_find_bin() {
    local d
    if command -v initdb >/dev/null 2>&1 && command -v pg_ctl >/dev/null 2>&1; then
        dirname "$(command -v initdb)"
        return 0
    fi
    for d in $(ls -d /usr/lib/postgresql/*/bin 2>/dev/null | sort -V -r); do
        if [ -x "$d/initdb" ] && [ -x "$d/pg_ctl" ]; then
            echo "$d"
            return 0
        fi
    done
    return 1
}

pg_find_or_install() {
    if PG_BIN=$(pg_find_bin); then
        return 0
    fi
    if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then
        say "installing PostgreSQL (Debian package postgresql)"
        export DEBIAN_FRONTEND=noninteractive
        apt-get update -qq
        apt-get install -y -qq postgresql >/dev/null
        PG_BIN=$(pg_find_bin) || die "PostgreSQL installed but initdb/pg_ctl not found"
    else
        die "PostgreSQL server binaries (initdb, pg_ctl) not found; install PostgreSQL 14 or newer"
    fi
}

pg_user_setup() {
    PG_USER=$(id -un)
    as_pg() { "$@"; }
    if [ "$(id -u)" = 0 ]; then
        PG_USER=herald-test
        if ! id -u "$PG_USER" >/dev/null 2>&1; then
            say "creating the unprivileged user $PG_USER for PostgreSQL"
            useradd --system --no-create-home --shell /usr/sbin/nologin "$PG_USER" 2>/dev/null \
                || useradd -r -M -s /bin/false "$PG_USER"
        fi
        if command -v runuser >/dev/null 2>&1; then
            as_pg() { runuser -u "$PG_USER" -- "$@"; }
        else
            as_pg() { su -s /bin/sh "$PG_USER" -c "$(printf '%q ' "$@")"; }
        fi
    fi
}

pg_port_in_use() { (exec 3<>"/dev/tcp/127.0.0.1/$1") 2>/dev/null; }

pg_cluster_start() {
    local dir=$1 options=$2 candidate
    chmod 0755 "$dir"
    if [ "$(id -u)" = 0 ]; then chown "$PG_USER" "$dir"; fi
    as_pg "$PG_BIN/initdb" -D "$dir/data" -U herald --auth=trust -E UTF8 --no-sync >"$dir/initdb.log" 2>&1 \
        || { cat "$dir/initdb.log" >&2; die "initdb failed"; }
    PG_PORT=
    # Below Linux's default ephemeral range (32768-60999), where client
    # connections take their local ports.
    for _ in $(seq 1 20); do
        candidate=$(( 20000 + RANDOM % 12000 ))
        pg_port_in_use "$candidate" && continue
        if as_pg "$PG_BIN/pg_ctl" -D "$dir/data" -l "$dir/server.log" -w -t 60 \
            -o "-p $candidate -k $dir -c listen_addresses=127.0.0.1 $options" \
            start >/dev/null 2>&1; then
            PG_PORT=$candidate
            return 0
        fi
    done
    cat "$dir/server.log" >&2 || true
    die "could not start PostgreSQL"
}

pg_cluster_stop() {
    local dir=$1
    if [ -f "$dir/data/postmaster.pid" ]; then
        as_pg "$PG_BIN/pg_ctl" -D "$dir/data" -m immediate -w stop >/dev/null 2>&1 || true
    fi
}
