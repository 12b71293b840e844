//! `sharehost test-plugin`: a component run offline on records given as JSON lines, with the
//! grants of its flags or of a manifest's pipeline.

use std::path::PathBuf;

use anyhow::{Context, Result};
use clap::Args;

/// `sharehost test-plugin COMPONENT --input FILE.jsonl [--config k=v ...]`.
#[derive(Args)]
pub(crate) struct TestPluginArgs {
    /// The plugin component (.wasm), e.g. target/guests/order_validator.wasm.
    component: PathBuf,
    /// JSON lines, one record per line: key, value, headers, topic, partition, offset,
    /// timestamp, delivery_count (values as text or {"base64": "..."}).
    #[arg(long)]
    input: PathBuf,
    /// Plugin configuration entry KEY=VALUE (repeatable), passed to the plugin's init.
    #[arg(long = "config", value_name = "KEY=VALUE")]
    config: Vec<String>,
    /// Records per batch handed to the plugin.
    #[arg(long, default_value_t = 500)]
    batch_size: usize,
    /// CPU deadline per batch, in milliseconds.
    #[arg(long, default_value_t = 5000)]
    deadline_ms: u64,
    /// Memory limit of the plugin instance, in MiB.
    #[arg(long, default_value_t = 64)]
    max_memory_mib: usize,
    /// Largest component file read, in MiB (the manifest's `runtime.max_component_mib`).
    #[arg(long, default_value_t = sharehost::runtime::DEFAULT_MAX_COMPONENT_BYTES >> 20)]
    max_component_mib: u64,
    /// Output name the plugin may emit to (repeatable; the manifest's `[pipeline.outputs]`
    /// keys). Emits are shown on their record's line, never produced.
    #[arg(long = "output", value_name = "NAME")]
    outputs: Vec<String>,
    /// Grants outbound HTTP to scheme://host[:port] (repeatable; the manifest's
    /// `allowed_outbound_hosts`). Without it, every request is refused in the host.
    #[arg(long = "allow-outbound-host", value_name = "URL")]
    allowed_outbound_hosts: Vec<String>,
    /// Secret handed to init, read from an environment variable: NAME=ENV_VAR (repeatable;
    /// the manifest's `[pipeline.secrets]`). Never taken as a value on the command line.
    #[arg(long = "secret-env", value_name = "NAME=ENV_VAR")]
    secret_env: Vec<String>,
    /// Wall-clock deadline per batch, in milliseconds (default: 3 × the CPU deadline, as a
    /// pipeline's `wall_deadline_ms`).
    #[arg(long)]
    wall_deadline_ms: Option<u64>,
    /// Longest `retry` delay a verdict keeps, in ms; a longer one is shown cut to it, as a
    /// pipeline cuts it (the manifest's `max_retry_delay_ms`).
    #[arg(long, default_value_t = sharehost::manifest::defaults::MAX_RETRY_DELAY_MS)]
    max_retry_delay_ms: u64,
    /// Most emits per batch (the manifest's `max_emits_per_batch`).
    #[arg(long, default_value_t = sharehost::runtime::DEFAULT_MAX_EMITS_PER_BATCH)]
    max_emits_per_batch: u32,
    /// Most emitted bytes per batch (the manifest's `max_emit_bytes_per_batch`).
    #[arg(long, default_value_t = sharehost::runtime::DEFAULT_MAX_EMIT_BYTES_PER_BATCH)]
    max_emit_bytes_per_batch: u64,
    /// Per-request HTTP timeout, in ms, from when the request has its permit (the
    /// manifest's `http_timeout_ms`).
    #[arg(long, default_value_t = sharehost::manifest::defaults::HTTP_TIMEOUT_MS)]
    http_timeout_ms: u64,
    /// Largest HTTP response body handed to the plugin, in bytes (the manifest's
    /// `http_max_response_bytes`).
    #[arg(long, default_value_t = sharehost::manifest::defaults::HTTP_MAX_RESPONSE_BYTES)]
    http_max_response_bytes: u64,
    /// HTTP requests in flight at once (the manifest's `http_max_concurrent`).
    #[arg(long, default_value_t = sharehost::manifest::defaults::HTTP_MAX_CONCURRENT)]
    http_max_concurrent: usize,
    /// Compile the component even if the precompiled cache has it, and do not store it
    /// (the cache is the one `sharehost run` uses: $SHAREHOST_CACHE_DIR or
    /// ~/.cache/sharehost/cwasm).
    #[arg(long)]
    no_cache: bool,
    /// Run with a pipeline's settings from this manifest: its config, limits, grants, secrets
    /// and trusted keys, under the manifest's runtime (so the compiled component is the
    /// cache entry `sharehost run` maps). --config entries are added to its config; the
    /// other limit and grant flags are not taken with it.
    #[arg(long)]
    manifest: Option<PathBuf>,
    /// The manifest's pipeline to take the settings of (needed when it has more than one).
    #[arg(long, requires = "manifest")]
    pipeline: Option<String>,
    /// A schema read from a file instead of the pipeline's registry (repeatable; the registry
    /// is then never asked): SUBJECT=FILE, e.g. orders-value=order.avsc, or SUBJECT@ID=FILE
    /// for records given framed with that id. The type is told by the extension: .avsc,
    /// .proto or .json (JSON Schema).
    #[arg(
        long = "schema-file",
        value_name = "SUBJECT=FILE",
        requires = "manifest"
    )]
    schema_files: Vec<sharehost::schema::SchemaFile>,
    /// Hide the plugin's own log lines (shown at info by default, as the host logs them).
    #[arg(long)]
    pub(crate) quiet: bool,
}

