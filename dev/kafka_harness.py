#!/usr/bin/env python3
"""dev/kafka's program: the project's only way to get a local Apache Kafka broker for tests and the demo.

One KRaft node (broker+controller) with share groups (KIP-932) enabled, or with `up --brokers 3` a cluster of three
such nodes (a three-voter quorum that survives one node down), run from plain Maven Central jars (no tarball, no
Docker).
  * The jars are cached OUTSIDE the repo, in $SHAREHOST_CACHE/kafka-$KAFKA_VERSION/lib, and shared by all checkouts.
    The default version's jars are listed with their SHA-256 in dev/kafka-jars-<version>.txt and fetched one by one
    from Maven Central, each checked before it is kept; another KAFKA_VERSION is resolved by Maven (mvn).
  * The broker state lives INSIDE the checkout (target/kafka), so parallel checkouts don't collide.
    Each checkout needs its own ports (KAFKA_PORT, ...) if two of them run brokers at the same time.

dev/kafka is its entry point (same command line, environment, output and exit codes); `dev/kafka help` lists the
commands. Standard library only: CI runs it on a fresh machine. Its tests are dev/test_kafka_harness.py.

Every wait waits for an event (a log line, a port, a pid, a leader), polled and bounded by a generous deadline, so a
busy machine only makes a wait longer, never a failure or a different fault.
"""

import base64
import concurrent.futures
import fcntl
import hashlib
import json
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path

NAME = "dev/kafka"
DEV = Path(os.path.abspath(os.path.dirname(__file__)))
REPO = DEV.parent
DEFAULT_KAFKA_VERSION = "4.4.0"
# kafka-server 4.4.0 pulls in log4j-api/log4j-core 2.25.5 and slf4j-api 1.7.36, so the slf4j 1.x binding
# (log4j-slf4j-impl, not log4j-slf4j2-impl) at the same log4j version is the right backend.
DEFAULT_LOG4J_VERSION = "2.25.5"
MAVEN_CENTRAL = "https://repo1.maven.org/maven2"
# Node N of a cluster listens on each base port + 10*(N-1), so node 1 keeps the single-node ports.
NODE_PORT_STEP = 10
SASL_USER = "alice"
SASL_PASSWORD = "alice-secret"
# Tools are short-lived: C1-only JIT and serial GC start measurably faster.
TOOL_JVM_OPTS = ["-Xms64m", "-Xmx512m", "-XX:TieredStopAtLevel=1", "-XX:+UseSerialGC"]
# How often a wait looks again for what it waits for.
POLL_S = 0.2

# Quiet logging: WARN everywhere, plus the broker's one "Kafka Server started" line (which `up` waits for).
# Everything goes to stderr so tool output on stdout stays parseable. Rewritten atomically on every run.
LOG4J_CONF = """<?xml version="1.0" encoding="UTF-8"?>
<Configuration status="WARN">
  <Appenders>
    <Console name="STDERR" target="SYSTEM_ERR"><PatternLayout pattern="[%d] %p %m (%c)%n"/></Console>
  </Appenders>
  <Loggers>
    <Root level="WARN"><AppenderRef ref="STDERR"/></Root>
    <Logger name="kafka.server.KafkaRaftServer" level="INFO"/>
  </Loggers>
</Configuration>
"""


class Die(Exception):
    """A failure that ends the command: printed as "dev/kafka: error: MSG" on stderr, exit status 1."""


def note(msg):
    """A progress line on stdout, beside the addresses the commands print (as dev/kafka always printed them)."""
    print(f"{NAME}: {msg}", flush=True)


def env(name, default):
    """A variable as bash's ${NAME:-default} reads it: unset and empty both mean the default."""
    return os.environ.get(name) or default


def env_int(name, default):
    """A numeric variable (a port, a timeout in seconds); anything else is refused naming it."""
    value = env(name, str(default))
    if not re.fullmatch(r"[0-9]+", value):
        raise Die(f"{name} must be a whole number (got '{value}')")
    return int(value)


# --- ports and shapes: pure functions of the base ports and the node count -------------------------------------------


def node_port(base, n):
    """Node N's port for a base port (client, controller or SASL_SSL): node 1 keeps the base."""
    return base + NODE_PORT_STEP * (n - 1)


def proxied_port(port, n):
    """The PROXIED listener's advertised port (for the fault tests' loopback proxy): the node listens on client port
    + 6 but advertises client port + 5, where a test runs a proxy that forwards to it; a client bootstrapping through
    the proxy is told to reach the node through the proxy too, so the test can cut every connection it has."""
    return node_port(port, n) + 5


def proxied_bind(port, n):
    """Where the PROXIED listener really listens (see proxied_port)."""
    return node_port(port, n) + 6


def replication(brokers):
    """Replication of internal topics and of create-topic: 3 in a cluster of three or more, else the node count."""
    return min(brokers, 3)


def min_isr(brokers):
    """Writes need two replicas in sync once there are three, so one node may be down."""
    return 2 if replication(brokers) >= 3 else 1


@dataclass
class Shape:
    """What `up` pins in broker.env: the version, the base ports, the SASL_SSL listener and the node count. Status,
    start-broker and create-topic keep using it whatever the environment says later."""

    version: str = DEFAULT_KAFKA_VERSION
    port: int = 9092
    controller_port: int = 9093
    sasl_ssl_port: int = 9094
    sasl_ssl: bool = False
    brokers: int = 1

    def nodes(self):
        return range(1, self.brokers + 1)

    def bootstrap(self):
        """Every node's client address, comma-separated: tools keep working while any one node is down."""
        return ",".join(f"127.0.0.1:{node_port(self.port, n)}" for n in self.nodes())

    def sasl_bootstrap(self):
        return ",".join(f"127.0.0.1:{node_port(self.sasl_ssl_port, n)}" for n in self.nodes())

    def node_ports(self, n):
        """The ports node N listens on."""
        ports = [node_port(self.port, n), node_port(self.controller_port, n), proxied_bind(self.port, n)]
        if self.sasl_ssl:
            ports.append(node_port(self.sasl_ssl_port, n))
        return ports

    def broker_env(self):
        """broker.env's text (a single node has no BROKERS line, as before clusters existed)."""
        text = (
            f"KAFKA_VERSION={self.version}\nPORT={self.port}\nCONTROLLER_PORT={self.controller_port}\n"
            f"SASL_SSL_PORT={self.sasl_ssl_port}\nSASL_SSL={1 if self.sasl_ssl else 0}\n"
        )
        if self.brokers != 1:
            text += f"BROKERS={self.brokers}\n"
        return text


def parse_env_file(text):
    """KEY=value lines (what broker.env holds; quotes around a value are dropped), comments and blanks skipped."""
    out = {}
    for line in text.splitlines():
        line = line.strip()
        if not line or line.startswith("#") or "=" not in line:
            continue
        key, value = line.split("=", 1)
        out[key.strip()] = value.strip().strip('"')
    return out


def shape_from_env_file(text):
    """The Shape a broker.env records; a state written before clusters existed has no BROKERS line (one node)."""
    values = parse_env_file(text)
    shape = Shape()

    def number(key, default):
        value = values.get(key, "")
        return int(value) if re.fullmatch(r"[0-9]+", value) else default

    shape.version = values.get("KAFKA_VERSION") or DEFAULT_KAFKA_VERSION
    shape.port = number("PORT", shape.port)
    shape.controller_port = number("CONTROLLER_PORT", shape.controller_port)
    shape.sasl_ssl_port = number("SASL_SSL_PORT", shape.sasl_ssl_port)
    shape.sasl_ssl = values.get("SASL_SSL") == "1"
    brokers = values.get("BROKERS", "1")
    shape.brokers = int(brokers) if re.fullmatch(r"[1-9]", brokers) else 1
    return shape


