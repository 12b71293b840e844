//! The Kubernetes resources of `deploy/kubernetes` run for real with `podman kube play` on
//! this machine (tests/deploy.rs): loaded as kustomize would list them, changed only where a
//! podman test must (names, the broker's address, host networking, the plugins' volume), played,
//! watched through the containers' logs and stopped the way the kubelet stops a pod.
//!
//! What podman 4.3 (Debian 12's) does differently from a kubelet, and how this module answers:
//! - its `kube down` stops pods with a zero timeout (SIGTERM and SIGKILL at once), and its
//!   `kube play` gives every container a 10 s stop timeout whatever
//!   `terminationGracePeriodSeconds` says: pods are stopped with `podman pod stop --time
//!   GRACE`, GRACE read from the Deployment, before `kube down` removes them;
//! - it reads a Secret for `secretKeyRef` from a podman secret holding a flat JSON map of
//!   base64 values (a `kind: Secret` document in the played file is stored in a form it cannot
//!   read back): each Secret document becomes such a podman secret before the play;
//! - it turns an `emptyDir` into a named volume shared by every pod that names it, and a
//!   ConfigMap into a volume named after it, both left behind by `kube down`: volume names get
//!   the test's prefix and are removed at the end;
//! - it publishes every `containerPort`, which it refuses on the host's network: the
//!   container's `ports` are dropped (the test reaches the admin listener on loopback);
//! - probes become `curl` healthchecks run inside the container (the image has no shell and no
//!   curl, and no systemd here runs them): the test asks `/readyz` and `/healthz` itself, from
//!   outside, as a kubelet does.

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::{Arc, Mutex};

use base64::Engine as _;
use base64::prelude::BASE64_STANDARD;
use serde::Deserialize as _;
use serde_json::{Value, json};

use crate::host::{PATIENCE, Seen, Watch, follow_log, http_request};

/// The image `dev/image` builds (`SHAREHOST_IMAGE` names another).
pub fn image() -> String {
    std::env::var("SHAREHOST_IMAGE").unwrap_or_else(|_| "localhost/sharehost:dev".to_owned())
}

/// `podman` with the project's containers.conf, never this machine's own.
pub fn podman() -> Command {
    let mut c = Command::new("podman");
    c.env(
        "CONTAINERS_CONF",
        crate::repo_root().join("deploy/podman/containers.conf"),
    );
    c
}

/// Runs `podman ARGS`, fails the test with its output when it fails; returns stdout.
pub fn podman_ok(args: &[&str]) -> String {
    let out = podman()
        .args(args)
        .output()
        .unwrap_or_else(|e| panic!("run podman {args:?} (dev/kube-test installs it): {e}"));
    assert!(
        out.status.success(),
        "podman {args:?} failed: {}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).into_owned()
}

/// Every document of the files `deploy/kubernetes/kustomization.yaml` lists under
/// `resources`, in order, as JSON values.
pub fn base_resources() -> Vec<Value> {
    let dir = crate::repo_root().join("deploy/kubernetes");
    let kustomization = yaml_docs(&dir.join("kustomization.yaml"));
    let files: Vec<String> = kustomization[0]["resources"]
        .as_array()
        .expect("kustomization.yaml: resources is a list")
        .iter()
        .map(|f| f.as_str().expect("a resource file name").to_owned())
        .collect();
    files.iter().flat_map(|f| yaml_docs(&dir.join(f))).collect()
}

/// The YAML documents of `path` as JSON values (empty documents skipped).
pub fn yaml_docs(path: &Path) -> Vec<Value> {
    let text =
        std::fs::read_to_string(path).unwrap_or_else(|e| panic!("read {}: {e}", path.display()));
    serde_yaml_ng::Deserializer::from_str(&text)
        .map(|d| {
            Value::deserialize(d).unwrap_or_else(|e| panic!("{}: not YAML: {e}", path.display()))
        })
        .filter(|v| !v.is_null())
        .collect()
}

/// The document of `kind` named `name` in `docs`.
pub fn find<'a>(docs: &'a mut [Value], kind: &str, name: &str) -> &'a mut Value {
    docs.iter_mut()
        .find(|d| d["kind"] == kind && d["metadata"]["name"] == name)
        .unwrap_or_else(|| panic!("deploy/kubernetes has no {kind} named {name}"))
}

