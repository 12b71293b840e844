//! The admin listener refuses what a web page could make the operator's browser send, through
//! the binary (`sharehost run` against the broker):
//!
//! - a page on another origin posting a `text/plain` form, or a `no-cors` fetch, to a
//!   token-less host's swap cannot change the active version (the requests carry the headers
//!   Chromium sends for them), while `sharehost ctl`'s JSON request from no origin, and the
//!   console's from its own origin, still swap;
//! - a `Host` that is not the listener's (DNS rebinding) is refused on reads and actions, one
//!   that is (its address, `localhost`, `[::1]`, a name of `[admin] allowed_hosts`) is served;
//!   a request without `Host` is refused;
//! - the bearer scheme in lower case is taken like `Bearer`;
//! - a listener off loopback without a token does not start, and says which key fixes it.
//!
//! Raw HTTP rather than headless Chromium: what the host decides on is the request's headers,
//! which are written out here as the browser sends them, and the test needs no browser.

use std::io::{Read, Write};
use std::net::TcpStream;
use std::path::{Path, PathBuf};
use std::process::Command;

use sharehost::api::{self, PipelineRoute};
use sharehost_tests::host::HostProcess;
use sharehost_tests::{
    blocking, bootstrap, client, fresh_group, guest, ledger_manifest, new_version, sharehost_bin,
    unique,
};

/// The name the hosts here list in `[admin] allowed_hosts`, as a proxy in front would send it.
const ALLOWED: &str = "sharehost.test";

/// Where the attacker's page is served from: another port on the same machine, so the request
/// is cross-origin (and same-site, which no browser rule stops).
const ATTACKER: &str = "http://127.0.0.1:8123";

/// A scratch folder of this test's own.
fn scratch(name: &str) -> PathBuf {
    let dir = std::env::temp_dir().join(unique(&format!("sharehost-admin-guard-{name}")));
    std::fs::create_dir_all(&dir).expect("scratch folder");
    dir
}

/// A host running the accept-all plugin as pipeline `ledger` on a fresh topic and group, with
/// `admin` (lines of `[admin]` beyond `listen`) and `env`; also a new version of the plugin
/// to swap to.
async fn host(name: &str, admin: &str, env: &[(&str, &str)]) -> (HostProcess, PathBuf) {
    let client = client().await;
    let topic = unique("admin-guard");
    client
        .create_topic(&topic, 1, 1, &[])
        .await
        .expect("create topic");
    let group = fresh_group(&client, None).await;
    let dir = scratch(name);
    let text = ledger_manifest(&bootstrap(), &topic, &group, &guest("accept_all"), "", "").replace(
        "listen = \"127.0.0.1:0\"\n",
        &format!("listen = \"127.0.0.1:0\"\n{admin}\n"),
    );
    let manifest = dir.join("host.toml");
    std::fs::write(&manifest, text).expect("write manifest");
    let next = dir.join("next.wasm");
    std::fs::write(&next, new_version(&guest("accept_all"), name)).expect("write next version");
    let env: Vec<(String, String)> = env
        .iter()
        .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
        .collect();
    let name = name.to_owned();
    let host = blocking(move || {
        let env: Vec<(&str, &str)> = env.iter().map(|(k, v)| (k.as_str(), v.as_str())).collect();
        HostProcess::start_with_env(sharehost_bin!(), &manifest, &name, &env)
    })
    .await;
    (host, next)
}

/// The active version of pipeline `ledger`, as `GET /pipelines` shows it.
fn active(host: &HostProcess) -> String {
    let value = host.status();
    value[0]["active_version"]
        .as_str()
        .unwrap_or_else(|| panic!("no active version: {value}"))
        .to_owned()
}

/// The swap's path on `host`.
fn swap_path() -> String {
    PipelineRoute::Swap.path("ledger")
}

