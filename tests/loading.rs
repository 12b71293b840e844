//! Loading a component file: what the runtime, `sharehost test-plugin`, `sharehost check` and
//! the hot-swap endpoint do with paths that are not a plugin (a FIFO, a device, a directory, a
//! file too big, a core module, a secret), with a component of another contract version and
//! with one that does not fit the instance pool, and with a function that would take the
//! compiler too long.
//!
//! Needs the guest components (`dev/build-guests`). Anything that could block forever on
//! today's bugs (a FIFO) runs behind a bounded wait for the event (a load's result, a process
//! exit, an HTTP response), so a regression fails the test instead of hanging the suite.

use std::future::Future;
use std::io::{Read, Write};
use std::os::unix::fs::symlink;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::Arc;
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::Duration;

use sharehost::admin::{self, AdminState};
use sharehost::manifest::Manifest;
use sharehost::metrics::Metrics;
use sharehost::pipeline::Pipeline;
use sharehost::runtime::{
    AllocatorKind, LoadError, Origin, PluginLimits, PluginRuntime, RuntimeConfig,
};
use sharehost::tenants::Tenants;
use sharehost_tests::guest;
use wasm_encoder::{
    CodeSection, ComponentBuilder, ComponentExportKind, ComponentTypeRef, ConstExpr, DataSection,
    ExportKind, ExportSection, Function, FunctionSection, InstanceType, MemorySection, MemoryType,
    Module, TypeSection,
};

/// How long a load, a process or a response may take before the test calls it a hang. Only a
/// bound on waiting for the event; nothing is timed.
const HANG: Duration = Duration::from_secs(120);

fn scratch(tag: &str) -> PathBuf {
    static N: AtomicU32 = AtomicU32::new(0);
    let dir = std::env::temp_dir().join(format!(
        "sharehost-loading-{tag}-{}-{}",
        std::process::id(),
        N.fetch_add(1, Ordering::Relaxed)
    ));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).expect("scratch dir");
    dir
}

fn mkfifo(path: &Path) {
    let status = Command::new("mkfifo")
        .arg(path)
        .status()
        .expect("run mkfifo");
    assert!(status.success(), "mkfifo {}", path.display());
}

fn runtime() -> PluginRuntime {
    PluginRuntime::new(RuntimeConfig {
        max_instances: 4,
        ..RuntimeConfig::default()
    })
    .expect("runtime")
}

/// Loads `path` on a thread of its own and waits for the result with a bound, so a load that
/// blocks (today: opening a FIFO) fails the test instead of hanging it.
fn load_bounded(rt: PluginRuntime, path: &Path) -> Result<(), LoadError> {
    let path = path.to_owned();
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        let result = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .expect("tokio")
            .block_on(rt.load(&path, PluginLimits::default(), Vec::new()))
            .map(|_| ());
        let _ = tx.send(result);
    });
    rx.recv_timeout(HANG)
        .expect("the load did not finish: it blocked on the path")
}

fn refused(path: &Path) -> LoadError {
    load_bounded(runtime(), path).expect_err("must be refused")
}

/// A core module with one function `f` and one memory of `pages` 64 KiB pages (`memories` of
/// them), with `data` bytes of active data in memory 0.
fn core_module(pages: u64, memories: u32, data: usize) -> Module {
    let mut m = Module::new();
    let mut types = TypeSection::new();
    types.ty().function([], []);
    m.section(&types);
    let mut funcs = FunctionSection::new();
    funcs.function(0);
    m.section(&funcs);
    let mut mems = MemorySection::new();
    for _ in 0..memories {
        mems.memory(MemoryType {
            minimum: pages,
            maximum: None,
            memory64: false,
            shared: false,
            page_size_log2: None,
        });
    }
    m.section(&mems);
    let mut exports = ExportSection::new();
    exports.export("f", ExportKind::Func, 0);
    m.section(&exports);
    let mut code = CodeSection::new();
    let mut body = Function::new([]);
    body.instructions().end();
    code.function(&body);
    m.section(&code);
    if data > 0 {
        let mut section = DataSection::new();
        section.active(0, &ConstExpr::i32_const(0), vec![0x5a; data]);
        m.section(&section);
    }
    m
}

