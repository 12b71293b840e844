# shellcheck shell=bash
# shellcheck disable=SC2034  # it sets variables (ACC, P_CPU, BOOTSTRAP, ...) for the scripts that source it
# dev/lib.sh: the helpers the dev/ scripts share. Sourced, never run; a script starts with
#
#   # shellcheck source=dev/lib.sh
#   source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"
#   DEV_NAME=bench          # how this script's messages begin
#
# Why one file: die, note, the port probe, the waits and the exit hooks were copied into most scripts, and copies
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
#   header_help                    print the script's header comment (its --help), exit 0
# Processes, ports and waits
#   port_in_use PORT               whether something accepts connections on 127.0.0.1:PORT
#   wait_until SECONDS PID CMD...  poll CMD until it succeeds; 2 as soon as PID is gone, 1 after SECONDS
#   wait_gone PID SECONDS          whether PID exits within SECONDS
#   wait_ports_free SECONDS PORT...  wait until nothing listens on the PORTs (held by somebody else), or die
#   at_exit COMMAND                run COMMAND when the script exits, the last registered first
#   children PID                   PID's child processes
#   kill_tree PID...               SIGTERM to each PID's children and to it
#   kill_pids PID...               SIGTERM to each PID that is set, without waiting
#   stop_child PID                 SIGTERM to a child of this shell that still runs, and wait for it
#   cpu_ticks PID [IF_GONE]        user+sys clock ticks PID has used (IF_GONE when it is gone; else it fails)
# Brokers (dev/kafka)
#   REPO, KAFKA                    the checkout, its dev/kafka
#   kafka_at BASE DIR ARGS...      dev/kafka for the broker or cluster at base port BASE with its state in DIR
#   cluster_bootstrap BASE         the client addresses of the three nodes of the cluster at BASE
#   up_owned WHAT CMD [ARGS...]    CMD up ARGS; stopped (CMD down) at exit if nothing ran there before
#   attach_broker BUSY [RUNNING [STOPPED]]  the benchmarks' broker: this checkout's, or one started and owned
#   broker_facts                   BROKER_PID, KAFKA_VERSION, BOOTSTRAP from dev/kafka status
# The benchmarks' bookkeeping (they keep a run's files in OUT and read from BOOTSTRAP)
#   machine_lines                  the cpu, memory and kernel lines of a run's machine.txt
#   fresh_group GROUP              a new share group that starts at the earliest offset
#   delete_topic TOPIC             delete a topic the run made (a failure is only noted)
#   nap_us MICROSECONDS            sleep without starting a process
#   judged_at PORT                 ACC and REJ: records a sharehost process accepted and rejected so far
#   time_report FILE               P_CPU and P_RSS from a /usr/bin/time -v report

if [[ ${BASH_SOURCE[0]} == "$0" ]]; then
  echo "dev/lib.sh is sourced by the dev/ scripts, not run" >&2
  exit 2
fi

REPO=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
KAFKA=$REPO/dev/kafka
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
# header_help: the comment between the shebang and `set -euo pipefail` is the script's manual.
header_help() {
  sed -n '2,/^set -euo/p' "$0" | sed '$d; s/^# \{0,1\}//'
  exit 0
}

# --- processes, ports and waits ----------------------------------------------------------------------------------

port_in_use() { (exec 3<>"/dev/tcp/127.0.0.1/$1") 2>/dev/null; }

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

# wait_gone PID SECONDS: whether PID exits within SECONDS (polled every 0.2 s).
wait_gone() {
  local t0=$SECONDS
  while kill -0 "$1" 2>/dev/null; do
    ((SECONDS - t0 < $2)) || return 1
    sleep 0.2
  done
}

