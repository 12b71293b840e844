//! The one reader of component files: every path that loads a plugin (the runtime's compile,
//! `sharehost test-plugin` and `check`, the hot-swap endpoint, the manifest's check) goes
//! through it, so none of them can be made to hang or to exhaust memory by a path: the file is
//! read by the bounded reader (`fs.rs`: regular files only, refused by size before a byte is
//! read), whose refusals become [`LoadError`]s naming the setting that raises the maximum.
//!
//! Then the first eight bytes say what the file is (a component, a core module, something
//! else); errors describe the file and never quote its bytes, since a path may point at a
//! secret the caller could not otherwise read (the host may run as another user).
//!
//! Last, [`Surface`] reads the component's top-level imports and exports without compiling
//! it, so a component that would be refused anyway (forbidden import, another package version,
//! not the plugin world) costs a parse of its section headers, not a compilation.

use std::path::Path;

use wasmparser::{Chunk, ComponentExternalKind, ComponentTypeRef, Parser, Payload};

use crate::error::LoadError;
use crate::fs::{self, FileError};

/// The largest component file read by default: ample for a plugin (the example plugins are
/// well under 1 MiB; a Python component with its interpreter is about 40 MiB), small enough
/// that refusing a hostile file costs little.
pub const DEFAULT_MAX_COMPONENT_BYTES: u64 = 64 << 20;

/// The name of the setting that raises the maximum, for error messages.
pub(crate) const MAX_SETTING: &str =
    "runtime.max_component_mib in the manifest, --max-component-mib for test-plugin";

/// A load's words for a file the reader refused: the same as the reader's, with the setting
/// that raises the maximum named.
fn refused(e: FileError) -> LoadError {
    match e {
        FileError::Read { path, error } => LoadError::Read { path, error },
        FileError::NotAFile { path, what } => LoadError::NotAFile { path, what },
        FileError::TooLarge {
            path,
            size,
            maximum,
        } => LoadError::TooLarge {
            path,
            size,
            maximum,
            setting: MAX_SETTING,
        },
    }
}

/// Checks that `path` names a regular file of at most `max_bytes` without reading it: what
/// the manifest check needs to refuse a bad path early, with the same words as a load.
pub fn check_component_path(path: &Path, max_bytes: u64) -> Result<(), LoadError> {
    fs::open_regular(path, max_bytes)
        .map(|_| ())
        .map_err(refused)
}

/// Reads a component file: a regular file of at most `max_bytes`, whose header says it is a
/// component (see the module doc). Only then are its bytes handed to a parser.
pub fn read_component(path: &Path, max_bytes: u64) -> Result<Vec<u8>, LoadError> {
    let bytes = fs::read_regular(path, max_bytes).map_err(refused)?;
    identify(path, &bytes)?;
    Ok(bytes)
}

/// The WebAssembly magic number, `\0asm`.
const MAGIC: [u8; 4] = *b"\0asm";
/// Version and layer of a core module (version 1, layer 0).
const CORE_MODULE: [u8; 4] = [1, 0, 0, 0];
/// Version and layer of a component (version 0x0d, layer 1), the only encoding wasmtime 48
/// reads.
const COMPONENT: [u8; 4] = [0x0d, 0, 1, 0];

/// Refuses bytes that are not a component with one line saying what they are. Never quotes
/// the bytes (a parser's "bad magic number ... actual=[...]" would).
pub(crate) fn identify(path: &Path, bytes: &[u8]) -> Result<(), LoadError> {
    let not = |what: &'static str| LoadError::NotAComponent {
        path: path.to_owned(),
        what,
    };
    if bytes.is_empty() {
        return Err(not("is empty, not WebAssembly"));
    }
    if bytes.len() < 8 || bytes[..4] != MAGIC {
        return Err(not("not WebAssembly (no WebAssembly header)"));
    }
    let layer: [u8; 4] = [bytes[4], bytes[5], bytes[6], bytes[7]];
    match layer {
        COMPONENT => Ok(()),
        CORE_MODULE => Err(not(
            "a core module, not a component (wrap it with `wasm-tools component new`, or build for wasm32-wasip2)",
        )),
        _ => Err(LoadError::Compile {
            path: path.to_owned(),
            message: "a WebAssembly binary of an unsupported version or layer (this host reads component binaries, version 0x0d, layer 1)".into(),
        }),
    }
}

