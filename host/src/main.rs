//! The `sharehost` command line.

use std::path::PathBuf;
use std::process::ExitCode;

mod cli;

use clap::{Args, Parser, Subcommand};

/// Runs sandboxed WebAssembly plugins on Apache Kafka share groups.
#[derive(Parser)]
#[command(version, about, long_about = None)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Connect to a cluster the way a pipeline will (TLS, SASL, version negotiation) and print
    /// the brokers and the share-group API versions they offer.
    Probe(cli::probe::ProbeArgs),
    /// Run a plugin component offline on records given as JSON lines and print one JSON line
    /// per record (verdict and reason), then a summary line.
    TestPlugin(cli::test_plugin::TestPluginArgs),
    /// Run every pipeline of a manifest until SIGTERM or SIGINT (a second signal exits at once).
    Run(RunArgs),
    /// Validate a manifest and load and validate every component it names, without touching a
    /// broker.
    Check(CheckArgs),
    /// Read a pipeline's dead-letter topic (plain fetch, no group): list the dead letters with
    /// their provenance, or replay chosen ones to their original topic, once.
    Dlq(sharehost::dlq::DlqArgs),
    /// Create topics (a pipeline's input, outputs, dead letters) with the host's own Kafka
    /// client: no Java tools needed.
    CreateTopics(cli::topics::CreateTopicsArgs),
    /// Produce test records to a topic from JSON lines (test-plugin's input format), with the
    /// host's own Kafka client: no Java tools needed.
    Produce(cli::topics::ProduceArgs),
    /// Print a topic's records as JSON lines (test-plugin's input format), read committed, no
    /// group: a pipeline's outputs and dead letters read back.
    Consume(cli::topics::ConsumeArgs),
    /// Control a running host over its admin API: pipelines, versions, swap, rollback,
    /// shadow, canary, promote.
    Ctl(cli::ctl::CtlArgs),
    /// Operate a fleet of hosts as one, through Kafka: deploy, roll back, shadow and canary a
    /// pipeline's component on every host with signed actions, and see every host's status.
    Fleet(cli::fleet::FleetArgs),
    /// Make a plugin project to start from (Rust, Python or JavaScript): the plugin, a native
    /// test, sample records, a manifest and a README with the commands; it builds and passes
    /// its test as made.
    New(cli::new::NewArgs),
    /// Build a plugin project into its component (Rust, Python or JavaScript, with the
    /// toolchain its SDK pins), where the project's manifest names it; prints its SHA-256.
    Build(cli::build::BuildArgs),
    /// The author's loop: build, judge the project's records with test-plugin, and again on
    /// every change to the project, printing the verdicts that changed.
    Dev(cli::build::DevArgs),
}

/// `sharehost run MANIFEST`.
#[derive(Args)]
struct RunArgs {
    /// The manifest (TOML), see docs/manifest.md.
    manifest: PathBuf,
    /// Log lines as JSON objects instead of readable text.
    #[arg(long)]
    log_json: bool,
    /// All or nothing: exit when any pipeline fails to load (before joining any group) or
    /// fails while running, instead of reporting it failed and trying it again while the
    /// others run.
    #[arg(long)]
    strict: bool,
}

/// `sharehost check MANIFEST`.
#[derive(Args)]
struct CheckArgs {
    /// The manifest (TOML), see docs/manifest.md.
    manifest: PathBuf,
}

/// The log filter: `SHAREHOST_LOG` (or `default_level`), with WASI's own call tracing held
/// at debug whatever is asked. wasmtime-wasi and wasmtime-wasi-http trace every host call of a
/// guest with its arguments (URLs, header values, bytes written), which would print a
/// plugin's secrets past every redaction.
fn log_filter(default_level: &str) -> tracing_subscriber::EnvFilter {
    let filter = tracing_subscriber::EnvFilter::try_from_env("SHAREHOST_LOG")
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new(default_level));
    if filter.max_level_hint() != Some(tracing_subscriber::filter::LevelFilter::TRACE) {
        return filter;
    }
    ["wasmtime_wasi=debug", "wasmtime_wasi_http=debug"]
        .into_iter()
        .filter_map(|d| d.parse().ok())
        .fold(filter, |f, d| f.add_directive(d))
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    let (default_level, json) = match &cli.command {
        Command::Run(a) => ("info", a.log_json),
        // A plugin's own log lines (`print`, `console.log`, `log::info!`) are what an author
        // runs test-plugin to see; the host's other info lines are not.
        Command::TestPlugin(a) if !a.quiet => ("warn,sharehost_runtime::log=info", false),
        _ => ("warn", false),
    };
    let filter = log_filter(default_level);
    if json {
        tracing_subscriber::fmt()
            .json()
            .with_env_filter(filter)
            .with_writer(std::io::stderr)
            .init();
    } else {
        // Colours only on a terminal: a log piped to a file or a collector stays plain text.
        tracing_subscriber::fmt()
            .with_env_filter(filter)
            .with_writer(std::io::stderr)
            .with_ansi(std::io::IsTerminal::is_terminal(&std::io::stderr()))
            .init();
    }
    let runtime = match sharehost::host_threads::runtime() {
        Ok(r) => r,
        Err(e) => {
            eprintln!("error: cannot start the async runtime: {e}");
            return ExitCode::FAILURE;
        }
    };
    let result = runtime.block_on(async {
        match cli.command {
            Command::Probe(args) => cli::probe::run(args).await,
            Command::TestPlugin(args) => cli::test_plugin::run(args).await,
            Command::Run(args) => cli::run::run(&args.manifest, args.strict).await,
            Command::Check(args) => cli::run::check(&args.manifest).await,
            Command::Dlq(args) => sharehost::dlq::run(&args, &mut std::io::stdout().lock())
                .await
                .map(|_| ()),
            Command::Fleet(args) => cli::fleet::run(args).await,
            Command::New(args) => cli::new::run(&args),
            Command::Build(args) => cli::build::run_build(&args),
            Command::Dev(args) => cli::build::run_dev(&args),
            Command::CreateTopics(args) => cli::topics::create_topics(args).await,
            Command::Produce(args) => cli::topics::produce(args).await,
            Command::Consume(args) => {
                cli::topics::consume(args, &mut std::io::stdout().lock()).await
            }
            Command::Ctl(args) => cli::ctl::run(&args, &mut std::io::stdout().lock()).await,
        }
    });
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            // One line that names what was wrong; the chain is joined with ": ".
            eprintln!("error: {e:#}");
            ExitCode::FAILURE
        }
    }
}
