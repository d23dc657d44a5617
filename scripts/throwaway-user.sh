# The throwaway login user of `make test-install` and `make test-deb` (sourced, as root):
#   throwaway_user_create USER        a new account without subordinate ids (host-setup must add them), with sudo
#   throwaway_user_sudo USER RULE...  its sudoers rule, only those commands (logged to $THROWAWAY_SUDO_LOG if set)
#   throwaway_user_remove USER        its servers stopped by their pid files, the account and home, its sudoers
#                                     rule and cgroups removed
#   as_user USER COMMAND              COMMAND in a login shell of USER
#   user_step USER WHAT COMMAND       as_user under the heading WHAT, skipped once $status is 1, which a
#                                     failure sets (saying WHAT FAILED)

throwaway_user_create() {
    if ! command -v sudo >/dev/null; then
        echo "throwaway user: apt-get install sudo"
        DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends sudo >/dev/null
    fi
    # Without subordinate ids, as a new account on a host without useradd's defaults.
    useradd -m -s /bin/bash -K SUB_UID_COUNT=0 -K SUB_GID_COUNT=0 "$1"
    echo "throwaway user: created $1"
}

throwaway_user_sudo() {
    local user=$1 rule
    shift
    rule="$user ALL=(root) NOPASSWD: $(IFS=,; echo "$*")"
    {
        [ -n "${THROWAWAY_SUDO_LOG:-}" ] && echo "Defaults:$user logfile=$THROWAWAY_SUDO_LOG, loglinelen=0"
        echo "$rule"
    } >"/etc/sudoers.d/$user"
    chmod 440 "/etc/sudoers.d/$user"
    visudo -cqf "/etc/sudoers.d/$user"
}

# Stops the daemon, then the helper (the daemon would start it again), each by its pid file under HOME.
stop_servers_of() {
    local pidfile
    for pidfile in "$1"/.local/state/sandbox-mcp/run/{daemon,helper}.pid; do
        [ -f "$pidfile" ] && kill "$(cat "$pidfile")" 2>/dev/null && sleep 2
    done
}

throwaway_user_remove() {
    local user=$1 home d
    home=$(getent passwd "$user" | cut -d: -f6)
    if [ -n "$home" ]; then
        stop_servers_of "$home"
        userdel -r -f "$user" >/dev/null 2>&1
    fi
    rm -f "/etc/sudoers.d/$user"
    for d in /sys/fs/cgroup/*/sandbox-mcp."$user" /sys/fs/cgroup/sandbox-mcp."$user"; do
        [ -d "$d" ] && find "$d" -depth -type d -exec rmdir {} + 2>/dev/null
    done
    return 0
}

as_user() { runuser -l "$1" -c "$2"; }

user_step() {
    [ "${status:-0}" -eq 0 ] || return 0
    echo "== $2"
    if ! as_user "$1" "$3"; then
        echo "== $2 FAILED"
        status=1
    fi
}
