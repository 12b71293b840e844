"""dev/bench_host.py: what the benchmark drivers share about running release `sharehost run` hosts.

Imported by the drivers (dev/bench.py, ...), never run. Standard library only. What it holds:

  Building       build_release(bins, examples): `cargo build --release` of the host crate, the binaries' paths;
                 build_guests(log, names): dev/build-guests, the guests' paths (target/guests/NAME.wasm).
  Manifests      Pipeline, manifest(...): the TOML of one benchmark host (defaults everywhere but the essentials).
  The broker     Broker: this checkout's broker on the KAFKA_* ports used as it is, or one started (and stopped by
                 close()) through dev/kafka_harness.py; its pid and bootstrap, the Kafka tools' command lines
                 (tool_cmd, tool), create_topic, share_earliest, delete_topic; topic_count and share_group_lag
                 parse GetOffsetShell's and ShareGroupCommand --describe's output.
  A host         Host: one process (`sharehost run`, pipeline_bench, ...) with its output in files, optionally
                 under /usr/bin/time -v; wait_ready() (its admin endpoint answers), judged() (GET /pipelines'
                 accepted + rejected), wait_judged(), save() (/pipelines and /metrics to files), stop() or
                 terminate() + wait_exit() (SIGTERM, wait for the drain), kill() (a run that failed half-way).
                 admin_get, admin_post and judged_counts are the same without a Host.
  Measuring      TimeReport (a /usr/bin/time -v report: CPU s, peak RSS), cpu_ticks/cpu_seconds and status_kb
                 (/proc of a live process), thread_cpu_seconds, children/descendants.
  A driver's main  driver_main: the exit statuses and messages of a failure or an interruption, the clean-up.
  A run's notes  machine_lines, commit, changed_files, load_now, utc_stamp, now_us, epoch_us_of (the Kafka tools'
                 dates), bash_quote (a command line as the shell scripts printed it), port_in_use.

Every wait waits for an event (a port answering, a counter reaching a value, a process exiting), polled, with an
upper bound that fails loudly with Die; a busy machine makes a wait longer, never a failure. Anything read from
outside (a report, /proc, an HTTP answer) that is not what it should be raises Die naming where it came from.
"""

import calendar
import dataclasses
import http.client
import json
import os
import re
import signal
import subprocess
import sys
import time
from contextlib import redirect_stdout
from pathlib import Path

DEV = Path(os.path.abspath(os.path.dirname(__file__)))
REPO = DEV.parent
sys.path.insert(0, str(DEV))
import kafka_harness  # noqa: E402  (dev/ is not a package)

# The one error of the drivers: a failure that ends the run, printed as "NAME: error: MSG" (exit 1). The broker
# harness raises the same one.
Die = kafka_harness.Die
GUESTS = REPO / "target" / "guests"
CLK_TCK = os.sysconf("SC_CLK_TCK")
POLL_S = 0.2
port_in_use = kafka_harness.port_in_use


def now_us():
    """Wall-clock microseconds since the epoch (what results.tsv files hold)."""
    return time.time_ns() // 1000


def target_dir(environ=os.environ):
    """Cargo's target dir as a build from the checkout's root sees it (CARGO_TARGET_DIR relative to the root)."""
    return REPO / (environ.get("CARGO_TARGET_DIR") or "target")


# --- building --------------------------------------------------------------------------------------------------------


def build_release(bins=("sharehost",), examples=()):
    """Builds the host crate's BINS and EXAMPLES (release, quiet); returns {name: path}. Dies if cargo fails or a
    binary is not there afterwards."""
    cmd = ["cargo", "build", "--release", "--quiet", "-p", "sharehost"]
    for b in bins:
        cmd += ["--bin", b]
    for e in examples:
        cmd += ["--example", e]
    if subprocess.call(cmd, cwd=REPO, stdin=subprocess.DEVNULL) != 0:
        raise Die(f"{' '.join(cmd)} failed")
    release = target_dir() / "release"
    paths = {b: release / b for b in bins}
    paths.update({e: release / "examples" / e for e in examples})
    for path in paths.values():
        if not os.access(path, os.X_OK):
            raise Die(f"no {path} after the build")
    return paths


