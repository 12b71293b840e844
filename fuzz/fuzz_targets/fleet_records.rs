//! The fleet's record decoders on arbitrary keys and values, as a host reads its three topics:
//! `decode_deployment` (actions and decisions), the signed-action check (`sign::verify`, the
//! minisign signature parser and the action's JSON), `decode_status` into a bounded book of
//! hosts (`Hosts::take`), and the components topic's chunk keys (`parse_chunk_key`).
//!
//! Input: `[flags, key_len, key..., value...]`: bit 0 of `flags` drops the key, bit 1 the
//! value (a tombstone); `key_len` bytes of key (fewer when the input is shorter), the rest the
//! value.
//!
//! Asserts:
//! - nothing panics (a record must never stop a host's fleet agent);
//! - an error's text stays short (it is logged and shown in `GET /fleet`);
//! - a book of hosts never holds more than its bound, and no kept status is later than the
//!   reader's clock.
#![no_main]

use std::sync::OnceLock;

use libfuzzer_sys::fuzz_target;
use sharehost::fleet::components::parse_chunk_key;
use sharehost::fleet::hosts::Hosts;
use sharehost::fleet::records::{DeploymentRecord, SignedAction, decode_deployment, decode_status};
use sharehost::fleet::sign;
use sharehost::runtime::{TrustPolicy, TrustedKey};

/// The public half of the key the seeds' signed action is signed with (made by `minisign -G -W`
/// for this target only; its secret half signs nothing else).
const SEED_KEY: &str = "RWTt4RcmNq6I2eoA5bHavq1Km4MxB7AzQMN3FPQe81TCoVIgm99y+xKH";

/// The hosts' trust: the seeds' key, so a valid signed action gets past the signature to the
/// action's own JSON.
fn trust() -> &'static TrustPolicy {
    static TRUST: OnceLock<TrustPolicy> = OnceLock::new();
    TRUST.get_or_init(|| {
        TrustPolicy::new([TrustedKey::parse(SEED_KEY).expect("the seed key")]).expect("a policy")
    })
}

/// The longest error text a record may produce (its cut at 200 bytes, plus its prefix).
const MAX_ERROR: usize = 1024;

fn check_signed(signed: &SignedAction) {
    let _ = sign::verify(signed, trust());
}

fuzz_target!(|data: &[u8]| {
    let Some((&flags, rest)) = data.split_first() else {
        return;
    };
    let Some((&key_len, rest)) = rest.split_first() else {
        return;
    };
    let (key, value) = rest.split_at(usize::from(key_len).min(rest.len()));
    let key = (flags & 1 == 0).then_some(key);
    let value = (flags & 2 == 0).then_some(value);

    match decode_deployment(key, value) {
        Ok(DeploymentRecord::Action(signed)) => check_signed(&signed),
        Ok(DeploymentRecord::Decision(_)) => {}
        Err(e) => assert!(e.to_string().len() <= MAX_ERROR, "{e}"),
    }
    // Arbitrary signature text over arbitrary action bytes, straight to the verifier.
    check_signed(&SignedAction {
        action: String::from_utf8_lossy(key.unwrap_or_default()).into_owned(),
        signature: String::from_utf8_lossy(value.unwrap_or_default()).into_owned(),
    });

    let now = 1_800_000_000_000;
    let mut book = Hosts::new(2, 30_000);
    match decode_status(value) {
        Ok(s) => {
            let mut other = s.clone();
            other.instance.push('x');
            for status in [s.clone(), other, s] {
                let _ = book.take(status, now);
                assert!(book.len() <= 2);
            }
            assert!(book.statuses().all(|(_, s)| s.at_ms <= now));
        }
        Err(e) => assert!(e.to_string().len() <= MAX_ERROR, "{e}"),
    }

    if let Some(k) = key
        && let Some((digest, _)) = parse_chunk_key(k)
    {
        assert_eq!(digest.len(), 64);
    }
});
