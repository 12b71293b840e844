//! Signed components through the `sharehost` binary: when the manifest trusts minisign keys,
//! a component without a valid signature by one of them is refused at `check`, at `run` and at
//! a hot-swap (HTTP or the file watch), naming the file and the reason, while the active
//! (signed) version keeps judging and nothing is lost; and the precompiled cache never stands
//! in for a signature.
//!
//! Keys and signatures are made here with the `minisign` crate, exactly as `minisign -G` and
//! `minisign -Sm` make them (a fresh key pair per run; no secret key is kept anywhere).
//!
//! Part of the host package's tests (it needs the `sharehost` binary), like tests/faults.rs.
//! The broker scenario needs `dev/kafka up`; the others need no broker.

use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::Arc;
use std::time::{Duration, Instant};

use sharehost::runtime::{
    LoadError, PluginLimits, PluginRuntime, RuntimeConfig, TrustPolicy, TrustRefusal, TrustedKey,
    signature_path,
};
use sharehost_tests::host::{HostProcess, PATIENCE};
use sharehost_tests::ledger::Ledger;
use sharehost_tests::sharehost_bin;
use sharehost_tests::signing::Signer;
use sharehost_tests::{
    FAULT_SETTINGS, blocking, bootstrap, client, fresh_group_with, guest, ledger_manifest,
    new_version, plugin_record, produce_ids, topic_records, topic_with_dead_letters, unique,
    wait_until_drained,
};

const PARTITIONS: i32 = 3;

fn scratch(tag: &str) -> PathBuf {
    let dir = std::env::temp_dir().join(unique(&format!("sharehost-trust-{tag}")));
    std::fs::create_dir_all(&dir).expect("temp dir");
    dir
}

/// A ledger manifest (topic, group) whose host trusts `keys`.
fn trusting_manifest(
    dir: &Path,
    keys: &[String],
    component: &Path,
    topic: &str,
    group: &str,
) -> PathBuf {
    let keys: Vec<String> = keys.iter().map(|k| format!("\"{k}\"")).collect();
    let text = format!(
        "[trust]\nkeys = [{}]\n\n{}",
        keys.join(", "),
        ledger_manifest(
            &bootstrap(),
            topic,
            group,
            component,
            r#"reject-every = "7""#,
            &format!("{FAULT_SETTINGS}dead_letter_topic = \"{topic}-dlq\"\n"),
        )
    );
    let path = dir.join(format!("{}.toml", unique("manifest")));
    std::fs::write(&path, text).expect("write manifest");
    path
}

/// Runs `sharehost SUBCOMMAND manifest` to its end; returns success and stdout + stderr. `run`
/// runs with `--strict`, which refuses to start when a pipeline cannot load (without it the
/// host reports that pipeline failed and tries it again while the others run:
/// tests/tenants.rs).
fn sharehost_cmd(subcommand: &str, manifest: &Path) -> (bool, String) {
    let strict: &[&str] = if subcommand == "run" {
        &["--strict"]
    } else {
        &[]
    };
    let out = Command::new(sharehost_bin!())
        .arg(subcommand)
        .args(strict)
        .arg(manifest)
        .env("SHAREHOST_LOG", "warn")
        .output()
        .expect("run sharehost");
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    (out.status.success(), text)
}

/// Puts a (wrong) signature in place for one case.
type Arrange<'a> = Box<dyn Fn() + 'a>;

