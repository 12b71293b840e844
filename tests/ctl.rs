//! `sharehost ctl` through the binary against a stub admin server: each command sends the
//! request the admin API expects (method, path, JSON body and content type, bearer token),
//! renders the answer as a table or unchanged JSON, and turns an error answer (plain text or
//! JSON `error`) into a non-zero exit that says what the host answered. No broker is needed.

use std::sync::{Arc, Mutex};

use axum::body::Bytes;
use axum::http::{HeaderMap, Method, StatusCode, Uri};
use axum::response::{IntoResponse, Response};
use serde_json::{Value, json};

/// One request the stub saw.
#[derive(Debug, Clone)]
struct Seen {
    method: String,
    path: String,
    auth: Option<String>,
    content_type: Option<String>,
    body: Option<Value>,
}

type Log = Arc<Mutex<Vec<Seen>>>;

fn sha(c: char) -> String {
    std::iter::repeat_n(c, 64).collect()
}

/// A shadow as `GET /pipelines` shows it (rollout.rs `ShadowStatus`).
fn shadow_status() -> Value {
    json!({
        "candidate": sha('c'), "path": "/srv/cand.wasm", "sample": 0.5, "batches": 4,
        "records": 400, "agreed": { "accept": 390, "reject": 5 },
        "disagreed": { "accept→reject": 5 }, "faults": 1, "dropped_batches": 0,
        "dropped_records": 0, "us_per_record": 12.5,
        "first_disagreements": [{ "topic": "orders", "partition": 2, "offset": 17,
                                  "active": "accept", "candidate": "reject: too big" }],
    })
}

/// A canary as `GET /pipelines` shows it (rollout.rs `CanaryStatus`).
fn canary_status() -> Value {
    json!({
        "candidate": sha('e'), "path": "/srv/canary.wasm", "percent": 10.0, "state": "running",
        "reason": null, "seconds": 42,
        "candidate_tally": { "batches": 4, "faulted_batches": 0, "records": 400,
                             "rejected": 8, "released": 0 },
        "active_tally": { "batches": 36, "faulted_batches": 0, "records": 3600,
                          "rejected": 36, "released": 0 },
        "promote_after": { "batches": 100, "seconds": null },
        "rollback_if": { "max_fault_rate": 0.0, "max_reject_rate_increase": 0.05,
                         "max_release_rate_increase": 0.05 },
    })
}