# --- rendered files ------------------------------------------------------------------------------------------------


def server_properties(shape, n, state, node_dir):
    """Node N's server.properties. STATE holds the TLS files; NODE_DIR the node's data."""
    port = node_port(shape.port, n)
    cport = node_port(shape.controller_port, n)
    sport = node_port(shape.sasl_ssl_port, n)
    listeners = (
        f"PLAINTEXT://127.0.0.1:{port},CONTROLLER://127.0.0.1:{cport},PROXIED://127.0.0.1:{proxied_bind(shape.port, n)}"
    )
    advertised = f"PLAINTEXT://127.0.0.1:{port},PROXIED://127.0.0.1:{proxied_port(shape.port, n)}"
    protomap = "CONTROLLER:PLAINTEXT,PLAINTEXT:PLAINTEXT,PROXIED:PLAINTEXT"
    if shape.sasl_ssl:
        listeners += f",SASL_SSL://127.0.0.1:{sport}"
        advertised += f",SASL_SSL://127.0.0.1:{sport}"
        protomap += ",SASL_SSL:SASL_SSL"
    if shape.brokers == 1:
        quorum = f"controller.quorum.bootstrap.servers=127.0.0.1:{cport}"
    else:
        # A static quorum of every node: formatted once, no voter changes to manage.
        quorum = "controller.quorum.voters=" + ",".join(
            f"{m}@127.0.0.1:{node_port(shape.controller_port, m)}" for m in shape.nodes()
        )
    text = f"""# Generated by dev/kafka; regenerated by every 'dev/kafka up'.
process.roles=broker,controller
node.id={n}
{quorum}
controller.listener.names=CONTROLLER
inter.broker.listener.name=PLAINTEXT
listeners={listeners}
advertised.listeners={advertised}
listener.security.protocol.map={protomap}
log.dirs={node_dir}/data
num.partitions=1
auto.create.topics.enable=false
group.initial.rebalance.delay.ms=0
"""
    if shape.brokers == 1:
        text += """# single node: every internal topic must have replication factor 1 (else share partitions never initialise)
offsets.topic.replication.factor=1
share.coordinator.state.topic.replication.factor=1
share.coordinator.state.topic.min.isr=1
transaction.state.log.replication.factor=1
transaction.state.log.min.isr=1
"""
    else:
        rf, isr = replication(shape.brokers), min_isr(shape.brokers)
        text += f"""# cluster: internal topics on {rf} replicas, writes need {isr} in sync, so one node may be down
offsets.topic.replication.factor={rf}
share.coordinator.state.topic.replication.factor={rf}
share.coordinator.state.topic.min.isr={isr}
transaction.state.log.replication.factor={rf}
transaction.state.log.min.isr={isr}
default.replication.factor={rf}
min.insync.replicas={isr}
"""
    text += """# Lower the minimums so tests can set short group-level lock durations / heartbeats; broker defaults are unchanged
# (record lock 30000, session 45000, heartbeat 5000).
group.share.min.record.lock.duration.ms=1000
group.share.min.heartbeat.interval.ms=1000
group.share.min.session.timeout.ms=6000
# After kill-broker, a restarted node cannot re-register until its old session expires (default 9 s): shorten it.
broker.heartbeat.interval.ms=1000
broker.session.timeout.ms=4000
"""
    if shape.sasl_ssl:
        text += f"""# SASL_SSL for client tests; inter-broker and controller traffic stay PLAINTEXT.
sasl.enabled.mechanisms=PLAIN,SCRAM-SHA-256,SCRAM-SHA-512
listener.name.sasl_ssl.plain.sasl.jaas.config=org.apache.kafka.common.security.plain.PlainLoginModule required user_{SASL_USER}="{SASL_PASSWORD}";
listener.name.sasl_ssl.scram-sha-256.sasl.jaas.config=org.apache.kafka.common.security.scram.ScramLoginModule required;
listener.name.sasl_ssl.scram-sha-512.sasl.jaas.config=org.apache.kafka.common.security.scram.ScramLoginModule required;
listener.name.sasl_ssl.ssl.keystore.type=PEM
listener.name.sasl_ssl.ssl.keystore.location={state}/tls/server-keystore.pem
"""
    return text


def sasl_ssl_env(shape, state):
    """sasl-ssl.env: where the SASL_SSL listener is, its CA and credentials (tests/support reads it)."""
    return (
        f"KAFKA_SASL_SSL_BOOTSTRAP={shape.sasl_bootstrap()}\nKAFKA_CA_FILE={state}/tls/ca.crt\n"
        f"KAFKA_SASL_USER={SASL_USER}\nKAFKA_SASL_PASSWORD={SASL_PASSWORD}\n"
    )


def client_sasl_ssl_properties(state):
    """A ready-made Java client config, for `dev/kafka tool ... --command-config` (PLAIN: swap mechanism + module)."""
    return f"""security.protocol=SASL_SSL
ssl.truststore.type=PEM
ssl.truststore.location={state}/tls/ca.crt
sasl.mechanism=SCRAM-SHA-512
sasl.jaas.config=org.apache.kafka.common.security.scram.ScramLoginModule required username="{SASL_USER}" password="{SASL_PASSWORD}";
"""


def proxied_env(shape):
    """proxied.env: node 1's PROXIED pair, for the fault tests' proxy (tests/support reads it)."""
    return (
        f"KAFKA_PROXIED_BOOTSTRAP=127.0.0.1:{proxied_port(shape.port, 1)}\n"
        f"KAFKA_PROXIED_TARGET=127.0.0.1:{proxied_bind(shape.port, 1)}\n"
    )


def cluster_id(random_bytes=os.urandom):
    """A Kafka cluster id: 16 random bytes in URL-safe base64 (what `StorageTool random-uuid` prints); making it here
    saves a JVM start. A leading '-' would read as an option, so draw again."""
    while True:
        cid = base64.urlsafe_b64encode(random_bytes(16)).decode().rstrip("=")
        if not cid.startswith("-"):
            return cid


def java_major(version_output):
    """The major version in `java -version`'s output ("1.8.0_x" means 8), or None when there is none."""
    m = re.search(r'version "([^"]*)"', version_output)
    if not m:
        return None, ""
    v = m.group(1)
    parts = v.split(".")
    major = parts[1] if parts[0] == "1" and len(parts) > 1 else parts[0]
    return (int(major) if major.isdigit() else None), v


def parse_partition(describe_output, partition):
    """(leader, replicas, isr) of one partition from TopicCommand --describe ("Leader: none" is -1), or None."""
    for line in describe_output.splitlines():
        words = line.split()
        fields = {words[i]: words[i + 1] for i in range(len(words) - 1)}
        got = fields.get("Partition:")
        if got is None or "Leader:" not in line:
            continue
        same = int(got) == int(partition) if got.isdigit() and str(partition).isdigit() else got == str(partition)
        if same:
            leader = fields.get("Leader:", "")
            return ("-1" if leader == "none" else leader), fields.get("Replicas:", ""), fields.get("Isr:", "")
    return None