#[test]
fn check_and_run_refuse_an_unsigned_or_wrongly_signed_component_naming_file_and_reason() {
    let dir = scratch("cli");
    let (alice, stranger) = (Signer::new(), Signer::new());
    let component = dir.join("ledger.wasm");
    std::fs::write(&component, new_version(&guest("fixture_ledger"), "cli")).expect("write");
    let other = dir.join("other.wasm");
    std::fs::write(&other, new_version(&guest("fixture_ledger"), "other")).expect("write");
    let manifest = trusting_manifest(&dir, &[alice.public()], &component, "t", "g");
    let sig = signature_path(&component);
    let sig_shown = sig.display().to_string();

    // Each wrong signature, with the words the refusal must contain.
    let cases: Vec<(&str, Arrange<'_>, Vec<String>)> = vec![
        (
            "unsigned",
            Box::new(|| {
                let _ = std::fs::remove_file(&sig);
            }),
            vec!["no signature".into(), format!("expected {sig_shown}")],
        ),
        (
            "signed by a key not trusted",
            Box::new(|| stranger.sign(&component)),
            vec![
                format!("signed by unknown key {}", stranger.id()),
                format!("the pipeline trusts {}", alice.id()),
            ],
        ),
        (
            "a trusted key's signature of another file",
            Box::new(|| {
                alice.sign(&other);
                std::fs::rename(signature_path(&other), &sig).expect("move signature");
            }),
            vec![format!(
                "bad signature: the signature by trusted key {}",
                alice.id()
            )],
        ),
        (
            "malformed",
            Box::new(|| {
                std::fs::write(&sig, "untrusted comment: hi\nnot base64\n").expect("write")
            }),
            vec![format!("malformed signature {sig_shown}")],
        ),
    ];
    let component_shown = component.display().to_string();
    for (case, arrange, words) in &cases {
        arrange();
        for subcommand in ["check", "run"] {
            let (ok, out) = sharehost_cmd(subcommand, &manifest);
            assert!(!ok, "{subcommand} refuses a component {case}: {out}");
            assert!(
                out.contains(&format!(
                    "{component_shown}: refused by the pipeline's [trust]"
                )),
                "{subcommand}, {case}: names the file: {out}"
            );
            for w in words {
                assert!(
                    out.contains(w.as_str()),
                    "{subcommand}, {case}: says {w:?}: {out}"
                );
            }
        }
    }

    // Signed by the trusted key: check passes and says so.
    alice.sign(&component);
    let (ok, out) = sharehost_cmd("check", &manifest);
    assert!(ok, "a signed component passes check: {out}");
    assert!(
        out.contains(&format!("signature verified; trusted keys {}", alice.id())),
        "{out}"
    );
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn a_cached_compilation_never_stands_in_for_a_signature() {
    let dir = scratch("cache");
    let alice = Signer::new();
    let component = dir.join("ledger.wasm");
    std::fs::write(&component, new_version(&guest("fixture_ledger"), "cache")).expect("write");
    alice.sign(&component);
    let runtime = PluginRuntime::new(RuntimeConfig {
        max_plugin_memory: 64 << 20,
        max_instances: 8,
        cache_dir: Some(dir.join("cache")),
        ..RuntimeConfig::default()
    })
    .expect("runtime");
    let limits = PluginLimits {
        trust: TrustPolicy::new([TrustedKey::parse(&alice.public()).expect("key")]).map(Arc::new),
        ..PluginLimits::default()
    };
    let first = runtime
        .compile_blocking(&component, &limits)
        .expect("signed: compiled");
    assert_eq!(first.signer.as_deref(), Some(alice.id().as_str()));
    let again = runtime
        .compile_blocking(&component, &limits)
        .expect("signed: from the cache");
    assert_eq!(again.origin, sharehost::runtime::Origin::Cached);
    // The same bytes, now without their signature: the cache holds them, and still no load.
    std::fs::remove_file(signature_path(&component)).expect("remove signature");
    match runtime.compile_blocking(&component, &limits) {
        Err(LoadError::Untrusted {
            refusal: TrustRefusal::NoSignature { signature },
            ..
        }) => assert_eq!(signature, signature_path(&component)),
        Err(e) => panic!("refused for the missing signature, not: {e}"),
        Ok(_) => panic!("a cache hit let an unsigned component in"),
    }
    // Without a trust policy the same runtime loads it (the refusal was the policy's).
    let open = runtime
        .compile_blocking(&component, &PluginLimits::default())
        .expect("no policy");
    assert_eq!(open.signer, None);
    let _ = std::fs::remove_dir_all(&dir);
}

#[tokio::test]
async fn cached_code_of_one_component_never_runs_for_another_under_a_verified_signature() {
    let dir = scratch("cache-moved");
    let alice = Signer::new();
    // Two signed components that judge differently: one panics on a record `bad`, one accepts it.
    let panics = dir.join("panics.wasm");
    let accepts = dir.join("accepts.wasm");
    std::fs::copy(guest("fixture_panic"), &panics).expect("copy");
    std::fs::copy(guest("accept_all"), &accepts).expect("copy");
    alice.sign(&panics);
    alice.sign(&accepts);
    let config = |cache: Option<PathBuf>| RuntimeConfig {
        max_plugin_memory: 64 << 20,
        max_instances: 8,
        cache_dir: cache,
        ..RuntimeConfig::default()
    };
    let cached = PluginRuntime::new(config(Some(dir.join("cache")))).expect("runtime");
    let limits = || PluginLimits {
        trust: TrustPolicy::new([TrustedKey::parse(&alice.public()).expect("key")]).map(Arc::new),
        ..PluginLimits::default()
    };
    let first = cached
        .compile(&panics, &limits())
        .await
        .expect("signed: compiled");
    // The accepting component's hash, from a runtime without a cache.
    let accepts_hash = PluginRuntime::new(config(None))
        .expect("runtime")
        .compile(&accepts, &limits())
        .await
        .expect("signed")
        .hash;
    // The panicking component's entry, copied by this same user (right owner, right mode)
    // to the name the accepting component's entry would have.
    let entries: Vec<PathBuf> = std::fs::read_dir(dir.join("cache"))
        .expect("cache dir")
        .filter_map(|e| e.ok().map(|e| e.path()))
        .filter(|p| p.extension().is_some_and(|x| x == "cwasm"))
        .collect();
    assert_eq!(entries.len(), 1, "one entry: {entries:?}");
    let name = entries[0]
        .file_name()
        .and_then(|n| n.to_str())
        .expect("entry name")
        .replace(&first.hash, &accepts_hash);
    std::fs::copy(&entries[0], dir.join("cache").join(name)).expect("plant");

    let again = cached
        .compile(&accepts, &limits())
        .await
        .expect("signed: loads");
    assert_eq!(
        again.origin,
        sharehost::runtime::Origin::Compiled,
        "the planted entry was refused and the verified bytes compiled"
    );
    let mut plugin = cached
        .load(&accepts, limits(), Vec::new())
        .await
        .expect("loads");
    let outcome = plugin.handle(&[plugin_record(0, "bad", &[])]).await;
    assert!(
        outcome.fault().is_none(),
        "the accepting component's own code ran, not the planted one: {:?}",
        outcome.fault()
    );
    let _ = std::fs::remove_dir_all(&dir);
}

/// Polls `/pipelines` until `cond` holds on it (a hang guard of [`PATIENCE`]).
fn wait_status(host: &HostProcess, what: &str, cond: impl Fn(&serde_json::Value) -> bool) {
    let deadline = Instant::now() + PATIENCE;
    loop {
        let s = host.status();
        if cond(&s) {
            return;
        }
        assert!(Instant::now() < deadline, "gave up waiting for {what}: {s}");
        std::thread::sleep(Duration::from_millis(100));
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_swap_to_an_unsigned_or_wrongly_signed_component_is_refused_while_the_signed_one_keeps_judging()
 {
    let (alice, stranger) = (Signer::new(), Signer::new());
    let client = Arc::new(client().await);
    let (topic, dlq) = topic_with_dead_letters(&client, "trust-swap", PARTITIONS, 1).await;
    let group = fresh_group_with(
        &client,
        Some(30_000),
        &[("share.session.timeout.ms", "6000")],
    )
    .await;
    let mut ids = produce_ids(&client, &topic, PARTITIONS, 0..600).await;
    let dir = scratch("swap");
    let original = guest("fixture_ledger");
    let v1 = dir.join("ledger-v1.wasm");
    std::fs::write(&v1, new_version(&original, "v1")).expect("write v1");
    alice.sign(&v1);
    let manifest = trusting_manifest(&dir, &[alice.public()], &v1, &topic, &group);
    let host =
        Arc::new(blocking(move || HostProcess::start(sharehost_bin!(), &manifest, "host")).await);
    let h = host.clone();
    blocking(move || {
        h.wait_for("records judged by the signed version", |s| {
            s.judged() >= 100
        })
    })
    .await;
    let active = host.status()[0]["active_version"]
        .as_str()
        .expect("active version")
        .to_owned();

    // HTTP swaps: unsigned, signed by a stranger, signed by alice over other bytes.
    let unsigned = dir.join("ledger-unsigned.wasm");
    std::fs::write(&unsigned, new_version(&original, "unsigned")).expect("write");
    let foreign = dir.join("ledger-foreign.wasm");
    std::fs::write(&foreign, new_version(&original, "foreign")).expect("write");
    stranger.sign(&foreign);
    let tampered = dir.join("ledger-tampered.wasm");
    std::fs::write(&tampered, new_version(&original, "tampered")).expect("write");
    alice.sign(&tampered);
    std::fs::write(&tampered, new_version(&original, "tampered!")).expect("tamper");
    for (path, why) in [
        (
            &unsigned,
            format!(
                "no signature: expected {}",
                signature_path(&unsigned).display()
            ),
        ),
        (&foreign, format!("signed by unknown key {}", stranger.id())),
        (
            &tampered,
            format!("bad signature: the signature by trusted key {}", alice.id()),
        ),
    ] {
        let (h, body) = (host.clone(), format!(r#"{{"path":"{}"}}"#, path.display()));
        let (code, answer) =
            blocking(move || h.http("POST", "/pipelines/ledger/swap", &body)).await;
        assert_eq!(
            code,
            422,
            "a swap to {} is refused: {answer}",
            path.display()
        );
        assert!(
            answer.contains(&format!(
                "{}: refused by the pipeline's [trust]",
                path.display()
            )) && answer.contains(&why),
            "the refusal names the file and says {why:?}: {answer}"
        );
    }

    // The file watch: the active file replaced in place by bytes its signature does not cover.
    // Renamed into place, so the watch sees one change (not a half-written file).
    let next = dir.join("ledger-v1.next");
    std::fs::write(&next, new_version(&original, "v1 replaced")).expect("write");
    std::fs::rename(&next, &v1).expect("replace v1");
    let (h, refused) = (
        host.clone(),
        format!(
            "{}: refused by the pipeline's [trust]: bad signature",
            v1.display()
        ),
    );
    blocking(move || {
        wait_status(&h, "the watched swap refused", |s| {
            s[0]["last_swap_error"]
                .as_str()
                .is_some_and(|e| e.contains(&refused))
        })
    })
    .await;

    // More records: all judged, by the signed version alone, none lost.
    ids.extend(produce_ids(&client, &topic, PARTITIONS, 600..1200).await);
    let (h, n) = (host.clone(), ids.len());
    blocking(move || h.wait_for("every id judged", |s| s.distinct().len() >= n)).await;
    let status = host.status();
    let (_, metrics) = host.http("GET", "/metrics", "");
    let host = Arc::try_unwrap(host).ok().expect("sole owner");
    let (_, seen) = blocking(move || host.stop()).await;
    let g = group.clone();
    blocking(move || wait_until_drained(&g)).await;
    let mut ledger = Ledger::new("trust-swap", ids.iter().cloned());
    seen.record(&mut ledger);
    ledger.check();
    assert_eq!(ledger.duplicates(), 0, "nothing judged twice: {ledger}");
    assert_eq!(status[0]["active_version"], active.as_str(), "{status}");
    let versions = status[0]["versions"].as_object().expect("versions");
    assert_eq!(
        versions.keys().collect::<Vec<_>>(),
        [&active],
        "only the signed version judged: {status}"
    );
    assert!(
        metrics.contains(r#"sharehost_swaps_total{pipeline="ledger",result="failed"} 4"#)
            && metrics.contains(r#"sharehost_swaps_total{pipeline="ledger",result="ok"} 0"#),
        "three HTTP swaps and one watched swap refused, none taken: {metrics}"
    );
    // The signer shows in /pipelines and in the version metric.
    assert_eq!(status[0]["signer"], alice.id().as_str(), "{status}");
    let version_line = format!(
        r#"sharehost_plugin_version{{pipeline="ledger",version="{}",signer="{}"}} 1"#,
        active.get(..12).unwrap_or_default(),
        alice.id()
    );
    assert!(
        metrics.contains(&version_line),
        "{version_line} in {metrics}"
    );
    // And in every dead letter's provenance.
    let dead = topic_records(&client, &dlq, 1).await;
    assert!(!dead.is_empty(), "every 7th id was dead-lettered");
    for (_, r) in &dead {
        let signer = r
            .headers
            .iter()
            .find(|h| h.key == "sharehost.plugin.signer")
            .and_then(|h| h.value.as_deref());
        assert_eq!(signer, Some(alice.id().as_bytes()), "{:?}", r.headers);
    }
    let _ = std::fs::remove_dir_all(&dir);
}
