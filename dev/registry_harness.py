#!/usr/bin/env python3
"""dev/registry's program: a real schema registry on this machine for the tests of Schema-Registry-encoded records.

Apicurio Registry 3 (Apache-2.0), whose Confluent-compatible API (/apis/ccompat/v7) is what the host and the Confluent
serializers of dev/schema_records.py speak. Storage is H2 in memory: `down` (or a crash) forgets every schema, and
every `up` starts empty.
  * The registry comes as Apicurio's own build, the Quarkus application in apicurio-registry-app-<version>-all.tar.gz
    on Maven Central (no Docker, no Maven run: the plain apicurio-registry-app jar is not runnable without Quarkus's
    build step). The archive is checked against the SHA-256 pinned here for the default version (another
    APICURIO_VERSION is checked against Maven Central's own .sha1), unpacked OUTSIDE the repo into
    $SHAREHOST_CACHE/apicurio-registry-<version>/app, shared by all checkouts, and the archive is not kept.
  * The state (pid, log, settings) lives INSIDE the checkout, in target/registry, so parallel checkouts don't collide
    as long as each has its own ports (REGISTRY_PORT, REGISTRY_MANAGEMENT_PORT).
  * Apicurio 3 is built for Java 21: the JVM is the first Java 21+ among REGISTRY_JAVA, $JAVA_HOME, `java` on PATH
    and /usr/lib/jvm/*.

It runs as a production registry does: every /apis request needs basic credentials (user `sharehost`, password
$REGISTRY_PASSWORD or `registry-secret`; Quarkus's embedded users and an `authenticated` path policy), and the API is
served on https too (REGISTRY_TLS_PORT) with a certificate of a CA made for each `up` (openssl), so that the host's
credentials and its TLS client are tested against a real server.

`up` is done when the registry answers GET /apis/ccompat/v7/subjects with the credentials; every wait polls for its event and is bounded by
a generous deadline, so a busy machine makes it longer, never a failure.
"""

import fcntl
import glob
import hashlib
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import tarfile
import time
import urllib.error
import urllib.request
from base64 import b64encode
from pathlib import Path

DEV = Path(os.path.abspath(os.path.dirname(__file__)))
sys.path.insert(0, str(DEV))
from kafka_harness import java_major, pid_running_with, port_in_use, tail, wait_until  # noqa: E402

NAME = "dev/registry"
REPO = DEV.parent
DEFAULT_VERSION = "3.3.3"
# SHA-256 of io.apicurio:apicurio-registry-app:<version>:all:tar.gz as Maven Central serves it (its .sha1 agrees).
PINNED_SHA256 = {
    "3.3.3": "8bc6751c76d963734224b01d5e7f84ccb3cb61c87d3bd77c36c35f10a5cbed63",
}
MAVEN_CENTRAL = "https://repo1.maven.org/maven2"
MIN_JAVA = 21
CCOMPAT = "/apis/ccompat/v7"
# C1 only and the serial collector: on 2 cores this halved the time to the first answer (7.0 s to 3.2 s with the
# machine busy) and the CPU it took (5 s to 2 s). 256 MiB of heap is plenty for a test's few schemas.
JVM_OPTS = ["-XX:TieredStopAtLevel=1", "-XX:+UseSerialGC", "-Xms64m", "-Xmx256m"]
POLL_S = 0.2
USER = "sharehost"


class Die(Exception):
    """A failure that ends the command: printed as "dev/registry: error: MSG" on stderr, exit status 1."""


def note(msg):
    """A progress line on stdout, beside the URL the commands print (as dev/kafka prints its addresses)."""
    print(f"{NAME}: {msg}", flush=True)


def env(name, default):
    """A variable as bash's ${NAME:-default} reads it: unset and empty both mean the default."""
    return os.environ.get(name) or default


def env_int(name, default):
    value = env(name, str(default))
    if not re.fullmatch(r"[0-9]+", value):
        raise Die(f"{name} must be a whole number (got '{value}')")
    return int(value)


def parse_env_file(text):
    out = {}
    for line in text.splitlines():
        if "=" in line and not line.lstrip().startswith("#"):
            key, value = line.split("=", 1)
            out[key.strip()] = value.strip()
    return out


def artifact_url(repo, version, suffix=""):
    return f"{repo}/io/apicurio/apicurio-registry-app/{version}/apicurio-registry-app-{version}-all.tar.gz{suffix}"