/// A component's top-level imports and exports, read from its sections without validating
/// or compiling it.
#[derive(Debug, Default, PartialEq, Eq)]
pub(crate) struct Surface {
    /// Every top-level import name but type imports, in order (e.g. `wasi:io/streams@0.2.6`).
    pub(crate) imports: Vec<String>,
    /// Every top-level export name with whether it is a function.
    pub(crate) exports: Vec<(String, bool)>,
    /// Bytes of linear memory the core modules inside declare at their start (the sum of
    /// every defined memory's initial size): what instantiating them at least takes.
    pub(crate) initial_memory: u64,
}

impl Surface {
    /// Reads the surface of `bytes` (already [`identify`]-ed as a component). The parser walks
    /// the top level's section headers and reads its import and export sections only; nested
    /// modules and components (code, data) are stepped over, not parsed. An error is the
    /// parser's message (positions, no bytes).
    pub(crate) fn read(bytes: &[u8]) -> Result<Surface, String> {
        let mut surface = Surface::default();
        let mut parser = Parser::new(0);
        let mut data = bytes;
        loop {
            let payload = match parser.parse(data, true).map_err(|e| e.to_string())? {
                Chunk::Parsed { consumed, payload } => {
                    data = data.get(consumed..).unwrap_or_default();
                    payload
                }
                // Not returned with `eof = true`; an error rather than a panic all the same.
                Chunk::NeedMoreData(_) => return Err("unexpected end of the file".into()),
            };
            match payload {
                // The parser has moved past the nested module or component; so do we, without
                // looking inside (its imports are not the component's).
                Payload::ModuleSection {
                    unchecked_range, ..
                } => {
                    let module = data
                        .get(..unchecked_range.len())
                        .ok_or("a nested module runs past the end of the file")?;
                    surface.initial_memory = surface
                        .initial_memory
                        .saturating_add(initial_memory(module)?);
                    data = &data[unchecked_range.len()..];
                }
                Payload::ComponentSection {
                    unchecked_range, ..
                } => {
                    data = data
                        .get(unchecked_range.len()..)
                        .ok_or("a nested component runs past the end of the file")?;
                }
                Payload::ComponentImportSection(reader) => {
                    for import in reader {
                        let import = import.map_err(|e| e.to_string())?;
                        // Type imports (a world's `use types.{batch, verdict}`) grant nothing
                        // and are not listed by wasmtime's component type either.
                        if !matches!(import.ty, ComponentTypeRef::Type(_)) {
                            surface.imports.push(import.name.name.to_owned());
                        }
                    }
                }
                Payload::ComponentExportSection(reader) => {
                    for export in reader {
                        let export = export.map_err(|e| e.to_string())?;
                        surface.exports.push((
                            export.name.name.to_owned(),
                            export.kind == ComponentExternalKind::Func,
                        ));
                    }
                }
                Payload::End(_) => return Ok(surface),
                _ => {}
            }
        }
    }
}