/// What test-plugin runs a component with: the runtime, its limits and `init`, the longest
/// retry delay a verdict keeps, records per batch, and the pipeline's schemas (its
/// `[pipeline.schema]`: records decoded and emits checked as `run` does).
type PluginSetup = (
    sharehost::runtime::PluginRuntime,
    sharehost::runtime::PluginLimits,
    sharehost::runtime::PluginInit,
    u64,
    usize,
    Option<sharehost::schema::Schemas>,
);

/// test-plugin's settings from its flags.
fn flag_settings(args: &TestPluginArgs, config: Vec<(String, String)>) -> Result<PluginSetup> {
    use sharehost::runtime::{
        HttpGrant, HttpSettings, OutputGrant, PluginInit, PluginLimits, PluginRuntime,
        RuntimeConfig, Secrets,
    };
    let max_memory = args.max_memory_mib << 20;
    let runtime = PluginRuntime::new(RuntimeConfig {
        max_plugin_memory: max_memory.max(RuntimeConfig::default().max_plugin_memory),
        max_instances: 4,
        max_component_bytes: args.max_component_mib.saturating_mul(1 << 20),
        cache_dir: (!args.no_cache).then(sharehost::runtime::default_cache_dir),
        ..RuntimeConfig::default()
    })?;
    let secrets = args
        .secret_env
        .iter()
        .map(|item| {
            let (name, var) = item
                .split_once('=')
                .with_context(|| format!("--secret-env `{item}`: expected NAME=ENV_VAR"))?;
            let value = std::env::var(var).with_context(|| {
                format!("--secret-env {name}: environment variable {var} is not set")
            })?;
            Ok((name.to_owned(), value))
        })
        .collect::<Result<Vec<_>>>()?;
    let http = if args.allowed_outbound_hosts.is_empty() {
        None
    } else {
        let settings = HttpSettings {
            allowed_outbound_hosts: args.allowed_outbound_hosts.clone(),
            request_timeout: std::time::Duration::from_millis(args.http_timeout_ms),
            max_response_bytes: args.http_max_response_bytes,
            max_concurrent: args.http_max_concurrent,
            ..HttpSettings::default()
        };
        Some(HttpGrant::named("test-plugin", settings).map_err(grant_error_in_flags)?)
    };
    let limits = PluginLimits {
        max_memory,
        batch_deadline: std::time::Duration::from_millis(args.deadline_ms),
        wall_deadline: args.wall_deadline_ms.map(std::time::Duration::from_millis),
        http,
        outputs: std::sync::Arc::new(OutputGrant {
            names: args.outputs.iter().map(|n| n.as_str().into()).collect(),
            max_emits: args.max_emits_per_batch,
            max_bytes: args.max_emit_bytes_per_batch,
        }),
        ..PluginLimits::default()
    };
    let init = PluginInit {
        config,
        secrets: std::sync::Arc::new(Secrets::new(secrets)),
        tenant: None,
    };
    Ok((
        runtime,
        limits,
        init,
        args.max_retry_delay_ms,
        args.batch_size,
        None,
    ))
}

