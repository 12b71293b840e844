//! `sharehost build` and `sharehost dev`: the author's loop in one place, for every language.
//!
//! `build` turns a plugin project (what `sharehost new` makes, or any folder with a
//! `Cargo.toml`, a `package.json` or a `plugin.py`) into its component, where the project's
//! manifest names it, with the toolchain each SDK pins: cargo for `wasm32-wasip2`,
//! `sharehost-build-py` (componentize-py) from the project's venv, `sharehost-build-js`
//! (componentize-js) from its `node_modules`. The build tools stay the SDKs' own; this command
//! only finds them, says what is missing, and reports what it built (bytes and SHA-256, the
//! digest `run`, `fleet` and the compile cache know a component by).
//!
//! `dev` builds, runs the project's records through `test-plugin` with the project's manifest,
//! and does it again on every change to the project's files, printing which verdicts changed.

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail};
use clap::Args;
use sha2::{Digest, Sha256};

use super::new::Lang;

/// `sharehost build [DIR]`.
#[derive(Args, Clone)]
pub(crate) struct BuildArgs {
    /// The plugin project (default: here).
    #[arg(default_value = ".")]
    dir: PathBuf,
    /// The plugin's language (default: told by the project's files: `Cargo.toml` is Rust,
    /// `package.json` JavaScript, `plugin.py` Python).
    #[arg(long, value_enum)]
    lang: Option<Lang>,
    /// The plugin's source module, for Python and JavaScript, in the project (default:
    /// `plugin.py`; package.json's `main`, else `plugin.js`).
    #[arg(long)]
    entry: Option<PathBuf>,
    /// Where to write the component (default: where the project's manifest names it).
    #[arg(long)]
    out: Option<PathBuf>,
    /// The manifest naming the component (default: the project's `manifest.toml`, if any).
    #[arg(long)]
    manifest: Option<PathBuf>,
    /// The manifest's pipeline whose component this is (needed when it names several).
    #[arg(long)]
    pipeline: Option<String>,
}

/// `sharehost dev [DIR]`.
#[derive(Args)]
pub(crate) struct DevArgs {
    #[command(flatten)]
    build: BuildArgs,
    /// The records to judge after each build (default: the project's `records.jsonl`).
    #[arg(long)]
    input: Option<PathBuf>,
    /// Build and judge once, print, and exit (a script's or a CI's check).
    #[arg(long)]
    once: bool,
}

/// A project, resolved: what to build, with what, and where the component goes.
#[derive(Debug)]
struct Project {
    dir: PathBuf,
    lang: Lang,
    entry: Option<PathBuf>,
    out: PathBuf,
    manifest: Option<PathBuf>,
    pipeline: Option<String>,
}

/// What a build made.
#[derive(Debug)]
struct Built {
    path: PathBuf,
    bytes: u64,
    sha256: String,
    took: Duration,
}

/// The language a project's files tell.
fn detect_lang(dir: &Path) -> Result<Lang> {
    if dir.join("Cargo.toml").is_file() {
        Ok(Lang::Rust)
    } else if dir.join("package.json").is_file() {
        Ok(Lang::Js)
    } else if dir.join("plugin.py").is_file() || dir.join("pyproject.toml").is_file() {
        Ok(Lang::Python)
    } else {
        bail!(
            "{}: cannot tell the plugin's language (no Cargo.toml, package.json or plugin.py); pass --lang",
            dir.display()
        )
    }
}

