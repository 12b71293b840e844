#!/usr/bin/env python3
"""Tests of dev/kafka_harness.py (dev/kafka's program), run by dev/test: standard library only, no broker, no java.

Fixtures in dev/testdata/kafka/: the server.properties of every node, sasl-ssl.env and client-sasl-ssl.properties for
a single node and a three-node cluster, with and without SASL_SSL, at base port 19292 and state dir /state, and
`dev/kafka help` with the default environment. They were written by the bash dev/kafka before it became a program,
so they hold the program to the files and the help the harness always wrote (the help has one line more since: the
SHAREHOST_MAVEN_URL the program added).

What needs a process (status, stop-broker, kill-broker, down) runs the program as its callers do (a subprocess through
dev/kafka, in a scratch state dir), against stand-in "nodes": sleeping Python processes whose command line names the
node's server.properties, which is how the harness recognises its JVMs. The jar download runs against a scratch Maven
repository (a file:// URL) with jars made here.
"""

import hashlib
import os
import pathlib
import signal
import socket
import subprocess
import sys
import tempfile
import unittest
from unittest import mock

DEV = pathlib.Path(__file__).resolve().parent
sys.path.insert(0, str(DEV))
import kafka_harness as kh  # noqa: E402

ENTRY = DEV / "kafka"
FIXTURES = DEV / "testdata" / "kafka"
PORTS = {"KAFKA_PORT": "19292", "KAFKA_CONTROLLER_PORT": "19293", "KAFKA_SASL_SSL_PORT": "19294"}


def shape(brokers=1, sasl=False):
    return kh.Shape(port=19292, controller_port=19293, sasl_ssl_port=19294, sasl_ssl=sasl, brokers=brokers)


def run(*args, state, extra=None, timeout=120):
    """dev/kafka ARGS on STATE, as a caller runs it."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("KAFKA_")}
    env.update(SHAREHOST_KAFKA_DIR=str(state), **(extra or {}))
    return subprocess.run([str(ENTRY), *args], capture_output=True, text=True, env=env, timeout=timeout)


class Scratch(unittest.TestCase):
    """A scratch directory per test, and the stand-in nodes started in it stopped at the end."""

    def setUp(self):
        self.tmp = pathlib.Path(tempfile.mkdtemp(prefix="kafka-harness-test-"))
        self.procs = []

    def tearDown(self):
        for p in self.procs:
            if p.poll() is None:
                p.kill()
            p.wait()
            if p.stdout is not None:
                p.stdout.close()
        subprocess.run(["rm", "-rf", str(self.tmp)], check=True)

    def fake_node(self, node_dir):
        """A process the harness takes for node NODE_DIR's JVM: its command line names the node's
        server.properties, and its pid is in the node's kafka.pid."""
        node_dir.mkdir(parents=True, exist_ok=True)
        (node_dir / "server.properties").write_text("# stand-in\n")
        p = subprocess.Popen(
            [sys.executable, "-c", "import time\nwhile True: time.sleep(60)", f"{node_dir}/server.properties"]
        )
        self.procs.append(p)
        (node_dir / "kafka.pid").write_text(f"{p.pid}\n")
        return p

    def fake_state(self, brokers=1, sasl=False, port=19292):
        """A state dir as `up` leaves it (marker, broker.env, a server.properties per node), no node running."""
        state = self.tmp / "state"
        state.mkdir()
        (state / ".sharehost-kafka").touch()
        s = kh.Shape(port=port, controller_port=port + 1, sasl_ssl_port=port + 2, sasl_ssl=sasl, brokers=brokers)
        (state / "broker.env").write_text(s.broker_env())
        for n in s.nodes():
            d = state if brokers == 1 else state / f"node-{n}"
            d.mkdir(exist_ok=True)
            (d / "server.properties").write_text("# stand-in\n")
        return state