def build_guests(log, names=()):
    """Runs dev/build-guests with its output in LOG (shown on failure; None: on stderr); returns
    {name: target/guests/NAME.wasm} for NAMES, each of which must exist afterwards."""
    if log is None:
        rc = subprocess.call([str(DEV / "build-guests")], cwd=REPO, stdout=sys.stderr, stdin=subprocess.DEVNULL)
    else:
        with open(log, "wb") as out:
            rc = subprocess.call([str(DEV / "build-guests")], cwd=REPO, stdout=out, stderr=subprocess.STDOUT,
                                 stdin=subprocess.DEVNULL)
        if rc != 0:
            sys.stderr.write(Path(log).read_text(errors="replace"))
    if rc != 0:
        raise Die("dev/build-guests failed")
    paths = {n: GUESTS / f"{n}.wasm" for n in names}
    for path in paths.values():
        if not path.is_file():
            raise Die(f"no {path.relative_to(REPO)} after dev/build-guests")
    return paths


# --- manifests -------------------------------------------------------------------------------------------------------


def toml_string(text):
    """TEXT as a TOML basic string."""
    text = str(text)
    escaped = text.replace("\\", "\\\\").replace('"', '\\"')
    escaped = "".join(c if c >= " " or c == "\t" else f"\\u{ord(c):04x}" for c in escaped)
    return f'"{escaped}"'


@dataclasses.dataclass
class Pipeline:
    """One [[pipeline]] table: EXTRA is raw TOML lines added at its end (e.g. "max_in_flight = 3000")."""

    name: str
    topics: list
    group: str
    component: str
    extra: str = ""


def manifest(bootstrap, admin_port, pipelines, client_id="sharehost-bench", before="", after_admin=""):
    """The manifest of one benchmark host: [cluster] (BOOTSTRAP, CLIENT_ID; None: no client_id, the host's default),
    [admin] on 127.0.0.1:ADMIN_PORT, then the PIPELINES, every other setting at its default. BEFORE is raw TOML put
    first (tables such as [trust] and [fleet]); AFTER_ADMIN raw TOML between [admin] and the pipelines."""
    parts = [before.rstrip("\n") + "\n\n"] if before.strip() else []
    client = "" if client_id is None else f"client_id = {toml_string(client_id)}\n"
    parts.append(f"[cluster]\nbootstrap = {toml_string(bootstrap)}\n{client}\n"
                 f"[admin]\nlisten = {toml_string(f'127.0.0.1:{admin_port}')}\n\n")
    if after_admin.strip():
        parts.append(after_admin.rstrip("\n") + "\n\n")
    for p in pipelines:
        topics = ", ".join(toml_string(t) for t in p.topics)
        parts.append(f"[[pipeline]]\nname = {toml_string(p.name)}\ntopics = [{topics}]\n"
                     f"group = {toml_string(p.group)}\n"
                     f"component = {toml_string(p.component)}\n")
        if p.extra.strip():
            parts.append(p.extra.rstrip("\n") + "\n")
        parts.append("\n")
    return "".join(parts).rstrip("\n") + "\n"


# --- the admin endpoint ----------------------------------------------------------------------------------------------


def admin_get(port, path, timeout=5):
    """GET PATH from the admin endpoint on 127.0.0.1:PORT: the body of a 200 answer, or None (no answer, refused,
    another status)."""
    status, body = admin_request(port, "GET", path, timeout=timeout)
    return body if status == 200 else None


def admin_post(port, path, doc=None, timeout=5):
    """POST PATH on 127.0.0.1:PORT with DOC as its JSON body (None: an empty body); (status, body), (None, b"") when
    nothing answers. A swap's answer is read whatever its status: its body says why it failed."""
    return admin_request(port, "POST", path, b"" if doc is None else json.dumps(doc).encode(),
                         {} if doc is None else {"content-type": "application/json"}, timeout)


def admin_request(port, method, path, body=None, headers=None, timeout=5):
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=timeout)
    try:
        conn.request(method, path, body, headers or {})
        answer = conn.getresponse()
        return answer.status, answer.read()
    except (OSError, http.client.HTTPException):
        return None, b""
    finally:
        conn.close()


def judged_counts(status, where="GET /pipelines"):
    """(accepted, rejected) summed over every pipeline and version of a GET /pipelines answer (parsed JSON): every
    record judged, since a plugin that rejects some still sees them all."""
    accepted = rejected = 0
    try:
        for p in status:
            for counters in p["versions"].values():
                accepted += int(counters["accepted"])
                rejected += int(counters["rejected"])
    except (TypeError, KeyError, AttributeError, ValueError) as e:
        raise Die(f"{where}: not a list of pipelines with per-version accepted/rejected counters ({e!r})") from None
    return accepted, rejected


# --- /proc and /usr/bin/time -----------------------------------------------------------------------------------------