/// The component path the manifest's pipeline names (relative paths are the manifest's
/// folder's, as `run` reads them), or `None` when the manifest names none.
fn component_in_manifest(manifest: &Path, pipeline: Option<&str>) -> Result<Option<PathBuf>> {
    let text = std::fs::read_to_string(manifest)
        .with_context(|| format!("manifest {}", manifest.display()))?;
    let doc: toml::Table =
        toml::from_str(&text).with_context(|| format!("manifest {}", manifest.display()))?;
    let pipelines: Vec<(String, String)> = doc
        .get("pipeline")
        .and_then(|p| p.as_array())
        .map(|a| {
            a.iter()
                .filter_map(|p| {
                    let name = p.get("name")?.as_str()?.to_owned();
                    let component = p.get("component")?.as_str()?.to_owned();
                    Some((name, component))
                })
                .collect()
        })
        .unwrap_or_default();
    let chosen: Vec<&(String, String)> = match pipeline {
        Some(want) => pipelines.iter().filter(|(n, _)| n == want).collect(),
        None => pipelines.iter().collect(),
    };
    let components: BTreeSet<&str> = chosen.iter().map(|(_, c)| c.as_str()).collect();
    let base = manifest.parent().unwrap_or(Path::new("."));
    match (components.len(), pipeline) {
        (1, _) => Ok(components.first().map(|c| base.join(c))),
        (0, Some(want)) => bail!(
            "manifest {}: no pipeline named {want:?} with a component (it has {})",
            manifest.display(),
            pipelines
                .iter()
                .map(|(n, _)| n.as_str())
                .collect::<Vec<_>>()
                .join(", ")
        ),
        (0, None) => Ok(None),
        _ => bail!(
            "manifest {} names several components ({}); pass --pipeline NAME or --out FILE",
            manifest.display(),
            components.into_iter().collect::<Vec<_>>().join(", ")
        ),
    }
}

/// The project's module name: its folder's name as `sharehost new` writes it (`-` as `_`).
fn module_name(dir: &Path) -> Result<String> {
    let canonical = dir
        .canonicalize()
        .with_context(|| format!("project {}", dir.display()))?;
    let name = canonical
        .file_name()
        .and_then(|n| n.to_str())
        .context("the project folder's name is not UTF-8")?;
    Ok(name.replace('-', "_"))
}

/// Resolves what `args` asks to build.
fn project(args: &BuildArgs) -> Result<Project> {
    let dir = args.dir.clone();
    if !dir.is_dir() {
        bail!("{}: not a folder", dir.display());
    }
    let lang = match args.lang {
        Some(l) => l,
        None => detect_lang(&dir)?,
    };
    let manifest = match &args.manifest {
        Some(m) => Some(m.clone()),
        None => Some(dir.join("manifest.toml")).filter(|m| m.is_file()),
    };
    let named = match &manifest {
        Some(m) => component_in_manifest(m, args.pipeline.as_deref())?,
        None => None,
    };
    let out = match (&args.out, named) {
        (Some(o), _) => o.clone(),
        (None, Some(n)) => n,
        (None, None) => {
            let module = module_name(&dir)?;
            match lang {
                Lang::Rust => dir.join(format!("target/wasm32-wasip2/release/{module}.wasm")),
                Lang::Python | Lang::Js => dir.join(format!("{module}.wasm")),
            }
        }
    };
    let entry = match lang {
        Lang::Rust => None,
        Lang::Python => Some(
            args.entry
                .clone()
                .unwrap_or_else(|| PathBuf::from("plugin.py")),
        ),
        Lang::Js => Some(match &args.entry {
            Some(e) => e.clone(),
            None => js_main(&dir)?.unwrap_or_else(|| PathBuf::from("plugin.js")),
        }),
    };
    if let Some(e) = &entry
        && !dir.join(e).is_file()
    {
        bail!(
            "{}: the plugin's module {} is not there; pass --entry FILE",
            dir.display(),
            e.display()
        );
    }
    Ok(Project {
        dir,
        lang,
        entry,
        out,
        manifest,
        pipeline: args.pipeline.clone(),
    })
}

/// package.json's `main`, if it names one.
fn js_main(dir: &Path) -> Result<Option<PathBuf>> {
    let path = dir.join("package.json");
    let text = std::fs::read_to_string(&path)
        .with_context(|| format!("cannot read {}", path.display()))?;
    let json: serde_json::Value =
        serde_json::from_str(&text).with_context(|| format!("{}", path.display()))?;
    Ok(json.get("main").and_then(|m| m.as_str()).map(PathBuf::from))
}