# wait_ports_free SECONDS PORT...: another checkout (e.g. a CI run) may hold the ports with its own broker. It is not
# ours to stop: wait for it, every 30 s, SECONDS at most, then die.
wait_ports_free() {
  local limit=$1 waited=0 p busy
  shift
  while :; do
    busy=""
    for p in "$@"; do
      if port_in_use "$p"; then busy+=" $p"; fi
    done
    [[ -z $busy ]] && return 0
    ((waited >= limit)) && die "ports$busy still taken by another process after ${limit}s; not touching it"
    note "ports$busy are taken by a broker that is not this checkout's; waiting (${waited}s of ${limit}s)"
    sleep 30
    waited=$((waited + 30))
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

kill_pids() {
  local p
  for p in "$@"; do
    if [[ -n $p ]]; then kill "$p" 2>/dev/null || true; fi
  done
}

stop_child() {
  if [[ -n ${1:-} ]] && kill -0 "$1" 2>/dev/null; then
    kill -TERM "$1"
    wait "$1" || true
  fi
}

cpu_ticks() {
  if [[ $# -gt 1 ]]; then
    awk '{ print $14 + $15 }' "/proc/$1/stat" 2>/dev/null || echo "$2"
  else
    awk '{ print $14 + $15 }' "/proc/$1/stat"
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

# attach_broker BUSY [RUNNING_NOTE [STOPPED_MSG]]: the benchmarks' broker. The one this checkout runs on its KAFKA_*
# ports is used as it is (RUNNING_NOTE says so) and never stopped; otherwise one is started (dev/kafka up, its output
# on stderr) that this script owns: STARTED_BROKER=1, and dev/kafka down (which deletes its data) at exit. A stopped
# broker whose state is kept is refused with STOPPED_MSG: `up` would wipe it, and it may be somebody's restart test
# between stop and start. BUSY is what to do when a port is held by something else, which is not ours to stop:
# "wait SECONDS" waits for it (wait_ports_free); anything else is a message to die with, %s standing for the port.
attach_broker() {
  local busy=$1 running=${2:-"using this checkout's running broker"} stopped=${3:-}
  local ports=("${KAFKA_PORT:-9092}" "${KAFKA_CONTROLLER_PORT:-9093}" "${KAFKA_SASL_SSL_PORT:-9094}") p status
  [[ -n $stopped ]] ||
    stopped="a stopped broker's state is kept in this checkout; resume it (dev/kafka start-broker) or remove it (dev/kafka down)"
  STARTED_BROKER=0
  if status=$("$KAFKA" status 2>&1); then
    note "$running"
    return 0
  fi
  [[ $status != *"stopped broker state"* ]] || die "$stopped"
  if [[ $busy == "wait "* ]]; then
    wait_ports_free "${busy#wait }" "${ports[@]}"
  else
    for p in "${ports[@]}"; do
      if port_in_use "$p"; then die "${busy//%s/$p}"; fi
    done
  fi
  # shellcheck disable=SC2016  # evaluated at exit
  at_exit 'if [[ $STARTED_BROKER == 1 ]]; then "$KAFKA" down >&2 || true; fi'
  "$KAFKA" up >&2
  STARTED_BROKER=1
}

# broker_facts: BROKER_PID, KAFKA_VERSION and BOOTSTRAP of this checkout's running single node, as dev/kafka status
# gives them: the broker's own record wins over the defaults (it may have been started with others). 1 when it does
# not run or they cannot be read.
broker_facts() {
  local status
  status=$("$KAFKA" status) || return 1
  BROKER_PID=$(awk '/^running: pid/ { gsub(",", "", $3); print $3 }' <<<"$status")
  KAFKA_VERSION=$(awk '/^running: pid/ { gsub(",", "", $5); print $5 }' <<<"$status")
  BOOTSTRAP=$(awk '$1 == "bootstrap:" { print $2 }' <<<"$status")
  [[ $BROKER_PID =~ ^[0-9]+$ && -n $BOOTSTRAP ]]
}

# --- the benchmarks' bookkeeping ---------------------------------------------------------------------------------

machine_lines() {
  echo "cpu: $(nproc) x $(awk -F': ' '/^model name/ { print $2; exit }' /proc/cpuinfo)"
  echo "memory: $(awk '/^MemTotal/ { printf "%.1f GiB", $2 / 1048576 }' /proc/meminfo)"
  echo "kernel: $(uname -r)"
}

# fresh_group GROUP: share.auto.offset.reset=earliest on a new share group. It must be set before the first member
# joins: the share-partition start offset is fixed when the partition is first initialised for the group.
fresh_group() {
  "$KAFKA" share-earliest "$1" >"$OUT/$1.config.log" 2>&1 || { cat "$OUT/$1.config.log" >&2; die "cannot configure group $1"; }
}

delete_topic() {
  "$KAFKA" tool org.apache.kafka.tools.TopicCommand --bootstrap-server "$BOOTSTRAP" --delete --topic "$1" \
    >>"$OUT/$1.create.log" 2>&1 || note "could not delete $1 (harmless)"
}

# nap_us MICROSECONDS: a sleep without a process per call (the pollers nap between every poll, beside the consumers
# they measure): read with a timeout on a pipe nobody writes to, opened on the first nap.
DEV_SLEEP_FD=""
nap_us() {
  local s
  [[ -n $DEV_SLEEP_FD ]] || exec {DEV_SLEEP_FD}<> <(:)
  printf -v s '%d.%06d' $(($1 / 1000000)) $(($1 % 1000000))
  read -r -t "$s" -u "$DEV_SLEEP_FD" || true
}

# judged_at PORT: sets ACC and REJ to the records accepted and rejected so far by the sharehost process whose admin
# endpoint is on PORT (sums of GET /pipelines' per-version counters; a plugin that rejects some records still has to
# see them all). 1 when it does not answer. No process is forked: bash's /dev/tcp, HTTP/1.0.
judged_at() {
  local fd body rest n=0 r=0
  ACC=""
  REJ=""
  # (The group keeps the stderr redirection off the shell: on `exec` alone it would stay.)
  { exec {fd}<>"/dev/tcp/127.0.0.1/$1"; } 2>/dev/null || return 1
  printf 'GET /pipelines HTTP/1.0\r\nHost: 127.0.0.1\r\n\r\n' >&"$fd"
  IFS= read -r -d '' -u "$fd" body || true
  exec {fd}>&-
  [[ $body == "HTTP/1."?" 200"* ]] || return 1
  rest=$body
  while [[ $rest =~ \"accepted\":([0-9]+)(.*) ]]; do
    n=$((n + BASH_REMATCH[1]))
    rest=${BASH_REMATCH[2]}
  done
  rest=$body
  while [[ $rest =~ \"rejected\":([0-9]+)(.*) ]]; do
    r=$((r + BASH_REMATCH[1]))
    rest=${BASH_REMATCH[2]}
  done
  ACC=$n
  REJ=$r
}

# time_report FILE: sets P_CPU (user+sys s) and P_RSS (peak RSS, KiB) from a /usr/bin/time -v report.
time_report() {
  P_CPU=$(awk -F': ' '/User time/ { u = $2 } /System time/ { s = $2 } END { printf "%.2f", u + s }' "$1")
  P_RSS=$(awk -F': ' '/Maximum resident set size/ { print $2 }' "$1")
}
