//! The Kafka wire decoder: any headers and value bytes either decode to an envelope (which
//! then validates or not) or give a `WireError` with a reason code; never a panic.
//!
//! Input layout: byte 0 picks the topic kind (or none) and which headers are set; then up to
//! four header values separated by 0xFF, then the record value.
#![no_main]

use libfuzzer_sys::fuzz_target;
use weft_schemas::wire::{self, SchemaIds};
use weft_schemas::Kind;

const NAMES: [&str; 4] = ["content-type", "weft-kind", "weft-seq", "weft-tenant"];

fuzz_target!(|data: &[u8]| {
    let Some((&ctl, rest)) = data.split_first() else {
        return;
    };
    let kinds = Kind::ALL;
    let topic_kind = kinds.get(usize::from(ctl & 0x0f)).copied();
    let mut parts = rest.splitn(5, |b| *b == 0xff);
    let mut headers: Vec<(&str, &[u8])> = Vec::new();
    for (i, name) in NAMES.iter().enumerate() {
        let Some(v) = parts.next() else { break };
        if ctl & (0x10 << i) != 0 {
            headers.push((name, v));
        }
    }
    let value = parts.next().unwrap_or(rest);
    let mut ids = SchemaIds::default();
    ids.insert(Kind::TraceEvent, 1);
    match wire::decode(&headers, value, topic_kind, &ids) {
        Ok((env, _)) => {
            let _ = env.check();
        }
        Err(e) => {
            assert!(!e.code().is_empty());
        }
    }
});
