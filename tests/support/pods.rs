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
//!
//! Podman 4.3 plays no StatefulSet ("does not contain any supported kube kind"), and replaces
//! no single pod of a Deployment it played. [`render_pods`] therefore plays a workload as the
//! `kind: Pod` documents its controller would create from its template: a StatefulSet's as
//! `NAME-0`, `NAME-1`, ... (the names it keeps), a Deployment's under names of their own.
//! [`Played::replace`] does what the controller does when one goes: the old pod is killed
//! or stopped and removed, and a pod from the same template is played in its place, under the
//! same name for a StatefulSet and a new one for a Deployment, with new (empty) volumes for
//! its `emptyDir`s, as a new pod gets. The downward API's `metadata.name` (`fieldRef`) is
//! podman's own: the Pod document's name.

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::{Arc, Mutex};
use std::time::{Duration, SystemTime};

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

/// The base's documents as the kustomize component `deploy/kubernetes/NAME` changes them: the
/// documents its `$patch: delete` patches name removed, the files of its `resources` added.
/// Those are the only changes this reads (the components here make no others).
pub fn component_resources(name: &str) -> Vec<Value> {
    let dir = crate::repo_root().join("deploy/kubernetes").join(name);
    let component = yaml_docs(&dir.join("kustomization.yaml"));
    let component = &component[0];
    assert_eq!(
        component["kind"], "Component",
        "{name} is a kustomize component"
    );
    let mut docs = base_resources();
    for patch in component["patches"].as_array().into_iter().flatten() {
        let text = patch["patch"].as_str().expect("an inline patch");
        let target: Value = serde_yaml_ng::from_str(text).expect("a patch in YAML");
        assert_eq!(
            target["$patch"], "delete",
            "{name}: this test reads only `$patch: delete` patches"
        );
        let before = docs.len();
        docs.retain(|d| {
            !(d["kind"] == target["kind"] && d["metadata"]["name"] == target["metadata"]["name"])
        });
        assert_eq!(
            docs.len() + 1,
            before,
            "{name}: its patch deletes one document"
        );
    }
    for f in component["resources"].as_array().into_iter().flatten() {
        docs.extend(yaml_docs(
            &dir.join(f.as_str().expect("a resource file name")),
        ));
    }
    docs
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
    /// The workload's `terminationGracePeriodSeconds`.
    pub grace_seconds: u64,
    /// The workload's name after the prefix.
    pub deployment: String,
    /// Its replicas.
    pub replicas: u64,
    /// The container's name.
    pub container: String,
    /// The pods podman will run, in replica order.
    pub pods: Vec<String>,
    /// How a replaced pod is made ([`render_pods`] only).
    template: Option<Template>,
}

/// Which workload of `deploy/kubernetes` [`render_pods`] plays.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Workload {
    /// The base's Deployment: a replaced pod gets a new name.
    Deployment,
    /// The `statefulset` component's StatefulSet: a replaced pod keeps its name.
    StatefulSet,
}

/// A workload's pod template, made ready to play, and how its pods are named.
#[derive(Debug, Clone)]
struct Template {
    workload: Workload,
    /// The workload's name after the prefix.
    name: String,
    /// `metadata` and `spec` of the template, after [`adapt_pod`].
    metadata: Value,
    spec: Value,
    /// The documents a replacement is played with (ConfigMaps its volumes name).
    configmaps: Vec<Value>,
}

impl Template {
    /// The Pod document of the pod called `name`, its `emptyDir` volumes named with `suffix`
    /// (a new pod's are new and empty).
    fn pod(&self, name: &str, suffix: &str) -> Value {
        let mut spec = self.spec.clone();
        let mut fresh = Vec::new();
        for v in spec["volumes"].as_array_mut().into_iter().flatten() {
            if v.get("emptyDir").is_some() {
                let old = v["name"].as_str().expect("volume name").to_owned();
                v["name"] = json!(format!("{old}{suffix}"));
                fresh.push(old);
            }
        }
        for c in spec["containers"].as_array_mut().into_iter().flatten() {
            for m in c["volumeMounts"].as_array_mut().into_iter().flatten() {
                let old = m["name"].as_str().expect("mount name").to_owned();
                if fresh.contains(&old) {
                    m["name"] = json!(format!("{old}{suffix}"));
                }
            }
        }
        let mut metadata = self.metadata.clone();
        metadata["name"] = json!(name);
        json!({"apiVersion": "v1", "kind": "Pod", "metadata": metadata, "spec": spec})
    }

    /// The name of replica `i`'s pod; `generation` counts its replacements (0: the first).
    fn pod_name(&self, i: usize, generation: usize) -> String {
        match (self.workload, generation) {
            // A StatefulSet's pod is NAME-ORDINAL, whatever replaced it.
            (Workload::StatefulSet, _) | (Workload::Deployment, 0) => format!("{}-{i}", self.name),
            // A Deployment's replacement is a new pod with a name of its own.
            (Workload::Deployment, g) => format!("{}-{i}-r{g}", self.name),
        }
    }
}

