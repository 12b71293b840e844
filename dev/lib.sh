# shellcheck shell=bash
# shellcheck disable=SC2034  # it sets variables (REPO, KAFKA, DEV_NAME) for the scripts that source it
# dev/lib.sh: the helpers the dev/ scripts share. Sourced, never run; a script starts with
#
#   # shellcheck source=dev/lib.sh
#   source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"
#   DEV_NAME=dev/faults     # how this script's messages begin
#
# Why one file: die, note, the waits and the exit hooks were copied into most scripts, and copies
# drift (one wait gave a process 5 s to appear, another 20 s, another forever; one broker check could never match).
# Each is written once here, with the rule the harness keeps: a wait is a wait for an event (a port, a pid, a log
# line, a counter), polled, and bounded by a generous deadline, so that a busy machine makes it longer, never a
# failure. Only functions and a few variables are defined; nothing runs when it is sourced.
#
# Messages and exits
#   die MSG                        "NAME: error: MSG" on stderr, exit 1
#   fail CODE MSG                  "NAME: MSG" on stderr, exit CODE (2 for a usage error)
#   note MSG                       "NAME: MSG" on stderr (DEV_NOTE_FD=1: on stdout, as dev/kafka prints)
#   step MSG                       a "== MSG" heading on stdout (and a mark in SHAREHOST_TIMINGS when set)
#   timing_mark MSG                the mark alone: MSG starts now in this script's lane ("-": the lane ends)
#   require_cargo                  exit 1 with where to get Rust when cargo is missing
#   clippy_while_building          clippy's driver as the workspace's compiler wrapper: the tests' build runs the lints
#   header_help                    print the script's header comment (its --help), exit 0
# Processes, ports and waits
#   wait_until SECONDS PID CMD...  poll CMD until it succeeds; 2 as soon as PID is gone, 1 after SECONDS
#   at_exit COMMAND                run COMMAND when the script exits, the last registered first
#   children PID                   PID's child processes
#   kill_tree PID...               SIGTERM to each PID's children and to it
#   stop_child PID                 SIGTERM to a child of this shell that still runs, and wait for it
# Brokers (dev/kafka)
#   REPO, KAFKA                    the checkout, its dev/kafka
#   kafka_at BASE DIR ARGS...      dev/kafka for the broker or cluster at base port BASE with its state in DIR
#   cluster_bootstrap BASE         the client addresses of the three nodes of the cluster at BASE
#   up_owned WHAT CMD [ARGS...]    CMD up ARGS; stopped (CMD down) at exit if nothing ran there before
if [[ ${BASH_SOURCE[0]} == "$0" ]]; then
  echo "dev/lib.sh is sourced by the dev/ scripts, not run" >&2
  exit 2
fi

REPO=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
KAFKA=$REPO/dev/kafka
# The JVM options of the brokers the tests run (dev/test, dev/kube-test; dev/kafka_harness.py
# reads SHAREHOST_BROKER_JVM_OPTS): C1's JIT only and the serial collector, for short-lived
# brokers on a small machine. Benchmarks and the demo leave the variable unset.
# shellcheck disable=SC2034  # used by the scripts that source this file
TEST_BROKER_JVM_OPTS="-XX:TieredStopAtLevel=1 -XX:+UseSerialGC"
DEV_NAME=${DEV_NAME:-$(basename "$0")}

# --- messages and exits ------------------------------------------------------------------------------------------

