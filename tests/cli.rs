//! The `sharehost` command line against the real broker: what a user sees when the address,
//! the CA, or the password is wrong. Lives in the host package so cargo builds the binary once,
//! with the same features as the tests (no nested cargo call).

use std::process::Command;

use sharehost_tests::{SaslSsl, bootstrap, repo_root};

/// Runs `sharehost probe` and returns (success, stdout, stderr).
fn probe(args: &[&str], env: &[(&str, &str)]) -> (bool, String, String) {
    let out = Command::new(sharehost_tests::sharehost_bin!())
        .arg("probe")
        .args(args)
        .envs(env.iter().copied())
        .output()
        .expect("run sharehost");
    (
        out.status.success(),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

fn assert_one_error_line(stderr: &str, needles: &[&str]) {
    let lines: Vec<&str> = stderr.lines().filter(|l| !l.trim().is_empty()).collect();
    assert_eq!(lines.len(), 1, "exactly one error line, got: {stderr}");
    assert!(lines[0].starts_with("error: "), "{stderr}");
    for n in needles {
        assert!(lines[0].contains(n), "{n:?} missing from: {stderr}");
    }
}

#[test]
fn the_cli_names_what_is_wrong_in_one_line() {
    let boot = bootstrap();
    let (ok, stdout, _) = probe(&["--bootstrap", &boot], &[]);
    assert!(
        ok && stdout.contains("ShareFetch"),
        "probe works against the broker: {stdout}"
    );

    let (ok, _, err) = probe(&["--bootstrap", "localhost"], &[]);
    assert!(!ok);
    assert_one_error_line(
        &err,
        &["invalid bootstrap address \"localhost\"", "missing port"],
    );

    // Port 1 on loopback: nothing listens there.
    let (ok, _, err) = probe(&["--bootstrap", "127.0.0.1:1"], &[]);
    assert!(!ok);
    assert_one_error_line(&err, &["cannot connect to bootstrap broker 127.0.0.1:1"]);

    let (ok, _, err) = probe(
        &["--bootstrap", &boot, "--tls-ca", "/nonexistent/ca.pem"],
        &[],
    );
    assert!(!ok);
    assert_one_error_line(&err, &["cannot read CA file /nonexistent/ca.pem"]);

    let s = SaslSsl::from_harness();
    let ca = s.ca_file.display().to_string();
    let common = [
        "--bootstrap",
        s.bootstrap.as_str(),
        "--tls-ca",
        ca.as_str(),
        "--sasl-username",
        s.username.as_str(),
    ];
    let (ok, stdout, err) = probe(
        &[&common[..], &["--sasl-mechanism", "SCRAM-SHA-512"]].concat(),
        &[("SHAREHOST_SASL_PASSWORD", &s.password)],
    );
    assert!(ok, "probe over SASL_SSL works: {err}");
    assert!(stdout.contains("ShareFetch"));
    let (ok, _, err) = probe(
        &[&common[..], &["--sasl-mechanism", "SCRAM-SHA-512"]].concat(),
        &[("SHAREHOST_SASL_PASSWORD", "pw-that-must-not-leak")],
    );
    assert!(!ok);
    assert_one_error_line(&err, &["SASL SCRAM-SHA-512 authentication", "failed"]);
    assert!(
        !err.contains("pw-that-must-not-leak"),
        "the password never appears in the error: {err}"
    );

    let bad_ca = repo_root()
        .join("tests/fixtures/unrelated-ca.pem")
        .display()
        .to_string();
    let (ok, _, err) = probe(
        &[
            "--bootstrap",
            s.bootstrap.as_str(),
            "--tls-ca",
            bad_ca.as_str(),
        ],
        &[],
    );
    assert!(!ok);
    assert_one_error_line(&err, &["TLS handshake", "not signed by a trusted CA"]);
}

#[test]
fn an_empty_admin_token_is_refused_before_anything_starts() {
    // An empty token would let any `Authorization: Bearer ` through to the rollout endpoints.
    let dir = std::env::temp_dir().join(format!("sharehost-cli-token-{}", std::process::id()));
    std::fs::create_dir_all(&dir).expect("temp dir");
    let manifest = dir.join("host.toml");
    std::fs::write(
        &manifest,
        format!(
            "[cluster]\nbootstrap = \"127.0.0.1:1\"\n\n[admin]\nlisten = \"0.0.0.0:0\"\ntoken_env = \"SHAREHOST_TEST_EMPTY_TOKEN\"\n\n[[pipeline]]\nname = \"orders\"\ntopics = [\"orders\"]\ngroup = \"orders\"\ncomponent = {:?}\n",
            sharehost_tests::guest("accept_all")
        ),
    )
    .expect("manifest");
    let out = Command::new(sharehost_tests::sharehost_bin!())
        .arg("run")
        .arg(&manifest)
        .env("SHAREHOST_TEST_EMPTY_TOKEN", "")
        .output()
        .expect("run sharehost");
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success(), "{stderr}");
    assert!(
        stderr
            .contains("admin.token_env: environment variable SHAREHOST_TEST_EMPTY_TOKEN is empty"),
        "{stderr}"
    );
    let _ = std::fs::remove_dir_all(&dir);
}

/// Runs `sharehost ARGS` under a data-segment limit (`prlimit --data`, which counts the heap
/// and every private writable mapping but not the address space wasmtime only reserves), so a
/// bound that regresses makes the child fail at 1 GiB instead of eating the machine, and
/// under PATIENCE as a hang guard (a FIFO opened for reading blocks without a writer).
/// Returns (success, stderr).
fn bounded(args: &[&std::ffi::OsStr], env: &[(&str, &str)]) -> (bool, String) {
    use std::time::Instant;
    let mut child = Command::new("prlimit")
        .arg("--data=1073741824")
        .arg("--")
        .arg(sharehost_tests::sharehost_bin!())
        .args(args)
        .env("SHAREHOST_LOG", "off")
        .envs(env.iter().copied())
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .expect("run prlimit sharehost");
    let until = Instant::now() + sharehost_tests::host::PATIENCE;
    let status = loop {
        if let Some(s) = child.try_wait().expect("wait") {
            break s;
        }
        if Instant::now() > until {
            let _ = child.kill();
            panic!("sharehost {args:?} did not end (a blocking open or an unbounded read)");
        }
        std::thread::sleep(std::time::Duration::from_millis(20));
    };
    let mut stderr = String::new();
    if let Some(mut e) = child.stderr.take() {
        use std::io::Read;
        let _ = e.read_to_string(&mut stderr);
    }
    (status.success(), stderr)
}

/// A pipeline table for `check` (a real component, so everything up to the secrets loads).
fn pipeline_table(i: usize) -> String {
    format!(
        "[[pipeline]]\nname = \"p{i}\"\ntopics = [\"t{i}\"]\ngroup = \"g{i}\"\ncomponent = {:?}\n",
        sharehost_tests::guest("accept_all")
    )
}

#[test]
fn check_refuses_a_manifest_or_secret_that_is_a_device_a_fifo_or_too_large_naming_file_and_bound() {
    let dir = std::env::temp_dir().join(sharehost_tests::unique("sharehost-cli-files"));
    std::fs::create_dir_all(&dir).expect("temp dir");
    let check =
        |manifest: &std::path::Path| bounded(&["check".as_ref(), manifest.as_os_str()], &[]);

    // The manifest replaced by a symlink to /dev/zero: refused by type, not read.
    let zero = dir.join("zero.toml");
    std::os::unix::fs::symlink("/dev/zero", &zero).expect("symlink");
    let (ok, err) = check(&zero);
    assert!(!ok);
    assert_one_error_line(
        &err,
        &[
            &zero.display().to_string(),
            "cannot read the manifest: it is a character device, not a regular file",
        ],
    );

    // A FIFO with no writer: refused by type at once (it used to block the open).
    let fifo = dir.join("fifo.toml");
    assert!(
        Command::new("mkfifo")
            .arg(&fifo)
            .status()
            .expect("mkfifo")
            .success()
    );
    let (ok, err) = check(&fifo);
    assert!(!ok);
    assert_one_error_line(
        &err,
        &[&fifo.display().to_string(), "it is a FIFO (named pipe)"],
    );

    // A file over the manifest's bound (sparse: no disk spent).
    let big = dir.join("big.toml");
    std::fs::File::create(&big)
        .and_then(|f| f.set_len(5 << 20))
        .expect("sparse file");
    let (ok, err) = check(&big);
    assert!(!ok);
    assert_one_error_line(
        &err,
        &[
            &big.display().to_string(),
            "more than a manifest's 4194304-byte (4 MiB) maximum",
        ],
    );

    // A secret file that is /dev/zero: refused by type, naming the secret and the file.
    let secret = dir.join("secret.toml");
    std::fs::write(
        &secret,
        format!(
            "[cluster]\nbootstrap = \"127.0.0.1:1\"\n\n{}[pipeline.secrets]\nt = {{ file = \"/dev/zero\" }}\n",
            pipeline_table(0)
        ),
    )
    .expect("manifest");
    let (ok, err) = check(&secret);
    assert!(!ok);
    assert!(
        err.contains("secrets.t: cannot read /dev/zero: is a character device, not a regular file"),
        "{err}"
    );

    // 10,002 pipelines: refused on the count, before any component is loaded.
    let many = dir.join("many.toml");
    let mut text = String::from("[cluster]\nbootstrap = \"127.0.0.1:1\"\n\n");
    for i in 0..10_002 {
        text.push_str(&pipeline_table(i));
    }
    std::fs::write(&many, text).expect("manifest");
    let (ok, err) = check(&many);
    assert!(!ok);
    assert_one_error_line(
        &err,
        &[
            &many.display().to_string(),
            "pipeline: 10002 pipelines, more than the 256 allowed",
        ],
    );
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn new_refuses_an_sdk_path_that_would_break_cargo_toml() {
    let dir = std::env::temp_dir().join(sharehost_tests::unique("sharehost-cli-new"));
    // A checkout whose path holds a quote and a newline.
    let sdk = dir.join("sdk\"\nx");
    std::fs::create_dir_all(sdk.join("guest-sdk")).expect("sdk dir");
    let out = Command::new(sharehost_tests::sharehost_bin!())
        .args(["new", "rust", "quoted", "--dir"])
        .arg(&dir)
        .arg("--sdk")
        .arg(&sdk)
        .output()
        .expect("run sharehost");
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success(), "{stderr}");
    assert!(stderr.contains("cannot hold as written"), "{stderr}");
    assert!(!dir.join("quoted").exists(), "nothing written");
    let _ = std::fs::remove_dir_all(&dir);
}

/// Runs `sharehost ARGS` with `stdin` and returns (success, stdout, stderr).
fn sharehost_with_input(args: &[&str], stdin: &str) -> (bool, String, String) {
    use std::io::Write as _;
    let mut child = Command::new(sharehost_tests::sharehost_bin!())
        .args(args)
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .expect("run sharehost");
    child
        .stdin
        .take()
        .expect("stdin")
        .write_all(stdin.as_bytes())
        .expect("write stdin");
    let out = child.wait_with_output().expect("wait for sharehost");
    (
        out.status.success(),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

/// What a consumed line says of its record: key, value and headers as JSON.
fn payload(line: &str) -> String {
    let v: serde_json::Value = serde_json::from_str(line).expect("a JSON line");
    serde_json::json!([v["key"], v["value"], v["headers"]]).to_string()
}

#[test]
fn produce_and_consume_carry_keys_values_and_headers_through_a_topic_as_json_lines() {
    let boot = bootstrap();
    let topic = sharehost_tests::unique("cli-io");
    let create = |extra: &[&str]| {
        let mut args = vec![
            "create-topics",
            &topic,
            "--partitions",
            "3",
            "--bootstrap",
            &boot,
        ];
        args.extend_from_slice(extra);
        sharehost_with_input(&args, "")
    };
    let (ok, _, stderr) = create(&[]);
    assert!(ok && stderr.contains("3 partitions"), "{stderr}");
    let (ok, _, stderr) = create(&[]);
    assert!(!ok);
    assert_one_error_line(
        &stderr,
        &[&format!("creating topic {topic}"), "TopicAlreadyExists"],
    );
    let (ok, _, stderr) = create(&["--if-not-exists"]);
    assert!(ok && stderr.contains("exists already"), "{stderr}");
    let input = [
        r#"{"key":"a","value":"one","headers":[["h","x"],["g",null]]}"#,
        r#"{"value":{"base64":"/wA="}}"#,
        r#"{"key":"b","value":null}"#,
        r#"{"key":"a","value":"two"}"#,
    ];
    let (ok, _, stderr) = sharehost_with_input(
        &["produce", &topic, "--bootstrap", &boot],
        &(input.join("\n") + "\n"),
    );
    assert!(ok && stderr.contains("produced 4 records"), "{stderr}");
    let (ok, stdout, stderr) = sharehost_with_input(
        &["consume", &topic, "--from-beginning", "--bootstrap", &boot],
        "",
    );
    assert!(ok, "{stderr}");
    let mut got: Vec<String> = stdout.lines().map(payload).collect();
    let mut want: Vec<String> = input
        .iter()
        .map(|l| {
            let v: serde_json::Value = serde_json::from_str(l).expect("input");
            let headers = v.get("headers").cloned().unwrap_or(serde_json::json!([]));
            serde_json::json!([
                v.get("key").cloned().unwrap_or_default(),
                v["value"],
                headers
            ])
            .to_string()
        })
        .collect();
    got.sort();
    want.sort();
    assert_eq!(got, want, "{stdout}");
    // One key, one partition, in the order produced.
    let a: Vec<&str> = stdout
        .lines()
        .filter(|l| l.contains(r#""key":"a""#))
        .collect();
    assert!(
        a.len() == 2 && a[0].contains("one") && a[1].contains("two"),
        "{stdout}"
    );
    // What consume prints, produce (and test-plugin) read back.
    let (ok, _, stderr) = sharehost_with_input(
        &["produce", &topic, "--bootstrap", &boot, "--input", "-"],
        &stdout,
    );
    assert!(ok && stderr.contains("produced 4 records"), "{stderr}");
    let (ok, stdout, _) = sharehost_with_input(
        &[
            "consume",
            &topic,
            "--from-beginning",
            "--max",
            "5",
            "--bootstrap",
            &boot,
        ],
        "",
    );
    assert!(ok && stdout.lines().count() == 5, "{stdout}");
    // A topic that does not exist, and a line that is not JSON, each named in one line.
    let (ok, _, stderr) =
        sharehost_with_input(&["produce", "no-such-topic-cli", "--bootstrap", &boot], "");
    assert!(!ok);
    assert_one_error_line(&stderr, &["topic no-such-topic-cli does not exist"]);
    let (ok, _, stderr) =
        sharehost_with_input(&["produce", &topic, "--bootstrap", &boot], "{\"value\":\n");
    assert!(!ok);
    assert_one_error_line(&stderr, &["standard input", "line 1"]);
}