class PortMath(unittest.TestCase):
    def test_node_n_listens_on_every_base_port_plus_ten_per_node(self):
        self.assertEqual([kh.node_port(19292, n) for n in (1, 2, 3)], [19292, 19302, 19312])
        self.assertEqual([kh.node_port(19293, n) for n in (1, 2, 3)], [19293, 19303, 19313])
        self.assertEqual(kh.proxied_port(19292, 2), 19307)
        self.assertEqual(kh.proxied_bind(19292, 2), 19308)

    def test_a_node_listens_on_the_sasl_ssl_port_only_with_sasl_ssl(self):
        self.assertEqual(shape(3).node_ports(3), [19312, 19313, 19318])
        self.assertEqual(shape(3, sasl=True).node_ports(3), [19312, 19313, 19318, 19314])

    def test_bootstrap_lists_every_node(self):
        self.assertEqual(shape(1).bootstrap(), "127.0.0.1:19292")
        self.assertEqual(shape(3).bootstrap(), "127.0.0.1:19292,127.0.0.1:19302,127.0.0.1:19312")
        self.assertEqual(shape(3, sasl=True).sasl_bootstrap(), "127.0.0.1:19294,127.0.0.1:19304,127.0.0.1:19314")

    def test_the_cluster_bootstrap_dev_lib_sh_computes_is_the_harness_own(self):
        out = subprocess.run(
            ["bash", "-c", f"source {DEV}/lib.sh && cluster_bootstrap 19392"], capture_output=True, text=True
        )
        self.assertEqual(out.stdout.strip(), kh.Shape(port=19392, brokers=3).bootstrap())

    def test_replication_is_three_at_most_and_min_isr_two_from_three(self):
        self.assertEqual([kh.replication(b) for b in (1, 2, 3, 5)], [1, 2, 3, 3])
        self.assertEqual([kh.min_isr(b) for b in (1, 2, 3, 5)], [1, 1, 2, 2])


class RenderedFiles(unittest.TestCase):
    """Every file `up` writes is byte for byte what the bash harness wrote."""

    def check_case(self, case, brokers, sasl):
        s = shape(brokers, sasl)
        state = pathlib.Path("/state")
        for n in s.nodes():
            node_dir = state if brokers == 1 else state / f"node-{n}"
            want = (FIXTURES / case / f"node-{n}.properties").read_text()
            self.assertEqual(kh.server_properties(s, n, state, node_dir), want, f"{case} node {n}")
        if sasl:
            self.assertEqual(kh.sasl_ssl_env(s, state), (FIXTURES / case / "sasl-ssl.env").read_text())
            self.assertEqual(
                kh.client_sasl_ssl_properties(state), (FIXTURES / case / "client-sasl-ssl.properties").read_text()
            )

    def test_single_node(self):
        self.check_case("single", 1, False)

    def test_single_node_with_sasl_ssl(self):
        self.check_case("single-sasl-ssl", 1, True)

    def test_cluster(self):
        self.check_case("cluster", 3, False)

    def test_cluster_with_sasl_ssl(self):
        self.check_case("cluster-sasl-ssl", 3, True)

    def test_proxied_env_names_node_one_pair(self):
        self.assertEqual(
            kh.proxied_env(shape(3)),
            "KAFKA_PROXIED_BOOTSTRAP=127.0.0.1:19297\nKAFKA_PROXIED_TARGET=127.0.0.1:19298\n",
        )

    def test_broker_env_round_trips_and_a_single_node_has_no_brokers_line(self):
        for s in (shape(1), shape(1, sasl=True), shape(3), shape(3, sasl=True)):
            text = s.broker_env()
            self.assertEqual(kh.shape_from_env_file(text), s)
            self.assertEqual("BROKERS=" in text, s.brokers != 1)
        self.assertEqual(
            shape(1, sasl=True).broker_env(),
            "KAFKA_VERSION=4.4.0\nPORT=19292\nCONTROLLER_PORT=19293\nSASL_SSL_PORT=19294\nSASL_SSL=1\n",
        )

    def test_a_broker_env_with_a_bad_node_count_is_one_node(self):
        self.assertEqual(kh.shape_from_env_file("PORT=1\nBROKERS=12\n").brokers, 1)
        self.assertEqual(kh.shape_from_env_file("PORT=1\n").brokers, 1)

    def test_cluster_ids_are_16_bytes_of_url_safe_base64_never_starting_with_a_dash(self):
        draws = iter([b"\xf8" + bytes(15), bytes(range(16))])  # the first encodes to "-A...", drawn again
        cid = kh.cluster_id(lambda n: next(draws))
        self.assertEqual(cid, "AAECAwQFBgcICQoLDA0ODw")
        self.assertRegex(kh.cluster_id(), r"^[A-Za-z0-9_][A-Za-z0-9_-]{21}$")


