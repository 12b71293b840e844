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
    let out = Command::new(sharehost_tests::sharehost_bin!())
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

/// `test-plugin`'s output: one JSON value per line.
fn json_lines(stdout: &str) -> Vec<serde_json::Value> {
    stdout
        .lines()
        .map(|l| serde_json::from_str(l).expect("JSON line"))
        .collect()
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
    let lines = json_lines(&stdout);
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
    let lines = json_lines(&stdout);
    assert_eq!(lines[0]["verdict"], "release");
    assert_eq!(lines[0]["fault"], "panic");
    assert_eq!(lines[1]["verdict"], "accept");
    assert_eq!(lines[2]["summary"]["faults"]["panic"], 1);
}

#[test]
fn a_faulting_batch_is_split_as_a_pipeline_splits_it_and_only_its_poison_record_faults() {
    let file = input(
        "isolate",
        "{\"value\":\"ok\"}\n{\"value\":\"ok\"}\n{\"value\":\"bad\"}\n{\"value\":\"ok\"}\n",
    );
    let (ok, stdout, stderr) = run(&[
        guest("fixture_panic").as_os_str(),
        "--input".as_ref(),
        file.as_os_str(),
    ]);
    assert!(ok, "{stderr}");
    let lines = json_lines(&stdout);
    let verdicts: Vec<&str> = lines[..4]
        .iter()
        .map(|l| l["verdict"].as_str().unwrap_or("?"))
        .collect();
    assert_eq!(
        verdicts,
        ["accept", "accept", "release", "accept"],
        "{stdout}"
    );
    assert_eq!(lines[2]["fault"], "panic", "{stdout}");
    assert!(lines[0].get("fault").is_none(), "{stdout}");
    // The whole batch's call, its half with the poison record, and that record alone.
    assert_eq!(lines[4]["summary"]["faults"]["panic"], 3, "{stdout}");
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
    let mut cmd = Command::new(sharehost_tests::sharehost_bin!());
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
    let lines = json_lines(&stdout);
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

#[test]
fn the_emit_bounds_and_the_retry_cap_are_flags_and_unaccepted_emits_are_marked_discarded() {
    let file = input(
        "bounds",
        concat!(
            r#"{"value":"emit:valid:x:3"}"#,
            "\n",
            r#"{"value":"emit-release:valid:y"}"#,
            "\n",
            r#"{"value":"retry:3600000"}"#,
            "\n"
        ),
    );
    let (ok, stdout, stderr) = run(&[
        guest("fixture_actor").as_os_str(),
        "--input".as_ref(),
        file.as_os_str(),
        "--output".as_ref(),
        "valid".as_ref(),
        "--max-emits-per-batch".as_ref(),
        "2".as_ref(),
        "--max-retry-delay-ms".as_ref(),
        "1000".as_ref(),
        // A batch each: the emit bound is per batch.
        "--batch-size".as_ref(),
        "1".as_ref(),
    ]);
    assert!(ok, "{stderr}");
    let lines = json_lines(&stdout);
    // The third emit of the first record is over the bound of 2.
    assert_eq!(lines[0]["verdict"], "reject", "{stdout}");
    assert!(
        lines[0]["reason"]
            .as_str()
            .is_some_and(|r| r.contains("TooMany")),
        "{stdout}"
    );
    assert_eq!(lines[0]["emits_discarded"], true, "{stdout}");
    assert_eq!(lines[1]["verdict"], "release");
    assert_eq!(lines[1]["emits_discarded"], true, "{stdout}");
    assert_eq!(lines[2]["retry_after_ms"], 1000, "{stdout}");
    assert_eq!(lines[2]["retry_after_ms_asked"], 3_600_000, "{stdout}");
    let summary = &lines[3]["summary"];
    assert_eq!(summary["emits"], 0, "{stdout}");
    assert_eq!(summary["emits_discarded"], 3, "{stdout}");
}

#[test]
fn a_record_that_emitted_to_an_output_nobody_maps_is_shown_rejected_as_a_pipeline_rejects_it() {
    // The plugin releases it after its emit was refused: a pipeline dead-letters such a record
    // whatever the plugin answered, and test-plugin shows what the pipeline would do.
    let file = input(
        "unmapped",
        concat!(
            r#"{"value":"emit-release:nowhere:y"}"#,
            "\n",
            r#"{"value":"emit-release:valid:y"}"#,
            "\n"
        ),
    );
    let (ok, stdout, stderr) = run(&[
        guest("fixture_actor").as_os_str(),
        "--input".as_ref(),
        file.as_os_str(),
        "--output".as_ref(),
        "valid".as_ref(),
    ]);
    assert!(ok, "{stderr}");
    let lines = json_lines(&stdout);
    assert_eq!(lines[0]["verdict"], "reject", "{stdout}");
    assert_eq!(
        lines[0]["reason"], r#"emitted to output "nowhere", which --output does not map"#,
        "{stdout}"
    );
    assert_eq!(lines[1]["verdict"], "release", "{stdout}");
    assert_eq!(lines[2]["summary"]["verdicts"]["reject"], 1, "{stdout}");
}

#[test]
fn http_refusals_name_the_test_plugin_flags_not_the_manifest_keys() {
    let file = input("http-flags", "{\"value\":\"http://127.0.0.1:9/\"}\n");
    let component = guest("fixture_http_fetch");
    let (ok, _, stderr) = run(&[component.as_os_str(), "--input".as_ref(), file.as_os_str()]);
    assert!(!ok);
    assert!(stderr.contains("pass --allow-outbound-host"), "{stderr}");
    assert!(!stderr.contains("allowed_outbound_hosts"), "{stderr}");
    for (flag, value) in [
        ("--http-timeout-ms", "0"),
        ("--http-max-response-bytes", "0"),
        ("--http-max-concurrent", "0"),
    ] {
        let (ok, _, stderr) = run(&[
            component.as_os_str(),
            "--input".as_ref(),
            file.as_os_str(),
            "--allow-outbound-host".as_ref(),
            "http://127.0.0.1:9".as_ref(),
            flag.as_ref(),
            value.as_ref(),
        ]);
        assert!(!ok, "{flag} 0 is refused");
        assert!(
            stderr.contains(&format!("{flag} must be greater than zero")),
            "{stderr}"
        );
    }
    let (ok, _, stderr) = run(&[
        component.as_os_str(),
        "--input".as_ref(),
        file.as_os_str(),
        "--allow-outbound-host".as_ref(),
        "ftp://x".as_ref(),
    ]);
    assert!(!ok);
    assert!(
        stderr.contains("--allow-outbound-host \"ftp://x\""),
        "{stderr}"
    );
}

#[test]
fn trace_logging_never_prints_wasis_own_call_tracing() {
    // wasmtime-wasi and wasmtime-wasi-http trace every host call with its arguments (URLs,
    // header values, bytes written): with SHAREHOST_LOG=trace they would print what a plugin
    // sends, secrets included, past every redaction.
    let file = input(
        "trace",
        "{\"value\":\"http://127.0.0.1:9/?token=s3cr3t\"}\n",
    );
    let out = Command::new(sharehost_tests::sharehost_bin!())
        .arg("test-plugin")
        .arg(guest("fixture_http_fetch"))
        .arg("--input")
        .arg(&file)
        .args(["--allow-outbound-host", "http://127.0.0.1:9"])
        .env("SHAREHOST_LOG", "trace")
        .output()
        .expect("run sharehost");
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{stderr}");
    assert!(
        stderr.lines().any(|l| l.contains("TRACE")),
        "trace logging is on for the host's own targets"
    );
    let wasi: Vec<&str> = stderr
        .lines()
        .filter(|l| l.contains("TRACE") && l.contains("wasmtime_wasi"))
        .collect();
    assert!(wasi.is_empty(), "WASI's call tracing: {:?}", wasi.first());
    assert!(!stderr.contains("s3cr3t"), "the request's URL was logged");
}

/// Runs `sharehost test-plugin ARGS` with the log level the command picks itself.
fn run_default_logging(args: &[&std::ffi::OsStr]) -> (bool, String, String) {
    let out = Command::new(sharehost_tests::sharehost_bin!())
        .arg("test-plugin")
        .args(args)
        .env_remove("SHAREHOST_LOG")
        .output()
        .expect("run sharehost");
    (
        out.status.success(),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

#[test]
fn the_plugins_own_log_lines_are_shown_unless_quiet() {
    let file = input("logs", "{\"value\":\"7\"}\n{\"value\":\"8\"}\n");
    let ledger = guest("fixture_ledger");
    let (ok, _, stderr) =
        run_default_logging(&[ledger.as_os_str(), "--input".as_ref(), file.as_os_str()]);
    assert!(ok, "{stderr}");
    assert!(stderr.contains("ledger begin n=2"), "{stderr}");
    assert!(
        !stderr
            .lines()
            .any(|l| l.contains("INFO") && !l.contains("ledger")),
        "only the plugin's own lines at info: {stderr}"
    );
    let (ok, _, stderr) = run_default_logging(&[
        ledger.as_os_str(),
        "--input".as_ref(),
        file.as_os_str(),
        "--quiet".as_ref(),
    ]);
    assert!(ok, "{stderr}");
    assert!(!stderr.contains("ledger begin"), "{stderr}");
}

#[test]
fn a_manifests_pipeline_gives_its_config_and_limits_and_names_the_pipelines_it_has() {
    let dir = std::env::temp_dir().join(format!(
        "sharehost-test-plugin-manifest-{}",
        std::process::id()
    ));
    std::fs::create_dir_all(&dir).expect("dir");
    let component = guest("order_validator");
    let manifest = dir.join("manifest.toml");
    std::fs::write(
        &manifest,
        format!(
            "[cluster]\nbootstrap = \"127.0.0.1:9\"\n\n\
             [[pipeline]]\nname = \"loose\"\ntopics = [\"o\"]\ngroup = \"g1\"\ncomponent = \"{c}\"\nconfig = {{ max-quantity = \"100\" }}\n\n\
             [[pipeline]]\nname = \"strict\"\ntopics = [\"o\"]\ngroup = \"g2\"\ncomponent = \"{c}\"\nconfig = {{ max-quantity = \"1\" }}\nbatch_size = 1\nmemory_limit_mib = 32\n",
            c = component.display()
        ),
    )
    .expect("write manifest");
    let file = input(
        "manifest",
        &format!(
            "{}\n{}\n",
            r#"{"value":"{\"id\":\"o1\",\"sku\":\"A\",\"quantity\":1,\"price\":3}"}"#,
            r#"{"value":"{\"id\":\"o2\",\"sku\":\"A\",\"quantity\":2,\"price\":3}"}"#
        ),
    );
    let with = |extra: &[&str]| {
        let mut args: Vec<&std::ffi::OsStr> = vec![
            component.as_os_str(),
            "--input".as_ref(),
            file.as_os_str(),
            "--manifest".as_ref(),
            manifest.as_os_str(),
        ];
        args.extend(extra.iter().map(|a| std::ffi::OsStr::new(*a)));
        run(&args)
    };
    let (ok, stdout, stderr) = with(&["--pipeline", "strict"]);
    assert!(ok, "{stderr}");
    let lines = json_lines(&stdout);
    assert_eq!(
        (lines[0]["verdict"].as_str(), lines[1]["verdict"].as_str()),
        (Some("accept"), Some("reject")),
        "the strict pipeline's max-quantity: {stdout}"
    );
    assert_eq!(
        lines[2]["summary"]["batches"], 2,
        "its batch_size of 1: {stdout}"
    );
    let (ok, stdout, stderr) = with(&["--pipeline", "loose"]);
    assert!(ok, "{stderr}");
    assert_eq!(json_lines(&stdout)[1]["verdict"], "accept");
    let (ok, _, stderr) = with(&[]);
    assert!(!ok);
    assert!(
        stderr.contains("has 2 pipelines: name one with --pipeline (loose, strict)"),
        "{stderr}"
    );
    let (ok, _, stderr) = with(&["--pipeline", "nope"]);
    assert!(!ok);
    assert!(stderr.contains("--pipeline nope"), "{stderr}");
}

#[test]
fn an_endless_input_line_an_empty_config_key_and_a_cache_path_that_is_a_file_are_refused_clearly() {
    let component = guest("fixture_actor");
    // /dev/zero as input: one endless line. Under a 1 GiB data limit, so a read of the whole
    // line fails fast instead of taking the machine.
    let out = Command::new("prlimit")
        .arg("--data=1073741824")
        .arg("--")
        .arg(sharehost_tests::sharehost_bin!())
        .arg("test-plugin")
        .arg(&component)
        .args(["--input", "/dev/zero"])
        .env("SHAREHOST_LOG", "off")
        .output()
        .expect("run prlimit sharehost");
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success(), "{stderr}");
    assert!(
        stderr.contains("input /dev/zero: line 1: a line is longer than the 16777216-byte maximum"),
        "{stderr}"
    );

    let file = input("empty-key", "{\"value\":\"a\"}\n");
    let (ok, _, stderr) = run(&[
        component.as_os_str(),
        "--input".as_ref(),
        file.as_os_str(),
        "--config".as_ref(),
        "=x".as_ref(),
    ]);
    assert!(!ok);
    assert!(
        stderr.contains("--config `=x`: the key is empty (expected KEY=VALUE)"),
        "{stderr}"
    );

    // The cache directory's path names a regular file: the error says so once.
    let cache = input("cache-is-a-file", "");
    let out = Command::new(sharehost_tests::sharehost_bin!())
        .arg("test-plugin")
        .arg(&component)
        .arg("--input")
        .arg(&file)
        .env("SHAREHOST_CACHE_DIR", &cache)
        .env("SHAREHOST_LOG", "off")
        .output()
        .expect("run sharehost");
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success(), "{stderr}");
    assert!(
        stderr.contains(&format!("cache directory {}", cache.display())),
        "{stderr}"
    );
    assert_eq!(stderr.matches("os error 17").count(), 1, "{stderr}");
}

#[test]
fn emits_are_listed_with_secret_values_redacted_and_marked() {
    let file = input(
        "secret-emit",
        "{\"value\":\"emit:valid:tok-4f2a9c-value:1\"}\n",
    );
    let out = Command::new(sharehost_tests::sharehost_bin!())
        .arg("test-plugin")
        .arg(guest("fixture_actor"))
        .arg("--input")
        .arg(&file)
        .args(["--output", "valid"])
        .args(["--secret-env", "api-token=SHAREHOST_TEST_EMIT_TOKEN"])
        .env("SHAREHOST_TEST_EMIT_TOKEN", "tok-4f2a9c-value")
        .env("SHAREHOST_LOG", "off")
        .output()
        .expect("run sharehost");
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let lines = json_lines(&stdout);
    assert_eq!(lines[0]["verdict"], "accept", "{stdout}");
    assert_eq!(
        lines[0]["emits"][0]["value"], "[secret api-token]",
        "{stdout}"
    );
    assert!(!stdout.contains("tok-4f2a9c-value"), "{stdout}");
}

#[test]
fn a_component_tested_without_a_manifest_is_found_compiled_by_a_manifest_with_another_memory_limit()
{
    // The cache entry's key held the runtime's memory limit, which shapes no code outside the
    // compact pool: test-plugin's own 64 MiB and a project's 32 MiB compiled the same
    // component twice, and `check` after `test-plugin` compiled again.
    let dir = std::env::temp_dir().join(sharehost_tests::unique("sharehost-test-plugin-cache"));
    std::fs::create_dir_all(&dir).expect("dir");
    let component = guest("order_validator");
    let manifest = dir.join("manifest.toml");
    std::fs::write(
        &manifest,
        format!(
            "[cluster]\nbootstrap = \"127.0.0.1:9\"\n\n\
             [[pipeline]]\nname = \"p\"\ntopics = [\"o\"]\ngroup = \"g\"\ncomponent = \"{}\"\n\
             memory_limit_mib = 32\n",
            component.display()
        ),
    )
    .expect("manifest");
    let file = input("cache", "{\"value\":\"x\"}\n");
    let compiled = |extra: &[&std::ffi::OsStr]| {
        let out = Command::new(sharehost_tests::sharehost_bin!())
            .arg("test-plugin")
            .arg(&component)
            .arg("--input")
            .arg(&file)
            .args(extra)
            .env("SHAREHOST_LOG", "off")
            .env("SHAREHOST_CACHE_DIR", dir.join("cache"))
            .output()
            .expect("run sharehost");
        let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
        assert!(out.status.success(), "{stdout}");
        json_lines(&stdout)
            .last()
            .map(|s| s["summary"]["compiled"].clone())
            .unwrap_or_default()
    };
    assert_eq!(compiled(&[]), "now");
    assert_eq!(
        compiled(&["--manifest".as_ref(), manifest.as_os_str()]),
        "from the cache"
    );
    let entries = std::fs::read_dir(dir.join("cache"))
        .expect("cache dir")
        .filter_map(Result::ok)
        .filter(|e| e.path().extension().is_some_and(|x| x == "cwasm"))
        .count();
    assert_eq!(entries, 1, "one compiled entry for both");
    let _ = std::fs::remove_dir_all(&dir);
}

#[path = "../host/examples/pricing_service.rs"]
#[allow(dead_code)]
mod pricing_service;

/// The offline fraud-check manifest (`sharehost_tests::manifests`) for `format`, in `dir`.
fn schema_manifest(dir: &std::path::Path, score_url: &str, format: &str) -> PathBuf {
    let manifest = dir.join(format!("manifest-{format}.toml"));
    std::fs::write(
        &manifest,
        sharehost_tests::manifests::offline_schema_manifest(
            &guest("fraud_check"),
            score_url,
            format,
            "orders-scored",
        ),
    )
    .expect("write manifest");
    manifest
}

#[test]
fn schema_files_stand_in_for_the_registry_and_records_written_as_json_are_encoded_first() {
    use base64::Engine as _;
    let rt = tokio::runtime::Runtime::new().expect("runtime");
    let app = pricing_service::app(pricing_service::Args {
        token: Some("tok-schema".to_owned()),
        ..Default::default()
    });
    let score_url = format!(
        "http://{}",
        rt.block_on(sharehost_tests::serve_on_loopback(app))
    );
    let dir = std::env::temp_dir().join(format!(
        "sharehost-test-plugin-schema-files-{}",
        std::process::id()
    ));
    std::fs::create_dir_all(&dir).expect("dir");
    let fixtures = sharehost_tests::repo_root().join("tests/fixtures/schemas");
    let order = |id: &str, amount: f64, quantity: serde_json::Value| {
        serde_json::json!({
            "topic": "orders",
            "key": id,
            "value": serde_json::json!({"id": id, "amount": amount, "customer": "ann", "quantity": quantity}).to_string(),
        })
        .to_string()
    };
    // Framed by hand with an id no file has: what a captured record of another schema is.
    let unknown = base64::engine::general_purpose::STANDARD.encode([0u8, 0, 0, 0, 99, 2, b'x']);
    let file = input(
        "schema-files",
        &[
            order("o-1", 125.0, 1.into()),
            order("o-2", 900.0, 3.into()),
            serde_json::json!({"topic": "orders", "key": "x", "value": {"base64": unknown}})
                .to_string(),
        ]
        .join("\n"),
    );
    let test_plugin = |manifest: &std::path::Path, input: &std::path::Path, files: &[PathBuf]| {
        let mut cmd = Command::new(sharehost_tests::sharehost_bin!());
        cmd.arg("test-plugin")
            .arg(guest("fraud_check"))
            .arg("--input")
            .arg(input)
            .arg("--manifest")
            .arg(manifest)
            .env("SHAREHOST_LOG", "off")
            .env("SCORING_TOKEN", "tok-schema");
        for (subject, f) in ["orders-value", "orders-scored-value"].iter().zip(files) {
            cmd.arg("--schema-file")
                .arg(format!("{subject}={}", f.display()));
        }
        let out = cmd.output().expect("run test-plugin");
        (
            out.status.success(),
            String::from_utf8_lossy(&out.stdout).into_owned(),
            String::from_utf8_lossy(&out.stderr).into_owned(),
        )
    };

    for (format, input_schema, output_schema) in [
        ("avro", "order.avsc", "scored-order.avsc"),
        ("protobuf", "order.proto", "scored-order.proto"),
    ] {
        let manifest = schema_manifest(&dir, &score_url, format);
        let files = [fixtures.join(input_schema), fixtures.join(output_schema)];
        let (ok, stdout, stderr) = test_plugin(&manifest, &file, &files);
        assert!(ok, "{format}: {stderr}");
        let lines = json_lines(&stdout);
        assert_eq!(lines[0]["verdict"], "accept", "{format}: {stdout}");
        let emitted: serde_json::Value = serde_json::from_str(
            lines[0]["emits"][0]["value"]
                .as_str()
                .unwrap_or_else(|| panic!("{format}: an emit: {stdout}")),
        )
        .expect("the emit is JSON");
        assert_eq!(
            (emitted["id"].as_str(), emitted["score"].as_i64()),
            (Some("o-1"), Some(12)),
            "{format}: the plugin read the decoded order: {stdout}"
        );
        assert_eq!(lines[1]["verdict"], "reject", "{format}: {stdout}");
        assert_eq!(lines[1]["reason"], "score 90 > 80", "{format}: {stdout}");
        assert_eq!(
            lines[2]["reason"], "value: schema id 99 is not in the schema files",
            "{format}: {stdout}"
        );
    }

    // The output's schema from a file refuses an emit that does not fit it: the score a string.
    let strict = dir.join("scored-strict.avsc");
    std::fs::write(
        &strict,
        std::fs::read_to_string(fixtures.join("scored-order.avsc"))
            .expect("read")
            .replace(
                r#""name": "score", "type": "long""#,
                r#""name": "score", "type": "string""#,
            ),
    )
    .expect("write");
    let manifest = schema_manifest(&dir, &score_url, "avro");
    let (ok, stdout, stderr) =
        test_plugin(&manifest, &file, &[fixtures.join("order.avsc"), strict]);
    assert!(ok, "{stderr}");
    let reason = json_lines(&stdout)[0]["reason"]
        .as_str()
        .unwrap_or("")
        .to_owned();
    assert!(
        reason.starts_with(
            "output scored (schema id 2): the emit does not conform to the Avro schema"
        ),
        "{stdout}"
    );

    // A record written as JSON that its schema cannot encode is the input's mistake: named.
    let bad = input("schema-files-bad", &order("o-3", 1.0, 2.5.into()));
    let (ok, _, stderr) = test_plugin(
        &manifest,
        &bad,
        &[
            fixtures.join("order.avsc"),
            fixtures.join("scored-order.avsc"),
        ],
    );
    assert!(!ok);
    assert!(
        stderr.contains("record 1 (topic orders, offset 0): value as subject orders-value (schema id 1): it does not conform to the Avro schema"),
        "{stderr}"
    );

    // A record written as JSON on a topic whose subject has no schema: named, with the way out.
    let no_topic = input("schema-files-no-topic", r#"{"value": "{\"id\": \"o-4\"}"}"#);
    let (ok, _, stderr) = test_plugin(
        &manifest,
        &no_topic,
        &[
            fixtures.join("order.avsc"),
            fixtures.join("scored-order.avsc"),
        ],
    );
    assert!(!ok);
    assert!(
        stderr.contains("record 1 (topic test, offset 0): value is JSON to encode, but subject test-value has no schema in the schema files"),
        "{stderr}"
    );

    // Schema files that cannot stand in for the registry are refused naming the file.
    let no_type = dir.join("order.txt");
    std::fs::write(&no_type, "{}").expect("write");
    let broken = dir.join("broken.avsc");
    std::fs::write(
        &broken,
        r#"{"type": "record", "name": "X", "fields": [{"name": "a"}]}"#,
    )
    .expect("write");
    for (files, expected) in [
        (
            vec![no_type.clone()],
            "order.txt: the type is told by the extension",
        ),
        (
            vec![broken.clone()],
            "broken.avsc: its Avro schema does not parse",
        ),
        (vec![dir.join("missing.avsc")], "missing.avsc: "),
    ] {
        let (ok, _, stderr) = test_plugin(&manifest, &file, &files);
        assert!(!ok, "{files:?}");
        assert!(stderr.contains(expected), "{files:?}: {stderr}");
    }
    for arg in ["orders-value", "=x.avsc", "orders-value@x=x.avsc"] {
        let out = Command::new(sharehost_tests::sharehost_bin!())
            .args([
                "test-plugin",
                "c.wasm",
                "--input",
                "i.jsonl",
                "--manifest",
                "m.toml",
            ])
            .args(["--schema-file", arg])
            .output()
            .expect("run");
        assert!(!out.status.success());
        assert!(
            String::from_utf8_lossy(&out.stderr).contains("--schema-file"),
            "{arg}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
    }
}