/// One raw request: exactly `head` (request line and headers, without the final blank line)
/// and `body`; the answer's status and body.
fn raw(addr: &str, head: &str, body: &str) -> (u16, String) {
    let mut s = TcpStream::connect(addr).expect("connect to the admin listener");
    write!(
        s,
        "{head}\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
        body.len()
    )
    .expect("write");
    let mut resp = String::new();
    s.read_to_string(&mut resp).expect("read");
    sharehost_tests::http::parse_response(&resp)
}

/// The headers Chromium sends with a cross-origin top-level form submission (`<form
/// method=post enctype=text/plain action=...>` on the attacker's page), minus Content-Length.
fn form_post_head(admin: &str) -> String {
    format!(
        "POST {path} HTTP/1.1\r\nHost: {admin}\r\nCache-Control: max-age=0\r\n\
         Upgrade-Insecure-Requests: 1\r\nOrigin: {ATTACKER}\r\nContent-Type: text/plain\r\n\
         User-Agent: Mozilla/5.0 (X11; Linux x86_64) Chrome/131.0.0.0 Safari/537.36\r\n\
         Accept: text/html,application/xhtml+xml,application/xml;q=0.9,*/*;q=0.8\r\n\
         Sec-Fetch-Site: same-site\r\nSec-Fetch-Mode: navigate\r\nSec-Fetch-User: ?1\r\n\
         Sec-Fetch-Dest: document\r\nReferer: {ATTACKER}/\r\nAccept-Encoding: gzip, deflate",
        path = swap_path()
    )
}