/// The stub's answers: a realistic status for every endpoint, and errors for pipeline `bad`
/// (JSON error), `plain` (plain-text error) and anything `POST`ed without the token `t0k`.
async fn answer(method: Method, uri: Uri, headers: HeaderMap, body: Bytes, log: Log) -> Response {
    let auth = headers
        .get("authorization")
        .and_then(|v| v.to_str().ok())
        .map(str::to_owned);
    let path = uri.path().to_owned();
    log.lock().expect("log").push(Seen {
        method: method.to_string(),
        path: path.clone(),
        auth: auth.clone(),
        content_type: headers
            .get("content-type")
            .and_then(|v| v.to_str().ok())
            .map(str::to_owned),
        body: serde_json::from_slice(&body).ok(),
    });
    if method != Method::GET && auth.as_deref() != Some("Bearer t0k") {
        return (
            StatusCode::UNAUTHORIZED,
            "a valid bearer token is required\n",
        )
            .into_response();
    }
    let parts: Vec<&str> = path.trim_start_matches('/').split('/').collect();
    match (method.as_str(), parts.as_slice()) {
        ("GET", ["pipelines"]) => axum::Json(json!([{
            "name": "orders", "state": "running", "active_version": sha('a'),
            "component": "/srv/orders.wasm",
            "versions": { sha('a'): { "accepted": 120, "rejected": 3, "released": 1,
                                      "faults": 0, "batches": 7 },
                          sha('b'): { "accepted": 5, "rejected": 0, "released": 0,
                                      "faults": 2, "batches": 2 } },
            "dead_lettered": 3, "in_flight": 17, "last_swap_error": null,
            "signer": null, "shadow": shadow_status(), "canary": canary_status(),
        }, {
            "name": "idle", "state": "running", "active_version": sha('f'),
            "component": "/srv/idle.wasm", "versions": {}, "dead_lettered": 0, "in_flight": 0,
            "last_swap_error": "component /srv/x.wasm: no signature", "signer": "RWQf6LRC",
            "shadow": null, "canary": null,
        }]))
        .into_response(),
        ("GET", ["pipelines", "orders", "versions"]) => axum::Json(json!({
            "active": sha('a'),
            "versions": [
                { "hash": sha('a'), "path": "/srv/orders.wasm", "signer": "RWQf6LRC",
                  "loaded_at_ms": 1_700_000_000_000i64, "active": true,
                  "counters": { "accepted": 120, "rejected": 3, "released": 1, "faults": 0, "batches": 7 } },
                { "hash": sha('b'), "path": "/srv/orders-old.wasm", "signer": null,
                  "loaded_at_ms": 1_699_999_000_000i64, "active": false,
                  "counters": { "accepted": 5, "rejected": 0, "released": 0, "faults": 2, "batches": 2 } },
            ]
        }))
        .into_response(),
        (_, ["pipelines", "bad", ..]) => (
            StatusCode::UNPROCESSABLE_ENTITY,
            axum::Json(json!({ "pipeline": "bad", "error": "component x.wasm: bad signature" })),
        )
            .into_response(),
        (_, ["pipelines", "plain", ..]) => {
            (StatusCode::NOT_FOUND, "no pipeline named \"plain\"\n").into_response()
        }
        ("POST", ["pipelines", name, "swap" | "rollback"]) => {
            axum::Json(json!({ "pipeline": name, "active_version": sha('d') })).into_response()
        }
        ("POST", ["pipelines", name, "shadow" | "canary"]) => {
            axum::Json(json!({ "pipeline": name, "candidate": sha('e') })).into_response()
        }
        ("POST", ["pipelines", name, "promote"]) => {
            axum::Json(json!({ "pipeline": name, "active_version": sha('e') })).into_response()
        }
        ("DELETE", ["pipelines", name, "shadow"]) => {
            axum::Json(json!({ "pipeline": name, "shadow": shadow_status() })).into_response()
        }
        ("DELETE", ["pipelines", name, "canary"]) => {
            axum::Json(json!({ "pipeline": name, "active_version": sha('a') })).into_response()
        }
        _ => (StatusCode::NOT_FOUND, "no such endpoint\n").into_response(),
    }
}

/// Starts the stub on an ephemeral loopback port; returns its URL and what it saw.
async fn stub() -> (String, Log) {
    let log: Log = Arc::default();
    let l = log.clone();
    let app = axum::Router::new().fallback(
        move |method: Method, uri: Uri, headers: HeaderMap, body: Bytes| {
            answer(method, uri, headers, body, l.clone())
        },
    );
    let addr = sharehost_tests::serve_on_loopback(app).await;
    (format!("http://{addr}"), log)
}

/// Runs `sharehost ctl ARGS...` with `SHAREHOST_TEST_TOKEN=t0k` in its environment (and no
/// `SHAREHOST_ADMIN`); returns success, stdout and stderr.
async fn ctl_bare(args: &[&str]) -> (bool, String, String) {
    let mut cmd = std::process::Command::new(sharehost_tests::sharehost_bin!());
    cmd.arg("ctl").args(args).env_remove("SHAREHOST_ADMIN");
    run_ctl(cmd).await
}

/// Runs `sharehost ctl --admin URL ARGS...` with `SHAREHOST_TEST_TOKEN=t0k` in its
/// environment; returns success, stdout and stderr.
async fn ctl(url: &str, args: &[&str]) -> (bool, String, String) {
    let mut cmd = std::process::Command::new(sharehost_tests::sharehost_bin!());
    cmd.args(["ctl", "--admin", url]).args(args);
    run_ctl(cmd).await
}