class Parsing(unittest.TestCase):
    def test_up_options(self):
        self.assertEqual(kh.parse_up_args([]), (1, False))
        self.assertEqual(kh.parse_up_args(["--brokers", "3", "--sasl-ssl"]), (3, True))
        self.assertEqual(kh.parse_up_args(["--sasl-ssl", "--brokers", "1"]), (1, True))
        for bad, msg in (
            (["--brokers"], "--brokers takes a node count from 1 to 9 (got '')"),
            (["--brokers", "10"], "--brokers takes a node count from 1 to 9 (got '10')"),
            (["--brokers", "0"], "--brokers takes a node count from 1 to 9 (got '0')"),
            (["--tls"], "unknown option for up: --tls (only --brokers N and --sasl-ssl)"),
        ):
            with self.assertRaises(kh.Die) as e:
                kh.parse_up_args(bad)
            self.assertEqual(str(e.exception), msg)

    def test_java_versions(self):
        self.assertEqual(kh.java_major('openjdk version "17.0.15" 2025-04-15\nOpenJDK Runtime'), (17, "17.0.15"))
        self.assertEqual(kh.java_major('Picked up JAVA_TOOL_OPTIONS: x\njava version "21" 2023-09-19'), (21, "21"))
        self.assertEqual(kh.java_major('java version "1.8.0_392"'), (8, "1.8.0_392"))
        self.assertEqual(kh.java_major("no java here"), (None, ""))

    DESCRIBE = (
        "Topic: t\tTopicId: abc\tPartitionCount: 3\tReplicationFactor: 3\tConfigs: min.insync.replicas=2\n"
        "\tTopic: t\tPartition: 0\tLeader: 2\tReplicas: 2,3,1\tIsr: 2,3,1\tElr: \tLastKnownElr: \n"
        "\tTopic: t\tPartition: 1\tLeader: none\tReplicas: 3,1,2\tIsr: 3\tElr: \tLastKnownElr: \n"
        "\tTopic: t\tPartition: 10\tLeader: 1\tReplicas: 1,2,3\tIsr: 1,2\tElr: \tLastKnownElr: \n"
    )

    def test_a_partition_leader_replicas_and_isr(self):
        self.assertEqual(kh.parse_partition(self.DESCRIBE, "0"), ("2", "2,3,1", "2,3,1"))
        self.assertEqual(kh.parse_partition(self.DESCRIBE, "1"), ("-1", "3,1,2", "3"))
        self.assertEqual(kh.parse_partition(self.DESCRIBE, "10"), ("1", "1,2,3", "1,2"))
        self.assertIsNone(kh.parse_partition(self.DESCRIBE, "2"))

    def test_share_version_from_feature_describe(self):
        features = (
            "Feature: kraft.version\tSupportedMinVersion: 0\tSupportedMaxVersion: 1\tFinalizedVersionLevel: 1\t\n"
            "Feature: share.version\tSupportedMinVersion: 0\tSupportedMaxVersion: 2\tFinalizedVersionLevel: 2\t\n"
        )
        self.assertEqual(kh.share_version(features), "2")
        self.assertIsNone(kh.share_version(features.splitlines()[0]))