/// Renders the base for a test: names prefixed with `prefix` (and every reference to them),
/// the manifest ConfigMap's `manifest.toml` and `trusted.pub` replaced, the pods on the
/// host's network (the broker listens on 127.0.0.1 and advertises that address), the image
/// from [`image`], and the `plugins` volume a host directory.
pub fn render(prefix: &str, manifest: &str, trusted: &str, plugins: &Path) -> Rendered {
    let mut docs = prepare(base_resources(), prefix, manifest, trusted);
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
    let container = adapt_pod(pod, prefix, plugins);
    let (secrets, docs) = docs.into_iter().partition(|d| d["kind"] == "Secret");
    Rendered {
        prefix: prefix.to_owned(),
        docs,
        secrets,
        grace_seconds,
        pods: (0..replicas)
            .map(|i| format!("{deployment}-pod-{i}"))
            .collect(),
        deployment,
        replicas,
        container,
        template: None,
    }
}

/// [`render`] for `workload`, played as the `kind: Pod` documents its controller would make
/// of its template (podman 4.3 has no StatefulSet, and replaces no single pod of a
/// Deployment): `NAME-0`, `NAME-1`, ... Their pods can then be replaced one at a time
/// ([`Played::replace`]).
pub fn render_pods(
    prefix: &str,
    workload: Workload,
    manifest: &str,
    trusted: &str,
    plugins: &Path,
) -> Rendered {
    let (kind, docs) = match workload {
        Workload::Deployment => ("Deployment", base_resources()),
        Workload::StatefulSet => ("StatefulSet", component_resources("statefulset")),
    };
    let docs = prepare(docs, prefix, manifest, trusted);
    let (mut found, mut docs): (Vec<Value>, Vec<Value>) =
        docs.into_iter().partition(|d| d["kind"] == kind);
    assert_eq!(found.len(), 1, "one {kind}");
    let mut wl = found.remove(0);
    let name = wl["metadata"]["name"].as_str().expect("name").to_owned();
    let replicas = wl["spec"]["replicas"].as_u64().unwrap_or(1);
    let mut template = wl["spec"]["template"].take();
    let grace_seconds = template["spec"]["terminationGracePeriodSeconds"]
        .as_u64()
        .expect("the workload sets terminationGracePeriodSeconds");
    let container = adapt_pod(&mut template["spec"], prefix, plugins);
    let template = Template {
        workload,
        name: name.clone(),
        metadata: template["metadata"].clone(),
        spec: template["spec"].clone(),
        configmaps: docs
            .iter()
            .filter(|d| d["kind"] == "ConfigMap")
            .cloned()
            .collect(),
    };
    let pods: Vec<String> = (0..usize::try_from(replicas).unwrap_or(1))
        .map(|i| template.pod_name(i, 0))
        .collect();
    // Each pod its own `emptyDir`s, as a kubelet gives them (podman's Deployment shares one
    // volume among its pods).
    docs.extend(
        pods.iter()
            .enumerate()
            .map(|(i, p)| template.pod(p, &format!("-p{i}"))),
    );
    let (secrets, docs) = docs.into_iter().partition(|d| d["kind"] == "Secret");
    Rendered {
        prefix: prefix.to_owned(),
        docs,
        secrets,
        grace_seconds,
        deployment: name,
        replicas,
        container,
        pods,
        template: Some(template),
    }
}

/// `docs` with the test's manifest and keys in the ConfigMap and every name prefixed.
fn prepare(mut docs: Vec<Value>, prefix: &str, manifest: &str, trusted: &str) -> Vec<Value> {
    let cm = find(&mut docs, "ConfigMap", "sharehost-manifest");
    cm["data"]["manifest.toml"] = json!(manifest);
    cm["data"]["trusted.pub"] = json!(trusted);
    for d in &mut docs {
        let name = format!(
            "{prefix}-{}",
            d["metadata"]["name"].as_str().expect("a name")
        );
        d["metadata"]["name"] = json!(name);
    }
    docs
}

/// Changes a pod spec the way a podman test must (the host's network, the image, the
/// plugins' host directory, prefixed names for the ConfigMaps, Secrets and `emptyDir`s, no
/// `ports`); returns the application container's name.
fn adapt_pod(pod: &mut Value, prefix: &str, plugins: &Path) -> String {
    let p = |n: &Value| format!("{prefix}-{}", n.as_str().expect("a name"));
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
    container
}

/// The volumes podman makes for `pod` (a pod spec): one per ConfigMap, named after it, and
/// one per `emptyDir`.
fn pod_volumes(pod: &Value) -> Vec<String> {
    pod["volumes"]
        .as_array()
        .into_iter()
        .flatten()
        .filter_map(|v| match v.get("configMap") {
            // A ConfigMap becomes a volume named after it.
            Some(cm) => cm["name"].as_str().map(str::to_owned),
            None if v.get("emptyDir").is_some() => v["name"].as_str().map(str::to_owned),
            None => None,
        })
        .collect()
}