/// The base resources after the changes a podman test needs, ready to play.
pub struct Rendered {
    /// Every resource name carries this prefix, so tests run side by side.
    pub prefix: String,
    /// The documents to play (Secrets excluded: they become podman secrets).
    pub docs: Vec<Value>,
    /// The Secret documents.
    pub secrets: Vec<Value>,
    /// The Deployment's `terminationGracePeriodSeconds`.
    pub grace_seconds: u64,
    /// The Deployment's name after the prefix.
    pub deployment: String,
    /// Its replicas.
    pub replicas: u64,
    /// The container's name.
    pub container: String,
}

/// Renders the base for a test: names prefixed with `prefix` (and every reference to them),
/// the manifest ConfigMap's `manifest.toml` and `trusted.pub` replaced, the pods on the
/// host's network (the broker listens on 127.0.0.1 and advertises that address), the image
/// from [`image`], and the `plugins` volume a host directory.
pub fn render(prefix: &str, manifest: &str, trusted: &str, plugins: &Path) -> Rendered {
    let mut docs = base_resources();
    let p = |n: &Value| format!("{prefix}-{}", n.as_str().expect("a name"));
    let cm = find(&mut docs, "ConfigMap", "sharehost-manifest");
    cm["data"]["manifest.toml"] = json!(manifest);
    cm["data"]["trusted.pub"] = json!(trusted);
    for d in &mut docs {
        let name = p(&d["metadata"]["name"]);
        d["metadata"]["name"] = json!(name);
    }
    let dep = docs
        .iter_mut()
        .find(|d| d["kind"] == "Deployment")
        .expect("a Deployment");
    let deployment = dep["metadata"]["name"].as_str().expect("name").to_owned();
    let replicas = dep["spec"]["replicas"].as_u64().unwrap_or(1);
    let pod = &mut dep["spec"]["template"]["spec"];
    let grace_seconds = pod["terminationGracePeriodSeconds"]
        .as_u64()
        .expect("the Deployment sets terminationGracePeriodSeconds");
    pod["hostNetwork"] = json!(true);
    pod["dnsPolicy"] = json!("ClusterFirstWithHostNet");
    for v in pod["volumes"].as_array_mut().expect("volumes") {
        let original = v["name"].as_str().expect("volume name").to_owned();
        if let Some(cm) = v.get_mut("configMap") {
            cm["name"] = json!(p(&cm["name"]));
        }
        if original == "plugins" {
            *v = json!({"name": "plugins",
                        "hostPath": {"path": plugins.display().to_string(), "type": "Directory"}});
        } else if v.get("emptyDir").is_some() {
            v["name"] = json!(format!("{prefix}-{original}"));
        }
    }
    let renamed: Vec<String> = pod["volumes"]
        .as_array()
        .expect("volumes")
        .iter()
        .filter_map(|v| v["name"].as_str().map(str::to_owned))
        .collect();
    let containers = pod["containers"].as_array_mut().expect("containers");
    let container = containers[0]["name"].as_str().expect("name").to_owned();
    for c in containers {
        c["image"] = json!(image());
        // Podman publishes every containerPort, which it refuses on the host's network (a
        // kubelet only records them there); the probes that name the port are not run by it.
        if let Some(c) = c.as_object_mut() {
            c.remove("ports");
        }
        for e in c["env"].as_array_mut().into_iter().flatten() {
            if let Some(r) = e.pointer_mut("/valueFrom/secretKeyRef") {
                r["name"] = json!(p(&r["name"]));
            }
        }
        for m in c["volumeMounts"].as_array_mut().into_iter().flatten() {
            let prefixed = format!("{prefix}-{}", m["name"].as_str().expect("mount name"));
            if renamed.contains(&prefixed) {
                m["name"] = json!(prefixed);
            }
        }
    }
    let (secrets, docs) = docs.into_iter().partition(|d| d["kind"] == "Secret");
    Rendered {
        prefix: prefix.to_owned(),
        docs,
        secrets,
        grace_seconds,
        deployment,
        replicas,
        container,
    }
}

/// A played set of resources; removed (pods, secrets, volumes) when dropped.
pub struct Played {
    file: PathBuf,
    prefix: String,
    secrets: Vec<String>,
    volumes: Vec<String>,
    /// The Deployment's `terminationGracePeriodSeconds`.
    pub grace_seconds: u64,
    /// Pod names, in replica order.
    pub pods: Vec<String>,
    /// Their application container's names.
    pub containers: Vec<String>,
}