class Jars(Scratch):
    def test_the_pinned_list_is_kafka_4_4_0_with_log4j_2_25_5(self):
        jars = kh.pinned_jars("4.4.0", "2.25.5")
        self.assertIsNotNone(jars)
        coords = {f"{j.group}:{j.artifact}:{j.version}" for j in jars.jars}
        self.assertEqual(len(coords), len(jars.jars))
        self.assertEqual(len(jars.jars), 93)
        for want in (
            "org.apache.kafka:kafka_2.13:4.4.0",
            "org.apache.kafka:kafka-tools:4.4.0",
            "org.apache.kafka:kafka-server:4.4.0",
            "org.apache.logging.log4j:log4j-slf4j-impl:2.25.5",
            "org.apache.logging.log4j:log4j-core:2.25.5",
            "org.apache.logging.log4j:log4j-api:2.25.5",
            "org.apache.logging.log4j:log4j-1.2-api:2.25.5",
            "org.slf4j:slf4j-api:1.7.36",
        ):
            self.assertIn(want, coords)
        self.assertEqual(len({j.file_name() for j in jars.jars}), 93, "two jars would share a file name in lib/")

    def test_another_version_has_no_pinned_list(self):
        self.assertIsNone(kh.pinned_jars("4.2.1", "2.25.5"))
        self.assertIsNone(kh.pinned_jars("4.4.0", "2.24.3"))

    def test_urls_follow_maven_central_layout(self):
        jar = kh.Jar("org.apache.kafka", "kafka_2.13", "4.4.0", "0" * 64)
        self.assertEqual(
            jar.url("https://repo1.maven.org/maven2/"),
            "https://repo1.maven.org/maven2/org/apache/kafka/kafka_2.13/4.4.0/kafka_2.13-4.4.0.jar",
        )

    def test_a_malformed_list_is_refused_naming_the_line(self):
        for text, where in (
            ("kafka 4.4.0\n", "x:1:"),
            ("kafka 4.4.0 log4j 2.25.5\na:b:c 1234\n", "x:2:"),
            ("kafka 4.4.0 log4j 2.25.5\na:b " + "0" * 64 + "\n", "x:2:"),
            ("# only a comment\n", "x: no"),
        ):
            with self.assertRaises(kh.Die) as e:
                kh.parse_jar_list(text, "x")
            self.assertIn(where, str(e.exception))

    def repo_with(self, jars):
        """A scratch Maven repository holding JARS ({coordinates: content}); returns its URL and a JarList."""
        repo = self.tmp / "repo"
        listed = []
        for coords, content in jars.items():
            g, a, v = coords.split(":")
            jar = kh.Jar(g, a, v, hashlib.sha256(content).hexdigest())
            path = repo / g.replace(".", "/") / a / v / jar.file_name()
            path.parent.mkdir(parents=True)
            path.write_bytes(content)
            listed.append(jar)
        return repo.as_uri(), kh.JarList("9.9.9", "2.25.5", listed)

    def test_pinned_jars_are_fetched_and_checked(self):
        url, jars = self.repo_with({"org.example:one:1.0": b"one" * 1000, "org.example.deep:two:2.0": b"two"})
        lib = self.tmp / "lib"
        self.assertEqual(kh.fetch_pinned(jars, url, lib), 3003)
        self.assertEqual(sorted(p.name for p in lib.iterdir()), ["one-1.0.jar", "two-2.0.jar"])
        self.assertEqual((lib / "two-2.0.jar").read_bytes(), b"two")

    def test_a_jar_with_another_checksum_is_refused_and_not_kept(self):
        url, jars = self.repo_with({"org.example:one:1.0": b"one"})
        jars.jars[0].sha256 = hashlib.sha256(b"not one").hexdigest()
        lib = self.tmp / "lib"
        with self.assertRaises(kh.Die) as e:
            kh.fetch_pinned(jars, url, lib)
        self.assertIn(f"one-1.0.jar from {url}/org/example/one/1.0/one-1.0.jar has SHA-256", str(e.exception))
        self.assertIn(f"expected {jars.jars[0].sha256}", str(e.exception))
        self.assertEqual(list(lib.iterdir()), [])

    def test_a_missing_jar_is_refused_naming_its_url(self):
        url, jars = self.repo_with({})
        jars.jars.append(kh.Jar("org.example", "gone", "1.0", "0" * 64))
        with self.assertRaises(kh.Die) as e:
            kh.fetch_pinned(jars, url, self.tmp / "lib")
        self.assertIn(f"cannot fetch {url}/org/example/gone/1.0/gone-1.0.jar", str(e.exception))

    def test_the_cache_is_filled_once_and_a_failed_fetch_leaves_no_stamp(self):
        url, good = self.repo_with({"org.example:one:1.0": b"one"})
        bad = kh.JarList(good.kafka, good.log4j, [kh.Jar("org.example", "one", "1.0", "f" * 64)])
        env = {"SHAREHOST_CACHE": str(self.tmp / "cache"), "KAFKA_VERSION": "9.9.9", "SHAREHOST_MAVEN_URL": url}
        with mock.patch.dict(os.environ, env), mock.patch("sys.stdout"):
            h = kh.Harness()
            with mock.patch.object(kh, "pinned_jars", return_value=bad):
                with self.assertRaises(kh.Die):
                    h.ensure_lib()
            self.assertFalse(h.stamp.exists())
            self.assertFalse(h.lib.exists())
            with mock.patch.object(kh, "pinned_jars", return_value=good):
                h.ensure_lib()
            self.assertTrue(h.stamp.is_file())
            self.assertEqual([p.name for p in h.lib.iterdir()], ["one-1.0.jar"])
            self.assertIn("kafka.server.KafkaRaftServer", h.log4j_conf.read_text())
            # Once stamped, nothing is fetched again (a fetch would find no list and no repository).
            with mock.patch.object(kh, "pinned_jars", side_effect=AssertionError("fetched again")):
                h.ensure_lib()