def parse_stat(text, where):
    """utime + stime clock ticks from a /proc/PID/stat line (the comm field may hold spaces and parentheses)."""
    fields = text[text.rfind(")") + 2:].split()
    # After "(comm)": state is field 3, utime field 14, stime field 15.
    try:
        return int(fields[11]) + int(fields[12])
    except (IndexError, ValueError):
        raise Die(f"{where}: not a /proc stat line") from None


def cpu_ticks(pid, if_gone=None):
    """User+sys clock ticks PID has used; IF_GONE when it is gone (None: Die)."""
    try:
        text = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        if if_gone is not None:
            return if_gone
        raise Die(f"process {pid} is gone (no /proc/{pid}/stat)") from None
    return parse_stat(text, f"/proc/{pid}/stat")


def thread_ticks(pid):
    """{thread id: user+sys clock ticks} of every thread of PID now ({} when it is gone)."""
    out = {}
    try:
        tids = os.listdir(f"/proc/{pid}/task")
    except OSError:
        return out
    for tid in tids:
        try:
            text = Path(f"/proc/{pid}/task/{tid}/stat").read_text()
        except OSError:
            continue  # the thread ended meanwhile
        if tid.isdigit():
            out[int(tid)] = parse_stat(text, f"/proc/{pid}/task/{tid}/stat")
    return out


def parse_thread_dump(text):
    """{native thread id: Java thread name} from `jcmd PID Thread.print` (each thread's line names it in quotes and
    carries nid=0x...; the JVM's own threads, such as GC and JIT compiler threads, are listed too)."""
    out = {}
    for m in re.finditer(r'^"(.*)"[^\n]*?\bnid=(0x[0-9a-fA-F]+|\d+)', text, re.MULTILINE):
        nid = m.group(2)
        out[int(nid, 16) if nid.startswith("0x") else int(nid)] = m.group(1)
    return out


def thread_group(name):
    """A thread's name with its numbers taken out, so a pool's threads add up under one name
    ("data-plane-kafka-request-handler-3" -> "data-plane-kafka-request-handler-#")."""
    return re.sub(r"\d+", "#", name)


def thread_cpu(before, after, names, hz=None):
    """[(thread group, CPU seconds)] spent between two thread_ticks readings, most first: threads started meanwhile
    count from zero, names missing from NAMES are "thread TID"."""
    hz = hz or CLK_TCK
    groups = {}
    for tid, ticks in after.items():
        used = ticks - before.get(tid, 0)
        if used > 0:
            group = thread_group(names.get(tid, f"thread {tid}"))
            groups[group] = groups.get(group, 0) + used
    return sorted(((g, t / hz) for g, t in groups.items()), key=lambda gt: (-gt[1], gt[0]))


def cpu_seconds(pid, if_gone=None):
    ticks = cpu_ticks(pid, if_gone)
    return ticks if ticks is None else ticks / CLK_TCK


def thread_cpu_seconds(pid, comm):
    """User+sys seconds of PID's threads named COMM (e.g. a host's "sharehost-epoch" ticker); 0 when none."""
    ticks = 0
    for task in Path(f"/proc/{pid}/task").glob("*"):
        try:
            text = (task / "stat").read_text()
        except OSError:
            continue  # a thread that ended meanwhile
        if text[text.find("(") + 1:text.rfind(")")] == comm:
            ticks += parse_stat(text, task / "stat")
    return ticks / CLK_TCK


def parse_status_kb(text, key, where):
    for line in text.splitlines():
        name, _, value = line.partition(":")
        if name == key:
            words = value.split()
            if words and words[0].isdigit():
                return int(words[0])
    raise Die(f"{where}: no {key} in kB")


def status_kb(pid, key, if_gone=None):
    """A kB field of /proc/PID/status: VmRSS (resident now), VmHWM (peak resident). IF_GONE when the process is gone
    or a zombie (which has no memory left to show; None: Die)."""
    where = f"/proc/{pid}/status"
    try:
        text = Path(where).read_text()
    except OSError:
        if if_gone is not None:
            return if_gone
        raise Die(f"process {pid} is gone (no {where})") from None
    if if_gone is not None and re.search(r"^State:\s*Z", text, re.MULTILINE):
        return if_gone
    return parse_status_kb(text, key, where)


def children(pid):
    """PID's child processes."""
    try:
        return [int(p) for p in Path(f"/proc/{pid}/task/{pid}/children").read_text().split()]
    except (OSError, ValueError):
        return []


def descendants(pid):
    """PID's children, theirs, and so on."""
    found, todo = [], children(pid)
    while todo:
        p = todo.pop()
        found.append(p)
        todo.extend(children(p))
    return found