/// Runs a `sharehost ctl` command line with the test token in its environment.
async fn run_ctl(mut cmd: std::process::Command) -> (bool, String, String) {
    cmd.env("SHAREHOST_TEST_TOKEN", "t0k");
    let out = sharehost_tests::blocking(move || cmd.output())
        .await
        .expect("run sharehost ctl");
    (
        out.status.success(),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

const TOKEN: [&str; 2] = ["--token-env", "SHAREHOST_TEST_TOKEN"];

fn last(log: &Log) -> Seen {
    log.lock().expect("log").last().cloned().expect("a request")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn pipelines_and_versions_are_tables_and_json_is_the_answer_unchanged() {
    let (url, log) = stub().await;
    let (ok, out, err) = ctl(&url, &["pipelines"]).await;
    assert!(ok, "{err}");
    let seen = last(&log);
    assert_eq!(
        (seen.method.as_str(), seen.path.as_str()),
        ("GET", "/pipelines")
    );
    assert_eq!(seen.auth, None, "no token unless --token-env");
    let lines: Vec<&str> = out.lines().collect();
    assert!(
        lines[0].starts_with("PIPELINE") && lines[0].contains("ACCEPTED"),
        "{out}"
    );
    // The active version's counters, not the sum over versions.
    let row: Vec<&str> = lines[1].split_whitespace().collect();
    assert_eq!(
        row,
        [
            "orders",
            "running",
            "aaaaaaaaaaaa",
            "120",
            "3",
            "1",
            "0",
            "3",
            "17",
            "/srv/orders.wasm"
        ],
        "{out}"
    );
    let block: Vec<&str> = lines[2..lines.len() - 3].to_vec();
    assert_eq!(
        block,
        [
            "  shadow: candidate cccccccccccc (/srv/cand.wasm), sample 0.5",
            "    compared 400 records in 4 batches; candidate faults 1; dropped 0 batches (0 records); 12.5 us/record",
            "    agreed: accept 390, reject 5",
            "    disagreed: accept→reject 5",
            "    first disagreements:",
            "      orders/2/17: active accept, candidate reject: too big",
            "  canary: candidate eeeeeeeeeeee (/srv/canary.wasm), 10.0% of batches, running after 42 s",
            "    candidate: 4 batches (0 faulted), 400 records, rejected 8 (2.0%), released 0 (0.0%)",
            "    active:    36 batches (0 faulted), 3600 records, rejected 36 (1.0%), released 0 (0.0%)",
            "    promote after: 100 batches or - s; roll back if fault rate > 0.0, reject rate +0.05, release rate +0.05",
        ],
        "{out}"
    );
    // A pipeline without counters, shadow or canary: dashes, and its signer and swap error.
    let idle: Vec<&str> = lines[lines.len() - 3].split_whitespace().collect();
    assert_eq!(
        idle,
        [
            "idle",
            "running",
            "ffffffffffff",
            "-",
            "-",
            "-",
            "-",
            "0",
            "0",
            "/srv/idle.wasm"
        ],
        "{out}"
    );
    assert_eq!(lines[lines.len() - 2], "  signer: RWQf6LRC");
    assert_eq!(
        lines[lines.len() - 1],
        "  last_swap_error: component /srv/x.wasm: no signature"
    );

    let (ok, out, err) = ctl(&url, &["pipelines", "--json"]).await;
    assert!(ok, "{err}");
    let v: Value = serde_json::from_str(&out).expect("--json prints JSON");
    assert_eq!(v[0]["versions"][sha('b')]["faults"], 2);

    let (ok, out, err) = ctl(&url, &["versions", "orders"]).await;
    assert!(ok, "{err}");
    assert_eq!(last(&log).path, "/pipelines/orders/versions");
    let lines: Vec<&str> = out.lines().collect();
    assert_eq!(lines[0], "pipeline orders: active aaaaaaaaaaaa", "{out}");
    let active: Vec<&str> = lines[2].split_whitespace().collect();
    assert_eq!(
        active,
        [
            "*",
            "aaaaaaaaaaaa",
            "2023-11-14",
            "22:13:20",
            "RWQf6LRC",
            "120",
            "3",
            "1",
            "0",
            "7",
            "/srv/orders.wasm"
        ],
        "{out}"
    );
    let old: Vec<&str> = lines[3].split_whitespace().collect();
    assert_eq!(old[0], "bbbbbbbbbbbb", "{out}");
    assert_eq!(old[3], "-", "no signer: {out}");
}

/// Arguments, then the method, path and body the host must see, and a line the output shows.
type Case<'a> = (Vec<&'a str>, &'a str, &'a str, Option<Value>, String);

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_command_sends_its_path_body_and_token() {
    let (url, log) = stub().await;
    let component = std::env::temp_dir().join(format!("ctl-{}.wasm", std::process::id()));
    std::fs::write(&component, b"\0asm").expect("write a component file");
    let abs = std::fs::canonicalize(&component)
        .expect("canonical")
        .display()
        .to_string();
    let here = component.to_str().expect("utf-8 path");
    let cases: Vec<Case<'_>> = vec![
        (
            vec!["swap", "orders", here],
            "POST",
            "/pipelines/orders/swap",
            Some(json!({ "path": abs })),
            format!("active_version: {}", sha('d')),
        ),
        (
            vec!["swap", "orders", "/on/the/host.wasm"],
            "POST",
            "/pipelines/orders/swap",
            Some(json!({ "path": "/on/the/host.wasm" })),
            "pipeline: orders".to_owned(),
        ),
        (
            vec!["rollback", "orders"],
            "POST",
            "/pipelines/orders/rollback",
            Some(json!({})),
            format!("active_version: {}", sha('d')),
        ),
        (
            vec!["rollback", "orders", "abc123"],
            "POST",
            "/pipelines/orders/rollback",
            Some(json!({ "hash": "abc123" })),
            "pipeline: orders".to_owned(),
        ),
        (
            vec!["shadow", "orders", here, "--sample", "0.25"],
            "POST",
            "/pipelines/orders/shadow",
            Some(json!({ "path": abs, "sample": 0.25 })),
            format!("candidate: {}", sha('e')),
        ),
        (
            vec!["shadow-stop", "orders"],
            "DELETE",
            "/pipelines/orders/shadow",
            None,
            "shadow: candidate cccccccccccc (/srv/cand.wasm), sample 0.5".to_owned(),
        ),
        (
            vec![
                "canary",
                "orders",
                here,
                "--percent",
                "10",
                "--promote-after-batches",
                "50",
                "--max-fault-rate",
                "0.01",
                "--max-reject-rate-increase",
                "0.05",
            ],
            "POST",
            "/pipelines/orders/canary",
            Some(json!({
                "path": abs, "percent": 10.0,
                "promote_after": { "batches": 50 },
                "rollback_if": { "max_fault_rate": 0.01, "max_reject_rate_increase": 0.05 },
            })),
            format!("candidate: {}", sha('e')),
        ),
        (
            vec![
                "canary",
                "orders",
                "/c.wasm",
                "--percent",
                "5",
                "--promote-after-seconds",
                "600",
                "--max-release-rate-increase",
                "0.2",
            ],
            "POST",
            "/pipelines/orders/canary",
            Some(json!({
                "path": "/c.wasm", "percent": 5.0,
                "promote_after": { "seconds": 600 },
                "rollback_if": { "max_release_rate_increase": 0.2 },
            })),
            "pipeline: orders".to_owned(),
        ),
        (
            vec!["canary-stop", "orders"],
            "DELETE",
            "/pipelines/orders/canary",
            None,
            format!("active_version: {}", sha('a')),
        ),
        (
            vec!["promote", "orders"],
            "POST",
            "/pipelines/orders/promote",
            None,
            format!("active_version: {}", sha('e')),
        ),
    ];
    for (args, method, path, body, shows) in cases {
        let mut full = TOKEN.to_vec();
        full.extend(&args);
        let (ok, out, err) = ctl(&url, &full).await;
        assert!(ok, "{args:?}: {err}");
        let seen = last(&log);
        assert_eq!(seen.method, method, "{args:?}");
        assert_eq!(seen.path, path, "{args:?}");
        assert_eq!(seen.body, body, "{args:?}");
        assert_eq!(seen.auth.as_deref(), Some("Bearer t0k"), "{args:?}");
        // The host takes nothing else on a POST or DELETE, body or not.
        assert_eq!(
            seen.content_type.as_deref(),
            Some("application/json"),
            "{args:?}"
        );
        assert!(
            out.lines().any(|l| l == shows),
            "{args:?} shows {shows:?}: {out}"
        );
    }
    let _ = std::fs::remove_file(&component);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn errors_say_what_the_host_answered_and_exit_non_zero() {
    let (url, log) = stub().await;
    let (ok, out, err) = ctl(&url, &["swap", "orders", "/x.wasm"]).await;
    assert!(!ok && out.is_empty());
    assert!(
        err.contains("POST /pipelines/orders/swap: the host answered 401 Unauthorized: a valid bearer token is required")
            && err.contains("pass --token-env"),
        "{err}"
    );
    let mut args = TOKEN.to_vec();
    args.extend(["swap", "bad", "/x.wasm"]);
    let (ok, _, err) = ctl(&url, &args).await;
    assert!(!ok);
    assert!(
        err.contains("the host answered 422 Unprocessable Entity: component x.wasm: bad signature"),
        "the JSON error is shown: {err}"
    );
    let (ok, _, err) = ctl(&url, &["versions", "plain", "--json"]).await;
    assert!(!ok);
    assert!(
        err.contains("GET /pipelines/plain/versions: the host answered 404 Not Found: no pipeline named \"plain\""),
        "the plain-text error is shown: {err}"
    );
    let requests = log.lock().expect("log").len();
    // Mistakes caught before any request, and a host that is not there.
    // ctl refuses with the host's own checks: what it lets through, the host takes.
    let (ok, _, err) = ctl(&url, &["canary", "orders", "/c.wasm", "--percent", "0"]).await;
    assert!(
        !ok && err.contains("percent must be in (0, 100], got 0"),
        "{err}"
    );
    let (ok, _, err) = ctl(&url, &["shadow", "orders", "/c.wasm", "--sample", "2"]).await;
    assert!(
        !ok && err.contains("sample must be in (0, 1], got 2"),
        "{err}"
    );
    let (ok, _, err) = ctl(&url, &["shadow", "orders", "/c.wasm", "--sample", "0"]).await;
    assert!(
        !ok && err.contains("sample must be in (0, 1], got 0"),
        "{err}"
    );
    let (ok, _, err) = ctl(
        &url,
        &[
            "canary",
            "orders",
            "/c.wasm",
            "--percent",
            "10",
            "--promote-after-batches",
            "5",
            "--max-fault-rate",
            "2",
        ],
    )
    .await;
    assert!(
        !ok && err.contains("rollback_if.max_fault_rate must be in [0, 1], got 2"),
        "{err}"
    );
    let (ok, _, err) = ctl(
        &url,
        &["--token-env", "SHAREHOST_NO_SUCH_VAR", "promote", "orders"],
    )
    .await;
    assert!(
        !ok && err.contains("SHAREHOST_NO_SUCH_VAR is not set"),
        "{err}"
    );
    assert_eq!(
        log.lock().expect("log").len(),
        requests,
        "no request was sent"
    );
    let closed = {
        let l = std::net::TcpListener::bind("127.0.0.1:0").expect("bind");
        l.local_addr().expect("addr")
    };
    let (ok, _, err) = ctl(&format!("http://{closed}"), &["pipelines"]).await;
    assert!(
        !ok && err.contains("cannot reach the admin listener"),
        "{err}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_manifest_names_the_listener_and_the_token_variable() {
    let (url, log) = stub().await;
    let listen = url.trim_start_matches("http://").to_owned();
    let dir = std::env::temp_dir().join(format!("sharehost-ctl-{}", std::process::id()));
    std::fs::create_dir_all(&dir).expect("temp dir");
    let manifest = dir.join("host.toml");
    std::fs::write(
        &manifest,
        format!(
            r#"[cluster]
bootstrap = "127.0.0.1:9092"

[admin]
listen = "{listen}"
token_env = "SHAREHOST_TEST_TOKEN"

[[pipeline]]
name = "orders"
topics = ["orders"]
group = "g"
component = "orders.wasm"
"#
        ),
    )
    .expect("write manifest");
    let m = manifest.to_str().expect("utf-8 path");
    let (ok, out, err) = ctl_bare(&["--manifest", m, "promote", "orders"]).await;
    assert!(ok, "{err}");
    assert!(out.contains("active_version: "), "{out}");
    let seen = last(&log);
    assert_eq!(seen.path, "/pipelines/orders/promote");
    assert_eq!(
        seen.auth.as_deref(),
        Some("Bearer t0k"),
        "the manifest's token_env"
    );
    // --token-env wins over the manifest's (here: a variable that is not set).
    let (ok, _, err) = ctl_bare(&[
        "--manifest",
        m,
        "--token-env",
        "SHAREHOST_NO_SUCH_VAR",
        "pipelines",
    ])
    .await;
    assert!(
        !ok && err.contains("SHAREHOST_NO_SUCH_VAR is not set"),
        "{err}"
    );
    // An ephemeral port cannot be known from the manifest; neither --admin nor --manifest is
    // a usage error.
    let text = std::fs::read_to_string(&manifest)
        .expect("read")
        .replace(&listen, "127.0.0.1:0");
    std::fs::write(&manifest, text).expect("write");
    let (ok, _, err) = ctl_bare(&["--manifest", m, "pipelines"]).await;
    assert!(!ok && err.contains("pass --admin"), "{err}");
    let (ok, _, err) = ctl_bare(&["pipelines"]).await;
    assert!(!ok && err.contains("--admin"), "{err}");
    let _ = std::fs::remove_dir_all(&dir);
}
