//! Plugins that act (contract 0.2) against the runtime, with real components built by
//! `dev/build-guests`: `fixture_actor` (0.2, wit-bindgen only) emits, retries, reads secrets
//! and waits; `fixture_contract_v01` is built from the frozen 0.1.0 WIT and must load and
//! judge exactly as before.

use std::sync::Arc;
use std::time::Duration;

use sharehost::runtime::{
    BatchOutcome, Contract, FaultKind, OutputGrant, Plugin, PluginInit, PluginLimits, Record,
    Secrets, Verdict,
};
use sharehost_tests::{guest, plugin_record as record, plugin_runtime as runtime};

fn limits(outputs: &[&str]) -> PluginLimits {
    PluginLimits {
        max_memory: 16 << 20,
        batch_deadline: Duration::from_millis(2000),
        outputs: Arc::new(OutputGrant {
            names: outputs.iter().map(|n| (*n).into()).collect(),
            ..OutputGrant::default()
        }),
        ..PluginLimits::default()
    }
}

async fn actor(limits: PluginLimits, secrets: &[(&str, &str)]) -> Plugin {
    let init = PluginInit {
        config: Vec::new(),
        secrets: Arc::new(Secrets::new(
            secrets
                .iter()
                .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
                .collect(),
        )),
        tenant: None,
    };
    runtime()
        .load_with(&guest("fixture_actor"), limits, init)
        .await
        .expect("fixture_actor loads")
}

fn batch(values: &[&str]) -> Vec<Record> {
    values
        .iter()
        .enumerate()
        .map(|(i, v)| record(100 + i as i64, v, &[]))
        .collect()
}

fn verdicts(outcome: BatchOutcome) -> Vec<Verdict> {
    match outcome {
        BatchOutcome::Verdicts(v) => v,
        BatchOutcome::Fault(f) => panic!("unexpected fault: {f:?}"),
    }
}

