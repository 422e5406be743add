//! A record's headers, read without trusting their names.
//!
//! Kafka header names are bytes on the wire, and neither the broker nor librdkafka checks
//! them; rdkafka's `Headers::iter` unwraps each name as UTF-8 and panics on any other, which
//! would stop ingest on the record at every restart. So the headers are read here through
//! librdkafka's C API, and a name that is not UTF-8 is the record's fault (it is dead-lettered
//! as `bad_header`), not the process's.

use std::ffi::CStr;

use rdkafka::bindings as rd;
use rdkafka::message::BorrowedMessage;

/// One header as (name, value) bytes.
type RawHeader<'a> = (&'a [u8], &'a [u8]);
/// One header whose name is UTF-8.
type Header<'a> = (&'a str, &'a [u8]);

/// The headers of `m` as (name, value) bytes, in record order; a header without a value has
/// an empty one.
pub(super) fn raw<'a>(m: &'a BorrowedMessage<'a>) -> Vec<RawHeader<'a>> {
    let mut hdrs: *mut rd::rd_kafka_headers_t = std::ptr::null_mut();
    // SAFETY: `m.ptr()` is the message `m` borrows from the consumer, alive for 'a; librdkafka
    // only reads it and points `hdrs` into it (NULL with an error when it has no headers).
    let err = unsafe { rd::rd_kafka_message_headers(m.ptr(), &mut hdrs) };
    if err != rd::rd_kafka_resp_err_t::RD_KAFKA_RESP_ERR_NO_ERROR || hdrs.is_null() {
        return Vec::new();
    }
    // SAFETY: `hdrs` is the message's own header list (above), alive as long as `m`.
    let n = unsafe { rd::rd_kafka_header_cnt(hdrs) };
    let mut out = Vec::with_capacity(n);
    for idx in 0..n {
        let mut name: *const std::os::raw::c_char = std::ptr::null();
        let mut value: *const std::os::raw::c_void = std::ptr::null();
        let mut size = 0usize;
        // SAFETY: `idx < n` on the list above; librdkafka sets the three out-pointers to its
        // own NUL-terminated name and value buffer, owned by the message.
        let err =
            unsafe { rd::rd_kafka_header_get_all(hdrs, idx, &mut name, &mut value, &mut size) };
        if err != rd::rd_kafka_resp_err_t::RD_KAFKA_RESP_ERR_NO_ERROR || name.is_null() {
            break;
        }
        // SAFETY: as above: a NUL-terminated name, and `size` bytes at `value` when not NULL,
        // both owned by the message borrowed for 'a.
        let (name, value) = unsafe {
            let value: &[u8] = if value.is_null() {
                &[]
            } else {
                std::slice::from_raw_parts(value.cast::<u8>(), size)
            };
            (CStr::from_ptr(name).to_bytes(), value)
        };
        out.push((name, value));
    }
    out
}

/// The value of the last header of `m` named `name` (the one `weft_schemas::wire::decode`
/// reads), if any.
pub(super) fn last<'a>(m: &'a BorrowedMessage<'a>, name: &str) -> Option<&'a [u8]> {
    raw(m)
        .into_iter()
        .rev()
        .find(|(k, _)| *k == name.as_bytes())
        .map(|(_, v)| v)
}

/// The headers whose names are UTF-8 (every name weft reads), and the first name that is
/// not, if any.
pub(super) fn utf8<'a>(raw: &[RawHeader<'a>]) -> (Vec<Header<'a>>, Option<&'a [u8]>) {
    let mut bad = None;
    let named = raw
        .iter()
        .filter_map(|&(k, v)| match std::str::from_utf8(k) {
            Ok(k) => Some((k, v)),
            Err(_) => {
                bad = bad.or(Some(k));
                None
            }
        })
        .collect();
    (named, bad)
}

#[cfg(test)]
mod tests {
    #[test]
    fn a_name_that_is_not_utf8_is_named_and_left_out() {
        let raw: [(&[u8], &[u8]); 3] =
            [(b"weft-tenant", b"acme"), (b"\xffx", b"v"), (b"other", b"")];
        let (named, bad) = super::utf8(&raw);
        assert_eq!(named, [("weft-tenant", &b"acme"[..]), ("other", &b""[..])]);
        assert_eq!(bad, Some(&b"\xffx"[..]));
        assert_eq!(super::utf8(&raw[..1]).1, None);
    }
}