/// test-plugin's settings from a manifest's pipeline (`--manifest`, `--pipeline`): its
/// config (plus `--config` entries), limits, grants, secrets and trusted keys, under the
/// manifest's runtime, as `sharehost run` loads it.
fn pipeline_settings(
    path: &std::path::Path,
    pipeline: Option<&str>,
    config: Vec<(String, String)>,
    schema_files: &[sharehost::schema::SchemaFile],
) -> Result<PluginSetup> {
    let manifest = sharehost::manifest::Manifest::load(path)?;
    let names = || {
        manifest
            .pipelines
            .iter()
            .map(|p| p.name.as_str())
            .collect::<Vec<_>>()
            .join(", ")
    };
    let spec = match pipeline {
        Some(name) => manifest.pipelines.iter().find(|p| p.name == name),
        None if manifest.pipelines.len() == 1 => manifest.pipelines.first(),
        None => anyhow::bail!(
            "{}: has {} pipelines: name one with --pipeline ({})",
            path.display(),
            manifest.pipelines.len(),
            names()
        ),
    };
    let Some(spec) = spec else {
        anyhow::bail!(
            "--pipeline {}: {} has no such pipeline (it has: {})",
            pipeline.unwrap_or_default(),
            path.display(),
            names()
        );
    };
    let mut spec = spec.clone();
    spec.config.extend(config);
    let (limits, init) = sharehost::pipeline::plugin_setup(&spec)?;
    let runtime = super::run::plugin_runtime(&manifest)?;
    let schemas = match &spec.schema {
        Some(s) if !schema_files.is_empty() => Some(sharehost::schema::Schemas::from_files(
            &s.settings,
            schema_files,
            &spec.outputs,
        )?),
        Some(s) => {
            let auth = s.resolve_auth(&spec.name).map_err(anyhow::Error::msg)?;
            Some(sharehost::schema::Schemas::new(
                &s.settings,
                auth,
                &spec.outputs,
            )?)
        }
        None if !schema_files.is_empty() => anyhow::bail!(
            "--schema-file: pipeline {} of {} has no [pipeline.schema] saying which formats its topics use",
            spec.name,
            path.display()
        ),
        None => None,
    };
    Ok((
        runtime,
        limits,
        init,
        u64::try_from(spec.max_retry_delay.as_millis()).unwrap_or(u64::MAX),
        spec.batch_size,
        schemas,
    ))
}