/// A component that instantiates [`core_module`] and exports its `f` as `init` and `handle`
/// (functions of the wrong type, but functions: enough to reach compilation), importing an
/// empty instance under each of `imports`.
fn crafted_component(pages: u64, memories: u32, data: usize, imports: &[&str]) -> Vec<u8> {
    let mut b = ComponentBuilder::default();
    for name in imports {
        let ty = b.type_instance(None, &InstanceType::new());
        b.import(*name, ComponentTypeRef::Instance(ty));
    }
    let module = b.core_module(None, &core_module(pages, memories, data));
    let instance = b.core_instantiate(None, module, Vec::<(&str, wasm_encoder::ModuleArg)>::new());
    export_f_as_init_and_handle(b, instance)
}

/// Lifts core instance `instance`'s `f` and exports it as both `init` and `handle`.
fn export_f_as_init_and_handle(mut b: ComponentBuilder, instance: u32) -> Vec<u8> {
    let core_f = b.core_alias_export(None, instance, "f", ExportKind::Func);
    let (ty, encoder) = b.ty(None);
    encoder
        .function()
        .params(Vec::<(&str, wasm_encoder::ComponentValType)>::new())
        .result(None);
    let f = b.lift_func(
        None,
        core_f,
        ty,
        Vec::<wasm_encoder::CanonicalOption>::new(),
    );
    b.export("init", ComponentExportKind::Func, f, None);
    b.export("handle", ComponentExportKind::Func, f, None);
    b.finish()
}

fn write(dir: &Path, name: &str, bytes: &[u8]) -> PathBuf {
    let path = dir.join(name);
    std::fs::write(&path, bytes).expect("write");
    path
}