/// Runs `cmd` with the author's terminal as its output; fails naming `what` on a non-zero exit.
fn run_tool(cmd: &mut Command, what: &str) -> Result<()> {
    let status = cmd
        .status()
        .with_context(|| format!("cannot start {what}"))?;
    if !status.success() {
        bail!("{what} failed ({status})");
    }
    Ok(())
}

/// A tool the project installed (`.venv/bin`, `node_modules/.bin`), else one on `PATH`.
fn project_tool(dir: &Path, local: &str, name: &str) -> Option<PathBuf> {
    let mine = dir.join(local).join(name);
    if mine.is_file() {
        return Some(mine);
    }
    std::env::var_os("PATH").and_then(|paths| {
        std::env::split_paths(&paths)
            .map(|p| p.join(name))
            .find(|p| p.is_file())
    })
}

/// Builds a Rust project with cargo, as `cargo build --release --target wasm32-wasip2`, and
/// returns the component cargo wrote (its target folder may be elsewhere: CARGO_TARGET_DIR).
fn build_rust(dir: &Path) -> Result<PathBuf> {
    let sysroot = Command::new("rustc")
        .args(["--print", "sysroot"])
        .current_dir(dir)
        .output()
        .context("cannot run rustc (install Rust: https://rustup.rs)")?;
    let sysroot = PathBuf::from(String::from_utf8_lossy(&sysroot.stdout).trim());
    if !sysroot.join("lib/rustlib/wasm32-wasip2").is_dir() {
        bail!(
            "the wasm32-wasip2 target is not installed for this toolchain: rustup target add wasm32-wasip2"
        );
    }
    let out = Command::new("cargo")
        .args([
            "build",
            "--release",
            "--target",
            "wasm32-wasip2",
            "--message-format=json-render-diagnostics",
        ])
        .current_dir(dir)
        .stderr(Stdio::inherit())
        .output()
        .context("cannot start cargo")?;
    if !out.status.success() {
        bail!("cargo build failed ({})", out.status);
    }
    // cargo's JSON messages name each artifact it wrote; the component is the cdylib's .wasm.
    let stdout = String::from_utf8_lossy(&out.stdout);
    stdout
        .lines()
        .filter_map(|l| serde_json::from_str::<serde_json::Value>(l).ok())
        .filter(|m| m["reason"] == "compiler-artifact")
        .filter(|m| {
            m["target"]["kind"]
                .as_array()
                .is_some_and(|k| k.iter().any(|k| k == "cdylib"))
        })
        .flat_map(|m| {
            m["filenames"]
                .as_array()
                .cloned()
                .unwrap_or_default()
                .into_iter()
        })
        .filter_map(|f| f.as_str().map(PathBuf::from))
        .find(|f| f.extension().is_some_and(|e| e == "wasm"))
        .context(
            "cargo built no component: the crate needs `crate-type = [\"cdylib\"]` in [lib] (sharehost new writes it)",
        )
}