def parse_up_args(args):
    """`up`'s options: (brokers, sasl_ssl)."""
    want, sasl = 1, False
    i = 0
    while i < len(args):
        a = args[i]
        if a == "--sasl-ssl":
            sasl = True
        elif a == "--brokers":
            value = args[i + 1] if i + 1 < len(args) else ""
            if not re.fullmatch(r"[1-9]", value):
                raise Die(f"--brokers takes a node count from 1 to 9 (got '{value}')")
            want = int(value)
            i += 1
        else:
            raise Die(f"unknown option for up: {a} (only --brokers N and --sasl-ssl)")
        i += 1
    return want, sasl


# --- the jars ------------------------------------------------------------------------------------------------------


@dataclass
class Jar:
    """One pinned jar: its Maven coordinates and the SHA-256 its file must have."""

    group: str
    artifact: str
    version: str
    sha256: str

    def file_name(self):
        return f"{self.artifact}-{self.version}.jar"

    def url(self, repo):
        """Where a Maven repository (Maven Central's layout) keeps it."""
        return f"{repo.rstrip('/')}/{self.group.replace('.', '/')}/{self.artifact}/{self.version}/{self.file_name()}"


@dataclass
class JarList:
    """A dev/kafka-jars-<version>.txt: the jars of one Kafka and log4j version, as Maven resolved them once."""

    kafka: str
    log4j: str
    jars: list = field(default_factory=list)


def parse_jar_list(text, source="jar list"):
    """The list's first line is "kafka VERSION log4j VERSION"; each further one "GROUP:ARTIFACT:VERSION SHA256"."""
    header, jars = None, []
    for number, line in enumerate(text.splitlines(), 1):
        line = line.strip()
        if not line or line.startswith("#"):
            continue
        words = line.split()
        if header is None:
            if len(words) != 4 or words[0] != "kafka" or words[2] != "log4j":
                raise Die(f"{source}:{number}: expected 'kafka VERSION log4j VERSION', got '{line}'")
            header = (words[1], words[3])
            continue
        coords = words[0].split(":") if words else []
        if len(words) != 2 or len(coords) != 3 or not all(coords) or not re.fullmatch(r"[0-9a-f]{64}", words[1]):
            raise Die(f"{source}:{number}: expected 'GROUP:ARTIFACT:VERSION SHA256', got '{line}'")
        jars.append(Jar(*coords, words[1]))
    if header is None:
        raise Die(f"{source}: no 'kafka VERSION log4j VERSION' line")
    return JarList(header[0], header[1], jars)


def pinned_jars(kafka_version, log4j_version, dev=DEV):
    """The pinned list for these versions, or None (then Maven resolves them)."""
    path = dev / f"kafka-jars-{kafka_version}.txt"
    if not path.is_file():
        return None
    jars = parse_jar_list(path.read_text(), str(path))
    if jars.kafka != kafka_version or jars.log4j != log4j_version:
        return None
    return jars


def fetch_jar(jar, repo, into, attempts=3, timeout=120):
    """Downloads one jar into the directory INTO and checks its SHA-256; a failed or corrupt download is tried again
    (ATTEMPTS in all), then refused naming the jar, its URL and both checksums. Returns the bytes fetched."""
    url = jar.url(repo)
    dest = Path(into) / jar.file_name()
    problem = ""
    for _ in range(attempts):
        h = hashlib.sha256()
        size = 0
        try:
            with urllib.request.urlopen(url, timeout=timeout) as r, open(dest, "wb") as out:
                for chunk in iter(lambda: r.read(1 << 16), b""):
                    h.update(chunk)
                    out.write(chunk)
                    size += len(chunk)
        except OSError as e:  # urllib's errors are OSErrors
            problem = f"cannot fetch {url}: {e}"
            continue
        if h.hexdigest() == jar.sha256:
            return size
        problem = f"{jar.file_name()} from {url} has SHA-256 {h.hexdigest()}, expected {jar.sha256}"
    dest.unlink(missing_ok=True)
    raise Die(problem)


def fetch_pinned(jars, repo, into, workers=8):
    """Fetches every jar of a JarList into INTO (a few at a time); returns the bytes fetched."""
    Path(into).mkdir(parents=True)
    with concurrent.futures.ThreadPoolExecutor(max_workers=workers) as pool:
        return sum(pool.map(lambda j: fetch_jar(j, repo, into), jars.jars))


def fetch_with_maven(cache, lib_tmp, kafka_version, log4j_version):
    """Resolves kafka_2.13 + kafka-tools with their runtime dependencies and a log4j2 backend with Maven, for a
    version no pinned list covers."""
    if shutil.which("mvn") is None:
        raise Die(
            f"mvn (Maven) not found: Kafka {kafka_version} with log4j {log4j_version} has no pinned jar list "
            f"(dev/kafka-jars-{kafka_version}.txt), so Maven is needed once to fetch its jars"
        )
    deps = "".join(
        f"<dependency><groupId>{g}</groupId><artifactId>{a}</artifactId><version>{v}</version></dependency>"
        for g, a, v in (
            ("org.apache.kafka", "kafka_2.13", kafka_version),
            ("org.apache.kafka", "kafka-tools", kafka_version),
            ("org.apache.logging.log4j", "log4j-slf4j-impl", log4j_version),
            ("org.apache.logging.log4j", "log4j-core", log4j_version),
            ("org.apache.logging.log4j", "log4j-api", log4j_version),
            ("org.apache.logging.log4j", "log4j-1.2-api", log4j_version),
        )
    )
    pom = cache / "pom.xml"
    pom.write_text(
        '<project xmlns="http://maven.apache.org/POM/4.0.0"><modelVersion>4.0.0</modelVersion>\n'
        "  <groupId>sharehost.dev</groupId><artifactId>kafka-runtime</artifactId>"
        f"<version>{kafka_version}</version><packaging>pom</packaging>\n"
        f"  <dependencies>{deps}</dependencies>\n</project>\n"
    )
    log = cache / "fetch.log"
    with open(log, "wb") as out:
        rc = subprocess.call(
            ["mvn", "-q", "-B", "-f", str(pom), "dependency:copy-dependencies", "-DincludeScope=runtime",
             f"-DoutputDirectory={lib_tmp}"],
            stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
        )
    if rc != 0:
        sys.stderr.write("\n".join(log.read_text(errors="replace").splitlines()[-20:]) + "\n")
        raise Die(f"Maven could not fetch org.apache.kafka:kafka_2.13:{kafka_version} (full log: {log})")


# --- processes and ports -------------------------------------------------------------------------------------------


def port_in_use(port, timeout=10):
    """Whether something accepts connections on 127.0.0.1:PORT. A connect that hangs (a full backlog) counts as in
    use: something listens there."""
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=timeout):
            return True
    except socket.timeout:
        return True
    except OSError:
        return False


def wait_until(limit_s, check, poll_s=POLL_S):
    """Polls CHECK until it is true (True) or LIMIT_S seconds have passed (False)."""
    t0 = time.monotonic()
    while not check():
        if time.monotonic() - t0 >= limit_s:
            return False
        time.sleep(poll_s)
    return True