pub(crate) async fn run(args: TestPluginArgs) -> Result<()> {
    use sharehost::runtime::offline::{MAX_INPUT_LINE_BYTES, read_jsonl, verdict_line};
    use sharehost::runtime::{Origin, Verdict};
    use std::collections::BTreeMap;
    use std::io::Write;

    let config = args
        .config
        .iter()
        .map(|item| config_entry(item))
        .collect::<Result<Vec<_>>>()?;
    anyhow::ensure!(args.batch_size > 0, "--batch-size must be at least 1");
    // A line at a time, each line bounded (a FIFO such as /dev/stdin is a fine input: it is
    // read as the stream it is, and /dev/zero is refused at its first 16 MiB).
    let input = std::fs::File::open(&args.input)
        .with_context(|| format!("input {}", args.input.display()))?;
    let mut records = read_jsonl(&mut std::io::BufReader::new(input), MAX_INPUT_LINE_BYTES)
        .with_context(|| format!("input {}", args.input.display()))?;
    let (runtime, limits, init, max_retry, batch_size, schemas) = match &args.manifest {
        Some(path) => {
            pipeline_settings(path, args.pipeline.as_deref(), config, &args.schema_files)?
        }
        None => flag_settings(&args, config)?,
    };
    // As a pipeline with `[pipeline.schema]` does: the plugin reads each record decoded into
    // JSON; one that does not decode is rejected with its reason and never reaches it.
    let mut undecodable: BTreeMap<usize, (sharehost::runtime::Record, String)> = BTreeMap::new();
    let positions: Vec<usize>;
    if let Some(s) = schemas.as_ref().filter(|s| s.decodes()) {
        // Records written as the JSON they stand for are encoded first, as their producer
        // would, so the plugin reads what the topic would give it.
        s.frame_json(&mut records)
            .await?
            .map_err(anyhow::Error::msg)
            .with_context(|| format!("input {}", args.input.display()))?;
        let decoded = s.decode(&mut records).await?;
        let faults = decoded.faults;
        let mut kept = Vec::with_capacity(records.len());
        for (i, (r, f)) in records.into_iter().zip(faults).enumerate() {
            match f {
                Some(why) => {
                    undecodable.insert(i, (r, why));
                }
                None => kept.push((i, r)),
            }
        }
        let (places, decodable): (Vec<usize>, Vec<_>) = kept.into_iter().unzip();
        records = decodable;
        positions = places;
    } else {
        positions = (0..records.len()).collect();
    }
    let secrets = init.secrets.clone();
    let granted = limits.outputs.names.clone();
    let where_mapped = if args.manifest.is_some() {
        "the pipeline's [pipeline.outputs]"
    } else {
        "--output"
    };
    let loading = std::time::Instant::now();
    let mut plugin = runtime
        .load_with(&args.component, limits, init)
        .await
        .map_err(load_error_in_flags)?;
    let load_ms = loading.elapsed().as_secs_f64() * 1e3;

    let fault_policy = Verdict::Release;
    let mut counts: BTreeMap<&'static str, u64> = BTreeMap::new();
    let mut faults: BTreeMap<&'static str, u64> = BTreeMap::new();
    let mut batch_us = Vec::new();
    let mut emitted = 0u64;
    let mut discarded = 0u64;
    let undecoded = undecodable.len();
    let stdout = std::io::stdout();
    let mut out = stdout.lock();
    let mut positions = positions.into_iter();
    // The records that did not decode, each shown (rejected, as a pipeline dead-letters it)
    // where it stood in the input.
    let mut write_undecodable = |out: &mut std::io::StdoutLock<'_>,
                                 before: usize,
                                 counts: &mut BTreeMap<&'static str, u64>|
     -> Result<()> {
        while let Some(entry) = undecodable.first_entry() {
            if *entry.key() >= before {
                break;
            }
            let (record, why) = entry.remove();
            let verdict = Verdict::Reject(Some(why));
            *counts.entry(verdict.kind()).or_default() += 1;
            writeln!(
                out,
                "{}",
                verdict_line(&record, &verdict, None, &[], max_retry, &secrets)
            )?;
        }
        Ok(())
    };
    for batch in records.chunks(batch_size) {
        let started = std::time::Instant::now();
        // As a pipeline judges it: a faulting batch is split to find the records that fault
        // on their own, and the others keep the verdicts the plugin gave them.
        let judged = plugin
            .handle_isolating(
                batch,
                &fault_policy,
                sharehost::pipeline::MAX_ISOLATION_CALLS,
            )
            .await;
        batch_us.push(started.elapsed().as_secs_f64() * 1e6);
        for f in &judged.faults {
            *faults.entry(f.kind.as_str()).or_default() += 1;
        }
        let emits = judged.emits;
        for (i, (record, verdict)) in batch.iter().zip(judged.verdicts).enumerate() {
            let fault = judged
                .faulted
                .iter()
                .find(|(r, _)| *r == i)
                .and_then(|(_, f)| judged.faults.get(*f))
                .cloned();
            let mine: Vec<_> = emits.iter().filter(|e| e.record == i).collect();
            // As a pipeline does: a record that emitted to an output nobody maps ends rejected
            // (dead-lettered) whatever the plugin answered.
            let mut verdict = match mine.iter().find(|e| !granted.contains(&e.output)) {
                Some(e) => Verdict::Reject(Some(format!(
                    "emitted to output {:?}, which {where_mapped} does not map",
                    &*e.output
                ))),
                None => verdict,
            };
            // And one whose emit does not fit its output's schema.
            if let Some(s) = &schemas {
                for e in &mine {
                    if let Some(Err(why)) = s.encode(&e.output, e.value.as_deref()).await? {
                        verdict = Verdict::Reject(Some(why));
                        break;
                    }
                }
            }
            write_undecodable(
                &mut out,
                positions.next().unwrap_or(usize::MAX),
                &mut counts,
            )?;
            *counts.entry(verdict.kind()).or_default() += 1;
            // A pipeline produces a record's emits only when it ends accepted.
            if matches!(verdict, Verdict::Accept) {
                emitted += mine.len() as u64;
            } else {
                discarded += mine.len() as u64;
            }
            writeln!(
                out,
                "{}",
                verdict_line(record, &verdict, fault.as_ref(), &mine, max_retry, &secrets)
            )?;
        }
    }
    write_undecodable(&mut out, usize::MAX, &mut counts)?;
    let mean = if batch_us.is_empty() {
        0.0
    } else {
        batch_us.iter().sum::<f64>() / batch_us.len() as f64
    };
    let summary = serde_json::json!({
        "summary": {
            "records": records.len() + undecoded,
            "batches": batch_us.len(),
            "verdicts": counts,
            "emits": emitted,
            "emits_discarded": discarded,
            "faults": faults,
            "us_per_batch": (mean * 10.0).round() / 10.0,
            "first_batch_us": batch_us.first().map(|us| (us * 10.0).round() / 10.0),
            "load_ms": (load_ms * 10.0).round() / 10.0,
            "compiled": match plugin.origin() {
                Origin::Compiled => "now",
                Origin::Cached => "from the cache",
            },
            "instances": plugin.stats().instances,
            "recycled_for_memory": plugin.stats().recycled_for_memory,
            "recycled_for_resources": plugin.stats().recycled_for_resources,
            "allocator": plugin.placement().allocator.name(),
            "allocator_reason": plugin.placement().reason,
            "plugin": plugin.name(),
            "sha256": plugin.content_hash(),
        }
    });
    writeln!(out, "{summary}")?;
    Ok(())
}

