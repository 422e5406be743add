//! The envelope validator and the strict (duplicate-key) parser: any text, as an envelope or
//! as the payload of each kind, validates or fails with a reason; never a panic. And the
//! strict parser agrees with serde_json on every text without a duplicate key.
#![no_main]

use libfuzzer_sys::fuzz_target;
use serde_json::value::RawValue;
use weft_schemas::{strict, Envelope, Kind};

fuzz_target!(|data: &[u8]| {
    let Ok(text) = std::str::from_utf8(data) else {
        return;
    };
    match strict::parse(text) {
        Ok(v) => {
            let plain: serde_json::Value =
                serde_json::from_str(text).expect("strict accepted what serde_json refuses");
            assert_eq!(v, plain, "strict and serde_json read different values");
        }
        Err(strict::StrictError::Json(_)) => {
            assert!(serde_json::from_str::<serde_json::Value>(text).is_err());
        }
        Err(strict::StrictError::DuplicateKey { .. }) => {}
    }
    if let Ok(env) = serde_json::from_str::<Envelope>(text) {
        let _ = env.validate();
    }
    if let Ok(raw) = RawValue::from_string(text.to_owned()) {
        for kind in Kind::ALL {
            let env = Envelope {
                kind,
                request_id: None,
                tenant: "fuzz".into(),
                producer_id: None,
                seq: None,
                emitted_at: None,
                payload: raw.clone(),
            };
            if let Err(e) = env.validate() {
                assert!(!e.code().is_empty());
            }
        }
    }
});