#[test]
fn loading_a_fifo_is_refused_without_blocking() {
    let dir = scratch("fifo");
    let fifo = dir.join("plugin.wasm");
    mkfifo(&fifo);
    let e = refused(&fifo);
    assert!(matches!(e, LoadError::NotAFile { .. }), "{e}");
    assert_eq!(
        e.to_string(),
        format!(
            "{}: is a FIFO (named pipe), not a regular file",
            fifo.display()
        )
    );
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn dev_zero_is_refused_by_type_not_read() {
    let e = refused(Path::new("/dev/zero"));
    assert_eq!(
        e.to_string(),
        "/dev/zero: is a character device, not a regular file"
    );
}

#[test]
fn a_file_over_the_maximum_is_refused_with_its_size_and_the_setting() {
    let dir = scratch("big");
    let path = dir.join("big.wasm");
    let file = std::fs::File::create(&path).expect("create");
    // A component header, then sparse zeros up to 100 MiB.
    (&file).write_all(b"\0asm\x0d\0\x01\0").expect("header");
    file.set_len(100 << 20).expect("grow");
    let e = refused(&path);
    assert!(matches!(e, LoadError::TooLarge { .. }), "{e}");
    let text = e.to_string();
    assert!(
        text.contains("is 100 MiB, more than the 64 MiB maximum"),
        "{text}"
    );
    assert!(text.contains("runtime.max_component_mib"), "{text}");
    // The same file under a raised maximum gets past the size check (and is then refused
    // for what it contains).
    let rt = PluginRuntime::new(RuntimeConfig {
        max_instances: 2,
        max_component_bytes: 128 << 20,
        ..RuntimeConfig::default()
    })
    .expect("runtime");
    let e = load_bounded(rt, &path).expect_err("not a plugin");
    assert!(!matches!(e, LoadError::TooLarge { .. }), "{e}");
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn a_directory_is_called_a_directory() {
    let dir = scratch("dir");
    let e = refused(&dir);
    assert_eq!(e.to_string(), format!("{}: is a directory", dir.display()));
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn a_core_module_is_called_a_core_module() {
    let dir = scratch("core");
    let path = write(&dir, "module.wasm", &core_module(1, 1, 0).finish());
    let e = refused(&path);
    let text = e.to_string();
    assert!(
        text.starts_with(&format!(
            "{}: a core module, not a component",
            path.display()
        )),
        "{text}"
    );
    assert!(!text.contains('\n'), "one line: {text}");
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn a_file_that_is_not_webassembly_is_named_and_its_bytes_never_echoed() {
    let dir = scratch("secret");
    let secret = write(&dir, "secret.txt", b"SECRET-token-4711\n");
    let link = dir.join("plugin.wasm");
    symlink(&secret, &link).expect("symlink");
    let e = refused(&link);
    let text = e.to_string();
    assert_eq!(
        text,
        format!(
            "{}: not WebAssembly (no WebAssembly header)",
            link.display()
        )
    );
    for quoted in ["SECR", "0x53", "0x45", "83, 69"] {
        assert!(!text.contains(quoted), "the error quotes the file: {text}");
    }
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn a_component_of_another_package_version_is_refused_naming_the_version() {
    let e = refused(&guest("fixture_other_version"));
    assert!(matches!(e, LoadError::WrongVersion { .. }), "{e}");
    let text = e.to_string();
    assert!(
        text.contains("built for sharehost:plugin@0.9.0, this host speaks 0.1.x and 0.2.x"),
        "{text}"
    );
    assert!(!text.contains("not granted"), "{text}");
}

#[test]
fn a_component_exporting_another_versions_interface_is_refused_naming_the_version() {
    let dir = scratch("export-version");
    let mut b = ComponentBuilder::default();
    let ty = b.type_instance(None, &InstanceType::new());
    let imported = b.import(
        "sharehost:plugin/handler@1.0.0",
        ComponentTypeRef::Instance(ty),
    );
    b.export(
        "sharehost:plugin/handler@1.0.0",
        ComponentExportKind::Instance,
        imported,
        None,
    );
    let path = write(&dir, "v1.wasm", &b.finish());
    let e = refused(&path);
    assert!(
        e.to_string()
            .contains("built for sharehost:plugin@1.0.0, this host speaks 0.1.x and 0.2.x"),
        "{e}"
    );
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn a_memory_larger_than_the_plugins_limit_is_refused_before_compiling() {
    let dir = scratch("declared-memory");
    let rt = PluginRuntime::new(RuntimeConfig {
        max_instances: 4,
        cache_dir: Some(dir.join("cwasm")),
        ..RuntimeConfig::default()
    })
    .expect("runtime");
    // 2048 pages = 128 MiB at start (with 1 MiB of data), against a limit of 64 MiB.
    let path = write(
        &dir,
        "big-memory.wasm",
        &crafted_component(2048, 1, 1 << 20, &[]),
    );
    let limits = PluginLimits {
        max_memory: 64 << 20,
        ..PluginLimits::default()
    };
    for _ in 0..2 {
        let Err(e) = rt.compile_blocking(&path, &limits) else {
            panic!("a 128 MiB memory compiled under a 64 MiB limit");
        };
        assert!(matches!(e, LoadError::InitialMemory { .. }), "{e}");
        let text = e.to_string();
        assert!(
            text.contains("declare 128 MiB of initial memory, more than the plugin's memory limit of 64 MiB (memory_limit_mib)"),
            "{text}"
        );
    }
    // Nothing was compiled: the cache holds no artifact.
    let artifacts = std::fs::read_dir(dir.join("cwasm"))
        .map(|d| {
            d.filter_map(Result::ok)
                .filter(|e| e.path().extension().is_some_and(|x| x == "cwasm"))
                .count()
        })
        .unwrap_or(0);
    assert_eq!(artifacts, 0, "a refused component was compiled and cached");
    let _ = std::fs::remove_dir_all(&dir);
}

/// A component that instantiates one small core module `instances` times (each instance of
/// it one memory), exporting the last one's `f` as `init` and `handle`.
fn component_with_instances(instances: u32) -> Vec<u8> {
    let mut b = ComponentBuilder::default();
    let module = b.core_module(None, &core_module(1, 1, 0));
    let mut last = None;
    for _ in 0..instances {
        last =
            Some(b.core_instantiate(None, module, Vec::<(&str, wasm_encoder::ModuleArg)>::new()));
    }
    let instance = last.expect("at least one instance");
    export_f_as_init_and_handle(b, instance)
}

#[test]
fn a_component_beyond_a_pool_slots_share_runs_on_demand_and_says_why() {
    let dir = scratch("placement");
    let rt = runtime();
    assert_ne!(
        rt.allocator(),
        AllocatorKind::OnDemand,
        "this test needs the pool"
    );
    let limits = PluginLimits::default();
    // Within a slot's share (8 core instances, 2 memories): the pool.
    let small = write(&dir, "small.wasm", &component_with_instances(2));
    let placed = rt
        .compile_blocking(&small, &limits)
        .expect("compiles")
        .placement;
    assert_eq!(placed.allocator, rt.allocator());
    assert_eq!(placed.reason, None);
    // Python components have ~40 core instances; this one has 12 (and 12 memories). Before,
    // such a component compiled for the pool and then could not be instantiated at all.
    let big = write(&dir, "big.wasm", &component_with_instances(12));
    let placed = rt
        .compile_blocking(&big, &limits)
        .expect("compiles")
        .placement;
    assert_eq!(placed.allocator, AllocatorKind::OnDemand);
    let reason = placed.reason.expect("a reason");
    assert!(
        reason.contains(
            "12 core module instances, which exceeds the configured maximum of 8 per pool slot"
        ),
        "{reason}"
    );
    // A core module with two memories does not fit a slot's shape either.
    let two = write(&dir, "two-memories.wasm", &crafted_component(1, 2, 0, &[]));
    let placed = rt
        .compile_blocking(&two, &limits)
        .expect("compiles")
        .placement;
    assert_eq!(placed.allocator, AllocatorKind::OnDemand, "{placed:?}");
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn compiling_never_runs_on_the_callers_async_worker() {
    // One worker thread: a compile that ran on it would be done by the time its future was
    // first polled (and would have stalled every other task of the runtime meanwhile).
    let rt = runtime();
    let component = guest("fixture_ledger");
    let worker = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("runtime");
    worker.block_on(async {
        let limits = PluginLimits::default();
        let compile = rt.compile(&component, &limits);
        tokio::pin!(compile);
        let first =
            std::future::poll_fn(|cx| std::task::Poll::Ready(compile.as_mut().poll(cx))).await;
        assert!(
            first.is_pending(),
            "the compile finished within its first poll: it ran on the async worker"
        );
        compile.await.expect("compiles");
    });
}

#[test]
fn an_on_demand_placement_survives_the_precompiled_cache() {
    let dir = scratch("placement-cache");
    let rt = PluginRuntime::new(RuntimeConfig {
        max_instances: 4,
        cache_dir: Some(dir.join("cwasm")),
        ..RuntimeConfig::default()
    })
    .expect("runtime");
    let big = write(&dir, "big.wasm", &component_with_instances(12));
    let limits = PluginLimits::default();
    let first = rt.compile_blocking(&big, &limits).expect("compiles");
    assert_eq!(first.origin, Origin::Compiled);
    let second = rt.compile_blocking(&big, &limits).expect("from the cache");
    assert_eq!(second.origin, Origin::Cached);
    assert_eq!(second.placement, first.placement);
    assert_eq!(second.placement.allocator, AllocatorKind::OnDemand);
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn hosts_loading_one_component_at_once_compile_it_once() {
    let dir = scratch("compile-once");
    let component = guest("order_validator");
    // Four runtimes on one new cache directory, as four hosts of one user on one machine
    // opening it at once; each then starts its load at the same moment.
    let runtimes: Vec<PluginRuntime> = std::thread::scope(|scope| {
        let opening: Vec<_> = (0..4)
            .map(|_| {
                scope.spawn(|| {
                    PluginRuntime::new(RuntimeConfig {
                        max_instances: 2,
                        cache_dir: Some(dir.join("cwasm")),
                        ..RuntimeConfig::default()
                    })
                    .expect("runtime")
                })
            })
            .collect();
        opening
            .into_iter()
            .map(|o| o.join().expect("no panic"))
            .collect()
    });
    let start = Arc::new(std::sync::Barrier::new(runtimes.len()));
    let loads: Vec<_> = runtimes
        .into_iter()
        .map(|rt| {
            let (component, start) = (component.clone(), start.clone());
            std::thread::spawn(move || {
                start.wait();
                rt.compile_blocking(&component, &PluginLimits::default())
                    .expect("loads")
                    .origin
            })
        })
        .collect();
    let origins: Vec<Origin> = loads
        .into_iter()
        .map(|l| l.join().expect("no panic"))
        .collect();
    assert_eq!(
        origins.iter().filter(|o| **o == Origin::Compiled).count(),
        1,
        "one compiled, the others waited for its artifact: {origins:?}"
    );
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn a_forbidden_import_is_refused_before_compiling() {
    let dir = scratch("before-compile");
    // Compiling this one would fail on the pool (a 128 MiB memory): refusing it for its
    // import instead shows the import was checked first, from the sections alone.
    let path = write(
        &dir,
        "forbidden.wasm",
        &crafted_component(2048, 1, 0, &["wasi:filesystem/types@0.2.6"]),
    );
    let e = refused(&path);
    match &e {
        LoadError::ForbiddenImport { imports, .. } => {
            assert_eq!(imports, &vec!["wasi:filesystem/types@0.2.6".to_owned()]);
        }
        other => panic!("expected ForbiddenImport, got {other}"),
    }
    let _ = std::fs::remove_dir_all(&dir);
}

// ---- the hot-swap endpoint ----------------------------------------------------------------

/// One HTTP/1.1 request on loopback; the response, or `None` if none came within [`HANG`].
fn http(addr: std::net::SocketAddr, request: &str) -> Option<String> {
    let mut stream = std::net::TcpStream::connect(addr).expect("connect");
    stream.set_read_timeout(Some(HANG)).expect("timeout");
    stream.write_all(request.as_bytes()).expect("send");
    let mut response = String::new();
    match stream.read_to_string(&mut response) {
        Ok(_) => Some(response),
        Err(_) if !response.is_empty() => Some(response),
        Err(_) => None,
    }
}

#[test]
fn the_swap_endpoint_refuses_a_fifo_without_blocking() {
    let dir = scratch("swap");
    let fifo = dir.join("next.wasm");
    mkfifo(&fifo);
    let manifest = Manifest::parse(
        &dir.join("m.toml"),
        &format!(
            "[cluster]\nbootstrap = \"127.0.0.1:9092\"\n\n[[pipeline]]\nname = \"p\"\ntopics = [\"t\"]\ngroup = \"g\"\ncomponent = \"{}\"\n",
            guest("accept_all").display()
        ),
    )
    .expect("manifest");
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .expect("tokio");
    let runtime = PluginRuntime::new(manifest.runtime_config()).expect("runtime");
    let metrics = Arc::new(Metrics::new());
    let pipeline = rt
        .block_on(Pipeline::load(
            manifest.pipelines[0].clone(),
            runtime,
            metrics.clone(),
        ))
        .expect("pipeline");
    let state = Arc::new(AdminState {
        tenants: Arc::new(Tenants::loaded(std::slice::from_ref(&pipeline))),
        metrics,
        token: None,
        manifest: None,
        fleet: None,
        allowed_hosts: Vec::new(),
    });
    let listener = rt
        .block_on(tokio::net::TcpListener::bind("127.0.0.1:0"))
        .expect("bind");
    let addr = listener.local_addr().expect("addr");
    let stop = tokio_util::sync::CancellationToken::new();
    let server = rt.spawn(admin::serve(listener, state, stop.clone()));

    let body = serde_json::json!({ "path": fifo }).to_string();
    let Some(response) = http(
        addr,
        &format!(
            "POST /pipelines/p/swap HTTP/1.1\r\nhost: 127.0.0.1\r\ncontent-type: application/json\r\ncontent-length: {}\r\nconnection: close\r\n\r\n{body}",
            body.len()
        ),
    ) else {
        // A worker thread is stuck opening the FIFO: dropping the runtime would wait for it
        // forever, so leave it behind and fail.
        rt.shutdown_background();
        panic!("no response: the swap blocked on the FIFO");
    };
    assert!(response.starts_with("HTTP/1.1 422"), "{response}");
    // The caller learns that the path cannot be loaded, not what the host found there.
    assert!(response.contains("cannot be loaded"), "{response}");
    assert!(!response.contains("FIFO"), "{response}");
    assert_eq!(
        pipeline.component(),
        guest("accept_all"),
        "the old version keeps running"
    );
    stop.cancel();
    let _ = rt.block_on(server);
    let _ = std::fs::remove_dir_all(&dir);
}

// ---- the command line ----------------------------------------------------------------------

/// Runs `sharehost ARGS` and waits for it to exit with a bound: (success, stdout, stderr). A
/// process still running at the bound is killed and the test fails.
fn sharehost(args: &[&std::ffi::OsStr]) -> (bool, String, String) {
    let child = Command::new(sharehost_tests::sharehost_bin!())
        .args(args)
        .env("SHAREHOST_LOG", "off")
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("run sharehost");
    let pid = child.id();
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        let _ = tx.send(child.wait_with_output());
    });
    match rx.recv_timeout(HANG) {
        Ok(out) => {
            let out = out.expect("wait");
            (
                out.status.success(),
                String::from_utf8_lossy(&out.stdout).into_owned(),
                String::from_utf8_lossy(&out.stderr).into_owned(),
            )
        }
        Err(_) => {
            // Our own child, by its pid.
            let _ = Command::new("kill").arg("-9").arg(pid.to_string()).status();
            panic!("sharehost {args:?} did not exit: it hung");
        }
    }
}

fn test_plugin(component: &Path) -> (bool, String, String) {
    let dir = scratch("cli-input");
    let input = write(&dir, "in.jsonl", b"{\"value\":\"a\"}\n");
    sharehost(&[
        "test-plugin".as_ref(),
        component.as_os_str(),
        "--input".as_ref(),
        input.as_os_str(),
    ])
}

#[test]
fn test_plugin_refuses_a_fifo_without_hanging() {
    let dir = scratch("cli-fifo");
    let fifo = dir.join("plugin.wasm");
    mkfifo(&fifo);
    let (ok, _, stderr) = test_plugin(&fifo);
    assert!(!ok);
    assert_eq!(
        stderr.trim_end(),
        format!(
            "error: {}: is a FIFO (named pipe), not a regular file",
            fifo.display()
        )
    );
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn test_plugin_refuses_dev_zero_by_type() {
    let (ok, _, stderr) = test_plugin(Path::new("/dev/zero"));
    assert!(!ok);
    assert_eq!(
        stderr.trim_end(),
        "error: /dev/zero: is a character device, not a regular file"
    );
}

#[test]
fn test_plugin_names_the_size_and_the_flag_for_a_file_over_the_maximum() {
    let dir = scratch("cli-big");
    let path = dir.join("big.wasm");
    std::fs::File::create(&path)
        .expect("create")
        .set_len(100 << 20)
        .expect("grow");
    let (ok, _, stderr) = test_plugin(&path);
    assert!(!ok);
    assert!(
        stderr.contains("is 100 MiB, more than the 64 MiB maximum"),
        "{stderr}"
    );
    assert!(stderr.contains("--max-component-mib"), "{stderr}");
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn test_plugin_says_a_directory_is_a_directory() {
    let dir = scratch("cli-dir");
    let (ok, _, stderr) = test_plugin(&dir);
    assert!(!ok);
    assert_eq!(
        stderr.trim_end(),
        format!("error: {}: is a directory", dir.display())
    );
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn test_plugin_never_echoes_the_bytes_of_a_secret_file() {
    let dir = scratch("cli-secret");
    let secret = write(&dir, "secret.txt", b"SECRET-token-4711\n");
    let link = dir.join("plugin.wasm");
    symlink(&secret, &link).expect("symlink");
    let (ok, _, stderr) = test_plugin(&link);
    assert!(!ok);
    assert_eq!(
        stderr.trim_end(),
        format!(
            "error: {}: not WebAssembly (no WebAssembly header)",
            link.display()
        )
    );
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn test_plugin_names_the_version_a_component_was_built_for() {
    let (ok, _, stderr) = test_plugin(&guest("fixture_other_version"));
    assert!(!ok);
    assert!(
        stderr.contains("built for sharehost:plugin@0.9.0, this host speaks 0.1.x and 0.2.x"),
        "{stderr}"
    );
}

#[test]
fn check_says_a_component_path_that_is_a_directory_is_a_directory() {
    let dir = scratch("cli-check");
    let plugin_dir = dir.join("plugin.wasm");
    std::fs::create_dir(&plugin_dir).expect("dir");
    let manifest = write(
        &dir,
        "m.toml",
        b"[cluster]\nbootstrap = \"127.0.0.1:9092\"\n\n[[pipeline]]\nname = \"p\"\ntopics = [\"t\"]\ngroup = \"g\"\ncomponent = \"plugin.wasm\"\n",
    );
    let (ok, _, stderr) = sharehost(&["check".as_ref(), manifest.as_os_str()]);
    assert!(!ok);
    assert!(
        stderr.contains(&format!("{}: is a directory", plugin_dir.display())),
        "{stderr}"
    );
    assert!(!stderr.contains("does not exist"), "{stderr}");
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn check_refuses_an_http_importing_component_without_allowed_outbound_hosts_naming_the_key() {
    let dir = scratch("cli-check-http");
    let component = guest("fixture_http_fetch");
    let pipeline = format!(
        "[cluster]\nbootstrap = \"127.0.0.1:9092\"\n\n[[pipeline]]\nname = \"p\"\ntopics = [\"t\"]\ngroup = \"g\"\ncomponent = \"{}\"\n",
        component.display()
    );
    let manifest = write(&dir, "m.toml", pipeline.as_bytes());
    let (ok, _, stderr) = sharehost(&["check".as_ref(), manifest.as_os_str()]);
    assert!(!ok, "refused without a grant");
    assert!(
        stderr.contains("wasi:http/outgoing-handler@0.2")
            && stderr.contains("add `allowed_outbound_hosts"),
        "{stderr}"
    );
    // Granting a host is all it takes.
    let granted = write(
        &dir,
        "granted.toml",
        format!("{pipeline}allowed_outbound_hosts = [\"http://127.0.0.1:8088\"]\n").as_bytes(),
    );
    let (ok, stdout, stderr) = sharehost(&["check".as_ref(), granted.as_os_str()]);
    assert!(ok, "{stdout}{stderr}");
    let _ = std::fs::remove_dir_all(&dir);
}

#[tokio::test]
async fn an_exhausted_instance_pool_names_the_sizing_rule() {
    let rt = PluginRuntime::new(RuntimeConfig {
        max_instances: 1,
        ..RuntimeConfig::default()
    })
    .expect("runtime");
    assert_ne!(
        rt.allocator(),
        AllocatorKind::OnDemand,
        "this test needs the pool"
    );
    let path = guest("accept_all");
    // The first plugin holds the pool's one instance while the second loads.
    let _first = rt
        .load(&path, PluginLimits::default(), Vec::new())
        .await
        .expect("the first fits");
    let e = rt
        .load(&path, PluginLimits::default(), Vec::new())
        .await
        .expect_err("no instance left");
    let text = e.to_string();
    assert!(
        text.contains("the plugin instance pool is exhausted")
            && text.contains("maximum concurrent limit of 1")
            && text.contains("3 × concurrency + 3 instances per pipeline"),
        "{text}"
    );
}

// ---- what one function asks of the compiler ------------------------------------------------

/// An unsigned LEB128, as WebAssembly writes counts and sizes.
fn leb(mut n: u32, out: &mut Vec<u8>) {
    loop {
        let byte = (n & 0x7f) as u8;
        n >>= 7;
        if n == 0 {
            out.push(byte);
            return;
        }
        out.push(byte | 0x80);
    }
}

/// Reads an unsigned LEB128 at the start of `bytes`: (value, bytes it took).
fn read_leb(bytes: &[u8]) -> (u32, usize) {
    let (mut n, mut shift) = (0u32, 0);
    for (i, b) in bytes.iter().enumerate() {
        n |= u32::from(b & 0x7f) << shift;
        if b & 0x80 == 0 {
            return (n, i + 1);
        }
        shift += 7;
    }
    panic!("a LEB128 runs past its section");
}

/// The sections of a module or component binary after its 8-byte header: (id, content).
fn sections(binary: &[u8]) -> Vec<(u8, &[u8])> {
    let mut out = Vec::new();
    let mut at = 8;
    while at < binary.len() {
        let id = binary[at];
        let (size, taken) = read_leb(&binary[at + 1..]);
        let start = at + 1 + taken;
        out.push((id, &binary[start..start + size as usize]));
        at = start + size as usize;
    }
    out
}

/// A binary of `header` and `sections`.
fn binary(header: &[u8], sections: &[(u8, Vec<u8>)]) -> Vec<u8> {
    let mut out = header.to_vec();
    for (id, content) in sections {
        out.push(*id);
        leb(
            u32::try_from(content.len()).expect("section size"),
            &mut out,
        );
        out.extend_from_slice(content);
    }
    out
}

/// A vector section's content with `extra` (already encoded) appended to its items.
fn append_item(content: &[u8], extra: &[u8]) -> Vec<u8> {
    let (count, taken) = read_leb(content);
    let mut out = Vec::new();
    leb(count + 1, &mut out);
    out.extend_from_slice(&content[taken..]);
    out.extend_from_slice(extra);
    out
}

/// A real plugin (`accept_all`) with one more function in its main core module (the
/// component's first): `() -> ()`, a body of `operators` operators (constants dropped, then
/// `end`; `operators` odd), unexported and never called. Everything else is untouched, so the
/// component loads and runs like the plugin it came from, once the bound lets it compile.
fn accept_all_with_a_function_of(operators: u32) -> Vec<u8> {
    assert!(operators % 2 == 1, "pairs of operators and an `end`");
    let component = std::fs::read(guest("accept_all")).expect("read accept_all");
    let mut top: Vec<(u8, Vec<u8>)> = Vec::new();
    let mut done = false;
    for (id, content) in sections(&component) {
        // Section 1 of a component is a core module; the first is the plugin's own code.
        if id == 1 && !done {
            done = true;
            let mut module: Vec<(u8, Vec<u8>)> = Vec::new();
            let mut new_type = None;
            for (id, content) in sections(content) {
                let content = match id {
                    // Type section: one more type, `() -> ()`, numbered after the others.
                    1 => {
                        new_type = Some(read_leb(content).0);
                        append_item(content, &[0x60, 0, 0])
                    }
                    // Function section: the new function's type.
                    3 => {
                        let mut ty = Vec::new();
                        leb(new_type.expect("a type section first"), &mut ty);
                        append_item(content, &ty)
                    }
                    // Code section: the new body (no locals), after the others.
                    10 => {
                        let mut body = vec![0x00];
                        for _ in 0..operators / 2 {
                            body.extend_from_slice(&[0x42, 0x01, 0x1a]); // i64.const 1; drop
                        }
                        body.push(0x0b); // end
                        let mut extra = Vec::new();
                        leb(u32::try_from(body.len()).expect("body size"), &mut extra);
                        extra.extend_from_slice(&body);
                        append_item(content, &extra)
                    }
                    _ => content.to_vec(),
                };
                module.push((id, content));
            }
            top.push((1, binary(&content[..8], &module)));
        } else {
            top.push((id, content.to_vec()));
        }
    }
    binary(&component[..8], &top)
}

#[test]
fn check_refuses_a_function_over_the_operator_bound_naming_it_and_the_key() {
    let dir = scratch("cli-check-function");
    let bound = sharehost::runtime::DEFAULT_MAX_FUNCTION_OPERATORS;
    let over = u32::try_from(bound + 1).expect("bound");
    let component = write(
        &dir,
        "big-function.wasm",
        &accept_all_with_a_function_of(over),
    );
    let pipeline = format!(
        "\n[[pipeline]]\nname = \"p\"\ntopics = [\"t\"]\ngroup = \"g\"\ncomponent = \"{}\"\n",
        component.display()
    );
    let cluster = "[cluster]\nbootstrap = \"127.0.0.1:9092\"\n";
    let manifest = write(&dir, "m.toml", format!("{cluster}{pipeline}").as_bytes());
    let (ok, stdout, stderr) = sharehost(&["check".as_ref(), manifest.as_os_str()]);
    assert!(!ok, "a function over the bound passed check: {stdout}");
    assert!(
        stderr.contains(&format!(
            "{}: function ",
            component.display()
        )) && stderr.contains(&format!(
            " of core module 0 has {over} operators, more than the maximum of {bound} (raise runtime.max_function_operators in the manifest)"
        )),
        "{stderr}"
    );
    // Raising the key is all it takes: the component is the plugin it was, and loads.
    let raised = write(
        &dir,
        "raised.toml",
        format!(
            "{cluster}\n[runtime]\nmax_function_operators = {}\n{pipeline}",
            bound + 2
        )
        .as_bytes(),
    );
    let (ok, stdout, stderr) = sharehost(&["check".as_ref(), raised.as_os_str()]);
    assert!(ok, "{stdout}{stderr}");
    assert!(stdout.contains("ok: pipeline p"), "{stdout}");
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn the_runtime_refuses_a_function_over_the_bound_before_compiling_it() {
    // The function bound is checked from the code section, like the declared memory: a
    // refused component is never compiled, so the cache holds nothing after it.
    let dir = scratch("big-function");
    let rt = PluginRuntime::new(RuntimeConfig {
        max_instances: 4,
        cache_dir: Some(dir.join("cwasm")),
        function_bounds: sharehost::runtime::FunctionBounds {
            max_operators: 1000,
            ..sharehost::runtime::FunctionBounds::default()
        },
        ..RuntimeConfig::default()
    })
    .expect("runtime");
    let path = write(&dir, "f.wasm", &accept_all_with_a_function_of(1001));
    let Err(e) = rt.compile_blocking(&path, &PluginLimits::default()) else {
        panic!("compiled a function over the bound");
    };
    assert!(matches!(e, LoadError::FunctionTooLarge { .. }), "{e}");
    let cached = std::fs::read_dir(dir.join("cwasm"))
        .map(|d| {
            d.filter_map(Result::ok)
                .filter(|e| e.path().extension().is_some_and(|x| x == "cwasm"))
                .count()
        })
        .unwrap_or(0);
    assert_eq!(cached, 0, "a refused component was compiled and cached");
    // The real guests' functions are well inside the default bounds, with a margin of at
    // least twice (the Python interpreter's largest: 166,865 operators, 781 nested blocks;
    // JavaScript's: 46,256 loops × locals).
    for name in ["enricher_py", "enricher_js", "order_validator"] {
        let shape =
            sharehost::runtime::CodeShape::measure(&std::fs::read(guest(name)).expect("read"))
                .expect("parses");
        let bounds = sharehost::runtime::FunctionBounds::default();
        assert!(
            shape.operators.0 * 2 <= bounds.max_operators,
            "{name}: {shape:?}"
        );
        assert!(
            shape.nesting.0 * 5 <= bounds.max_nesting,
            "{name}: {shape:?}"
        );
        assert!(
            shape.loop_locals.0 * 5 <= bounds.max_loop_locals,
            "{name}: {shape:?}"
        );
        assert!(shape.stack.0 * 5 <= bounds.max_stack, "{name}: {shape:?}");
        eprintln!("{name}: deepest operand stack {:?}", shape.stack);
    }
    let _ = std::fs::remove_dir_all(&dir);
}