/// A played set of resources; removed (pods, secrets, volumes) when dropped.
pub struct Played {
    file: PathBuf,
    prefix: String,
    secrets: Vec<String>,
    volumes: Vec<String>,
    /// The workload's `terminationGracePeriodSeconds`.
    pub grace_seconds: u64,
    /// Pod names, in replica order.
    pub pods: Vec<String>,
    /// Their application container's names.
    pub containers: Vec<String>,
    container: String,
    template: Option<Template>,
    /// Replacements played so far.
    replaced: usize,
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
        let mut volumes: Vec<String> = Vec::new();
        for d in &self.docs {
            let pod = match d["kind"].as_str() {
                Some("Deployment") => &d["spec"]["template"]["spec"],
                Some("Pod") => &d["spec"],
                _ => continue,
            };
            for v in pod_volumes(pod) {
                if !volumes.contains(&v) {
                    volumes.push(v);
                }
            }
        }
        let played = Played {
            file: file.clone(),
            prefix: self.prefix.clone(),
            secrets,
            volumes,
            grace_seconds: self.grace_seconds,
            pods: self.pods.clone(),
            containers: self
                .pods
                .iter()
                .map(|p| format!("{p}-{}", self.container))
                .collect(),
            container: self.container.clone(),
            template: self.template.clone(),
            replaced: 0,
        };
        podman_ok(&["kube", "play", &file.display().to_string()]);
        played
    }
}

/// How [`Played::end`] makes a pod go.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Ending {
    /// SIGKILL: the host leaves nothing in order, as when a grace period runs out, a pod is
    /// deleted by force or evicted without grace, or podman's `kube down` or `kube play
    /// --replace` stops it. Its groups keep it as a member until their session timeout.
    Killed,
    /// SIGTERM and the grace period, as the kubelet stops a deleted pod: the host drains and
    /// leaves its groups.
    Drained,
}

impl Played {
    /// Stops `pod` as the kubelet does when a pod is deleted: SIGTERM, then SIGKILL after the
    /// Deployment's grace period. Returns the application container's exit code.
    pub fn stop(&self, replica: usize) -> i64 {
        self.end(replica, Ending::Drained)
    }

    /// Makes `replica`'s pod go as `ending` says; returns its application container's exit
    /// code. The pod stays (its log can be read) until [`Played::replace`] or the end.
    pub fn end(&self, replica: usize, ending: Ending) -> i64 {
        match ending {
            Ending::Drained => {
                let grace = self.grace_seconds.to_string();
                podman_ok(&["pod", "stop", "--time", &grace, &self.pods[replica]]);
            }
            Ending::Killed => {
                podman_ok(&["kill", "--signal", "KILL", &self.containers[replica]]);
                podman_ok(&["wait", &self.containers[replica]]);
            }
        }
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

    /// What the workload's controller does once `replica`'s pod is gone ([`Played::end`]):
    /// the old pod removed, and a new pod from the same template played in its place (under
    /// the same name for a StatefulSet, a new one for a Deployment), with new, empty volumes
    /// for its `emptyDir`s. Only for [`render_pods`]. Returns when the new container started.
    pub fn replace(&mut self, replica: usize) -> SystemTime {
        let template = self
            .template
            .clone()
            .expect("a replaceable set of pods (render_pods)");
        podman_ok(&["pod", "rm", "--force", &self.pods[replica]]);
        self.replaced += 1;
        let name = template.pod_name(replica, self.replaced);
        let doc = template.pod(&name, &format!("-p{replica}-r{}", self.replaced));
        for v in pod_volumes(&doc["spec"]) {
            if !self.volumes.contains(&v) {
                self.volumes.push(v);
            }
        }
        let file = self
            .file
            .with_file_name(format!("replacement-{}.yaml", self.replaced));
        let text: Vec<String> = template
            .configmaps
            .iter()
            .chain([&doc])
            .map(Value::to_string)
            .collect();
        std::fs::write(&file, text.join("\n---\n")).expect("write the replacement");
        podman_ok(&["kube", "play", &file.display().to_string()]);
        self.containers[replica] = format!("{name}-{}", self.container);
        self.pods[replica] = name;
        self.started_at(replica)
    }

    /// When `replica`'s application container started, as podman recorded it.
    pub fn started_at(&self, replica: usize) -> SystemTime {
        let nanos: u64 = podman_ok(&[
            "inspect",
            "--format",
            "{{.State.StartedAt.UnixNano}}",
            &self.containers[replica],
        ])
        .trim()
        .parse()
        .expect("a start time");
        SystemTime::UNIX_EPOCH + Duration::from_nanos(nanos)
    }

    /// `podman kube down` on the played file (after [`Played::stop`], so every host drained);
    /// with pods played from a template, `podman pod rm` of each instead (the played file
    /// no longer names every pod once one was replaced).
    pub fn down(&self) {
        if self.template.is_some() {
            let mut args = vec!["pod", "rm", "--force"];
            args.extend(self.pods.iter().map(String::as_str));
            podman_ok(&args);
        } else {
            podman_ok(&["kube", "down", &self.file.display().to_string()]);
        }
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