def pid_running_with(pid_file, needle):
    """The pid in PID_FILE if that process runs and its command line contains NEEDLE. The cmdline check guards
    against pid reuse and zombies (a zombie has an empty cmdline), so we never signal an unrelated process."""
    try:
        text = Path(pid_file).read_text().strip()
    except OSError:
        return None
    if not re.fullmatch(r"[0-9]+", text):
        return None
    try:
        cmdline = Path(f"/proc/{text}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
    except OSError:
        return None
    return int(text) if needle in cmdline else None


def pid_exists(pid):
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def tail(path, n=30):
    """The last N lines of a log, to stderr (what a failed start shows)."""
    try:
        lines = Path(path).read_text(errors="replace").splitlines()[-n:]
    except OSError:
        return
    sys.stderr.write("".join(line + "\n" for line in lines))
    sys.stderr.flush()


def logged_since(log, from_line, text):
    """Whether TEXT is in LOG at or after line FROM_LINE (1-based)."""
    try:
        with open(log, errors="replace") as f:
            for number, line in enumerate(f, 1):
                if number >= from_line and text in line:
                    return True
    except OSError:
        pass
    return False


# --- the harness -----------------------------------------------------------------------------------------------------


class Harness:
    """The broker or cluster in one state dir, with the settings the environment gives."""

    def __init__(self):
        self.version = env("KAFKA_VERSION", DEFAULT_KAFKA_VERSION)
        self.log4j_version = env("LOG4J_VERSION", DEFAULT_LOG4J_VERSION)
        self.set_version_paths()
        # Absolute, so the pid checks (which match the JVM's command line) agree whichever directory a later call
        # runs from.
        self.state = Path(os.path.abspath(env("SHAREHOST_KAFKA_DIR", str(REPO / "target" / "kafka"))))
        self.marker = self.state / ".sharehost-kafka"  # we only ever delete a directory that carries this marker
        self.shape = Shape(
            version=self.version,
            port=env_int("KAFKA_PORT", 9092),
            controller_port=env_int("KAFKA_CONTROLLER_PORT", 9093),
            sasl_ssl_port=env_int("KAFKA_SASL_SSL_PORT", 9094),
        )
        # How many nodes the state dir holds: pinned in broker.env by `up` (a state without it, or none, is one node).
        env_file = self.state / "broker.env"
        if env_file.is_file():
            self.shape.brokers = shape_from_env_file(env_file.read_text(errors="replace")).brokers
        self.start_timeout = env_int("KAFKA_START_TIMEOUT", 90)
        # How long a node may take to stop after SIGTERM (a controlled shutdown) before it gets SIGKILL: stop-broker
        # must stay a stop, not turn into a kill, on a loaded machine.
        self.stop_timeout = env_int("KAFKA_STOP_TIMEOUT", 60)
        # How long move-leader keeps electing until the node leads.
        self.move_timeout = env_int("KAFKA_MOVE_TIMEOUT", 120)
        self.maven_repo = env("SHAREHOST_MAVEN_URL", MAVEN_CENTRAL)
        self.launched = {}  # node -> Popen of the JVMs this call started (so a dead one is reaped, not a zombie)

    # Jar cache paths depend on the version; recomputed when a running broker's recorded version is loaded.
    def set_version_paths(self):
        self.cache = Path(env("SHAREHOST_CACHE", str(Path.home() / ".cache" / "sharehost"))) / f"kafka-{self.version}"
        self.lib = self.cache / "lib"
        self.stamp = self.cache / "lib.complete"  # written only after a full download, so a half-finished one is redone
        self.log4j_conf = self.cache / "log4j2.xml"

    @property
    def brokers(self):
        return self.shape.brokers

    def usage(self):
        s = self.shape
        return f"""usage: dev/kafka COMMAND [ARGS]

  up [--brokers N] [--sasl-ssl]
                          fresh single-node Kafka {self.version} (KRaft, share groups on) on 127.0.0.1:{s.port};
                          --sasl-ssl adds a SASL_SSL listener on 127.0.0.1:{s.sasl_ssl_port} (PLAIN, SCRAM-SHA-256/512,
                          user {SASL_USER}/{SASL_PASSWORD}, CA in {self.state}/tls/ca.crt, vars in {self.state}/sasl-ssl.env).
                          --brokers 3: a cluster of 3 broker+controller nodes (a 3-voter quorum: survives one node
                          down). Node N listens on every base port + {NODE_PORT_STEP}*(N-1): with the defaults node 1 on
                          9092/9093/9094 (client/controller/SASL_SSL), node 2 on 9102/9103/9104, node 3 on 9112/9113/9114.
                          Internal topics and create-topic get replication 3, min.insync.replicas is 2.
                          Every node also has a PROXIED listener bound on its client port + 6 that advertises client
                          port + 5, where the fault tests run a loopback proxy to it (node 1's pair: {self.state}/proxied.env).
                          No-op if already running; fails if running in another shape (nodes, SASL_SSL).
  fetch                   only fetch the jars into the cache (what `up` does first), e.g. while something builds
  down                    stop every node and delete the state dir (all data)
  status                  print whether it runs; exit 0 if every node runs, 3 if none, 4 if only some
  stop-broker [N]         SIGTERM node N (default 1) and wait (SIGKILL after KAFKA_STOP_TIMEOUT), keep data and config
                          (start-broker resumes)
  kill-broker [N]         SIGKILL node N (default 1), keep data and config
  start-broker [N]        restart stopped node N (default 1) on the same data, ports and config
  create-topic NAME [P]   create topic NAME with P partitions (default 1), replication 1 (3 in a cluster); ok if it exists
  share-earliest GROUP    set share.auto.offset.reset=earliest on share group GROUP
  leader TOPIC PARTITION  print the node id leading the partition (-1 while it has none)
  move-leader TOPIC PARTITION NODE
                          make NODE (a replica in the ISR) the partition's leader: put it first in the replica list
                          (a reorder, no data moves), run a preferred leader election, wait until NODE leads
  tool CLASS [ARGS...]    run any Kafka tool main class with the cached jars and the quiet log4j config,
                          e.g. dev/kafka tool org.apache.kafka.tools.FeatureCommand --bootstrap-server 127.0.0.1:{s.port} describe
  help                    this text

env: KAFKA_VERSION ({self.version}), KAFKA_PORT, KAFKA_CONTROLLER_PORT, KAFKA_SASL_SSL_PORT (the base ports),
     KAFKA_START_TIMEOUT ({self.start_timeout} s to start), KAFKA_STOP_TIMEOUT ({self.stop_timeout} s from SIGTERM to SIGKILL),
     KAFKA_MOVE_TIMEOUT ({self.move_timeout} s for move-leader), SHAREHOST_CACHE (jar cache, default ~/.cache/sharehost),
     SHAREHOST_MAVEN_URL (the Maven repository the pinned jars come from, default {MAVEN_CENTRAL}),
     SHAREHOST_KAFKA_DIR (state, default <repo>/target/kafka; a cluster keeps node N in its node-N/),
     SHAREHOST_BROKER_JVM_OPTS (more JVM options for the brokers, e.g. dev/test's C1-only JIT; default none).
     A single node and a cluster run side by side with different base ports and state dirs, e.g.
     KAFKA_PORT=29092 KAFKA_CONTROLLER_PORT=29093 KAFKA_SASL_SSL_PORT=29094 SHAREHOST_KAFKA_DIR=target/kafka-cluster dev/kafka up --brokers 3
"""

    # --- prerequisites ---

    def require_java(self):
        if shutil.which("java") is None:
            raise Die(f"java not found on PATH (Kafka {self.version} needs Java 17+)")
        out = subprocess.run(["java", "-version"], capture_output=True, text=True, errors="replace")
        major, v = java_major(out.stderr + out.stdout)
        if major is None:
            raise Die(f"cannot parse Java version from 'java -version' (got '{v}')")
        if major < 17:
            raise Die(f"Java {v} is too old: Kafka {self.version} needs Java 17+")

    def write_log4j_conf(self):
        self.cache.mkdir(parents=True, exist_ok=True)
        tmp = self.cache / f"log4j2.xml.{os.getpid()}"
        tmp.write_text(LOG4J_CONF)
        os.replace(tmp, self.log4j_conf)

    def ensure_lib(self):
        """The jars in the cache (fetched once per version)."""
        self.write_log4j_conf()
        if self.stamp.is_file():
            return
        # Serialise concurrent first fetches (parallel test runs); the lock's fd is not inherited by java.
        with open(self.cache / ".lock", "w") as lock:
            fcntl.flock(lock, fcntl.LOCK_EX)
            if self.stamp.is_file():
                return
            note(f"fetching Kafka {self.version} jars from Maven Central into {self.lib} (one time) ...")
            t0 = time.monotonic()
            tmp = Path(f"{self.lib}.tmp")
            shutil.rmtree(self.lib, ignore_errors=True)
            shutil.rmtree(tmp, ignore_errors=True)
            pinned = pinned_jars(self.version, self.log4j_version)
            if pinned is not None:
                fetch_pinned(pinned, self.maven_repo, tmp)
            else:
                fetch_with_maven(self.cache, tmp, self.version, self.log4j_version)
            os.replace(tmp, self.lib)
            self.stamp.touch()
            jars = len(list(self.lib.glob("*.jar")))
            checked = ", each checked against its pinned SHA-256" if pinned is not None else ""
            note(f"fetched {jars} jars in {int(time.monotonic() - t0)}s{checked}")

    def java_cmd(self, *args, jvm=TOOL_JVM_OPTS):
        return ["java", *jvm, "-cp", f"{self.lib}/*", f"-Dlog4j2.configurationFile={self.log4j_conf}", *args]

    def run_tool(self, *args, capture=False):
        """Runs a Kafka tool class; CAPTURE: returns (status, stdout+stderr) instead of passing them through."""
        sys.stdout.flush()
        if capture:
            out = subprocess.run(self.java_cmd(*args), stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                 stdin=subprocess.DEVNULL, text=True, errors="replace")
            return out.returncode, out.stdout
        return subprocess.call(self.java_cmd(*args)), ""

    # --- state ---

    def node_dir(self, n):
        """Where node N keeps its config, pid, data and log: the state dir itself for a single node, node-N/ in a
        cluster."""
        return self.state if self.brokers == 1 else self.state / f"node-{n}"

    def node_name(self, n):
        """"broker" for a single node (the messages it always printed), "node N" in a cluster."""
        return "broker" if self.brokers == 1 else f"node {n}"

    def node_pid(self, n):
        d = self.node_dir(n)
        return pid_running_with(d / "kafka.pid", f"{d}/server.properties")

    def running_nodes(self):
        return [n for n in self.shape.nodes() if self.node_pid(n) is not None]

    def node_arg(self, arg):
        """The node a stop/kill/start-broker call means: its argument, default 1."""
        n = arg if arg else "1"
        if not re.fullmatch(r"[0-9]+", n) or not 1 <= int(n) <= self.brokers:
            raise Die(f"no node '{n}' in {self.state}: its nodes are 1..{self.brokers}")
        return int(n)

    def check_ports_free(self, ports):
        for p in ports:
            if port_in_use(p):
                raise Die(
                    f"port 127.0.0.1:{p} is already in use "
                    "(set KAFKA_PORT / KAFKA_CONTROLLER_PORT / KAFKA_SASL_SSL_PORT or free it)"
                )

    def load_broker_env(self):
        env_file = self.state / "broker.env"
        if not env_file.is_file():
            raise Die(f"no broker state in {self.state} (run dev/kafka up)")
        self.shape = shape_from_env_file(env_file.read_text(errors="replace"))
        self.version = self.shape.version
        self.set_version_paths()

    def require_running(self):
        if not self.running_nodes():
            raise Die("Kafka is not running (run dev/kafka up)")
        self.load_broker_env()

    def wipe_state(self):
        """Deletes the state dir, but only if it is ours (marker file) or empty: SHAREHOST_KAFKA_DIR may point
        anywhere."""
        if not os.path.lexists(self.state):
            return
        if not self.marker.is_file() and self.state.is_dir() and any(self.state.iterdir()):
            raise Die(f"refusing to delete {self.state}: it was not created by dev/kafka (no {self.marker})")
        if self.state.is_dir() and not self.state.is_symlink():
            # A file already gone is what was wanted: a broker still stopping, or another `down`
            # of the same dir, may delete its own files meanwhile. Then the walk starts again
            # (a few times: each one leaves less).
            for attempt in range(5):
                try:
                    shutil.rmtree(self.state)
                    break
                except FileNotFoundError:
                    if not os.path.lexists(self.state) or attempt == 4:
                        break
        else:
            self.state.unlink()

    # --- stopping ---

    def node_gone(self, n):
        proc = self.launched.get(n)
        if proc is not None:
            proc.poll()  # reaps our own child, so it is gone rather than a zombie
        return self.node_pid(n) is None

    def await_node_gone(self, n, wait_s):
        """Waits until node N is gone (it was signalled already); SIGKILL after WAIT_S seconds."""
        pid = self.node_pid(n)
        if pid is None:
            self.wait_ports_closed(n)
            return
        if not wait_until(wait_s, lambda: self.node_gone(n)):
            note(f"{self.node_name(n)} (pid {pid}) did not stop within {wait_s}s, sending SIGKILL")
            try:
                os.kill(pid, signal.SIGKILL)
            except OSError:
                pass
            if not wait_until(self.stop_timeout, lambda: self.node_gone(n)):
                raise Die(f"{self.node_name(n)} (pid {pid}) survived SIGKILL for {self.stop_timeout}s")
        self.wait_ports_closed(n)

    def stop_node(self, n, sig, wait_s):
        """Signals node N and waits until it is gone; SIGKILL after WAIT_S seconds."""
        pid = self.node_pid(n)
        if pid is None:
            return
        try:
            os.kill(pid, sig)
        except OSError:
            pass
        self.await_node_gone(n, wait_s)

    def wait_ports_closed(self, n):
        """A dying JVM loses its cmdline (what node_pid looks at) before the kernel closes its sockets, so an
        immediate start-broker could find its own old ports still listening. Wait until they are really closed; a
        port still open KAFKA_STOP_TIMEOUT s later is held by something else, which is said here (and start-broker's
        port check then refuses)."""
        t0 = time.monotonic()
        self.load_broker_env()
        for p in self.shape.node_ports(n):
            left = self.stop_timeout - (time.monotonic() - t0)
            if not wait_until(left, lambda: not port_in_use(p)):
                note(f"127.0.0.1:{p} still accepts connections {self.stop_timeout}s after {self.node_name(n)} exited")
                return

    # --- config, certificates, format ---

    def make_certs(self):
        """A throw-away CA and a server cert valid for DNS:localhost and IP:127.0.0.1 (rustls checks the IP SAN when
        the client dials "127.0.0.1" and the DNS SAN when it dials "localhost")."""
        if shutil.which("openssl") is None:
            raise Die("openssl not found (needed for --sasl-ssl)")
        d = self.state / "tls"
        d.mkdir(parents=True, exist_ok=True)
        (d / "server.ext").write_text(
            "basicConstraints=critical,CA:FALSE\nkeyUsage=critical,digitalSignature,keyEncipherment\n"
            "extendedKeyUsage=serverAuth\nsubjectAltName=DNS:localhost,IP:127.0.0.1\n"
            "subjectKeyIdentifier=hash\nauthorityKeyIdentifier=keyid\n"
        )
        steps = [
            ["openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-sha256", "-days", "3650",
             "-subj", "/CN=sharehost dev CA", "-keyout", f"{d}/ca.key", "-out", f"{d}/ca.crt",
             "-addext", "basicConstraints=critical,CA:TRUE", "-addext", "keyUsage=critical,keyCertSign,cRLSign"],
            ["openssl", "req", "-newkey", "rsa:2048", "-nodes", "-sha256", "-subj", "/CN=localhost",
             "-keyout", f"{d}/server.key", "-out", f"{d}/server.csr"],
            ["openssl", "x509", "-req", "-sha256", "-days", "825", "-in", f"{d}/server.csr", "-CA", f"{d}/ca.crt",
             "-CAkey", f"{d}/ca.key", "-set_serial", "0x" + os.urandom(8).hex(), "-extfile", f"{d}/server.ext",
             "-out", f"{d}/server.crt"],
        ]
        with open(d / "openssl.log", "wb") as log:
            for cmd in steps:
                if subprocess.call(cmd, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL) != 0:
                    log.close()
                    sys.stderr.write((d / "openssl.log").read_text(errors="replace"))
                    raise Die("openssl failed to create the test certificates")
        # Kafka's PEM keystore: unencrypted PKCS#8 key followed by the certificate chain.
        (d / "server-keystore.pem").write_bytes(
            b"".join((d / f).read_bytes() for f in ("server.key", "server.crt", "ca.crt"))
        )

    def format_storage(self):
        cid = cluster_id()
        args = []
        if self.shape.sasl_ssl:
            args += ["--add-scram", f"SCRAM-SHA-256=[name={SASL_USER},password={SASL_PASSWORD}]"]
            args += ["--add-scram", f"SCRAM-SHA-512=[name={SASL_USER},password={SASL_PASSWORD}]"]
        # A fresh 4.2+ cluster defaults to share.version >= 1 (2 on 4.4.0; `up` checks it), so no --feature is needed.
        if self.brokers == 1:
            log = self.state / "format.log"
            with open(log, "wb") as out:
                rc = subprocess.call(
                    self.java_cmd("kafka.tools.StorageTool", "format", "--standalone", "-t", cid,
                                  "-c", f"{self.state}/server.properties", *args),
                    stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                )
            if rc != 0:
                sys.stderr.write(log.read_text(errors="replace"))
                raise Die("kafka-storage format failed")
            return
        # Every node of the static quorum is formatted with the same cluster id; the JVMs run side by side.
        procs = []
        for n in self.shape.nodes():
            d = self.node_dir(n)
            out = open(d / "format.log", "wb")
            procs.append((n, out, subprocess.Popen(
                self.java_cmd("kafka.tools.StorageTool", "format", "-t", cid, "-c", f"{d}/server.properties", *args),
                stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
            )))
        failed = False
        for n, out, proc in procs:
            rc = proc.wait()
            out.close()
            if rc != 0:
                sys.stderr.write((self.node_dir(n) / "format.log").read_text(errors="replace"))
                failed = True
        if failed:
            raise Die("kafka-storage format failed")

    # --- start / wait ---

    def launch_node(self, n):
        """Launches node N in the background; await_node_started waits for it. In a cluster no node finishes
        starting before a quorum of them runs, so `up` launches them all first."""
        d = self.node_dir(n)
        (d / "logs").mkdir(parents=True, exist_ok=True)
        # The log is kept across restarts (useful after a kill-broker test); only lines after this marker count.
        log = d / "logs" / "server.log"
        log.touch()
        with open(log, "rb") as f:
            lines = sum(1 for _ in f)
        (d / "logs" / ".start-line").write_text(f"{lines + 1}\n")
        with open(log, "a") as f:
            f.write(f"===== dev/kafka: starting {self.node_name(n)} at {time.strftime('%Y-%m-%d %H:%M:%S')} =====\n")
        pid_file = d / "kafka.pid"
        pid_file.unlink(missing_ok=True)  # a stale pid file would make the wait watch the previous (dead) JVM
        # A cluster puts three JVMs (plus the tests and maybe other brokers) on one machine: half the heap each.
        heap = ["-Xmx1g", "-Xms256m"] if self.brokers == 1 else ["-Xmx512m", "-Xms128m"]
        # (dev/test's brokers: C1 only and the serial collector; a benchmark's keep the JVM's defaults)
        heap += os.environ.get("SHAREHOST_BROKER_JVM_OPTS", "").split()
        # Its own session and SIGHUP ignored (as setsid + nohup did): the broker outlives this call and its terminal.
        previous = signal.signal(signal.SIGHUP, signal.SIG_IGN)
        try:
            with open(log, "ab") as out:
                proc = subprocess.Popen(
                    self.java_cmd("kafka.Kafka", f"{d}/server.properties", jvm=heap),
                    stdin=subprocess.DEVNULL, stdout=out, stderr=subprocess.STDOUT, start_new_session=True,
                )
        finally:
            signal.signal(signal.SIGHUP, previous)
        self.launched[n] = proc
        tmp = d / f"kafka.pid.{os.getpid()}"
        tmp.write_text(f"{proc.pid}\n")
        os.replace(tmp, pid_file)  # whole or absent, never half-written

    def await_node_started(self, n, t0, started):
        """Waits until node N logged "Kafka Server started" (in KRaft: caught up with the metadata and unfenced) and
        its client port accepts (cheap, no JVM). A process gone means the JVM died. On failure every node of STARTED
        is stopped again."""
        d = self.node_dir(n)
        log = d / "logs" / "server.log"
        from_line = int((d / "logs" / ".start-line").read_text().strip() or "1")

        def give_up(msg):
            tail(log)
            for m in started:
                self.stop_node(m, signal.SIGTERM, 10)
            raise Die(msg)

        while True:
            pid = self.node_pid(n)
            proc = self.launched.get(n)
            if pid is None:
                # Gone only when the pid file names a process that no longer exists (our own child is reaped first).
                try:
                    written = (d / "kafka.pid").read_text().strip()
                except OSError:
                    written = ""
                if proc is not None:
                    proc.poll()
                if re.fullmatch(r"[0-9]+", written) and (
                    (proc is not None and proc.returncode is not None) or not pid_exists(int(written))
                ):
                    give_up(f"{self.node_name(n)} exited during startup (log: {log})")
            elif logged_since(log, from_line, "Kafka Server started") and port_in_use(node_port(self.shape.port, n)):
                break
            if time.monotonic() - t0 >= self.start_timeout:
                if not (d / "kafka.pid").is_file() or (d / "kafka.pid").stat().st_size == 0:
                    give_up(
                        f"{self.node_name(n)} was not launched within {self.start_timeout}s: no process wrote "
                        f"{d}/kafka.pid (log: {log})"
                    )
                give_up(f"{self.node_name(n)} did not come up within {self.start_timeout}s (log: {log})")
            time.sleep(POLL_S)
        note(f"{self.node_name(n)} started in {int(time.monotonic() - t0)}s (pid {pid})")

    def start_nodes(self, nodes):
        """Starts NODES (their ports must be free) and waits until each runs."""
        t0 = time.monotonic()
        self.load_broker_env()
        self.check_ports_free([p for n in nodes for p in self.shape.node_ports(n)])
        for n in nodes:
            self.launch_node(n)
        for n in nodes:
            self.await_node_started(n, t0, nodes)

    def print_where(self):
        self.load_broker_env()
        print(f"bootstrap: {self.shape.bootstrap()}")
        if self.shape.sasl_ssl:
            print(
                f"sasl_ssl bootstrap: {self.shape.sasl_bootstrap()}  (PLAIN, SCRAM-SHA-256, SCRAM-SHA-512; "
                f"user {SASL_USER} / {SASL_PASSWORD})"
            )
            print(
                f"ca: {self.state}/tls/ca.crt   env: {self.state}/sasl-ssl.env   "
                f"java client config: {self.state}/client-sasl-ssl.properties"
            )
        sys.stdout.flush()

    # --- commands ---

    def cmd_fetch(self, args):
        """Only the jars into the cache: dev/test fetches them while it builds, so that `up` finds them."""
        if args:
            raise Die(f"fetch takes no arguments (got {' '.join(args)})")
        self.ensure_lib()
        return 0

    def cmd_up(self, args):
        want, sasl = parse_up_args(args)
        self.require_java()
        running = self.running_nodes()
        if running:
            self.load_broker_env()
            if want != self.brokers:
                raise Die(
                    f"Kafka already runs in {self.state} with {self.brokers} node(s), not {want}; run 'dev/kafka down' "
                    "first (or use another SHAREHOST_KAFKA_DIR and ports)"
                )
            if sasl and not self.shape.sasl_ssl:
                raise Die(
                    f"Kafka already runs (pid {self.node_pid(running[0])}) WITHOUT the SASL_SSL listener; run "
                    "'dev/kafka down' first, then 'dev/kafka up --sasl-ssl'"
                )
            stopped = [str(n) for n in self.shape.nodes() if self.node_pid(n) is None]
            if stopped:
                raise Die(
                    f"node(s) {' '.join(stopped)} of the cluster in {self.state} are stopped: "
                    "'dev/kafka start-broker N' resumes one, 'dev/kafka down' clears all"
                )
            if self.brokers == 1:
                note(f"already running (pid {self.node_pid(1)})")
            else:
                note(f"already running ({self.brokers} nodes)")
            self.print_where()
            return 0
        self.shape.brokers = want
        self.shape.sasl_ssl = sasl
        self.ensure_lib()
        self.check_ports_free([p for n in self.shape.nodes() for p in self.shape.node_ports(n)])

        t0 = time.monotonic()
        self.wipe_state()  # `up` always starts from an empty data dir (start-broker is the resume path)
        self.state.mkdir(parents=True, exist_ok=True)
        self.marker.touch()
        for n in self.shape.nodes():
            (self.node_dir(n) / "data").mkdir(parents=True, exist_ok=True)
            (self.node_dir(n) / "logs").mkdir(parents=True, exist_ok=True)
        # Version, shape and ports are pinned at `up`, so status/start-broker/create-topic keep using them whatever
        # the env says later.
        (self.state / "broker.env").write_text(self.shape.broker_env())
        for n in self.shape.nodes():
            (self.node_dir(n) / "server.properties").write_text(
                server_properties(self.shape, n, self.state, self.node_dir(n))
            )
        if sasl:
            self.make_certs()
            (self.state / "sasl-ssl.env").write_text(sasl_ssl_env(self.shape, self.state))
            (self.state / "client-sasl-ssl.properties").write_text(client_sasl_ssl_properties(self.state))
        (self.state / "proxied.env").write_text(proxied_env(self.shape))
        self.format_storage()
        self.start_nodes(list(self.shape.nodes()))
        # One tool call: proves the bootstrap answers requests and that share groups are on.
        rc, features = self.run_tool(
            "org.apache.kafka.tools.FeatureCommand", "--bootstrap-server", self.shape.bootstrap(), "describe",
            capture=True,
        )
        if rc != 0:
            sys.stderr.write(features)
            raise Die("broker started but FeatureCommand describe failed")
        share = share_version(features)
        if share is None or not share.isdigit() or int(share) < 1:
            sys.stderr.write(features)
            raise Die(f"share.version is '{share or 'absent'}', expected >= 1")
        took = int(time.monotonic() - t0)
        if self.brokers == 1:
            note(f"up in {took}s: Kafka {self.version}, share.version={share}, state {self.state}")
        else:
            note(
                f"up in {took}s: {self.brokers} nodes of Kafka {self.version}, share.version={share}, replication "
                f"{replication(self.brokers)}, min.insync.replicas {min_isr(self.brokers)}, state {self.state}"
            )
        self.print_where()
        return 0

    def cmd_down(self, args):
        # Signal every node first, then wait: a cluster's last nodes would otherwise wait for a quorum that is leaving.
        stopping = []
        for n in self.shape.nodes():
            pid = self.node_pid(n)
            if pid is not None:
                try:
                    os.kill(pid, signal.SIGTERM)
                except OSError:
                    pass
                stopping.append((n, pid))
        if not stopping:
            note("not running")
        for n, pid in stopping:
            self.await_node_gone(n, 20)  # the data goes anyway: a node still stopping after 20 s is killed
            note(f"stopped {self.node_name(n)} (pid {pid})")
        self.wipe_state()
        return 0

    def cmd_status(self, args):
        if self.brokers == 1:
            pid = self.node_pid(1)
            if pid is not None:
                self.load_broker_env()
                print(f"running: pid {pid}, Kafka {self.version}, state {self.state}")
                self.print_where()
                return 0
            if (self.state / "server.properties").is_file():
                print(f"not running (stopped broker state kept in {self.state}; 'dev/kafka start-broker' resumes it)")
            else:
                print("not running")
            return 3
        self.load_broker_env()
        running = len(self.running_nodes())
        if running == 0:
            print(
                f"not running ({self.brokers} stopped nodes kept in {self.state}; 'dev/kafka start-broker N' "
                "resumes node N)"
            )
            return 3
        print(f"running: {running} of {self.brokers} nodes, Kafka {self.version}, state {self.state}")
        for n in self.shape.nodes():
            pid = self.node_pid(n)
            port = node_port(self.shape.port, n)
            if pid is not None:
                print(f"node {n}: pid {pid}, 127.0.0.1:{port} (controller :{node_port(self.shape.controller_port, n)})")
            else:
                print(f"node {n}: stopped (127.0.0.1:{port}; 'dev/kafka start-broker {n}' resumes it)")
        self.print_where()
        return 0 if running == self.brokers else 4

    def cmd_stop_broker(self, sig, args):
        t0 = time.monotonic()
        n = self.node_arg(args[0] if args else "")
        pid = self.node_pid(n)
        if pid is None:
            note(f"{self.node_name(n)} not running")
            return 0
        if sig == signal.SIGKILL:
            self.stop_node(n, sig, 10)
        else:
            self.stop_node(n, sig, self.stop_timeout)
        note(
            f"{self.node_name(n)} (pid {pid}) stopped with {signal.Signals(sig).name} in "
            f"{int(time.monotonic() - t0)}s; data kept in {self.node_dir(n)}"
        )
        return 0

    def cmd_start_broker(self, args):
        n = self.node_arg(args[0] if args else "")
        pid = self.node_pid(n)
        if pid is not None:
            note(f"{self.node_name(n)} already running (pid {pid})")
            self.print_where()
            return 0
        if not ((self.node_dir(n) / "server.properties").is_file() and (self.state / "broker.env").is_file()):
            raise Die(f"no stopped broker in {self.state} (use dev/kafka up)")
        self.require_java()
        self.load_broker_env()
        self.ensure_lib()
        self.start_nodes([n])
        self.print_where()
        return 0

    def cmd_tool(self, args):
        if not args:
            raise Die("usage: dev/kafka tool CLASS [ARGS...]")
        self.require_java()
        self.ensure_lib()
        sys.stdout.flush()
        sys.stderr.flush()
        os.execvp("java", self.java_cmd(*args))

    def cmd_create_topic(self, args):
        if not 1 <= len(args) <= 2:
            raise Die("usage: dev/kafka create-topic NAME [PARTITIONS]")
        self.require_java()
        self.require_running()
        self.ensure_lib()
        rc, _ = self.run_tool(
            "org.apache.kafka.tools.TopicCommand", "--bootstrap-server", self.shape.bootstrap(), "--create",
            "--if-not-exists", "--topic", args[0], "--partitions", args[1] if len(args) > 1 else "1",
            "--replication-factor", str(replication(self.brokers)),
        )
        return rc

    def cmd_share_earliest(self, args):
        if len(args) != 1:
            raise Die("usage: dev/kafka share-earliest GROUP")
        self.require_java()
        self.require_running()
        self.ensure_lib()
        # ConfigCommand moved from kafka.admin (core) to org.apache.kafka.tools in Kafka 4.x.
        rc, _ = self.run_tool(
            "org.apache.kafka.tools.ConfigCommand", "--bootstrap-server", self.shape.bootstrap(), "--alter",
            "--entity-type", "groups", "--entity-name", args[0], "--add-config", "share.auto.offset.reset=earliest",
        )
        return rc

    def describe_partition(self, topic, partition):
        """(leader, replicas, isr) of one partition (replicas and ISR comma-separated; leader -1 while leaderless)."""
        rc, out = self.run_tool(
            "org.apache.kafka.tools.TopicCommand", "--bootstrap-server", self.shape.bootstrap(), "--describe",
            "--topic", topic, capture=True,
        )
        if rc != 0:
            sys.stderr.write(out)
            raise Die(f"cannot describe topic {topic}")
        found = parse_partition(out, partition)
        if found is None:
            raise Die(f"topic {topic} has no partition {partition}")
        return found

    def cmd_leader(self, args):
        if len(args) != 2:
            raise Die("usage: dev/kafka leader TOPIC PARTITION")
        self.require_java()
        self.require_running()
        self.ensure_lib()
        print(self.describe_partition(args[0], args[1])[0])
        return 0

    def cmd_move_leader(self, args):
        if len(args) != 3:
            raise Die("usage: dev/kafka move-leader TOPIC PARTITION NODE")
        topic, partition, node = args
        if not re.fullmatch(r"[0-9]+", partition):
            raise Die(f"partition must be a number (got '{partition}')")
        if not re.fullmatch(r"[0-9]+", node):
            raise Die(f"node must be a node id (got '{node}')")
        self.require_java()
        self.require_running()
        self.ensure_lib()
        t0 = time.monotonic()
        leader, replicas, isr = self.describe_partition(topic, partition)
        if leader == node:
            note(f"node {node} already leads {topic}-{partition}")
            return 0
        if node not in replicas.split(","):
            raise Die(f"node {node} holds no replica of {topic}-{partition} (replicas {replicas})")
        if node not in isr.split(","):
            raise Die(f"node {node} is not in sync for {topic}-{partition} (isr {isr}): it cannot lead yet")
        # The preferred leader is the first replica: put NODE first. Same replica set, so nothing is copied.
        order = [node] + [r for r in replicas.split(",") if r != node]
        plan = {"version": 1, "partitions": [{"topic": topic, "partition": int(partition),
                                             "replicas": [int(r) for r in order]}]}
        (self.state / "move-leader.json").write_text(json.dumps(plan, separators=(",", ":")) + "\n")
        rc, out = self.run_tool(
            "org.apache.kafka.tools.reassign.ReassignPartitionsCommand", "--bootstrap-server", self.shape.bootstrap(),
            "--reassignment-json-file", f"{self.state}/move-leader.json", "--execute", capture=True,
        )
        if rc != 0:
            sys.stderr.write(out)
            raise Die(f"reordering the replicas of {topic}-{partition} failed")
        # Until the reorder is applied the election may keep (or pick) another replica; elect until NODE leads.
        while True:
            _, out = self.run_tool(
                "org.apache.kafka.tools.LeaderElectionCommand", "--bootstrap-server", self.shape.bootstrap(),
                "--election-type", "PREFERRED", "--topic", topic, "--partition", partition, capture=True,
            )
            leader = self.describe_partition(topic, partition)[0]
            if leader == node:
                break
            if time.monotonic() - t0 >= self.move_timeout:
                sys.stderr.write(out)
                raise Die(
                    f"node {node} did not become the leader of {topic}-{partition} within {self.move_timeout}s "
                    f"(leader: {leader})"
                )
            time.sleep(0.5)
        took = int(time.monotonic() - t0)
        note(f"node {node} leads {topic}-{partition} now (replicas {','.join(order)}, in {took}s)")
        return 0


def share_version(features):
    """share.version's FinalizedVersionLevel in FeatureCommand describe's output, or None."""
    for line in features.splitlines():
        words = line.split()
        if len(words) > 1 and words[1] == "share.version":
            for i, w in enumerate(words[:-1]):
                if w == "FinalizedVersionLevel:":
                    return words[i + 1]
    return None


def main(argv):
    """Runs one dev/kafka command; returns its exit status (0 ok, 1 an error, 3/4 from status)."""
    cmd, args = (argv[0], argv[1:]) if argv else ("help", [])
    try:
        h = Harness()
        commands = {
            "fetch": h.cmd_fetch,
            "up": h.cmd_up,
            "down": h.cmd_down,
            "status": h.cmd_status,
            "stop-broker": lambda a: h.cmd_stop_broker(signal.SIGTERM, a),
            "kill-broker": lambda a: h.cmd_stop_broker(signal.SIGKILL, a),
            "start-broker": h.cmd_start_broker,
            "create-topic": h.cmd_create_topic,
            "share-earliest": h.cmd_share_earliest,
            "leader": h.cmd_leader,
            "move-leader": h.cmd_move_leader,
            "tool": h.cmd_tool,
        }
        if cmd in ("help", "-h", "--help"):
            sys.stdout.write(h.usage())
            return 0
        if cmd not in commands:
            sys.stderr.write(h.usage())
            raise Die(f"unknown command: {cmd}")
        return commands[cmd](args)
    except Die as e:
        sys.stdout.flush()
        print(f"{NAME}: error: {e}", file=sys.stderr, flush=True)
        return 1
    except KeyboardInterrupt:
        return 130


if __name__ == "__main__":
    # A reader that stops early (`dev/kafka status | head -1`) ends it quietly, as it ended the shell script.
    signal.signal(signal.SIGPIPE, signal.SIG_DFL)
    sys.exit(main(sys.argv[1:]))
