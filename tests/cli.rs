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