class CommandLine(Scratch):
    def test_help_is_what_the_bash_harness_printed(self):
        for args in ([], ["help"], ["-h"], ["--help"]):
            out = run(*args, state="/state")
            self.assertEqual(out.returncode, 0)
            self.assertEqual(out.stdout, (FIXTURES / "help.txt").read_text())

    def test_an_unknown_command_prints_the_usage_and_fails(self):
        out = run("bogus", state=self.tmp / "s")
        self.assertEqual(out.returncode, 1)
        self.assertTrue(out.stderr.startswith("usage: dev/kafka COMMAND"))
        self.assertTrue(out.stderr.endswith("dev/kafka: error: unknown command: bogus\n"))

    def test_usage_errors_exit_1_before_anything_runs(self):
        for args, msg in (
            (["up", "--brokers", "x"], "--brokers takes a node count from 1 to 9 (got 'x')"),
            (["tool"], "usage: dev/kafka tool CLASS [ARGS...]"),
            (["fetch", "now"], "fetch takes no arguments (got now)"),
            (["create-topic"], "usage: dev/kafka create-topic NAME [PARTITIONS]"),
            (["share-earliest"], "usage: dev/kafka share-earliest GROUP"),
            (["leader", "t"], "usage: dev/kafka leader TOPIC PARTITION"),
            (["move-leader", "t", "x", "1"], "partition must be a number (got 'x')"),
            (["move-leader", "t", "0", "n"], "node must be a node id (got 'n')"),
        ):
            out = run(*args, state=self.tmp / "s")
            self.assertEqual((out.returncode, out.stderr), (1, f"dev/kafka: error: {msg}\n"), args)

    def test_a_port_that_is_no_number_is_refused_naming_the_variable(self):
        out = run("status", state=self.tmp / "s", extra={"KAFKA_PORT": "90x"})
        self.assertEqual(out.returncode, 1)
        self.assertEqual(out.stderr, "dev/kafka: error: KAFKA_PORT must be a whole number (got '90x')\n")