/// Builds `p`'s component into `p.out`.
fn build(p: &Project) -> Result<Built> {
    let started = Instant::now();
    if let Some(parent) = p.out.parent().filter(|d| !d.as_os_str().is_empty()) {
        std::fs::create_dir_all(parent)
            .with_context(|| format!("cannot make {}", parent.display()))?;
    }
    // The SDK tools take paths from the project's folder, where they run.
    let out = std::path::absolute(&p.out).with_context(|| format!("{}", p.out.display()))?;
    match p.lang {
        Lang::Rust => {
            let made = build_rust(&p.dir)?;
            let same = made.canonicalize().ok() == out.canonicalize().ok();
            if !same {
                std::fs::copy(&made, &out).with_context(|| {
                    format!("cannot copy {} to {}", made.display(), out.display())
                })?;
            }
        }
        Lang::Python => {
            let tool = project_tool(&p.dir, ".venv/bin", "sharehost-build-py").with_context(
                || {
                    format!(
                        "sharehost-build-py is neither in {}/.venv/bin nor on PATH: install the SDK's wheel into the project's venv (the project's README says how; guest-sdk/pack builds the wheel)",
                        p.dir.display()
                    )
                },
            )?;
            let entry = p.entry.as_deref().unwrap_or(Path::new("plugin.py"));
            run_tool(
                Command::new(tool).arg(entry).arg(&out).current_dir(&p.dir),
                "sharehost-build-py",
            )?;
        }
        Lang::Js => {
            let tool = project_tool(&p.dir, "node_modules/.bin", "sharehost-build-js")
                .with_context(|| {
                    format!(
                        "sharehost-build-js is neither in {}/node_modules/.bin nor on PATH: run `npm install` in the project (it installs the SDK package)",
                        p.dir.display()
                    )
                })?;
            let entry = p.entry.as_deref().unwrap_or(Path::new("plugin.js"));
            run_tool(
                Command::new(tool).arg(entry).arg(&out).current_dir(&p.dir),
                "sharehost-build-js",
            )?;
        }
    }
    let bytes = std::fs::read(&out).with_context(|| format!("cannot read {}", out.display()))?;
    Ok(Built {
        path: p.out.clone(),
        bytes: bytes.len() as u64,
        sha256: hex(&Sha256::digest(&bytes)),
        took: started.elapsed(),
    })
}

/// Lower-case hex, as `sha256sum` prints a digest.
fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

fn report(p: &Project, b: &Built) -> String {
    format!(
        "built {} ({}, {} bytes, sha256 {}) in {:.1} s",
        b.path.display(),
        p.lang.name(),
        b.bytes,
        b.sha256,
        b.took.as_secs_f64()
    )
}

/// Runs `sharehost build`.
pub(crate) fn run_build(args: &BuildArgs) -> Result<()> {
    let p = project(args)?;
    let built = build(&p)?;
    println!("{}", report(&p, &built));
    Ok(())
}

/// One record's outcome as `test-plugin` printed it.
#[derive(Debug, Clone, PartialEq)]
struct Outcome {
    place: String,
    line: serde_json::Value,
}

/// A verdict line in a few words: the verdict, its reason or delay, its fault, its emits.
fn describe(line: &serde_json::Value) -> String {
    let mut s = line["verdict"].as_str().unwrap_or("?").to_owned();
    if let Some(r) = line["reason"].as_str() {
        s.push_str(&format!(" ({r})"));
    }
    if let Some(ms) = line["retry_after_ms"].as_u64() {
        s.push_str(&format!(" after {ms} ms"));
    }
    if let Some(f) = line["fault"].as_str() {
        s.push_str(&format!(", fault {f}"));
        if let Some(m) = line["fault_message"].as_str() {
            s.push_str(&format!(": {m}"));
        }
    }
    if let Some(e) = line["emits"].as_array() {
        let n = e.len();
        s.push_str(&format!(", {n} emit{}", if n == 1 { "" } else { "s" }));
    }
    s
}

/// Judges `input` with the built component through `test-plugin` (this binary), with the
/// project's manifest when it has one; returns each record's outcome and the summary line.
fn judge(p: &Project, input: &Path) -> Result<(Vec<Outcome>, serde_json::Value)> {
    let exe = std::env::current_exe().context("this program's path")?;
    let mut cmd = Command::new(exe);
    cmd.arg("test-plugin").arg(&p.out).arg("--input").arg(input);
    if let Some(m) = &p.manifest {
        cmd.arg("--manifest").arg(m);
        if let Some(pl) = &p.pipeline {
            cmd.args(["--pipeline", pl]);
        }
    }
    let out = cmd
        .stderr(Stdio::inherit())
        .output()
        .context("cannot start test-plugin")?;
    if !out.status.success() {
        bail!("test-plugin failed ({})", out.status);
    }
    let mut outcomes = Vec::new();
    let mut summary = serde_json::Value::Null;
    for line in String::from_utf8_lossy(&out.stdout).lines() {
        let Ok(v) = serde_json::from_str::<serde_json::Value>(line) else {
            continue;
        };
        if v.get("summary").is_some() {
            summary = v["summary"].clone();
            continue;
        }
        let place = format!(
            "{}-{}@{}",
            v["topic"].as_str().unwrap_or("?"),
            v["partition"],
            v["offset"]
        );
        outcomes.push(Outcome { place, line: v });
    }
    Ok((outcomes, summary))
}

