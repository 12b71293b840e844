//! `sharehost test-plugin`: offline runs of a component on JSON-lines records.

use std::path::PathBuf;
use std::process::Command;

use sharehost_tests::guest;

fn input(tag: &str, text: &str) -> PathBuf {
    let path = std::env::temp_dir().join(format!(
        "sharehost-test-plugin-{tag}-{}.jsonl",
        std::process::id()
    ));
    std::fs::write(&path, text).expect("write input");
    path
}

fn run(args: &[&std::ffi::OsStr]) -> (bool, String, String) {
    let out = Command::new(env!("CARGO_BIN_EXE_sharehost"))
        .arg("test-plugin")
        .args(args)
        .env("SHAREHOST_LOG", "off")
        .output()
        .expect("run sharehost");
    (
        out.status.success(),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

#[test]
fn prints_one_verdict_line_per_record_and_a_summary() {
    let file = input(
        "orders",
        concat!(
            r#"{"value":"{\"id\":\"o1\",\"sku\":\"A\",\"quantity\":2,\"price\":3}"}"#,
            "\n",
            r#"{"value":"{oops","offset":7}"#,
            "\n",
            r#"{"value":{"base64":"e30="}}"#,
            "\n"
        ),
    );
    let (ok, stdout, stderr) = run(&[
        guest("order_validator").as_os_str(),
        "--input".as_ref(),
        file.as_os_str(),
        "--config".as_ref(),
        "max-quantity=5".as_ref(),
    ]);
    assert!(ok, "{stderr}");
    let lines: Vec<serde_json::Value> = stdout
        .lines()
        .map(|l| serde_json::from_str(l).expect("JSON line"))
        .collect();
    assert_eq!(lines.len(), 4);
    assert_eq!(lines[0]["verdict"], "accept");
    assert_eq!(lines[1]["verdict"], "reject");
    assert_eq!(lines[1]["offset"], 7);
    assert!(
        lines[1]["reason"]
            .as_str()
            .is_some_and(|r| r.starts_with("not JSON")),
        "{stdout}"
    );
    assert_eq!(lines[2]["reason"], "`id` missing or not a string");
    let summary = &lines[3]["summary"];
    assert_eq!(summary["records"], 3);
    assert_eq!(summary["verdicts"]["accept"], 1);
    assert_eq!(summary["verdicts"]["reject"], 2);
    assert!(summary["us_per_batch"].is_number());
}

#[test]
fn faulted_batches_get_the_release_policy_and_are_counted() {
    let file = input("panic", "{\"value\":\"bad\"}\n{\"value\":\"ok\"}\n");
    let (ok, stdout, stderr) = run(&[
        guest("fixture_panic").as_os_str(),
        "--input".as_ref(),
        file.as_os_str(),
        "--batch-size".as_ref(),
        "1".as_ref(),
    ]);
    assert!(ok, "{stderr}");
    let lines: Vec<serde_json::Value> = stdout
        .lines()
        .map(|l| serde_json::from_str(l).expect("JSON line"))
        .collect();
    assert_eq!(lines[0]["verdict"], "release");
    assert_eq!(lines[0]["fault"], "panic");
    assert_eq!(lines[1]["verdict"], "accept");
    assert_eq!(lines[2]["summary"]["faults"]["panic"], 1);
}

#[test]
fn bad_input_is_one_clear_error_naming_the_line_or_item() {
    let good = input("good", "{\"value\":\"x\"}\n");
    let bad = input("bad", "{\"value\":\"x\"}\n{\"value\":1}\n");
    let accept = guest("accept_all");
    let broken = guest("fixture_missing_handle");
    let cases: Vec<(Vec<&std::ffi::OsStr>, &str)> = vec![
        (
            vec![accept.as_os_str(), "--input".as_ref(), bad.as_os_str()],
            "line 2: value: expected a string",
        ),
        (
            vec![
                accept.as_os_str(),
                "--input".as_ref(),
                "/nonexistent/records.jsonl".as_ref(),
            ],
            "input /nonexistent/records.jsonl",
        ),
        (
            vec![broken.as_os_str(), "--input".as_ref(), good.as_os_str()],
            "missing export `handle`",
        ),
        (
            vec![
                accept.as_os_str(),
                "--input".as_ref(),
                good.as_os_str(),
                "--config".as_ref(),
                "novalue".as_ref(),
            ],
            "--config `novalue`: expected KEY=VALUE",
        ),
    ];
    for (args, expected) in cases {
        let (ok, _, stderr) = run(&args);
        assert!(!ok, "should fail: {args:?}");
        let errors: Vec<&str> = stderr.lines().filter(|l| l.starts_with("error:")).collect();
        assert_eq!(errors.len(), 1, "{stderr}");
        assert!(errors[0].contains(expected), "{stderr}");
    }
}

/// A pricing API on loopback (`GET /price/A-1` → `{"unit_price": 2.5}`, 404 otherwise) that
/// requires `Authorization: Bearer tok-offline`; returns its base URL.
fn pricing_server() -> String {
    use axum::extract::Path;
    use axum::http::{HeaderMap, StatusCode};
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .expect("runtime");
        rt.block_on(async move {
            let app = axum::Router::new().route(
                "/price/{sku}",
                axum::routing::get(|Path(sku): Path<String>, headers: HeaderMap| async move {
                    let bearer = headers
                        .get("authorization")
                        .and_then(|v| v.to_str().ok())
                        .unwrap_or_default()
                        .to_owned();
                    match (sku.as_str(), bearer == "Bearer tok-offline") {
                        (_, false) => (StatusCode::UNAUTHORIZED, String::new()),
                        ("A-1", true) => (StatusCode::OK, r#"{"unit_price": 2.5}"#.to_owned()),
                        _ => (StatusCode::NOT_FOUND, String::new()),
                    }
                }),
            );
            let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
                .await
                .expect("bind");
            let _ = tx.send(listener.local_addr().expect("addr"));
            let _ = axum::serve(listener, app).await;
        });
    });
    format!("http://{}", rx.recv().expect("server address"))
}

#[test]
fn runs_the_enricher_offline_with_http_granted_by_a_flag_and_shows_its_emits() {
    let url = pricing_server();
    let file = input(
        "enrich",
        concat!(
            r#"{"key":"o1","value":"{\"id\":\"o1\",\"sku\":\"A-1\",\"quantity\":3}"}"#,
            "\n",
            r#"{"key":"o2","value":"{\"id\":\"o2\",\"sku\":\"Z-9\",\"quantity\":1}"}"#,
            "\n"
        ),
    );
    let enricher = guest("enricher");
    let pricing = format!("pricing-url={url}");
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_sharehost"));
    cmd.arg("test-plugin")
        .arg(&enricher)
        .arg("--input")
        .arg(&file)
        .args(["--config", &pricing, "--output", "enriched"])
        .args(["--secret-env", "api-token=SHAREHOST_TEST_PRICING_TOKEN"])
        .env("SHAREHOST_TEST_PRICING_TOKEN", "tok-offline")
        .env("SHAREHOST_LOG", "off");
    // Without the grant, no request leaves: the lookup fails and the order is retried.
    let out = cmd.output().expect("run sharehost");
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        !out.status.success()
            || stdout
                .lines()
                .next()
                .is_some_and(|l| l.contains("\"retry\"")),
        "refused at load or retried without a grant: {stdout}"
    );
    let out = cmd
        .args(["--allow-outbound-host", &url])
        .output()
        .expect("run sharehost");
    let (stdout, stderr) = (
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr),
    );
    assert!(out.status.success(), "{stderr}");
    let lines: Vec<serde_json::Value> = stdout
        .lines()
        .map(|l| serde_json::from_str(l).expect("JSON line"))
        .collect();
    assert_eq!(lines[0]["verdict"], "accept", "{stdout}");
    let emit = &lines[0]["emits"][0];
    assert_eq!(emit["output"], "enriched");
    assert_eq!(emit["key"], "o1");
    let order: serde_json::Value =
        serde_json::from_str(emit["value"].as_str().expect("text value")).expect("JSON order");
    assert_eq!(
        (order["unit_price"].as_f64(), order["total"].as_f64()),
        (Some(2.5), Some(7.5))
    );
    assert_eq!(lines[1]["verdict"], "reject");
    assert!(lines[1].get("emits").is_none(), "{stdout}");
    assert_eq!(lines[2]["summary"]["emits"], 1);
}