die() { echo "$DEV_NAME: error: $*" >&2; exit 1; }
fail() {
  local code=$1
  shift
  echo "$DEV_NAME: $*" >&2
  exit "$code"
}
note() { echo "$DEV_NAME: $*" >&"${DEV_NOTE_FD:-2}"; }
step() {
  printf '\n== %s\n' "$*"
  timing_mark "$*"
}
# With SHAREHOST_TIMINGS naming a file (.ci/run sets it), every step appends "EPOCH<TAB>SCRIPT<TAB>STEP" to it:
# dev/timings.py makes the table of where a run's time went from it. A script's steps follow each other, so each
# lasts until the next mark of the same script; "-" ends the script's last one.
timing_mark() {
  if [[ -n ${SHAREHOST_TIMINGS:-} ]]; then
    printf '%s\t%s\t%s\n' "$(date +%s.%N)" "$DEV_NAME" "$1" >>"$SHAREHOST_TIMINGS"
  fi
}
require_cargo() {
  command -v cargo >/dev/null || { echo "error: cargo is missing: install Rust with rustup (https://rustup.rs)" >&2; exit 1; }
}
# clippy_while_building: exports clippy's driver as the workspace's compiler wrapper, so that a build of the tests
# also runs the lints (dev/build_warnings.py fails it on a warning) and no `cargo clippy` checks every dependency again.
# The wrapper is part of what cargo fingerprints: scripts that build the tests after dev/test (dev/kube-test) call
# this too, or they build the workspace's crates a second time. Never for benchmarks: the driver turns MIR
# optimisations off.
clippy_while_building() {
  local driver
  driver=$(rustup which clippy-driver 2>/dev/null) || {
    rustup component add clippy >&2 && driver=$(rustup which clippy-driver)
  } || driver=$(command -v clippy-driver) || { echo "error: clippy-driver is missing: rustup component add clippy" >&2; exit 1; }
  export RUSTC_WORKSPACE_WRAPPER=$driver
}
# header_help: the comment between the shebang and `set -euo pipefail` is the script's manual.
header_help() {
  sed -n '2,/^set -euo/p' "$0" | sed '$d; s/^# \{0,1\}//'
  exit 0
}

# --- processes, ports and waits ----------------------------------------------------------------------------------

# wait_until SECONDS PID CMD [ARG...]: polls CMD every 0.2 s until it succeeds (0). Gives up with 2 as soon as PID
# (unless empty) is gone, since what it waits for cannot come any more, and with 1 once SECONDS have passed; what
# that means is the caller's to say.
wait_until() {
  local limit=$1 pid=$2 t0=$SECONDS
  shift 2
  until "$@"; do
    if [[ -n $pid ]] && ! kill -0 "$pid" 2>/dev/null; then return 2; fi
    ((SECONDS - t0 < limit)) || return 1
    sleep 0.2
  done
}

DEV_AT_EXIT=()
# at_exit COMMAND: COMMAND (one string, evaluated at exit, so it sees the variables as they are then) runs when the
# script exits, the last registered first: what was started last is stopped first (the consumers before their
# broker). One that fails does not keep the others from running, nor changes the script's exit status.
at_exit() {
  DEV_AT_EXIT+=("$1")
  trap dev_on_exit EXIT
}
dev_on_exit() {
  local i
  for ((i = ${#DEV_AT_EXIT[@]} - 1; i >= 0; i--)); do eval "${DEV_AT_EXIT[i]}" || true; done
}

children() { cat "/proc/$1/task/$1/children" 2>/dev/null || true; }

# kill_tree PID...: SIGTERM to the children of each PID, then to it (a process under /usr/bin/time, then time).
kill_tree() {
  local p
  for p in "$@"; do
    # shellcheck disable=SC2046  # a list of pids
    kill $(children "$p") "$p" 2>/dev/null || true
  done
}

stop_child() {
  if [[ -n ${1:-} ]] && kill -0 "$1" 2>/dev/null; then
    kill -TERM "$1"
    wait "$1" || true
  fi
}

# --- brokers -----------------------------------------------------------------------------------------------------

# kafka_at BASE DIR ARGS...: a broker or cluster beside the one on the KAFKA_* ports: client port BASE, controller
# BASE + 1, SASL_SSL BASE + 2 (node N of a cluster + 10(N-1)), state in DIR.
kafka_at() {
  local base=$1 dir=$2
  shift 2
  KAFKA_PORT=$base KAFKA_CONTROLLER_PORT=$((base + 1)) KAFKA_SASL_SSL_PORT=$((base + 2)) SHAREHOST_KAFKA_DIR=$dir \
    "$KAFKA" "$@"
}

cluster_bootstrap() { echo "127.0.0.1:$1,127.0.0.1:$(($1 + 10)),127.0.0.1:$(($1 + 20))"; }

# up_owned WHAT CMD [ARGS...]: `CMD up ARGS` (CMD: dev/kafka or a function around kafka_at). A broker that ran there
# before is somebody's and is left running; otherwise it is this script's, and at exit a "stopping WHAT" step stops it
# and deletes its data (CMD down), also when the script fails (or when `up` itself did).
up_owned() {
  local what=$1 cmd=$2
  shift 2
  if ! "$cmd" status >/dev/null 2>&1; then
    at_exit "step $(printf %q "stopping $what"); $(printf %q "$cmd") down || true"
  fi
  "$cmd" up "$@"
}
