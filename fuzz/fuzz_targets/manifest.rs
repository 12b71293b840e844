//! The manifest parser (`Manifest::parse`, the text-level half of `Manifest::load`) on arbitrary
//! text, with a scratch folder that holds the files the seed manifests name (components, a CA
//! file), so valid manifests get all the way through validation.
//!
//! Input: the manifest text (invalid UTF-8 is replaced, as a lossy reader would).
//!
//! Asserts:
//! - every error names the manifest file (in the error and first in its message), and a line
//!   and column it gives lie inside the text;
//! - every manifest that parses keeps the documented invariants: at least one pipeline, unique
//!   valid names, batch_size <= max_in_flight, each value in its documented range, components
//!   that exist.
#![no_main]

use std::path::{Path, PathBuf};
use std::sync::OnceLock;

use libfuzzer_sys::fuzz_target;
use sharehost::manifest::{Manifest, ManifestError, defaults};

/// Files the seeds refer to, relative to the manifest's folder.
const FILES: &[&str] = &[
    "plugin.wasm",
    "ca.pem",
    "client.pem",
    "client.key",
    "password.txt",
    "plugins/order_validator.wasm",
    "../target/guests/order_validator.wasm",
];

/// The manifest's path: a file in a scratch folder (it never exists; the text comes from the
/// fuzzer). A distinctive name so an error that names it cannot do so by accident.
fn manifest_path() -> &'static Path {
    static PATH: OnceLock<PathBuf> = OnceLock::new();
    PATH.get_or_init(|| {
        let dir = std::env::temp_dir()
            .join("sharehost-fuzz-manifest")
            .join("conf");
        for f in FILES {
            let p = dir.join(f);
            if let Some(parent) = p.parent() {
                std::fs::create_dir_all(parent).expect("scratch folder");
            }
            std::fs::write(&p, b"fuzz").expect("scratch file");
        }
        dir.join("fuzz-manifest-7f3a.toml")
    })
}

fn check_error(e: &ManifestError, path: &Path, text: &str) {
    assert_eq!(e.file, path, "the error names another file");
    let shown = e.to_string();
    assert!(
        shown.starts_with(&path.display().to_string()),
        "the message does not start with the file: {shown}"
    );
    assert!(!e.message.is_empty(), "an empty message");
    assert_eq!(e.line.is_some(), e.column.is_some(), "line without column");
    if let (Some(line), Some(column)) = (e.line, e.column) {
        let lines = text.split('\n').count();
        assert!(
            (1..=lines).contains(&line),
            "line {line} of {lines}: {shown}"
        );
        let width = text.split('\n').nth(line - 1).map_or(0, str::len);
        assert!(
            (1..=width + 1).contains(&column),
            "column {column} of a {width}-byte line: {shown}"
        );
    }
}

fn check_manifest(m: &Manifest, path: &Path) {
    assert_eq!(m.path, path);
    assert!(!m.pipelines.is_empty(), "a manifest without pipelines");
    for (i, p) in m.pipelines.iter().enumerate() {
        assert!(
            m.pipelines[..i].iter().all(|o| o.name != p.name),
            "pipeline name {:?} twice",
            p.name
        );
        assert!(
            (1..=64).contains(&p.name.len())
                && p.name
                    .chars()
                    .all(|c| c.is_ascii_alphanumeric() || c == '-' || c == '_'),
            "pipeline name {:?}",
            p.name
        );
        assert!(!p.topics.is_empty() && p.topics.iter().all(|t| !t.is_empty()));
        assert!(!p.group.is_empty());
        assert!(p.component.is_file(), "component {:?}", p.component);
        assert!((1..=10_000).contains(&p.batch_size));
        assert!((p.batch_size..=1_000_000).contains(&p.max_in_flight));
        assert!(p.delivery_cap.is_none_or(|c| (2..=25).contains(&c)));
        assert!((1..=600_000).contains(&p.cpu_deadline.as_millis()));
        assert!(p.memory_limit >= 1 << 20 && p.memory_limit <= 4096 << 20);
        assert!((1..=1_000_000).contains(&p.recycle_after));
        assert!((1..=64).contains(&p.concurrency));
        assert!(p.max_renewals <= 100);
        assert!((0.05..=0.95).contains(&p.auto_renew_after));
        if let Some(dlq) = &p.dead_letter_topic {
            assert!(!dlq.is_empty() && !p.topics.contains(dlq));
        }
    }
    if m.admin.listen != defaults::ADMIN_LISTEN {
        assert!(m.admin.listen.parse::<std::net::SocketAddr>().is_ok());
    }
}

fuzz_target!(|data: &[u8]| {
    let text = String::from_utf8_lossy(data);
    let path = manifest_path();
    match Manifest::parse(path, &text) {
        Ok(m) => check_manifest(&m, path),
        Err(e) => check_error(&e, path, &text),
    }
});
