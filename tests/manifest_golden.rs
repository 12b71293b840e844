//! Golden tests for bad manifests: every file in `tests/manifests/bad/*.toml` must fail to load
//! with exactly the error in its `.err` file (file, line, column, field and message). Run with
//! `UPDATE_GOLDEN=1` to rewrite the `.err` files after an intended change, then review the diff.

use std::path::PathBuf;

use sharehost::manifest::Manifest;

#[test]
fn every_bad_manifest_fails_with_its_golden_error() {
    let dir = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../tests/manifests/bad");
    let dir = dir.canonicalize().expect("fixture folder");
    let mut seen = 0;
    let mut mismatches = Vec::new();
    let mut entries: Vec<_> = std::fs::read_dir(&dir)
        .expect("read fixtures")
        .filter_map(Result::ok)
        .collect();
    entries.sort_by_key(|e| e.path());
    for entry in entries {
        let path = entry.path();
        if path.extension().and_then(|e| e.to_str()) != Some("toml") {
            continue;
        }
        seen += 1;
        let err = match Manifest::load(&path) {
            Ok(_) => {
                mismatches.push(format!("{}: loaded, but it must fail", path.display()));
                continue;
            }
            Err(e) => e.to_string().replace(&format!("{}/", dir.display()), ""),
        };
        let golden = path.with_extension("err");
        if std::env::var_os("UPDATE_GOLDEN").is_some() {
            std::fs::write(&golden, format!("{err}\n")).expect("write golden");
            continue;
        }
        let want = std::fs::read_to_string(&golden)
            .unwrap_or_else(|_| format!("(missing {})", golden.display()));
        if want.trim_end() != err {
            mismatches.push(format!(
                "{}:\n  want: {}\n  got:  {err}",
                path.display(),
                want.trim_end()
            ));
        }
    }
    assert!(
        seen >= 10,
        "expected the bad-manifest fixtures, found {seen}"
    );
    assert!(mismatches.is_empty(), "{}", mismatches.join("\n"));
}