/// The initial size in bytes of the memories a core module defines (imported ones are
/// another module's), read from its memory section: its code and data are stepped over.
fn initial_memory(module: &[u8]) -> Result<u64, String> {
    let mut total = 0u64;
    let mut parser = Parser::new(0);
    let mut data = module;
    loop {
        let payload = match parser.parse(data, true).map_err(|e| e.to_string())? {
            Chunk::Parsed { consumed, payload } => {
                data = data.get(consumed..).unwrap_or_default();
                payload
            }
            Chunk::NeedMoreData(_) => return Err("a nested module ends early".into()),
        };
        match payload {
            Payload::MemorySection(reader) => {
                for memory in reader {
                    let memory = memory.map_err(|e| e.to_string())?;
                    let page = 1u64 << memory.page_size_log2.unwrap_or(16);
                    total = total.saturating_add(memory.initial.saturating_mul(page));
                }
            }
            Payload::CodeSectionStart { size, .. } => {
                // Function bodies are not needed: skip the whole section.
                data = data
                    .get(size as usize..)
                    .ok_or("a code section runs past the end of its module")?;
                parser.skip_section();
            }
            Payload::End(_) => return Ok(total),
            _ => {}
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn scratch(tag: &str) -> std::path::PathBuf {
        let d = std::env::temp_dir().join(format!(
            "sharehost-component-file-{tag}-{}",
            std::process::id()
        ));
        let _ = std::fs::remove_dir_all(&d);
        std::fs::create_dir_all(&d).expect("scratch dir");
        d
    }

    #[test]
    fn a_fifo_is_refused_by_type_without_blocking() {
        let d = scratch("fifo");
        let fifo = d.join("plugin.wasm");
        let made = std::process::Command::new("mkfifo")
            .arg(&fifo)
            .status()
            .expect("mkfifo");
        assert!(made.success());
        // No writer ever opens it: a blocking open would hang here.
        let e = read_component(&fifo, DEFAULT_MAX_COMPONENT_BYTES).expect_err("a fifo");
        assert!(e.to_string().contains("is a FIFO"), "{e}");
        let _ = std::fs::remove_dir_all(&d);
    }

    #[test]
    fn dev_zero_and_a_directory_are_refused_by_type() {
        let e = read_component(Path::new("/dev/zero"), DEFAULT_MAX_COMPONENT_BYTES)
            .expect_err("a device");
        assert_eq!(
            e.to_string(),
            "/dev/zero: is a character device, not a regular file"
        );
        let d = scratch("dir");
        let e = read_component(&d, DEFAULT_MAX_COMPONENT_BYTES).expect_err("a directory");
        assert_eq!(e.to_string(), format!("{}: is a directory", d.display()));
        let _ = std::fs::remove_dir_all(&d);
    }

    #[test]
    fn a_file_over_the_maximum_is_refused_by_size_naming_the_setting() {
        let d = scratch("big");
        let f = d.join("big.wasm");
        let file = std::fs::File::create(&f).expect("create");
        // Sparse: 100 MiB of size without 100 MiB of disk.
        file.set_len(100 << 20).expect("set_len");
        let e = read_component(&f, DEFAULT_MAX_COMPONENT_BYTES).expect_err("too big");
        assert_eq!(
            e.to_string(),
            format!(
                "{}: is 100 MiB, more than the 64 MiB maximum ({MAX_SETTING})",
                f.display()
            )
        );
        let _ = std::fs::remove_dir_all(&d);
    }

    #[test]
    fn headers_say_what_a_file_is_without_quoting_it() {
        let p = Path::new("x.wasm");
        let e = identify(p, b"SECRETbytes-and-more").expect_err("text");
        assert_eq!(
            e.to_string(),
            "x.wasm: not WebAssembly (no WebAssembly header)"
        );
        let e = identify(p, b"\0asm\x01\0\0\0").expect_err("module");
        assert!(
            e.to_string()
                .starts_with("x.wasm: a core module, not a component"),
            "{e}"
        );
        let e = identify(p, b"").expect_err("empty");
        assert_eq!(e.to_string(), "x.wasm: is empty, not WebAssembly");
        let e = identify(p, b"\0asm\x0e\0\x01\0").expect_err("future");
        assert!(e.to_string().contains("unsupported version"), "{e}");
        identify(p, b"\0asm\x0d\0\x01\0").expect("a component header");
    }
}
