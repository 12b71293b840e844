//! `sharehost new rust|python|js NAME`: a plugin project an author starts from, which builds
//! and passes its own test as generated: the plugin (reject tombstones and values over
//! `max-bytes`), a native unit test, sample records, a manifest and a README with the commands
//! (docs/plugin-guide.md, where each step is explained).
//!
//! The project depends on the SDK as a package (a wheel, an npm tarball, a packaged crate),
//! which `guest-sdk/pack` builds under the checkout's `target/sdk/`: the author's installs
//! never write into the checkout's sources, and the project sees what a published SDK holds.
//!
//! The templates are files under `host/templates/`, filled by plain `{{name}}` replacement:
//! five placeholders need no template engine.

use std::path::{Path, PathBuf};

use anyhow::{Context, Result, bail};
use clap::{Args, ValueEnum};

/// The plugin's language.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum Lang {
    /// A crate built for wasm32-wasip2 with the `sharehost-guest` SDK.
    Rust,
    /// A module built with `sharehost-build-py` (componentize-py).
    Python,
    /// An ES module built with `sharehost-build-js` (componentize-js).
    Js,
}

impl Lang {
    /// The language's name as an author says it.
    pub fn name(self) -> &'static str {
        match self {
            Lang::Rust => "Rust",
            Lang::Python => "Python",
            Lang::Js => "JavaScript",
        }
    }

    /// The name `guest-sdk/pack` takes and prints.
    fn pack_name(self) -> &'static str {
        match self {
            Lang::Rust => "rust",
            Lang::Python => "python",
            Lang::Js => "js",
        }
    }
}

/// `sharehost new LANG NAME`.
#[derive(Args)]
pub struct NewArgs {
    /// rust, python or js.
    lang: Lang,
    /// The plugin's name: letters, digits, `-` and `_`, starting with a letter (the project's
    /// folder, the pipeline's name and the component's file name).
    name: String,
    /// Where to make the project's folder (default: here).
    #[arg(long, default_value = ".")]
    dir: PathBuf,
    /// The sharehost checkout whose SDK packages the project depends on (default: the one
    /// this binary was built from); its `guest-sdk/pack` builds them into its `target/sdk/`.
    #[arg(long)]
    sdk: Option<PathBuf>,
}