def java_version(java):
    """(major, version text) of a java binary, (None, "") when it does not run."""
    try:
        out = subprocess.run([java, "-version"], capture_output=True, text=True, errors="replace", timeout=60)
    except (OSError, subprocess.TimeoutExpired):
        return None, ""
    return java_major(out.stderr + out.stdout)


def find_java():
    """The first Java 21+ among REGISTRY_JAVA (only it, when set), $JAVA_HOME, PATH and /usr/lib/jvm (newest first)."""
    explicit = os.environ.get("REGISTRY_JAVA")
    if explicit:
        major, v = java_version(explicit)
        if major is None or major < MIN_JAVA:
            raise Die(f"REGISTRY_JAVA={explicit} is Java {v or '(does not run)'}; "
                      f"Apicurio Registry 3 needs {MIN_JAVA}+")
        return explicit
    candidates = []
    if os.environ.get("JAVA_HOME"):
        candidates.append(os.path.join(os.environ["JAVA_HOME"], "bin", "java"))
    if shutil.which("java"):
        candidates.append(shutil.which("java"))
    candidates += sorted(glob.glob("/usr/lib/jvm/*/bin/java"), reverse=True)
    seen, found = set(), []
    for java in candidates:
        real = os.path.realpath(java)
        if real in seen or not os.access(real, os.X_OK):
            continue
        seen.add(real)
        major, v = java_version(java)
        found.append(f"{java} ({v or 'does not run'})")
        if major is not None and major >= MIN_JAVA:
            return java
    raise Die(
        f"Apicurio Registry 3 needs Java {MIN_JAVA}+ (its classes are Java 21 class files); found "
        f"{', '.join(found) or 'no java at all'}. Install a JDK {MIN_JAVA}+ or set REGISTRY_JAVA to its bin/java"
    )


# The registry is on loopback: no proxy from the environment stands between (the download keeps the environment's).
LOCAL = urllib.request.build_opener(urllib.request.ProxyHandler({}))


def http_get(url, timeout=5, opener=LOCAL):
    """(status, body) of a GET of a URL or a urllib Request; (None, reason) when nothing answers."""
    try:
        with opener.open(url, timeout=timeout) as r:
            return r.status, r.read().decode(errors="replace")
    except urllib.error.HTTPError as e:
        return e.code, e.read().decode(errors="replace")
    except OSError as e:
        return None, str(e)


def answers(port, password):
    """Whether a schema registry answers the Confluent API's subject list on 127.0.0.1:PORT to our credentials."""
    token = b64encode(f"{USER}:{password}".encode()).decode()
    request = urllib.request.Request(f"http://127.0.0.1:{port}{CCOMPAT}/subjects",
                                     headers={"Authorization": f"Basic {token}"})
    status, body = http_get(request)
    if status != 200:
        return False
    try:
        return isinstance(json.loads(body), list)
    except ValueError:
        return False