#[tokio::test]
async fn a_contract_0_1_component_still_loads_and_judges_exactly_as_before() {
    let mut plugin = runtime()
        .load(
            &guest("fixture_contract_v01"),
            limits(&[]),
            vec![("mode".into(), "strict".into())],
        )
        .await
        .expect("a 0.1.0 component loads");
    assert_eq!(plugin.contract(), Contract::V0_1);
    let got = verdicts(
        plugin
            .handle(&batch(&[
                "accept",
                "release",
                "renew",
                "reject:too big",
                "echo-config",
                "other",
            ]))
            .await,
    );
    assert_eq!(
        got,
        vec![
            Verdict::Accept,
            Verdict::Release,
            Verdict::Renew,
            Verdict::Reject(Some("too big".into())),
            Verdict::Reject(Some(r#"[("mode", "strict")]"#.into())),
            Verdict::Accept,
        ]
    );
    assert!(plugin.take_emits().is_empty());
}

#[tokio::test]
async fn emits_are_bound_to_their_record_and_refusals_are_values_the_plugin_sees() {
    let mut plugin = actor(limits(&["valid"]), &[]).await;
    assert_eq!(plugin.contract(), Contract::V0_2);
    let got = verdicts(
        plugin
            .handle(&batch(&[
                "emit:valid:first:2",
                "plain",
                "emit:nowhere:x",
                "emit-reserved",
                "emit-other:7",
                "emit-release:valid:dropped-later",
            ]))
            .await,
    );
    assert_eq!(got[0], Verdict::Accept);
    assert_eq!(got[1], Verdict::Accept);
    assert_eq!(
        got[2],
        Verdict::Reject(Some(r#"EmitError::UnknownOutput("nowhere")"#.into()))
    );
    assert_eq!(
        got[3],
        Verdict::Reject(Some(
            r#"EmitError::ReservedHeader("sharehost.source.offset")"#.into()
        ))
    );
    assert_eq!(
        got[4],
        Verdict::Reject(Some("EmitError::NoSuchRecord".into()))
    );
    assert_eq!(got[5], Verdict::Release);
    let emits = plugin.take_emits();
    let bound: Vec<(usize, &str, &[u8])> = emits
        .iter()
        .map(|e| (e.record, &*e.output, e.value.as_deref().unwrap_or_default()))
        .collect();
    // The runtime keeps every accepted emit with its record, and an empty marker of the emit
    // to an unknown output (the pipeline rejects that record); deciding what a Release means
    // for record 5's emit is the pipeline's job.
    assert_eq!(
        bound,
        vec![
            (0, "valid", &b"first"[..]),
            (0, "valid", &b"first"[..]),
            (2, "nowhere", &b""[..]),
            (5, "valid", &b"dropped-later"[..]),
        ]
    );
    assert_eq!(emits[2].value, None);
    assert_eq!(emits[1].headers[0].key, "n");
    assert_eq!(emits[1].headers[0].value.as_deref(), Some(&b"1"[..]));
    assert_eq!(plugin.stats().emits, 3);
    assert_eq!(plugin.stats().emits_refused, 3);
}

#[tokio::test]
async fn the_emit_bounds_of_a_batch_refuse_the_excess_and_nothing_is_dropped_silently() {
    let mut l = limits(&["valid"]);
    l.outputs = Arc::new(OutputGrant {
        names: vec!["valid".into()],
        max_emits: 5,
        max_bytes: 1 << 20,
    });
    let mut plugin = actor(l, &[]).await;
    let got = verdicts(
        plugin
            .handle(&batch(&["emit:valid:x:3", "emit:valid:y:3"]))
            .await,
    );
    assert_eq!(got[0], Verdict::Accept);
    assert_eq!(
        got[1],
        Verdict::Reject(Some("EmitError::TooManyEmits(5)".into()))
    );
    // The plugin saw the refusal of the sixth; the five taken are all there.
    assert_eq!(plugin.take_emits().len(), 5);
}

#[tokio::test]
async fn emits_of_an_isolated_sub_batch_keep_their_place_in_the_whole_batch() {
    let mut plugin = actor(limits(&["valid"]), &[]).await;
    // `spin:600000` computes for ten minutes of wall time: past the 2 s CPU deadline (or the
    // 6 s wall-clock one, on a machine too busy to give it 2 s of CPU first), so the batch
    // faults and is split.
    let records = batch(&[
        "emit:valid:a",
        "spin:600000",
        "emit:valid:c",
        "emit:valid:d",
    ]);
    let judged = plugin
        .handle_isolating(&records, &Verdict::Release, 8)
        .await;
    assert!(!judged.faults.is_empty());
    assert_eq!(judged.verdicts[1], Verdict::Release);
    let at: Vec<(usize, &[u8])> = judged
        .emits
        .iter()
        .map(|e| (e.record, e.value.as_deref().expect("value")))
        .collect();
    assert_eq!(at, vec![(0, &b"a"[..]), (2, &b"c"[..]), (3, &b"d"[..])]);
}

#[tokio::test]
async fn retry_with_a_delay_is_a_verdict_of_contract_0_2() {
    let mut plugin = actor(limits(&[]), &[]).await;
    let got = verdicts(
        plugin
            .handle(&batch(&["retry:1500", "retry:0", "fine"]))
            .await,
    );
    assert_eq!(
        got,
        vec![Verdict::Retry(1500), Verdict::Retry(0), Verdict::Accept]
    );
}

#[tokio::test]
async fn secrets_reach_init_and_are_redacted_from_reasons() {
    let mut plugin = actor(limits(&[]), &[("api-token", "tok-5up3r-53cr3t")]).await;
    let got = verdicts(plugin.handle(&batch(&["secret:api-token"])).await);
    assert_eq!(
        got,
        vec![Verdict::Reject(Some("leaking [secret api-token]".into()))],
        "the plugin had the value (it echoed it), and the host kept it out of the reason"
    );
}

#[tokio::test]
async fn waiting_in_host_calls_is_not_cpu_time_but_the_wall_clock_deadline_ends_it() {
    let mut l = limits(&[]);
    l.batch_deadline = Duration::from_millis(200);
    l.wall_deadline = Some(Duration::from_secs(5));
    let mut plugin = actor(l.clone(), &[]).await;
    // 600 ms asleep (in a host call) under a 200 ms CPU deadline: judged.
    assert_eq!(
        verdicts(plugin.handle(&batch(&["sleep:600"])).await),
        vec![Verdict::Accept]
    );
    // Computing past the CPU deadline is still a timeout.
    let outcome = plugin.handle(&batch(&["spin:3000"])).await;
    let f = outcome.fault().expect("a CPU timeout");
    assert_eq!(f.kind, FaultKind::Timeout);
    assert!(f.message.contains("CPU deadline"), "{}", f.message);

    // And waiting past the wall-clock deadline ends the batch.
    l.wall_deadline = Some(Duration::from_millis(400));
    let mut plugin = actor(l, &[]).await;
    let outcome = plugin.handle(&batch(&["sleep:30000"])).await;
    let f = outcome.fault().expect("a wall-clock timeout");
    assert_eq!(f.kind, FaultKind::Timeout);
    assert!(f.message.contains("wall-clock deadline"), "{}", f.message);
    // The next batch runs on a fresh instance.
    assert_eq!(
        verdicts(plugin.handle(&batch(&["fine"])).await),
        vec![Verdict::Accept]
    );
}

#[tokio::test]
async fn a_component_importing_http_without_a_grant_is_refused_naming_the_manifest_key() {
    let e = runtime()
        .load(&guest("fixture_http_fetch"), limits(&[]), Vec::new())
        .await
        .expect_err("no hosts granted");
    let text = e.to_string();
    assert!(text.contains("wasi:http/outgoing-handler@0.2"), "{text}");
    assert!(text.contains("allowed_outbound_hosts"), "{text}");
}

#[tokio::test]
async fn an_emit_carrying_more_than_the_per_call_budget_traps_naming_the_bound_and_its_batch_faults()
 {
    let mut l = limits(&["valid"]);
    l.max_memory = 32 << 20;
    let mut plugin = actor(l, &[]).await;
    // 2 MiB in one emit: over the 1 MiB a host call may carry from the guest.
    let big = format!("emit:valid:{}", "x".repeat(2 << 20));
    let outcome = plugin.handle(&batch(&["emit:valid:small", &big])).await;
    let f = outcome.fault().expect("the oversized emit traps");
    assert_eq!(f.kind, FaultKind::Trap, "{f:?}");
    assert!(
        f.message.contains("more than 1 MiB") && f.message.contains("emit"),
        "the fault names the bound and emit, not wasmtime's hostcall fuel: {}",
        f.message
    );
    assert!(!f.message.contains("fuel"), "{}", f.message);
    assert!(
        plugin.take_emits().is_empty(),
        "the emits of a faulted call are discarded with its instance"
    );
    // Well under the budget, the same plugin emits normally on a fresh instance.
    let ok = format!("emit:valid:{}", "x".repeat(512 << 10));
    assert_eq!(
        verdicts(plugin.handle(&batch(&[&ok])).await),
        vec![Verdict::Accept]
    );
    assert_eq!(plugin.take_emits().len(), 1);
}

#[tokio::test]
async fn sdk_plugins_that_do_not_call_out_load_without_any_http_grant() {
    // The SDK links wasi:http only into plugins that use it: these load where nothing is
    // granted, and the enricher (which calls out) does not.
    let rt = runtime();
    for name in ["accept_all", "splitter", "order_validator", "value_reader"] {
        rt.load(&guest(name), limits(&["urgent", "normal"]), Vec::new())
            .await
            .unwrap_or_else(|e| panic!("{name} loads without HTTP: {e}"));
    }
    let e = rt
        .load(&guest("enricher"), limits(&["enriched"]), Vec::new())
        .await
        .expect_err("the enricher imports wasi:http");
    assert!(e.to_string().contains("allowed_outbound_hosts"), "{e}");
}