/// One generated file: its path in the project and its text.
type File = (&'static str, String);

/// The project's files for `lang`, placeholders filled: `sdk` is the checkout (for the guide),
/// `package` the SDK package the project installs.
fn files(lang: Lang, name: &str, sdk: &Path, package: &Path) -> Vec<File> {
    let module = name.replace('-', "_");
    let ty: String = name
        .split(['-', '_'])
        .filter(|w| !w.is_empty())
        .map(|w| {
            let mut c = w.chars();
            c.next()
                .map(|f| f.to_ascii_uppercase().to_string() + c.as_str())
                .unwrap_or_default()
        })
        .collect();
    let fill = |text: &str| {
        text.replace("{{name}}", name)
            .replace("{{module}}", &module)
            .replace("{{type}}", &ty)
            .replace("{{sdk}}", &sdk.display().to_string())
            .replace("{{package}}", &package.display().to_string())
    };
    // Each language's own files: (path in the project, template text).
    let (component, memory, templates): (String, &str, &[(&str, &str)]) = match lang {
        Lang::Rust => (
            format!("target/wasm32-wasip2/release/{module}.wasm"),
            "",
            &[
                (
                    "Cargo.toml",
                    include_str!("../../templates/rust/Cargo.toml"),
                ),
                (
                    "src/lib.rs",
                    include_str!("../../templates/rust/src/lib.rs"),
                ),
                (".gitignore", "/target\n"),
            ],
        ),
        Lang::Python => (
            format!("{module}.wasm"),
            // A Python component is large; 32 MiB per instance is what section 9 of the guide
            // recommends, and what test-plugin --manifest then checks with.
            "memory_limit_mib = 32\n",
            &[
                (
                    "plugin.py",
                    include_str!("../../templates/python/plugin.py"),
                ),
                (
                    "test_plugin.py",
                    include_str!("../../templates/python/test_plugin.py"),
                ),
                (".gitignore", "/.venv\n/*.wasm\n__pycache__/\n"),
            ],
        ),
        Lang::Js => (
            format!("{module}.wasm"),
            "memory_limit_mib = 32\n",
            &[
                (
                    "package.json",
                    include_str!("../../templates/js/package.json"),
                ),
                ("plugin.js", include_str!("../../templates/js/plugin.js")),
                (
                    "test/plugin.test.js",
                    include_str!("../../templates/js/test/plugin.test.js"),
                ),
                (".gitignore", "/node_modules\n/*.wasm\n"),
            ],
        ),
    };
    let code: Vec<File> = templates
        .iter()
        .map(|(path, text)| (*path, fill(text)))
        .collect();
    let manifest = format!(
        "# `sharehost check manifest.toml` loads it as `run` would; `sharehost run manifest.toml`\n\
         # runs it (docs/manifest.md).\n\
         [cluster]\nbootstrap = \"127.0.0.1:9092\"\n\n\
         # The admin API (metrics, health, the console) on a free port, logged at start: two\n\
         # projects, or a project beside another host, run side by side.\n\
         [admin]\nlisten = \"127.0.0.1:0\"\n\n\
         [[pipeline]]\nname = \"{name}\"\ntopics = [\"{name}-in\"]\ngroup = \"{name}\"\n\
         component = \"{component}\"\nconfig = {{ max-bytes = \"8\" }}\n{memory}\
         # Read what the topic holds already (a new share group starts at the latest record).\n\
         start = \"earliest\"\n\
         # Nothing lost: a record the plugin rejects goes to the dead-letter topic with its\n\
         # reason, and so does one delivered a 4th time (the plugin kept faulting on it,\n\
         # releasing it or retrying it), without reaching the plugin again: before the group's\n\
         # delivery limit (5 by default) would have the broker archive it with no copy kept.\n\
         # Create the topic beside {name}-in.\n\
         dead_letter_topic = \"{name}-dlq\"\n\
         delivery_cap = 4\n"
    );
    let records = "{\"value\":\"small\"}\n{\"value\":\"far too large\",\"offset\":1}\n{\"value\":null,\"offset\":2}\n";
    let steps = match lang {
        Lang::Rust => format!(
            "cargo test                                        # the native test\n\
             rustup target add wasm32-wasip2\n\
             sharehost build                                   # {component}\n"
        ),
        Lang::Python => format!(
            "python3 -m venv .venv && . .venv/bin/activate\n\
             pip install \"{package}\" pytest   # the SDK\n\
             python -m pytest -q                               # the native test\n\
             sharehost build                                   # {component}\n",
            package = package.display()
        ),
        Lang::Js => format!(
            "npm install                                       # the SDK, {package}\n\
             npm test                                          # the native test\n\
             sharehost build                                   # {component}\n",
            package = package.display()
        ),
    };
    let readme = format!(
        "# {name}\n\n\
         A sharehost plugin ({lang}). It rejects tombstones and values over `max-bytes` and\n\
         accepts the rest; change it to judge your records. docs/plugin-guide.md in sharehost\n\
         ({sdk}) explains every step.\n\n\
         ```sh\n{steps}\
         sharehost test-plugin {component} --input records.jsonl --manifest manifest.toml\n\
         sharehost dev                                     # build and judge records.jsonl again on every save\n\
         sharehost check manifest.toml\n\
         sharehost create-topics {name}-in {name}-dlq --manifest manifest.toml --if-not-exists\n\
         sharehost produce {name}-in --manifest manifest.toml --input records.jsonl\n\
         sharehost run manifest.toml\n\
         sharehost consume {name}-dlq --manifest manifest.toml --from-beginning   # the rejected, with their reasons\n```\n",
        lang = lang.name(),
        sdk = sdk.display(),
    );
    let mut out = code;
    out.push(("manifest.toml", manifest));
    out.push(("records.jsonl", records.into()));
    out.push(("README.md", readme));
    out
}

/// Whether `name` can name a crate, a module, a pipeline and a file alike.
fn valid_name(name: &str) -> bool {
    let mut chars = name.chars();
    chars.next().is_some_and(|c| c.is_ascii_alphabetic())
        && chars.all(|c| c.is_ascii_alphanumeric() || c == '-' || c == '_')
        && name.len() <= 64
}

/// Refuses an SDK path that the generated files could not hold as written: the path goes
/// into a TOML string (Cargo.toml), a JSON string (package.json) and double-quoted shell
/// (README.md), so a quote, a backslash, a `$`, a backquote or a control character (a
/// newline) would end the string or run as code there. Such paths are refused clearly rather
/// than escaped three ways; a path that is not UTF-8 cannot be written as it is at all.
fn writable_path(sdk: &Path) -> Result<()> {
    let Some(text) = sdk.to_str() else {
        bail!(
            "--sdk {}: the path is not UTF-8, which Cargo.toml and package.json cannot hold",
            sdk.display()
        );
    };
    if let Some(c) = text
        .chars()
        .find(|c| c.is_control() || matches!(*c, '"' | '\\' | '$' | '`'))
    {
        bail!(
            "--sdk {:?}: the path holds {c:?}, which the generated Cargo.toml, package.json and README cannot hold as written; use a path without quotes, backslashes, `$`, backquotes or control characters (a symlink to it will do)",
            text
        );
    }
    Ok(())
}

/// Builds the SDK package for `lang` with the checkout's `guest-sdk/pack` (into its
/// `target/sdk/`) and returns its path: built each time, so a project never gets a package
/// older than the checkout's SDK.
fn pack(sdk: &Path, lang: Lang) -> Result<PathBuf> {
    let name = lang.pack_name();
    let script = sdk.join("guest-sdk/pack");
    let out = std::process::Command::new(&script)
        .arg(name)
        .stderr(std::process::Stdio::inherit())
        .output()
        .with_context(|| format!("cannot run {}", script.display()))?;
    if !out.status.success() {
        bail!(
            "{} {name} failed ({}): the {name} SDK package could not be built",
            script.display(),
            out.status
        );
    }
    String::from_utf8_lossy(&out.stdout)
        .lines()
        .find_map(|l| l.strip_prefix(&format!("{name}\t")).map(PathBuf::from))
        .with_context(|| format!("{} {name} named no package", script.display()))
}

/// Runs `sharehost new`: writes the project into `DIR/NAME`, refusing a folder that exists.
pub fn run(args: &NewArgs) -> Result<()> {
    if !valid_name(&args.name) {
        bail!(
            "name {:?}: letters, digits, `-` and `_` only, starting with a letter, at most 64",
            args.name
        );
    }
    let sdk = match &args.sdk {
        Some(s) => s.clone(),
        // This binary's checkout: host/ is the crate, its parent the workspace.
        None => Path::new(env!("CARGO_MANIFEST_DIR"))
            .parent()
            .map(Path::to_path_buf)
            .context("the checkout this binary was built from")?,
    };
    if !sdk.join("guest-sdk").is_dir() {
        bail!(
            "--sdk {}: not a sharehost checkout (no guest-sdk folder); pass the checkout's path",
            sdk.display()
        );
    }
    let sdk = sdk
        .canonicalize()
        .with_context(|| format!("--sdk {}", sdk.display()))?;
    writable_path(&sdk)?;
    let root = args.dir.join(&args.name);
    if root.exists() {
        bail!(
            "{}: exists already; pick another name or --dir",
            root.display()
        );
    }
    let package = pack(&sdk, args.lang)?;
    writable_path(&package)?;
    for (path, text) in files(args.lang, &args.name, &sdk, &package) {
        let file = root.join(path);
        if let Some(parent) = file.parent() {
            std::fs::create_dir_all(parent)
                .with_context(|| format!("cannot make {}", parent.display()))?;
        }
        std::fs::write(&file, text).with_context(|| format!("cannot write {}", file.display()))?;
    }
    println!(
        "made {} ({} plugin); its README.md lists the commands to test, build and run it",
        root.display(),
        args.lang.name()
    );
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_are_filled_into_every_file_and_no_placeholder_is_left() {
        for lang in [Lang::Rust, Lang::Python, Lang::Js] {
            let files = files(
                lang,
                "size-check",
                Path::new("/opt/sharehost"),
                Path::new("/opt/sharehost/target/sdk/pkg"),
            );
            for (path, text) in &files {
                assert!(!text.contains("{{"), "{lang:?} {path}: {text}");
            }
            let all: String = files.iter().map(|(_, t)| t.as_str()).collect();
            assert!(all.contains("SizeCheck"), "{lang:?}");
            assert!(all.contains("/opt/sharehost/target/sdk/pkg"), "{lang:?}");
            assert!(!all.contains("/opt/sharehost/guest-sdk"), "{lang:?}");
            assert!(all.contains("size_check.wasm"), "{lang:?}");
        }
    }

    #[test]
    fn an_sdk_path_that_would_break_the_generated_files_is_refused() {
        writable_path(Path::new("/opt/share host/sdk-1.0")).expect("plain");
        for bad in [
            "/tmp/a\"b",
            "/tmp/a\nb",
            "/tmp/a\\b",
            "/tmp/$(x)",
            "/tmp/`x`",
        ] {
            let e = writable_path(Path::new(bad)).expect_err(bad).to_string();
            assert!(e.contains("cannot hold as written"), "{e}");
        }
    }

    #[test]
    fn a_name_that_cannot_be_a_crate_module_and_file_is_refused() {
        for ok in ["a", "size-check", "s_1"] {
            assert!(valid_name(ok), "{ok}");
        }
        for bad in ["", "1a", "-a", "a b", "a/b", "a.b", &"a".repeat(65)] {
            assert!(!valid_name(bad), "{bad}");
        }
    }
}