@dataclasses.dataclass
class TimeReport:
    """What /usr/bin/time -v reports of a process tree (the process and every child it waited for)."""

    cpu_s: float  # user + system seconds
    rss_kb: int  # the largest peak resident set size of one process

    @classmethod
    def parse(cls, text, where):
        values = {}
        for line in text.splitlines():
            name, sep, value = line.strip().rpartition(": ")
            if sep:
                values[name] = value.strip()
        try:
            return cls(cpu_s=float(values["User time (seconds)"]) + float(values["System time (seconds)"]),
                       rss_kb=int(values["Maximum resident set size (kbytes)"]))
        except (KeyError, ValueError) as e:
            raise Die(f"{where}: not a /usr/bin/time -v report (no or a bad {e})") from None

    @classmethod
    def read(cls, path):
        try:
            text = Path(path).read_text(errors="replace")
        except OSError as e:
            raise Die(f"cannot read the time report {path}: {e.strerror}") from None
        return cls.parse(text, path)


# --- hosts -----------------------------------------------------------------------------------------------------------


class Host:
    """One host process (`sharehost run MANIFEST`, pipeline_bench MANIFEST, ...) with its admin endpoint on
    127.0.0.1:ADMIN_PORT, stdout and stderr in files; with TIME_REPORT under /usr/bin/time -v -o TIME_REPORT. It
    does not stop by itself: stop() SIGTERMs it, and it drains and exits."""

    def __init__(self, argv, admin_port, stdout, stderr=None, env=None, time_report=None):
        self.admin_port = admin_port
        self.stderr_path = Path(stderr if stderr is not None else stdout)
        self.timed = time_report is not None
        cmd = ["/usr/bin/time", "-v", "-o", str(time_report), *map(str, argv)] if self.timed else list(map(str, argv))
        full_env = dict(os.environ, **(env or {}))
        with open(stdout, "wb") as out:
            if stderr is None:
                self.proc = subprocess.Popen(cmd, stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                             env=full_env)
            else:
                with open(stderr, "wb") as err:
                    self.proc = subprocess.Popen(cmd, stdout=out, stderr=err, stdin=subprocess.DEVNULL, env=full_env)
        self.pid = self.proc.pid

    def host_pids(self):
        """The host process itself: /usr/bin/time's child when timed (none before it forked or after it ended)."""
        return children(self.pid) if self.timed else [self.pid]

    def running(self):
        return self.proc.poll() is None

    def tail(self, n=20):
        kafka_harness.tail(self.stderr_path, n)

    def status(self, timeout=5):
        """GET /pipelines parsed, or None when the endpoint does not answer."""
        body = admin_get(self.admin_port, "/pipelines", timeout)
        if body is None:
            return None
        try:
            return json.loads(body)
        except ValueError:
            raise Die(f"GET /pipelines on port {self.admin_port} answered no JSON: {body[:200]!r}") from None

    def judged(self):
        """Records accepted + rejected so far by every pipeline of the host, or None when it does not answer."""
        status = self.status()
        return None if status is None else sum(judged_counts(status, f"GET /pipelines on port {self.admin_port}"))

    def wait_ready(self, limit_s, what="the host"):
        """Until the admin endpoint answers GET /pipelines. Dies when the process exits first or after LIMIT_S."""
        t0 = time.monotonic()
        while self.status(timeout=2) is None:
            if not self.running():
                self.tail()
                raise Die(f"{what} exited before its admin endpoint answered (see {self.stderr_path})")
            if time.monotonic() - t0 >= limit_s:
                raise Die(f"{what}: its admin endpoint on port {self.admin_port} did not answer within {limit_s}s")
            time.sleep(POLL_S)

    def wait_judged(self, target, idle_s, what="the host", poll_s=0.25):
        """Polls judged() until it reaches TARGET; returns (when it saw it in µs since the epoch, the count it saw).
        Dies when the process exits first or when the count did not move for IDLE_S seconds."""
        last, last_change = -1, time.monotonic()
        while True:
            if not self.running():
                self.tail()
                raise Die(f"{what}: the host exited (see {self.stderr_path})")
            n = self.judged()
            if n is not None and n >= target:
                return now_us(), n
            if n is not None and n > last:
                last, last_change = n, time.monotonic()
            if time.monotonic() - last_change > idle_s:
                seen = "?" if last < 0 else last
                raise Die(f"{what}: no progress for {idle_s}s at {seen} of {target} records")
            time.sleep(poll_s)

    def save(self, prefix):
        """The final /pipelines and /metrics into PREFIX.pipelines.json and PREFIX.metrics (missing when they do not
        answer: they are diagnostics)."""
        for path, name in (("/pipelines", "pipelines.json"), ("/metrics", "metrics")):
            body = admin_get(self.admin_port, path)
            if body is not None:
                Path(f"{prefix}.{name}").write_bytes(body)

    def stop(self, limit_s=300, what="the host"):
        """SIGTERM to the host (it drains and leaves), then waits for it; its exit status. Dies when it is still
        there after LIMIT_S (it is then killed)."""
        self.terminate()
        return self.wait_exit(limit_s, what)

    def terminate(self):
        """SIGTERM to the host, without waiting (several hosts drain side by side: terminate each, then wait)."""
        for pid in self.host_pids():
            try:
                os.kill(pid, signal.SIGTERM)
            except ProcessLookupError:
                pass

    def wait_exit(self, limit_s, what="the host"):
        """Waits for the process to exit; its exit status. Dies after LIMIT_S (it is then killed)."""
        try:
            return self.proc.wait(timeout=limit_s)
        except subprocess.TimeoutExpired:
            self.kill()
            raise Die(f"{what} did not exit within {limit_s}s of SIGTERM (killed; see {self.stderr_path})") from None

    def kill(self):
        """For a run that failed half-way: SIGTERM to the host and to /usr/bin/time, a bounded wait, then SIGKILL."""
        if not self.running():
            return
        for pid in [*self.host_pids(), self.pid]:
            try:
                os.kill(pid, signal.SIGTERM)
            except ProcessLookupError:
                pass
        try:
            self.proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            for pid in [*self.host_pids(), self.pid]:
                try:
                    os.kill(pid, signal.SIGKILL)
                except ProcessLookupError:
                    pass
            self.proc.wait()