impl Rendered {
    /// Writes the documents to `dir/kube.yaml`, creates the Secrets as podman secrets and runs
    /// `podman kube play`.
    pub fn play(&self, dir: &Path) -> Played {
        let file = dir.join("kube.yaml");
        let text: Vec<String> = self.docs.iter().map(Value::to_string).collect();
        std::fs::write(&file, text.join("\n---\n")).expect("write kube.yaml");
        let mut secrets = Vec::new();
        for s in &self.secrets {
            let name = s["metadata"]["name"].as_str().expect("name").to_owned();
            let mut map = serde_json::Map::new();
            for (k, v) in s["stringData"].as_object().into_iter().flatten() {
                let v = v.as_str().expect("a string");
                map.insert(k.clone(), json!(BASE64_STANDARD.encode(v)));
            }
            for (k, v) in s["data"].as_object().into_iter().flatten() {
                map.insert(k.clone(), v.clone());
            }
            let path = dir.join(format!("{name}.json"));
            std::fs::write(&path, Value::Object(map).to_string()).expect("write secret");
            let _ = podman().args(["secret", "rm", &name]).output();
            podman_ok(&["secret", "create", &name, &path.display().to_string()]);
            secrets.push(name);
        }
        let volumes = self
            .docs
            .iter()
            .filter(|d| d["kind"] == "Deployment")
            .flat_map(|d| {
                d["spec"]["template"]["spec"]["volumes"]
                    .as_array()
                    .into_iter()
                    .flatten()
                    .filter_map(|v| match v.get("configMap") {
                        // A ConfigMap becomes a volume named after it.
                        Some(cm) => cm["name"].as_str().map(str::to_owned),
                        None if v.get("emptyDir").is_some() => {
                            v["name"].as_str().map(str::to_owned)
                        }
                        None => None,
                    })
                    .collect::<Vec<_>>()
            });
        let played = Played {
            file: file.clone(),
            prefix: self.prefix.clone(),
            secrets,
            volumes: volumes.collect(),
            grace_seconds: self.grace_seconds,
            pods: (0..self.replicas)
                .map(|i| format!("{}-pod-{i}", self.deployment))
                .collect(),
            containers: (0..self.replicas)
                .map(|i| format!("{}-pod-{i}-{}", self.deployment, self.container))
                .collect(),
        };
        podman_ok(&["kube", "play", &file.display().to_string()]);
        played
    }
}

impl Played {
    /// Stops `pod` as the kubelet does when a pod is deleted: SIGTERM, then SIGKILL after the
    /// Deployment's grace period. Returns the application container's exit code.
    pub fn stop(&self, replica: usize) -> i64 {
        let grace = self.grace_seconds.to_string();
        podman_ok(&["pod", "stop", "--time", &grace, &self.pods[replica]]);
        podman_ok(&[
            "inspect",
            "--format",
            "{{.State.ExitCode}}",
            &self.containers[replica],
        ])
        .trim()
        .parse()
        .expect("an exit code")
    }

    /// `podman kube down` on the played file (after [`Played::stop`], so every host drained).
    pub fn down(&self) {
        podman_ok(&["kube", "down", &self.file.display().to_string()]);
    }

    /// Where podman keeps the volume the Deployment calls `name` (an `emptyDir`), on this
    /// machine.
    pub fn volume_path(&self, name: &str) -> PathBuf {
        let volume = format!("{}-{name}", self.prefix);
        PathBuf::from(
            podman_ok(&["volume", "inspect", "--format", "{{.Mountpoint}}", &volume]).trim(),
        )
    }

    /// The process ids inside `replica`'s application container (`podman top`).
    pub fn pids(&self, replica: usize) -> Vec<String> {
        podman_ok(&["top", &self.containers[replica], "pid", "comm"])
            .lines()
            .skip(1)
            .map(|l| l.split_whitespace().collect::<Vec<_>>().join(" "))
            .collect()
    }

    /// Follows `replica`'s log (`podman logs -f`), tagging its lines with the prefix.
    pub fn follow(&self, replica: usize, watch: &Watch) -> PodLog {
        PodLog::follow(
            replica,
            &self.containers[replica],
            &format!("{}#{replica}", self.prefix),
            watch,
        )
    }
}