/// What changed between two runs, one line per record whose outcome changed (all of them on
/// the first run).
fn changes(before: Option<&[Outcome]>, now: &[Outcome]) -> Vec<String> {
    let Some(before) = before else {
        return now
            .iter()
            .map(|o| format!("  {}: {}", o.place, describe(&o.line)))
            .collect();
    };
    let mut lines = Vec::new();
    for (i, o) in now.iter().enumerate() {
        match before.get(i) {
            Some(b) if b == o => {}
            Some(b) if b.place == o.place => lines.push(format!(
                "  {}: {}  (was {})",
                o.place,
                describe(&o.line),
                describe(&b.line)
            )),
            _ => lines.push(format!("  {}: {}  (new)", o.place, describe(&o.line))),
        }
    }
    if before.len() > now.len() {
        lines.push(format!(
            "  {} records fewer than the last run",
            before.len() - now.len()
        ));
    }
    lines
}

/// Whether a change at `path` can change the build or its judging: not the build's own
/// output, installs or caches.
fn relevant(path: &Path, project: &Path, out: &Path) -> bool {
    if path == out || path.extension().is_some_and(|e| e == "wasm") {
        return false;
    }
    let inside = path.strip_prefix(project).unwrap_or(path);
    !inside.components().any(|c| {
        matches!(
            c.as_os_str().to_str(),
            Some(
                "target"
                    | "node_modules"
                    | ".venv"
                    | "__pycache__"
                    | ".git"
                    | ".pytest_cache"
                    | ".pybuild"
            )
        )
    })
}