class Status(Scratch):
    def test_no_state_is_not_running_exit_3(self):
        out = run("status", state=self.tmp / "none")
        self.assertEqual((out.returncode, out.stdout), (3, "not running\n"))

    def test_a_stopped_node_state_is_kept_exit_3(self):
        state = self.fake_state()
        out = run("status", state=state)
        self.assertEqual(out.returncode, 3)
        self.assertEqual(
            out.stdout, f"not running (stopped broker state kept in {state}; 'dev/kafka start-broker' resumes it)\n"
        )

    def test_a_running_node_is_shown_with_its_pid_version_and_addresses(self):
        state = self.fake_state(sasl=True)
        node = self.fake_node(state)
        out = run("status", state=state, extra=PORTS | {"KAFKA_PORT": "1"})  # the state's ports win over the env
        self.assertEqual(out.returncode, 0, out.stderr)
        self.assertEqual(
            out.stdout.splitlines(),
            [
                f"running: pid {node.pid}, Kafka 4.4.0, state {state}",
                "bootstrap: 127.0.0.1:19292",
                "sasl_ssl bootstrap: 127.0.0.1:19294  (PLAIN, SCRAM-SHA-256, SCRAM-SHA-512; user alice / alice-secret)",
                f"ca: {state}/tls/ca.crt   env: {state}/sasl-ssl.env   java client config: "
                f"{state}/client-sasl-ssl.properties",
            ],
        )

    def test_a_pid_file_naming_another_process_is_not_a_running_node(self):
        state = self.fake_state()
        (state / "kafka.pid").write_text(f"{os.getpid()}\n")
        self.assertEqual(run("status", state=state).returncode, 3)

    def test_a_cluster_with_a_node_down_exit_4(self):
        state = self.fake_state(brokers=3, port=19392)
        one = self.fake_node(state / "node-1")
        three = self.fake_node(state / "node-3")
        out = run("status", state=state)
        self.assertEqual(out.returncode, 4, out.stderr)
        self.assertEqual(
            out.stdout.splitlines(),
            [
                f"running: 2 of 3 nodes, Kafka 4.4.0, state {state}",
                f"node 1: pid {one.pid}, 127.0.0.1:19392 (controller :19393)",
                "node 2: stopped (127.0.0.1:19402; 'dev/kafka start-broker 2' resumes it)",
                f"node 3: pid {three.pid}, 127.0.0.1:19412 (controller :19413)",
                "bootstrap: 127.0.0.1:19392,127.0.0.1:19402,127.0.0.1:19412",
            ],
        )
        self.fake_node(state / "node-2")
        self.assertEqual(run("status", state=state).returncode, 0)

    def test_a_cluster_with_every_node_down_exit_3(self):
        state = self.fake_state(brokers=3)
        out = run("status", state=state)
        self.assertEqual(out.returncode, 3)
        self.assertEqual(
            out.stdout, f"not running (3 stopped nodes kept in {state}; 'dev/kafka start-broker N' resumes node N)\n"
        )