class Harness:
    """The registry whose state is in one directory, with the settings the environment gives."""

    def __init__(self):
        self.state = Path(os.path.abspath(env("SHAREHOST_REGISTRY_DIR", str(REPO / "target" / "registry"))))
        self.marker = self.state / ".sharehost-registry"  # we only ever delete a directory that carries this marker
        self.pid_file = self.state / "registry.pid"
        self.log = self.state / "registry.log"
        self.env_file = self.state / "registry.env"
        self.version = env("APICURIO_VERSION", DEFAULT_VERSION)
        self.port = env_int("REGISTRY_PORT", 18081)
        self.management_port = env_int("REGISTRY_MANAGEMENT_PORT", 18082)
        self.tls_port = env_int("REGISTRY_TLS_PORT", 18083)
        self.password = env("REGISTRY_PASSWORD", "registry-secret")
        self.tls = self.state / "tls"
        self.start_timeout = env_int("REGISTRY_START_TIMEOUT", 180)
        self.stop_timeout = env_int("REGISTRY_STOP_TIMEOUT", 30)
        self.maven_repo = env("SHAREHOST_MAVEN_URL", MAVEN_CENTRAL)
        self.proc = None  # the JVM this call started, so that a dead one is reaped rather than left a zombie
        # A running registry's recorded settings win over the environment's (status and down find it wherever it is).
        self.recorded = parse_env_file(self.env_file.read_text(errors="replace")) if self.env_file.is_file() else {}
        self.set_version_paths()

    def set_version_paths(self):
        self.cache = Path(env("SHAREHOST_CACHE", str(Path.home() / ".cache" / "sharehost"))) / (
            f"apicurio-registry-{self.version}")
        self.app = self.cache / "app"
        self.stamp = self.cache / "app.complete"  # written only once the archive is checked and unpacked whole

    def url(self):
        return f"http://127.0.0.1:{self.port}{CCOMPAT}"

    def tls_url(self):
        return f"https://127.0.0.1:{self.tls_port}{CCOMPAT}"

    def answers(self):
        return answers(self.port, self.password)

    def usage(self):
        return f"""usage: dev/registry COMMAND

  up        start Apicurio Registry {self.version} in memory on 127.0.0.1:{self.port} (its health and metrics on
            127.0.0.1:{self.management_port}) and wait until its Confluent-compatible API answers; print its URL
            ("url: {self.url()}", its https URL, CA file, user and password). Every
            /apis request needs the user {USER} and the password. No-op when it already runs. The first call downloads
            the registry (about 160 MB) into {self.cache}.
  down      stop it (SIGTERM, SIGKILL after REGISTRY_STOP_TIMEOUT) and delete the state dir; its schemas are gone
  status    print whether it runs; exit 0 if it runs and answers, 3 if it does not run, 4 if it runs but does not
            answer
  url       print the URL of the Confluent-compatible API alone (of the running registry; exit 3 if none runs)
  fetch     only download and unpack the registry into the cache (what `up` does first), e.g. while something builds
  help      this text

env: REGISTRY_PORT (18081), REGISTRY_MANAGEMENT_PORT (18082), REGISTRY_TLS_PORT (18083, https),
     REGISTRY_PASSWORD (the user {USER}'s, default registry-secret), APICURIO_VERSION ({DEFAULT_VERSION}),
     REGISTRY_JAVA (a Java {MIN_JAVA}+ binary; default: the first of $JAVA_HOME, PATH, /usr/lib/jvm),
     REGISTRY_START_TIMEOUT ({self.start_timeout} s to answer),
     REGISTRY_STOP_TIMEOUT ({self.stop_timeout} s from SIGTERM to SIGKILL),
     SHAREHOST_REGISTRY_DIR (state, default <repo>/target/registry), SHAREHOST_CACHE (default ~/.cache/sharehost),
     SHAREHOST_MAVEN_URL (the Maven repository, default {MAVEN_CENTRAL}),
     SHAREHOST_REGISTRY_JVM_OPTS (more JVM options, after {' '.join(JVM_OPTS)}).
"""

    # --- the distribution ---

    def ensure_app(self):
        """The unpacked registry in the cache (downloaded once per version)."""
        if self.stamp.is_file():
            return
        self.cache.mkdir(parents=True, exist_ok=True)
        # Serialises concurrent first downloads (parallel test runs); the lock's fd is not inherited by java.
        with open(self.cache / ".lock", "w") as lock:
            fcntl.flock(lock, fcntl.LOCK_EX)
            if self.stamp.is_file():
                return
            url = artifact_url(self.maven_repo, self.version)
            note(f"fetching Apicurio Registry {self.version} from {url} into {self.app} (one time) ...")
            t0 = time.monotonic()
            archive = self.cache / f"app.tar.gz.{os.getpid()}"
            tmp = Path(f"{self.app}.tmp")
            shutil.rmtree(self.app, ignore_errors=True)
            shutil.rmtree(tmp, ignore_errors=True)
            try:
                size = self.download(url, archive)
                t1 = time.monotonic()
                tmp.mkdir()
                with tarfile.open(archive) as tar:
                    # (the "data" filter refuses absolute paths, links out of the tree and device files)
                    tar.extractall(tmp, filter="data")
                if not (tmp / "quarkus-run.jar").is_file():
                    raise Die(f"{url} has no quarkus-run.jar: not the Quarkus distribution this script runs")
                os.replace(tmp, self.app)
            finally:
                archive.unlink(missing_ok=True)
                shutil.rmtree(tmp, ignore_errors=True)
            self.stamp.touch()
            note(f"fetched {size / 1e6:.0f} MB in {t1 - t0:.1f}s, unpacked in {time.monotonic() - t1:.1f}s")

    def download(self, url, dest, attempts=3, timeout=120):
        """Downloads URL to DEST and checks it (the pinned SHA-256, else Maven Central's .sha1); a failed or corrupt
        download is tried again (ATTEMPTS in all), then refused naming the URL and both checksums."""
        pinned = PINNED_SHA256.get(self.version)
        if pinned is None:
            status, body = http_get(artifact_url(self.maven_repo, self.version, ".sha1"), timeout=timeout,
                                    opener=urllib.request.build_opener())
            if status != 200 or not re.match(r"[0-9a-f]{40}", body.strip()):
                raise Die(
                    f"no checksum for Apicurio Registry {self.version}: none pinned in {__file__} and "
                    f"{artifact_url(self.maven_repo, self.version, '.sha1')} answered {status or body}"
                )
            algorithm, expected = "sha1", body.strip()[:40]
        else:
            algorithm, expected = "sha256", pinned
        problem = ""
        for _ in range(attempts):
            h = hashlib.new(algorithm)
            size = 0
            try:
                with urllib.request.urlopen(url, timeout=timeout) as r, open(dest, "wb") as out:
                    for chunk in iter(lambda: r.read(1 << 20), b""):
                        h.update(chunk)
                        out.write(chunk)
                        size += len(chunk)
            except urllib.error.HTTPError as e:
                raise Die(f"cannot fetch {url}: {e} (is APICURIO_VERSION={self.version} published?)")
            except OSError as e:
                problem = f"cannot fetch {url}: {e}"
                continue
            if h.hexdigest() == expected:
                return size
            problem = f"{url} has {algorithm.upper()} {h.hexdigest()}, expected {expected}"
        raise Die(problem)

    # --- the process ---

    def pid(self):
        """The running registry's pid (its command line names this state dir), else None."""
        # (the space: the next argument follows, so target/registry does not match target/registry-test)
        return pid_running_with(self.pid_file, f"-Dsharehost.registry.state={self.state} ")

    def gone(self):
        if self.proc is not None:
            self.proc.poll()  # reaps our own child, so it is gone rather than a zombie
        return self.pid() is None

    def load_recorded(self):
        """The running registry's version and ports, as `up` recorded them."""
        if self.recorded.get("VERSION"):
            self.version = self.recorded["VERSION"]
            self.set_version_paths()
        if self.recorded.get("PASSWORD"):
            self.password = self.recorded["PASSWORD"]
        for key, attr in (("PORT", "port"), ("MANAGEMENT_PORT", "management_port"), ("TLS_PORT", "tls_port")):
            if re.fullmatch(r"[0-9]+", self.recorded.get(key, "")):
                setattr(self, attr, int(self.recorded[key]))

    def wipe_state(self):
        """Deletes the state dir, but only if it is ours (marker file) or empty: SHAREHOST_REGISTRY_DIR may point
        anywhere."""
        if not os.path.lexists(self.state):
            return
        if not self.marker.is_file() and self.state.is_dir() and any(self.state.iterdir()):
            raise Die(f"refusing to delete {self.state}: it was not created by dev/registry (no {self.marker})")
        if self.state.is_dir() and not self.state.is_symlink():
            shutil.rmtree(self.state, ignore_errors=True)
        else:
            self.state.unlink()

    def make_tls(self):
        """A CA and a certificate for 127.0.0.1 and localhost signed by it, in the state dir (made anew each `up`)."""
        if shutil.which("openssl") is None:
            raise Die("openssl not found (the registry's https certificate is made with it)")
        self.tls.mkdir(parents=True, exist_ok=True)
        d = self.tls
        (d / "server.ext").write_text("subjectAltName=IP:127.0.0.1,DNS:localhost\n")
        for cmd in (
            ["openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-sha256", "-days", "3650",
             "-subj", "/CN=sharehost-dev-registry-ca", "-keyout", f"{d}/ca.key", "-out", f"{d}/ca.crt"],
            ["openssl", "req", "-newkey", "rsa:2048", "-nodes", "-sha256", "-subj", "/CN=localhost",
             "-keyout", f"{d}/server.key", "-out", f"{d}/server.csr"],
            ["openssl", "x509", "-req", "-sha256", "-days", "825", "-in", f"{d}/server.csr", "-CA", f"{d}/ca.crt",
             "-CAkey", f"{d}/ca.key", "-CAcreateserial", "-out", f"{d}/server.crt", "-extfile", f"{d}/server.ext"],
        ):
            r = subprocess.run(cmd, stdin=subprocess.DEVNULL, capture_output=True, text=True)
            if r.returncode != 0:
                raise Die(f"{' '.join(cmd[:3])} failed: {r.stderr.strip()}")

    def launch(self, java):
        self.state.mkdir(parents=True, exist_ok=True)
        self.marker.touch()
        (self.state / "tmp").mkdir(exist_ok=True)
        self.make_tls()
        self.env_file.write_text(
            f"VERSION={self.version}\nPORT={self.port}\nMANAGEMENT_PORT={self.management_port}\n"
            f"TLS_PORT={self.tls_port}\nPASSWORD={self.password}\nJAVA={java}\n")
        self.pid_file.unlink(missing_ok=True)
        props = {
            # Names this state dir on the command line: how pid() tells our JVM from any other process.
            "sharehost.registry.state": self.state,
            "quarkus.http.host": "127.0.0.1",
            "quarkus.http.port": self.port,
            # Quarkus's management interface (/health, /metrics) is on by default at 9000: a port of ours instead.
            "quarkus.management.host": "127.0.0.1",
            "quarkus.management.port": self.management_port,
            # In memory, said here rather than left to Apicurio's defaults.
            "apicurio.storage.kind": "sql",
            "apicurio.storage.sql.kind": "h2",
            "apicurio.datasource.url": "jdbc:h2:mem:sharehost",
            # A schema that differs from a registered one only in its layout gets the registered one's id, as in
            # Confluent's registry (the Avro serializer registers the schema re-printed compactly, not the file's text).
            "apicurio.ccompat.use-canonical-hash": "true",
            "apicurio.storage.snapshot.location": self.state / "tmp",
            "apicurio.import.work-dir": self.state / "tmp",
            "java.io.tmpdir": self.state / "tmp",
            # https beside http, with the certificate make_tls() signed.
            "quarkus.http.ssl-port": self.tls_port,
            "quarkus.http.ssl.certificate.files": self.tls / "server.crt",
            "quarkus.http.ssl.certificate.key-files": self.tls / "server.key",
            # Basic credentials on every API request: Quarkus's embedded users (Apicurio's build enables them)
            # and a path policy, as a registry in production asks for credentials.
            "quarkus.http.auth.basic": "true",
            "quarkus.security.users.embedded.enabled": "true",
            "quarkus.security.users.embedded.plain-text": "true",
            f"quarkus.security.users.embedded.users.{USER}": self.password,
            "quarkus.http.auth.permission.apis.paths": "/apis/*",
            "quarkus.http.auth.permission.apis.policy": "authenticated",
        }
        cmd = [java, *JVM_OPTS, *os.environ.get("SHAREHOST_REGISTRY_JVM_OPTS", "").split()]
        cmd += [f"-D{k}={v}" for k, v in props.items()]
        cmd += ["-jar", str(self.app / "quarkus-run.jar")]
        with open(self.log, "a") as f:
            f.write(f"===== dev/registry: starting Apicurio Registry {self.version} at "
                    f"{time.strftime('%Y-%m-%d %H:%M:%S')} =====\n")
        # Its own session and SIGHUP ignored (as setsid + nohup did): the registry outlives this call and its terminal.
        previous = signal.signal(signal.SIGHUP, signal.SIG_IGN)
        try:
            with open(self.log, "ab") as out:
                self.proc = subprocess.Popen(cmd, cwd=self.state, stdin=subprocess.DEVNULL, stdout=out,
                                             stderr=subprocess.STDOUT, start_new_session=True)
        finally:
            signal.signal(signal.SIGHUP, previous)
        tmp = self.state / f"registry.pid.{os.getpid()}"
        tmp.write_text(f"{self.proc.pid}\n")
        os.replace(tmp, self.pid_file)  # whole or absent, never half-written

    def await_answer(self, t0):
        """Waits until the registry answers its Confluent API; a JVM gone means it failed (its log says why)."""
        while not self.answers():
            self.proc.poll()
            if self.proc.returncode is not None:
                tail(self.log)
                raise Die(f"the registry exited during startup with status {self.proc.returncode} (log: {self.log})")
            if time.monotonic() - t0 >= self.start_timeout:
                tail(self.log)
                self.stop(self.proc.pid)
                raise Die(f"the registry did not answer {self.url()}/subjects within {self.start_timeout}s "
                          f"(REGISTRY_START_TIMEOUT; log: {self.log})")
            time.sleep(POLL_S)

    def stop(self, pid):
        """SIGTERM, then SIGKILL after REGISTRY_STOP_TIMEOUT; returns once the process and its ports are gone."""
        try:
            os.kill(pid, signal.SIGTERM)
        except OSError:
            pass
        if not wait_until(self.stop_timeout, self.gone, POLL_S):
            note(f"the registry (pid {pid}) did not stop within {self.stop_timeout}s, sending SIGKILL")
            try:
                os.kill(pid, signal.SIGKILL)
            except OSError:
                pass
            if not wait_until(self.stop_timeout, self.gone, POLL_S):
                raise Die(f"the registry (pid {pid}) survived SIGKILL for {self.stop_timeout}s")
        # A dying JVM loses its command line before the kernel closes its sockets: a prompt `up` would find them open.
        for port in (self.port, self.management_port, self.tls_port):
            if not wait_until(self.stop_timeout, lambda: not port_in_use(port, timeout=2), POLL_S):
                note(f"127.0.0.1:{port} still accepts connections {self.stop_timeout}s after the registry exited")

    def print_where(self):
        print(f"url: {self.url()}\nhttps url: {self.tls_url()}\nca: {self.tls / 'ca.crt'}\n"
              f"user: {USER}  password: {self.password}", flush=True)

    # --- commands ---

    def cmd_fetch(self, args):
        if args:
            raise Die(f"fetch takes no arguments (got {' '.join(args)})")
        self.ensure_app()
        return 0

    def cmd_up(self, args):
        if args:
            raise Die(f"up takes no arguments (got {' '.join(args)})")
        pid = self.pid()
        if pid is not None:
            wanted = self.port
            self.load_recorded()
            if not self.recorded.get("TLS_PORT"):
                raise Die(f"the registry in {self.state} was started by an older dev/registry (no credentials, no "
                          "https); run 'dev/registry down' first")
            if os.environ.get("REGISTRY_PORT") and wanted != self.port:
                raise Die(f"the registry already runs in {self.state} on port {self.port}, not {wanted}; run "
                          "'dev/registry down' first (or use another SHAREHOST_REGISTRY_DIR)")
            if not wait_until(self.start_timeout, lambda: self.answers() or self.gone(), POLL_S) or self.gone():
                raise Die(f"the registry (pid {pid}) runs but does not answer {self.url()}/subjects "
                          f"(log: {self.log}); 'dev/registry down' stops it")
            note(f"already running (pid {pid})")
            self.print_where()
            return 0
        java = find_java()
        self.ensure_app()
        for port, var in ((self.port, "REGISTRY_PORT"), (self.management_port, "REGISTRY_MANAGEMENT_PORT"),
                          (self.tls_port, "REGISTRY_TLS_PORT")):
            if port_in_use(port):
                raise Die(f"port 127.0.0.1:{port} is already in use (set {var} or free it)")
        t0 = time.monotonic()
        self.wipe_state()  # a dead registry's leftovers: the storage was in memory, nothing is lost
        self.launch(java)
        self.await_answer(t0)
        _, v = java_version(java)
        note(f"up in {time.monotonic() - t0:.1f}s: Apicurio Registry {self.version} in memory (Java {v}, "
             f"pid {self.proc.pid}), state {self.state}")
        self.print_where()
        return 0

    def cmd_down(self, args):
        if args:
            raise Die(f"down takes no arguments (got {' '.join(args)})")
        self.load_recorded()
        pid = self.pid()
        if pid is None:
            note("not running")
        else:
            self.stop(pid)
            note(f"stopped the registry (pid {pid})")
        self.wipe_state()
        return 0

    def cmd_status(self, args):
        if args:
            raise Die(f"status takes no arguments (got {' '.join(args)})")
        self.load_recorded()
        pid = self.pid()
        if pid is None:
            print("not running")
            return 3
        if not self.answers():
            print(f"running but not answering: pid {pid}, Apicurio Registry {self.version}, log {self.log}")
            return 4
        print(f"running: pid {pid}, Apicurio Registry {self.version} in memory, state {self.state}")
        self.print_where()
        return 0

    def cmd_url(self, args):
        if args:
            raise Die(f"url takes no arguments (got {' '.join(args)})")
        self.load_recorded()
        if self.pid() is None:
            print(f"{NAME}: not running (run dev/registry up)", file=sys.stderr)
            return 3
        print(self.url())
        return 0


def main(argv):
    """Runs one dev/registry command; returns its exit status (0 ok, 1 an error, 3/4 from status)."""
    cmd, args = (argv[0], argv[1:]) if argv else ("help", [])
    try:
        h = Harness()
        commands = {"fetch": h.cmd_fetch, "up": h.cmd_up, "down": h.cmd_down, "status": h.cmd_status,
                    "url": h.cmd_url}
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
    signal.signal(signal.SIGPIPE, signal.SIG_DFL)
    sys.exit(main(sys.argv[1:]))