/// A `--config KEY=VALUE` entry; a key is needed (`=x` would hand the plugin an entry no
/// manifest can write).
fn config_entry(item: &str) -> Result<(String, String)> {
    match item.split_once('=') {
        Some((k, v)) if !k.trim().is_empty() => Ok((k.to_owned(), v.to_owned())),
        Some(_) => anyhow::bail!("--config `{item}`: the key is empty (expected KEY=VALUE)"),
        None => anyhow::bail!("--config `{item}`: expected KEY=VALUE"),
    }
}

/// A refused `test-plugin` HTTP grant, in the words of its flags (the grant's own error
/// names the manifest's keys).
fn grant_error_in_flags(e: sharehost::runtime::HttpGrantError) -> anyhow::Error {
    use sharehost::runtime::HttpGrantError as E;
    let flag = |key: &str| match key {
        "http_timeout_ms" => "--http-timeout-ms",
        "http_max_response_bytes" => "--http-max-response-bytes",
        "http_max_concurrent" => "--http-max-concurrent",
        _ => "a limit",
    };
    match e {
        E::Origin(o) => anyhow::anyhow!("--allow-outbound-host {:?}: {}", o.entry, o.problem),
        E::ZeroLimit { key } => anyhow::anyhow!("{} must be greater than zero", flag(key)),
        E::TooManyConcurrent(n) => {
            anyhow::anyhow!("--http-max-concurrent {n} is too large")
        }
        other => anyhow::anyhow!("--allow-outbound-host: {other}"),
    }
}

/// A refused load, in `test-plugin`'s words where the runtime's name the manifest.
fn load_error_in_flags(e: sharehost::runtime::LoadError) -> anyhow::Error {
    match e {
        sharehost::runtime::LoadError::HttpNotGranted { path, imports } => anyhow::anyhow!(
            "{}: imports {} (outbound HTTP), but no host is granted: pass --allow-outbound-host \
             https://api.example.com (scheme://host[:port] of each host it may call, repeatable)",
            path.display(),
            imports.join(", ")
        ),
        other => other.into(),
    }
}