class Stopping(Scratch):
    """stop-broker, kill-broker and down on stand-in nodes: each waits for the process to be gone."""

    def free_base(self):
        """A base port whose node ports nobody listens on (the waits for closed ports then return at once)."""
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            return s.getsockname()[1]

    def test_stop_broker_sigterms_the_node_and_keeps_its_data(self):
        state = self.fake_state(port=self.free_base())
        node = self.fake_node(state)
        out = run("stop-broker", state=state)
        self.assertEqual(out.returncode, 0, out.stderr)
        self.assertEqual(node.wait(), -signal.SIGTERM)
        self.assertRegex(out.stdout, rf"^dev/kafka: broker \(pid {node.pid}\) stopped with SIGTERM in \d+s; data kept")
        self.assertTrue((state / "server.properties").is_file())
        self.assertEqual(run("stop-broker", state=state).stdout, "dev/kafka: broker not running\n")

    def test_a_node_that_ignores_sigterm_gets_sigkill_after_the_stop_timeout(self):
        state = self.fake_state(port=self.free_base())
        (state / "server.properties").write_text("# stand-in\n")
        node = subprocess.Popen(
            [sys.executable, "-c",
             "import signal, sys, time\nsignal.signal(signal.SIGTERM, signal.SIG_IGN)\nprint('ready', flush=True)\n"
             "while True: time.sleep(60)", f"{state}/server.properties"],
            stdout=subprocess.PIPE, text=True,
        )
        self.procs.append(node)
        self.assertEqual(node.stdout.readline(), "ready\n")  # SIGTERM is ignored from here on
        (state / "kafka.pid").write_text(f"{node.pid}\n")
        out = run("stop-broker", state=state, extra={"KAFKA_STOP_TIMEOUT": "1"})
        self.assertEqual(out.returncode, 0, out.stderr)
        self.assertEqual(node.wait(), -signal.SIGKILL)
        self.assertIn(f"broker (pid {node.pid}) did not stop within 1s, sending SIGKILL", out.stdout)

    def test_kill_broker_n_sigkills_that_node_only(self):
        state = self.fake_state(brokers=3, port=self.free_base())
        nodes = [self.fake_node(state / f"node-{n}") for n in (1, 2, 3)]
        out = run("kill-broker", "2", state=state)
        self.assertEqual(out.returncode, 0, out.stderr)
        self.assertEqual(nodes[1].wait(), -signal.SIGKILL)
        self.assertIsNone(nodes[0].poll())
        self.assertIsNone(nodes[2].poll())
        self.assertIn(f"node 2 (pid {nodes[1].pid}) stopped with SIGKILL", out.stdout)
        self.assertEqual(run("status", state=state).returncode, 4)

    def test_a_node_that_is_not_in_the_state_is_refused(self):
        state = self.fake_state(brokers=3)
        for arg in ("4", "0", "x"):
            out = run("stop-broker", arg, state=state)
            self.assertEqual(
                (out.returncode, out.stderr), (1, f"dev/kafka: error: no node '{arg}' in {state}: its nodes are 1..3\n")
            )

    def test_down_stops_every_node_and_deletes_the_state(self):
        state = self.fake_state(brokers=3, port=self.free_base())
        nodes = [self.fake_node(state / f"node-{n}") for n in (1, 2, 3)]
        out = run("down", state=state)
        self.assertEqual(out.returncode, 0, out.stderr)
        self.assertEqual([p.wait() for p in nodes], [-signal.SIGTERM] * 3)
        self.assertFalse(state.exists())
        self.assertEqual(run("down", state=state).stdout, "dev/kafka: not running\n")

    def test_down_refuses_a_directory_it_did_not_make(self):
        state = self.tmp / "precious"
        state.mkdir()
        (state / "thesis.tex").write_text("years of work")
        out = run("down", state=state)
        self.assertEqual(out.returncode, 1)
        self.assertIn(f"refusing to delete {state}: it was not created by dev/kafka", out.stderr)
        self.assertTrue((state / "thesis.tex").is_file())

    def test_commands_that_need_a_broker_say_it_does_not_run(self):
        state = self.fake_state()
        out = run("create-topic", "t", state=state)
        self.assertEqual(out.returncode, 1)
        self.assertEqual(out.stderr, "dev/kafka: error: Kafka is not running (run dev/kafka up)\n")


if __name__ == "__main__":
    unittest.main()