/// Runs `sharehost dev`.
pub(crate) fn run_dev(args: &DevArgs) -> Result<()> {
    use notify::{RecursiveMode, Watcher};

    let p = project(&args.build)?;
    let input = args
        .input
        .clone()
        .unwrap_or_else(|| p.dir.join("records.jsonl"));
    if !input.is_file() {
        bail!(
            "{}: no records to judge; pass --input FILE.jsonl (test-plugin's format)",
            input.display()
        );
    }
    let project_dir = p
        .dir
        .canonicalize()
        .with_context(|| format!("{}", p.dir.display()))?;
    let out_abs = std::path::absolute(&p.out).unwrap_or_else(|_| p.out.clone());
    let (tx, rx) = std::sync::mpsc::channel::<notify::Result<notify::Event>>();
    let mut watcher = notify::recommended_watcher(tx).context("cannot watch the project")?;
    if !args.once {
        watcher
            .watch(&project_dir, RecursiveMode::Recursive)
            .with_context(|| format!("cannot watch {}", project_dir.display()))?;
    }
    let mut last: Option<Vec<Outcome>> = None;
    loop {
        match build(&p) {
            Err(e) => println!("build failed: {e:#}"),
            Ok(built) => {
                println!("{}", report(&p, &built));
                match judge(&p, &input) {
                    Err(e) => println!("judging {} failed: {e:#}", input.display()),
                    Ok((now, summary)) => {
                        let lines = changes(last.as_deref(), &now);
                        if last.is_some() && lines.is_empty() {
                            println!("no verdict changed");
                        }
                        for l in lines {
                            println!("{l}");
                        }
                        println!(
                            "{} records: {}",
                            now.len(),
                            summary["verdicts"]
                                .as_object()
                                .map(|m| m
                                    .iter()
                                    .map(|(k, v)| format!("{v} {k}"))
                                    .collect::<Vec<_>>()
                                    .join(", "))
                                .unwrap_or_default()
                        );
                        last = Some(now);
                    }
                }
            }
        }
        if args.once {
            return Ok(());
        }
        println!("watching {} for changes", project_dir.display());
        // Waits for a change that matters, then lets a burst of saves settle (an editor
        // writes a file and its backup; cargo and npm touch many at once).
        loop {
            let event = rx.recv().context("the file watcher stopped")?;
            if let Ok(e) = event
                && e.paths
                    .iter()
                    .any(|path| relevant(path, &project_dir, &out_abs))
            {
                break;
            }
        }
        while rx.recv_timeout(Duration::from_millis(200)).is_ok() {}
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_language_is_told_by_the_projects_files() {
        let dir = std::env::temp_dir().join(format!("sharehost-build-lang-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).expect("dir");
        let err = detect_lang(&dir).expect_err("an empty folder");
        assert!(err.to_string().contains("--lang"), "{err}");
        std::fs::write(dir.join("plugin.py"), "").expect("write");
        assert_eq!(detect_lang(&dir).expect("python"), Lang::Python);
        std::fs::write(dir.join("package.json"), "{}").expect("write");
        assert_eq!(detect_lang(&dir).expect("js"), Lang::Js);
        std::fs::write(dir.join("Cargo.toml"), "").expect("write");
        assert_eq!(detect_lang(&dir).expect("rust"), Lang::Rust);
        let _ = std::fs::remove_dir_all(&dir);
    }

    #[test]
    fn the_component_is_where_the_manifest_names_it() {
        let dir = std::env::temp_dir().join(format!("sharehost-build-mf-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).expect("dir");
        let m = dir.join("manifest.toml");
        std::fs::write(
            &m,
            "[[pipeline]]\nname = \"a\"\ncomponent = \"a.wasm\"\n[[pipeline]]\nname = \"b\"\ncomponent = \"out/b.wasm\"\n",
        )
        .expect("write");
        let err = component_in_manifest(&m, None).expect_err("two components");
        assert!(err.to_string().contains("--pipeline"), "{err}");
        assert_eq!(
            component_in_manifest(&m, Some("b")).expect("b"),
            Some(dir.join("out/b.wasm"))
        );
        let err = component_in_manifest(&m, Some("c")).expect_err("no such pipeline");
        assert!(err.to_string().contains("a, b"), "{err}");
        std::fs::write(&m, "not = [toml").expect("write");
        let err = component_in_manifest(&m, None).expect_err("bad toml");
        assert!(format!("{err:#}").contains("manifest.toml"), "{err:#}");
        let _ = std::fs::remove_dir_all(&dir);
    }

    #[test]
    fn only_changed_verdicts_are_shown_after_the_first_run() {
        let o = |place: &str, line: serde_json::Value| Outcome {
            place: place.into(),
            line,
        };
        let first = vec![
            o("t-0@0", serde_json::json!({"verdict": "accept"})),
            o(
                "t-0@1",
                serde_json::json!({"verdict": "reject", "reason": "too big"}),
            ),
        ];
        assert_eq!(changes(None, &first).len(), 2);
        assert!(changes(Some(&first), &first).is_empty());
        let second = vec![
            first[0].clone(),
            o(
                "t-0@1",
                serde_json::json!({"verdict": "retry", "retry_after_ms": 1000, "emits": [{}]}),
            ),
        ];
        assert_eq!(
            changes(Some(&first), &second),
            ["  t-0@1: retry after 1000 ms, 1 emit  (was reject (too big))"]
        );
    }

    #[test]
    fn builds_installs_and_caches_are_not_changes() {
        let project = Path::new("/p");
        let out = Path::new("/p/x.wasm");
        assert!(relevant(Path::new("/p/src/lib.rs"), project, out));
        assert!(relevant(Path::new("/p/manifest.toml"), project, out));
        for p in [
            "/p/x.wasm",
            "/p/target/release/a",
            "/p/node_modules/a/b.js",
            "/p/.venv/bin/python",
            "/p/__pycache__/plugin.pyc",
            "/p/other.wasm",
        ] {
            assert!(!relevant(Path::new(p), project, out), "{p}");
        }
    }
}