# --- the broker ------------------------------------------------------------------------------------------------------


class Broker:
    """The benchmarks' broker, through dev/kafka_harness.py with the KAFKA_* and SHAREHOST_KAFKA_DIR settings of the
    environment: this checkout's running single node is used as it is (never stopped); otherwise one is started that
    close() stops again (dev/kafka down: its data goes too). A stopped broker whose state is kept is refused: `up`
    would wipe it, and it may be somebody's restart test between stop and start."""

    def __init__(self, say=None):
        self.harness = kafka_harness.Harness()
        self.started = False
        self.say = say or (lambda msg: print(msg, file=sys.stderr, flush=True))
        self.pid = self.bootstrap = self.version = None
        self._jmx = None  # the JMX agent's port once started in the broker (0: it could not be)

    def attach(self, busy_wait_s=None, busy_msg="port {port} is taken by a process that is not this checkout's broker",
               running_note="using this checkout's running broker", stopped_msg=None, log=None):
        """BUSY_WAIT_S: how long to wait for another checkout's broker to free the ports (None: die with BUSY_MSG).
        What starting one prints goes to stderr, or to the file LOG."""
        h = self.harness
        if h.brokers == 1 and h.node_pid(1) is not None:
            self.say(running_note)
            return self._facts()
        if h.brokers != 1 and h.running_nodes():
            raise Die(f"{h.state} holds a cluster of {h.brokers} nodes; the benchmarks need a single node")
        if (h.node_dir(1) / "server.properties").is_file():
            raise Die(stopped_msg or f"a stopped broker's state is kept in {h.state}; resume it (dev/kafka "
                      "start-broker) or remove it (dev/kafka down)")
        ports = (h.shape.port, h.shape.controller_port, h.shape.sasl_ssl_port)
        waited = 0
        while busy := [p for p in ports if kafka_harness.port_in_use(p)]:
            if busy_wait_s is None:
                raise Die(busy_msg.format(port=busy[0]))
            if waited >= busy_wait_s:
                raise Die(f"ports {' '.join(map(str, busy))} still taken by another process after {busy_wait_s}s; "
                          "not touching it")
            self.say(f"ports {' '.join(map(str, busy))} are taken by a broker that is not this checkout's; waiting "
                     f"({waited}s of {busy_wait_s}s)")
            time.sleep(30)
            waited += 30
        self.started = True
        if log is None:
            with redirect_stdout(sys.stderr):
                h.cmd_up([])
        else:
            with open(log, "a") as out, redirect_stdout(out):
                h.cmd_up([])
        return self._facts()

    def _facts(self):
        h = self.harness
        h.load_broker_env()
        self.pid = h.node_pid(1)
        if self.pid is None:
            raise Die(f"the broker in {h.state} is not running")
        self.version = h.version
        self.bootstrap = h.shape.bootstrap()
        h.require_java()
        with redirect_stdout(sys.stderr):
            h.ensure_lib()
        return self

    def close(self):
        """Stops the broker if this run started it."""
        if self.started:
            self.started = False
            with redirect_stdout(sys.stderr):
                self.harness.cmd_down([])

    def tool_cmd(self, cls, *args, jvm=()):
        """The java command line of Kafka tool CLS (dev/kafka tool's flags, then JVM: the later flags win)."""
        return self.harness.java_cmd(*jvm, cls, *map(str, args))

    def tool(self, cls, *args, log=None, jvm=()):
        """Runs tool CLS; (exit status, its output). LOG: the output is also written there."""
        out = subprocess.run(self.tool_cmd(cls, *args, jvm=jvm), stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                             stdin=subprocess.DEVNULL, text=True, errors="replace")
        if log is not None:
            with open(log, "a") as f:
                f.write(out.stdout)
        return out.returncode, out.stdout

    def create_topic(self, topic, partitions, log):
        rc, out = self.tool("org.apache.kafka.tools.TopicCommand", "--bootstrap-server", self.bootstrap, "--create",
                            "--if-not-exists", "--topic", topic, "--partitions", partitions,
                            "--replication-factor", "1", log=log)
        if rc != 0:
            sys.stderr.write(out)
            raise Die(f"cannot create {topic}")

    def share_earliest(self, group, log):
        """share.auto.offset.reset=earliest on a new share group. It must be set before the first member joins: the
        share-partition start offset is fixed when the partition is first initialised for the group."""
        rc, out = self.tool("org.apache.kafka.tools.ConfigCommand", "--bootstrap-server", self.bootstrap, "--alter",
                            "--entity-type", "groups", "--entity-name", group, "--add-config",
                            "share.auto.offset.reset=earliest", log=log)
        if rc != 0:
            sys.stderr.write(out)
            raise Die(f"cannot configure group {group}")

    def delete_topic(self, topic, log):
        """Deletes a topic the run made; a failure is only said (the topic is the run's own and harmless)."""
        rc, _ = self.tool("org.apache.kafka.tools.TopicCommand", "--bootstrap-server", self.bootstrap, "--delete",
                          "--topic", topic, log=log)
        if rc != 0:
            self.say(f"could not delete {topic} (harmless)")

    def counters(self):
        """The broker's own counts, read over JMX (see parse_jmx): requests by API, record acknowledgements by type,
        and the records of __share_group_state (the share coordinator's state writes). The JMX agent is started in
        the running broker with jcmd the first time (local only, no restart, no broker setting changed). {} when
        they cannot be read; the run goes on without them."""
        if self._jmx is None:
            port = free_port()
            rc = subprocess.call(["jcmd", str(self.pid), "ManagementAgent.start", f"jmxremote.port={port}",
                                  f"jmxremote.rmi.port={port}", "jmxremote.authenticate=false", "jmxremote.ssl=false",
                                  "jmxremote.host=127.0.0.1"], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
            self._jmx = port if rc == 0 else running_jmx_port(self.pid)
            if not self._jmx:
                self.say("cannot start the broker's JMX agent with jcmd: no request counts in this run")
        if not self._jmx:
            return {}
        rc, out = self.tool("org.apache.kafka.tools.JmxTool", "--jmx-url",
                            f"service:jmx:rmi:///jndi/rmi://127.0.0.1:{self._jmx}/jmxrmi",
                            *[a for name in JMX_OBJECTS for a in ("--object-name", name)],
                            "--one-time", "true", "--report-format", "tsv")
        if rc != 0:
            self.say(f"reading the broker's JMX counts failed: {out.strip()[-300:]}")
            return {}
        return parse_jmx(out)

    def threads(self):
        """{native thread id: name} of the broker's threads, from a thread dump ({} when jcmd cannot take one)."""
        r = subprocess.run(["jcmd", str(self.pid), "Thread.print"], stdout=subprocess.PIPE, stderr=subprocess.DEVNULL,
                           text=True)
        return parse_thread_dump(r.stdout) if r.returncode == 0 else {}

    def profile_start(self, name):
        """Starts a Java Flight Recorder recording NAME in the broker (the JDK's "profile" settings: a stack sample
        of each running thread every 10-20 ms)."""
        return subprocess.call(["jcmd", str(self.pid), "JFR.start", f"name={name}", "settings=profile"],
                               stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL) == 0

    def profile_stop(self, name, path):
        """Stops recording NAME and writes it to PATH; whether it was written."""
        return subprocess.call(["jcmd", str(self.pid), "JFR.stop", f"name={name}", f"filename={path}"],
                               stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL) == 0 and Path(path).is_file()


# What Broker.counters reads: every API's request count, the share groups' record acknowledgements by type, and the
# log end offsets of the share coordinator's state topic.
JMX_OBJECTS = ("kafka.network:type=RequestMetrics,name=RequestsPerSec,*",
               "kafka.server:type=ShareGroupMetrics,name=RecordAcknowledgementsPerSec,*",
               "kafka.log:type=Log,name=LogEndOffset,topic=__share_group_state,*")


def running_jmx_port(pid):
    """The port of the JMX agent already running in process PID (an earlier dev/bench started it in a broker kept
    running, and a second ManagementAgent.start fails), from `jcmd PID ManagementAgent.status`; 0 when none."""
    r = subprocess.run(["jcmd", str(pid), "ManagementAgent.status"], stdout=subprocess.PIPE,
                       stderr=subprocess.DEVNULL, text=True)
    return parse_agent_port(r.stdout) if r.returncode == 0 else 0


def parse_agent_port(status):
    """The jmxremote.port of a `jcmd ManagementAgent.status` answer; 0 when it has none."""
    for line in status.splitlines():
        key, _, value = line.partition("=")
        if key.strip() == "com.sun.management.jmxremote.port" and value.strip().isdigit():
            return int(value.strip())
    return 0


def parse_jmx(text):
    """{counter: number} from JmxTool's one-time tsv report: "requests.API" (RequestsPerSec Count summed over
    versions), "acks.TYPE" (RecordAcknowledgementsPerSec Count) and "state_records" (the summed log end offsets of
    __share_group_state). Lines of another shape are left out."""
    out = {}
    for line in text.splitlines():
        name, sep, value = line.rpartition("\t")
        if not sep or ":" not in name:
            continue
        mbean, _, attr = name.rpartition(":")
        keys = dict(kv.split("=", 1) for kv in mbean.partition(":")[2].split(",") if "=" in kv)
        try:
            number = float(value)
        except ValueError:
            continue
        if keys.get("name") == "RequestsPerSec" and attr == "Count" and "request" in keys:
            key = f"requests.{keys['request']}"
        elif keys.get("name") == "RecordAcknowledgementsPerSec" and attr == "Count" and "ackType" in keys:
            key = f"acks.{keys['ackType']}"
        elif keys.get("name") == "LogEndOffset" and keys.get("topic") == "__share_group_state" and attr == "Value":
            key = "state_records"
        else:
            continue
        out[key] = out.get(key, 0) + int(number)
    return out


def counters_delta(before, after):
    """AFTER - BEFORE for every counter in AFTER (a counter that first appeared counts from 0); zeros left out."""
    return {k: v - before.get(k, 0) for k, v in sorted(after.items()) if v - before.get(k, 0) != 0}


def free_port():
    """A TCP port nobody listens on now (the kernel's pick)."""
    import socket
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def hot_methods(jfr_json, top=40):
    """The broker's hottest methods from a JFR recording's execution samples (`jfr print --json --events
    jdk.ExecutionSample`): ([(method, self samples, samples with it on the stack)] most self samples first,
    [(method, samples with it on the stack)] most first, the number of samples). A method is "package.Class.method";
    a method recursing counts once per sample."""
    doc = json.loads(jfr_json)
    events = doc.get("recording", {}).get("events", [])
    self_count, total_count = {}, {}
    for e in events:
        frames = ((e.get("values") or {}).get("stackTrace") or {}).get("frames") or []
        names = []
        for f in frames:
            m = f.get("method") or {}
            names.append(f"{(m.get('type') or {}).get('name', '?')}.{m.get('name', '?')}".replace("/", "."))
        if not names:
            continue
        self_count[names[0]] = self_count.get(names[0], 0) + 1
        for n in set(names):
            total_count[n] = total_count.get(n, 0) + 1
    by_self = sorted(self_count.items(), key=lambda kv: (-kv[1], kv[0]))[:top]
    by_total = sorted(total_count.items(), key=lambda kv: (-kv[1], kv[0]))[:top]
    return [(n, c, total_count.get(n, c)) for n, c in by_self], by_total, len(events)


def topic_count(offsets_output):
    """Records in a topic from GetOffsetShell's "topic:partition:offset" lines: the sum of the end offsets (the runs
    delete no records). Lines of another shape (a warning) are left out."""
    total = 0
    for line in offsets_output.splitlines():
        m = re.fullmatch(r".+:[0-9]+:([0-9]+)", line.strip())
        if m:
            total += int(m.group(1))
    return total


def share_group_lag(describe_output, group):
    """The sum of GROUP's per-partition lag in ShareGroupCommand --describe's output, or None when it shows no
    partition or a lag that is not a number (unknown)."""
    total, rows = 0, 0
    for line in describe_output.splitlines():
        words = line.split()
        if len(words) >= 5 and words[0] == group:
            if not words[4].isdigit():
                return None
            total += int(words[4])
            rows += 1
    return total if rows else None


# --- a driver's main -------------------------------------------------------------------------------------------------


def _interrupted(signum, frame):
    raise KeyboardInterrupt


def driver_main(name, body):
    """What every driver's main does around BODY(on_exit), whose return is the exit status: ON_EXIT(f) registers a
    clean-up (stopping the hosts, the producer, a broker of its own) that runs on every way out, the last registered
    first. A Die is "NAME: error: MSG" on stderr and exit status 1; SIGTERM ends the run as Ctrl-C does, "NAME:
    interrupted" and 130; a Die while cleaning up is said ("NAME: error while stopping: MSG") and the rest still run."""
    cleanups = []
    signal.signal(signal.SIGTERM, _interrupted)
    try:
        return body(cleanups.append)
    except Die as e:
        sys.stdout.flush()
        print(f"{name}: error: {e}", file=sys.stderr, flush=True)
        return 1
    except KeyboardInterrupt:
        print(f"{name}: interrupted", file=sys.stderr, flush=True)
        return 130
    finally:
        for cleanup in reversed(cleanups):
            try:
                cleanup()
            except Die as e:
                print(f"{name}: error while stopping: {e}", file=sys.stderr, flush=True)


# --- a run's bookkeeping ---------------------------------------------------------------------------------------------


def machine_lines():
    """The cpu, memory and kernel lines of a run's machine.txt."""
    model = "?"
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                model = line.split(":", 1)[1].strip()
                break
        mem_kb = parse_status_kb(Path("/proc/meminfo").read_text(), "MemTotal", "/proc/meminfo")
    except OSError as e:
        raise Die(f"cannot read the machine's description: {e}") from None
    return [f"cpu: {os.cpu_count()} x {model}", f"memory: {mem_kb / 1048576:.1f} GiB", f"kernel: {os.uname().release}"]


def git(*args):
    return subprocess.run(["git", "-C", str(REPO), *args], capture_output=True, text=True).stdout.strip()


def commit():
    """The checkout's commit, short."""
    return git("rev-parse", "--short", "HEAD")


def changed_files(*paths):
    """The files that differ from the commit (under PATHS when given): a dirty checkout's run says so."""
    return git("diff", "--name-only", "HEAD", "--", *paths).split()


def load_now(fields=1):
    """The first FIELDS load averages of /proc/loadavg, as written there."""
    return " ".join(Path("/proc/loadavg").read_text().split()[:fields])


def utc_stamp(fmt="%Y%m%dT%H%M%SZ"):
    return time.strftime(fmt, time.gmtime())


def bash_quote(text):
    """TEXT quoted as bash's printf %q does for the printable strings a command line holds (so a command printed by
    a driver reads as it did when the drivers were shell scripts)."""
    if text == "":
        return "''"
    if any(ord(c) < 32 or ord(c) == 127 for c in text):
        body = text.replace("\\", "\\\\").replace("'", "\\'")
        body = "".join(c if ord(c) >= 32 and ord(c) != 127 else f"\\{ord(c):03o}" for c in body)
        return f"$'{body}'"
    out = []
    for i, c in enumerate(text):
        safe = c.isalnum() or c in "_./:=@%+-" or ord(c) > 127 or (c in "~#" and i > 0)
        out.append(c if safe else "\\" + c)
    return "".join(out)


def epoch_us_of(stamp):
    """Microseconds since the epoch of a "yyyy-MM-dd HH:mm:ss.SSSZ" time as the Kafka tools print it
    ("2026-05-01 09:13:06.123+0000"); ValueError when it is not one."""
    m = re.fullmatch(r"(\d{4})-(\d\d)-(\d\d) (\d\d):(\d\d):(\d\d)\.(\d{1,6})([+-])(\d\d)(\d\d)", stamp.strip())
    if not m:
        raise ValueError(f"not a yyyy-MM-dd HH:mm:ss.SSSZ time: '{stamp}'")
    y, mo, d, h, mi, s = (int(g) for g in m.groups()[:6])
    frac = int(m.group(7).ljust(6, "0"))
    offset = (int(m.group(9)) * 3600 + int(m.group(10)) * 60) * (1 if m.group(8) == "+" else -1)
    return (calendar.timegm((y, mo, d, h, mi, s)) - offset) * 1_000_000 + frac
