//! The gateway's request parsing: any body, as JSON or NDJSON, splits into at most
//! `max_items` items, each parsed and validated for the key's tenant, or is refused as a whole
//! with the one error body; never a panic, and never more items than the limit.
#![no_main]

use libfuzzer_sys::fuzz_target;
use weft_producers::gateway::parse_request;

fuzz_target!(|data: &[u8]| {
    let Some((&ctl, body)) = data.split_first() else {
        return;
    };
    let ct = match ctl % 3 {
        0 => None,
        1 => Some("application/json"),
        _ => Some("application/x-ndjson"),
    };
    let max = usize::from(ctl >> 2).max(1);
    match parse_request(body, ct, max, "acme") {
        Ok(items) => {
            assert!(items.len() <= max);
            for item in items {
                match item {
                    Ok(env) => assert_eq!(env.tenant, "acme"),
                    Err(e) => assert!(!e.code.is_empty() && e.message.len() <= 515),
                }
            }
        }
        Err(e) => assert!(e.status.is_client_error(), "{e}"),
    }
});