/// The headers Chromium sends with `fetch(url, {method: "POST", mode: "no-cors", body:
/// JSON.stringify(...)})` from the attacker's page: a string body is `text/plain`.
fn no_cors_head(admin: &str, origin: Option<&str>) -> String {
    let origin = origin
        .map(|o| format!("Origin: {o}\r\n"))
        .unwrap_or_default();
    format!(
        "POST {path} HTTP/1.1\r\nHost: {admin}\r\n{origin}\
         Content-Type: text/plain;charset=UTF-8\r\nAccept: */*\r\n\
         User-Agent: Mozilla/5.0 (X11; Linux x86_64) Chrome/131.0.0.0 Safari/537.36\r\n\
         Sec-Fetch-Site: same-site\r\nSec-Fetch-Mode: no-cors\r\nSec-Fetch-Dest: empty\r\n\
         Referer: {ATTACKER}/",
        path = swap_path()
    )
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_page_on_another_origin_cannot_swap_a_token_less_host() {
    let (host, next) = host("csrf", &format!("allowed_hosts = [{ALLOWED:?}]"), &[]).await;
    let admin = host.admin().to_owned();
    let before = active(&host);
    let path = next.display().to_string();
    // The form's one field is named `{"path": "...", "x": "` and valued `"}`: text/plain
    // encoding joins them with `=`, which makes the body JSON.
    let form_body = format!("{{\"path\": {path:?}, \"x\": \"=\"}}\r\n");
    let fetch_body = serde_json::json!({ "path": path }).to_string();
    let attempts = [
        ("a text/plain form post", form_post_head(&admin), &form_body),
        (
            "a no-cors fetch",
            no_cors_head(&admin, Some(ATTACKER)),
            &fetch_body,
        ),
        (
            "a no-cors fetch whose Origin was stripped",
            no_cors_head(&admin, None),
            &fetch_body,
        ),
        (
            "JSON from another origin (a preflight the browser never got granted)",
            format!(
                "POST {} HTTP/1.1\r\nHost: {admin}\r\nOrigin: {ATTACKER}\r\n\
                 Content-Type: application/json",
                swap_path()
            ),
            &fetch_body,
        ),
        (
            "JSON from an opaque origin (a sandboxed frame)",
            format!(
                "POST {} HTTP/1.1\r\nHost: {admin}\r\nOrigin: null\r\n\
                 Content-Type: application/json",
                swap_path()
            ),
            &fetch_body,
        ),
    ];
    for (what, head, body) in &attempts {
        let (code, answer) = raw(&admin, head, body);
        assert!(
            code == 403 || code == 415,
            "{what}: answered {code} {answer}"
        );
        let why: api::Denied = serde_json::from_str(&answer)
            .unwrap_or_else(|e| panic!("{what}: the refusal is JSON ({e}): {answer}"));
        assert!(!why.error.is_empty(), "{what}");
        assert_eq!(active(&host), before, "{what} swapped the plugin");
    }
    let (code, answer) = raw(&admin, &no_cors_head(&admin, None), &fetch_body);
    assert_eq!(code, 415, "{answer}");
    assert!(
        answer.contains("application/json"),
        "says what is expected: {answer}"
    );
    // Nothing that changes something is taken without JSON, body or not.
    for (method, route) in [
        ("POST", PipelineRoute::Promote),
        ("DELETE", PipelineRoute::Canary),
        ("DELETE", PipelineRoute::Shadow),
        ("POST", PipelineRoute::Rollback),
        ("POST", PipelineRoute::DeadLettersReplay),
    ] {
        let head = format!(
            "{method} {} HTTP/1.1\r\nHost: {admin}",
            route.path("ledger")
        );
        let (code, answer) = raw(&admin, &head, "");
        assert_eq!(
            code, 415,
            "{method} {route:?} without a content type: {answer}"
        );
    }
    assert_eq!(active(&host), before);

    // The console's own request (same origin, JSON) swaps; so does ctl's (JSON, no Origin).
    let (code, answer) = raw(
        &admin,
        &format!(
            "POST {} HTTP/1.1\r\nHost: {admin}\r\nOrigin: http://{admin}\r\n\
             Content-Type: application/json",
            swap_path()
        ),
        &fetch_body,
    );
    assert_eq!(code, 200, "{answer}");
    let swapped = active(&host);
    assert_ne!(
        swapped, before,
        "the same swap from the listener's own origin"
    );
    let out = blocking({
        let admin = admin.clone();
        move || {
            Command::new(sharehost_bin!())
                .args([
                    "ctl",
                    "--admin",
                    &format!("http://{admin}"),
                    "rollback",
                    "ledger",
                ])
                .output()
                .expect("run sharehost ctl")
        }
    })
    .await;
    assert!(
        out.status.success(),
        "ctl rollback: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert_eq!(active(&host), before, "ctl rolled back");
    let _ = blocking(move || host.kill()).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn only_the_listeners_own_names_are_served() {
    let (host, next) = host("names", &format!("allowed_hosts = [{ALLOWED:?}]"), &[]).await;
    let admin = host.admin().to_owned();
    let port = admin
        .rsplit_once(':')
        .map(|(_, p)| p.to_owned())
        .expect("port");
    let before = active(&host);
    let swap_body = serde_json::json!({ "path": next }).to_string();
    let reads = [
        api::PIPELINES,
        api::METRICS,
        api::HEALTHZ,
        api::READYZ,
        api::CONSOLE,
        api::HOST,
        api::FAULTS,
        api::MANIFEST,
    ];
    for evil in ["evil.example".to_owned(), format!("evil.example:{port}")] {
        for path in reads {
            let (code, answer) = host.request("GET", path, &[("Host", &evil)], "");
            assert_eq!(code, 403, "GET {path} with Host {evil}: {answer}");
        }
        let (code, answer) = host.request(
            "POST",
            &swap_path(),
            &[("Host", &evil), ("Content-Type", "application/json")],
            &swap_body,
        );
        assert_eq!(code, 403, "POST swap with Host {evil}: {answer}");
        assert!(answer.contains("allowed_hosts"), "names the key: {answer}");
    }
    assert_eq!(active(&host), before, "a rebinding page swapped the plugin");
    // HTTP/1.0 without a Host: refused.
    let (code, answer) = raw(&admin, &format!("GET {} HTTP/1.0", api::PIPELINES), "");
    assert_eq!(code, 403, "no Host: {answer}");
    for own in [
        admin.clone(),
        format!("localhost:{port}"),
        format!("[::1]:{port}"),
        format!("{ALLOWED}:{port}"),
        "SHAREHOST.TEST".to_owned(),
    ] {
        let (code, answer) = host.request("GET", api::PIPELINES, &[("Host", &own)], "");
        assert_eq!(code, 200, "GET /pipelines with Host {own}: {answer}");
    }
    // A proxy's name works for actions too, from its own origin.
    let (code, answer) = host.request(
        "POST",
        &swap_path(),
        &[
            ("Host", ALLOWED),
            ("Origin", &format!("http://{ALLOWED}")),
            ("Content-Type", "application/json"),
        ],
        &swap_body,
    );
    assert_eq!(code, 200, "swap through the allowed name: {answer}");
    assert_ne!(active(&host), before);
    let _ = blocking(move || host.kill()).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_bearer_scheme_is_taken_in_any_case() {
    let token = "admin-guard-token-81c4";
    let (host, next) = host(
        "bearer",
        "token_env = \"SHAREHOST_GUARD_TOKEN\"",
        &[("SHAREHOST_GUARD_TOKEN", token)],
    )
    .await;
    let before = active(&host);
    let body = serde_json::json!({ "path": next }).to_string();
    let json = ("Content-Type", "application/json");
    for wrong in [
        "bearer nope".to_owned(),
        format!("Basic {token}"),
        token.to_owned(),
    ] {
        let (code, answer) = host.request(
            "POST",
            &swap_path(),
            &[json, ("Authorization", &wrong)],
            &body,
        );
        assert_eq!(code, 401, "{wrong}: {answer}");
    }
    assert_eq!(active(&host), before);
    let lower = format!("bearer {token}");
    let (code, answer) = host.request(
        "POST",
        &swap_path(),
        &[json, ("Authorization", &lower)],
        &body,
    );
    assert_eq!(code, 200, "lowercase bearer: {answer}");
    assert_ne!(active(&host), before);
    let upper = format!("BEARER {token}");
    let (code, answer) = host.request(
        "POST",
        &PipelineRoute::Rollback.path("ledger"),
        &[json, ("Authorization", &upper)],
        "",
    );
    assert_eq!(code, 200, "uppercase BEARER: {answer}");
    assert_eq!(active(&host), before);
    let _ = blocking(move || host.kill()).await;
}

/// Runs `sharehost run` on a manifest whose admin listener is `listen` with no token; the
/// manifest is refused before anything connects, so no broker is needed.
fn run_without_token(dir: &Path, listen: &str) -> (bool, String) {
    let manifest = dir.join("host.toml");
    std::fs::write(
        &manifest,
        format!(
            "[cluster]\nbootstrap = \"127.0.0.1:1\"\n\n[admin]\nlisten = {listen:?}\n\n\
             [[pipeline]]\nname = \"orders\"\ntopics = [\"orders\"]\ngroup = \"orders\"\n\
             component = {:?}\n",
            guest("accept_all")
        ),
    )
    .expect("manifest");
    let out = Command::new(sharehost_bin!())
        .arg("run")
        .arg(&manifest)
        .output()
        .expect("run sharehost");
    (
        out.status.success(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

#[test]
fn a_listener_off_loopback_without_a_token_does_not_start() {
    let dir = scratch("loopback");
    for listen in ["0.0.0.0:0", "[::]:0"] {
        let (ok, stderr) = run_without_token(&dir, listen);
        assert!(!ok, "{listen}: {stderr}");
        assert!(
            stderr.contains("admin.listen")
                && stderr.contains("[admin] token_env")
                && stderr.contains("loopback only")
                && stderr.contains("127.0.0.1"),
            "{listen}: the error names the key and the fix: {stderr}"
        );
    }
    let _ = std::fs::remove_dir_all(&dir);
}