impl Drop for Played {
    fn drop(&mut self) {
        // Whatever the test's outcome: no pod, secret or volume of it stays behind.
        let _ = podman()
            .args(["pod", "rm", "--force"])
            .args(&self.pods)
            .output();
        let _ = podman().args(["secret", "rm"]).args(&self.secrets).output();
        let _ = podman()
            .args(["volume", "rm", "--force"])
            .args(&self.volumes)
            .output();
    }
}

/// A container's log, followed with `podman logs -f`: the ledger plugin's reports and the
/// admin address the host announced.
pub struct PodLog {
    /// Which replica of the Deployment it is.
    pub replica: usize,
    container: String,
    child: Child,
    seen: Arc<Mutex<Seen>>,
    log: Arc<Mutex<Vec<String>>>,
    admin: String,
    reader: Option<std::thread::JoinHandle<()>>,
}

impl PodLog {
    fn follow(replica: usize, container: &str, tag: &str, watch: &Watch) -> PodLog {
        // The host logs on stderr; podman keeps both streams and replays both from the start.
        let mut child = podman()
            .args(["logs", "-f", container])
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .expect("run podman logs");
        let stderr = child.stderr.take().expect("piped stderr");
        let stdout = child.stdout.take().expect("piped stdout");
        let (tx, rx) = std::sync::mpsc::channel();
        let seen: Arc<Mutex<Seen>> = Arc::default();
        let log: Arc<Mutex<Vec<String>>> = Arc::default();
        let reader = follow_log(stderr, tag, &seen, watch, &log, tx.clone());
        // The run summary goes to stdout: kept with the log lines.
        let out_log = follow_log(stdout, tag, &Arc::default(), &Watch::default(), &log, tx);
        drop(out_log);
        let admin = rx
            .recv_timeout(PATIENCE)
            .unwrap_or_else(|_| panic!("{container} never announced its admin address"));
        // Listening on every interface: reached on loopback (host network).
        let admin = admin.replace("0.0.0.0", "127.0.0.1");
        PodLog {
            replica,
            container: container.to_owned(),
            child,
            seen,
            log,
            admin,
            reader: Some(reader),
        }
    }

    /// The admin listener's address, reachable from this test.
    pub fn admin(&self) -> &str {
        &self.admin
    }

    /// One request to the admin listener (status 0 when nothing answers).
    pub fn http(&self, method: &str, path: &str) -> (u16, String) {
        http_request(&self.admin, method, path, "")
    }

    /// What the ledger plugin reported so far.
    pub fn seen(&self) -> Seen {
        self.seen.lock().unwrap_or_else(|p| p.into_inner()).clone()
    }

    /// The log lines so far (ledger reports excepted).
    pub fn lines(&self) -> Vec<String> {
        self.log.lock().unwrap_or_else(|p| p.into_inner()).clone()
    }

    /// Once the container has stopped: its whole log, read again from the start (`podman
    /// logs` without `-f`, which ends; podman 4.3's follower does not always see the exit).
    pub fn ended(mut self) -> (Seen, Vec<String>) {
        let _ = self.child.kill();
        let _ = self.child.wait();
        if let Some(r) = self.reader.take() {
            let _ = r.join();
        }
        let mut child = podman()
            .args(["logs", &self.container])
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .expect("run podman logs");
        let seen: Arc<Mutex<Seen>> = Arc::default();
        let log: Arc<Mutex<Vec<String>>> = Arc::default();
        let (tx, _rx) = std::sync::mpsc::channel();
        let quiet = Watch::default();
        let tag = format!("{} (after stop)", self.container);
        let readers = [
            follow_log(
                child.stderr.take().expect("piped"),
                &tag,
                &seen,
                &quiet,
                &log,
                tx.clone(),
            ),
            follow_log(
                child.stdout.take().expect("piped"),
                &tag,
                &Arc::default(),
                &quiet,
                &log,
                tx,
            ),
        ];
        let status = child.wait().expect("wait for podman logs");
        for r in readers {
            let _ = r.join();
        }
        assert!(status.success(), "podman logs {} failed", self.container);
        let seen = seen.lock().unwrap_or_else(|p| p.into_inner()).clone();
        let lines = log.lock().unwrap_or_else(|p| p.into_inner()).clone();
        (seen, lines)
    }
}

impl Drop for PodLog {
    fn drop(&mut self) {
        if let Ok(None) = self.child.try_wait() {
            let _ = self.child.kill();
            let _ = self.child.wait();
        }
    }
}
